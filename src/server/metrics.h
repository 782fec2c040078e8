// Server metrics in the Prometheus text exposition format (version 0.0.4). Counters and histograms
// are updated from the HTTP threads and the scheduler thread; gauges are sampled when rendered.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace anvil::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double v);
  // "<name>_bucket{le=..} n" lines (cumulative), _sum and _count.
  void render(const std::string& name, std::string* out) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  // One finished HTTP request to a counted endpoint.
  void count_request(const std::string& endpoint, int status);
  std::atomic<uint64_t> prompt_tokens{0}, cached_prompt_tokens{0}, store_prompt_tokens{0}, generation_tokens{0};
  std::atomic<uint64_t> preemptions{0}, cancelled{0}, rejected_busy{0};
  Histogram ttft, itl, e2e;
  // The scheduler's steps: how many, the whole of each (the loop's iteration that ran it: new
  // requests admitted, the step built, the forward, every row's token handled) and the forward pass
  // within it (Engine::step / step_sample: its launch and the wait for its result), in nanoseconds.
  // (step - forward) / steps is the host's part of a step, which the GPU waits through. The
  // scheduler adds an iteration's figures after it, steps last; render() reads steps first.
  // prep_ns: the part of the forward passes before their kernels were issued (Engine::last_step_prep_ns).
  std::atomic<uint64_t> steps{0}, step_ns{0}, forward_ns{0}, prep_ns{0};
  // Rows of logits ([vocab] fp32 each) the steps copied to the host (Engine::logit_rows_to_host):
  // with the device sampler, only the rows of requests that need host work on them.
  std::atomic<uint64_t> logit_rows_to_host{0};
  // Gauges: name -> (help, sampler), rendered in name order.
  void add_gauge(const std::string& name, const std::string& help, std::function<double()> value);
  // A counter kept elsewhere (the KV store's), sampled when rendered.
  void add_counter(const std::string& name, const std::string& help, std::function<double()> value);
  std::string render() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, std::pair<std::string, std::function<double()>>> gauges_, counters_;
};

}  // namespace anvil::server
