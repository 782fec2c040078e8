#include "server/metrics.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>

namespace anvil::server {

namespace {
// Shortest text that reads back as the same double ("0.005", not "0.0050000000000000001").
std::string num(double v) {
  char b[64];
  auto r = std::to_chars(b, b + sizeof b, v);
  return std::string(b, r.ptr);
}
// Latency buckets in seconds: 1 ms .. 60 s, roughly x2.5 apart.
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds_(std::move(b)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  std::lock_guard<std::mutex> lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string* out) const {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    *out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(cum) + "\n";
  *out += name + "_sum " + num(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics() : ttft(latency_buckets()), itl(latency_buckets()), e2e(latency_buckets()) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::add_gauge(const std::string& name, const std::string& help, std::function<double()> value) {
  std::lock_guard<std::mutex> lk(mu_);
  gauges_[name] = {help, std::move(value)};
}

void Metrics::add_counter(const std::string& name, const std::string& help, std::function<double()> value) {
  std::lock_guard<std::mutex> lk(mu_);
  counters_[name] = {help, std::move(value)};
}

std::string Metrics::render() const {
  std::string o;
  auto counter_text = [&](const char* name, const char* help, const std::string& v) {
    o += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + v + "\n";
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) { counter_text(name, help, std::to_string(v)); };
  auto seconds = [&](const char* name, const char* help, uint64_t ns) { counter_text(name, help, num(double(ns) * 1e-9)); };
  {
    std::lock_guard<std::mutex> lk(mu_);
    o += "# HELP anvil_requests_total HTTP requests by endpoint and status code\n# TYPE anvil_requests_total counter\n";
    for (auto& [k, v] : requests_)
      o += "anvil_requests_total{endpoint=\"" + k.first + "\",code=\"" + std::to_string(k.second) + "\"} " +
           std::to_string(v) + "\n";
  }
  counter("anvil_prompt_tokens_total", "Prompt tokens of admitted requests", prompt_tokens.load());
  counter("anvil_prompt_tokens_cached_total", "Prompt tokens whose KV came from the prefix cache",
          cached_prompt_tokens.load());
  counter("anvil_prompt_tokens_from_store_total",
          "Prompt tokens whose KV was restored from the durable store (part of the cached ones; pages loaded at "
          "start by --kv-warm count for the first request that uses them)",
          store_prompt_tokens.load());
  counter("anvil_generation_tokens_total", "Generated tokens", generation_tokens.load());
  counter("anvil_preemptions_total", "Sequences preempted (KV pages taken back, recomputed later)", preemptions.load());
  counter("anvil_cancelled_total", "Requests cancelled (client gone, or shutdown)", cancelled.load());
  counter("anvil_rejected_busy_total", "Requests refused with 503 (queue full or draining)", rejected_busy.load());
  counter("anvil_steps_total", "Scheduler steps (one forward pass each)", steps.load());
  seconds("anvil_step_seconds_total",
          "Time of the scheduler's steps: admission, building the step, the forward pass, handling its tokens",
          step_ns.load());
  seconds("anvil_step_forward_seconds_total", "Time of the steps' forward passes (launch and wait), within the steps'",
          forward_ns.load());
  seconds("anvil_step_prep_seconds_total",
          "Time of the forward passes before their kernels were issued (building and uploading the batch), within theirs",
          prep_ns.load());
  counter("anvil_logit_rows_to_host_total",
          "Rows of logits (vocabulary-sized, fp32) the steps copied to the host to sample there: every row on the host "
          "path; with the device sampler, only the rows of requests with logprobs, presence/frequency penalties or "
          "JSON mode",
          logit_rows_to_host.load());
  o += "# HELP anvil_time_to_first_token_seconds Submit to first generated token\n"
       "# TYPE anvil_time_to_first_token_seconds histogram\n";
  ttft.render("anvil_time_to_first_token_seconds", &o);
  o += "# HELP anvil_inter_token_latency_seconds Time between consecutive tokens of one request\n"
       "# TYPE anvil_inter_token_latency_seconds histogram\n";
  itl.render("anvil_inter_token_latency_seconds", &o);
  o += "# HELP anvil_request_duration_seconds Submit to last token\n"
       "# TYPE anvil_request_duration_seconds histogram\n";
  e2e.render("anvil_request_duration_seconds", &o);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [name, c] : counters_)
    o += "# HELP " + name + " " + c.first + "\n# TYPE " + name + " counter\n" + name + " " + num(c.second()) + "\n";
  for (auto& [name, g] : gauges_)
    o += "# HELP " + name + " " + g.first + "\n# TYPE " + name + " gauge\n" + name + " " + num(g.second()) + "\n";
  return o;
}

}  // namespace anvil::server
