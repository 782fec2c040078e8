// anvil bench: the standard decode/prefill benchmark (the protocol is docs/bench-protocol.md).
//   prompt: N synthetic ids (seed 0, uniform over the vocabulary), no template; generate M tokens
//   greedy with EOS suppressed; one warm-up run, then the best of R timed runs in one process.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "base/thread_pool.h"
#include "cli/command.h"
#include "cli/common.h"
#include "runtime/generate.h"

namespace anvil::cli {
namespace {

struct BenchArgs {
  ModelOptions model;
  int prompt = 512, n = 128, runs = 3;
  bool json = false;
};

int run_bench(BenchArgs& a) {
  if (a.prompt < 1) return fail("--prompt-tokens must be >= 1, got " + std::to_string(a.prompt));
  if (a.n < 2) return fail("-n/--max-tokens must be >= 2, got " + std::to_string(a.n));
  if (a.runs < 1) return fail("--runs must be >= 1, got " + std::to_string(a.runs));
  a.model.no_prefix_cache = true;  // every run must prefill for real
  if (!a.model.ctx_given || a.model.ctx < a.prompt + a.n) {
    a.model.ctx = std::max(a.prompt + a.n, a.model.ctx_given ? a.model.ctx : 0);
    a.model.ctx_given = true;
  }
  auto stack = build_stack(a.model);
  if (!stack.is_ok()) return fail(stack.status().message());
  Stack& s = *stack;
  const ModelConfig& c = s.model->config;
  std::mt19937_64 rng(0);
  std::vector<int32_t> prompt(size_t(a.prompt));
  for (auto& t : prompt) t = int32_t(rng() % uint64_t(c.vocab_size));

  GenerateRequest req;
  req.prompt = prompt;
  req.max_new_tokens = a.n;
  req.sampling.temperature = 0;
  req.eos_ids = c.eos_token_ids;
  req.ignore_eos = true;

  std::fprintf(stderr, "[anvil] bench %s on %s: prompt %d, generate %d, 1 warm-up + %d runs\n",
               s.model->source.c_str(), s.backend->name().c_str(), a.prompt, a.n, a.runs);
  double best_prefill = 0, best_decode = 0;
  for (int run = 0; run <= a.runs; ++run) {
    auto seq = s.engine->seq_create();
    if (!seq.is_ok()) return fail(seq.status().message());
    auto r = generate(*s.engine, *seq, req, nullptr);
    if (!r.is_ok()) return fail(r.status().message());
    s.engine->seq_release(*seq);
    double pf = a.prompt / r->prefill_s, dc = (r->ids.size() - 1) / r->decode_s;
    std::fprintf(stderr, "[anvil] %s: prefill %.1f tok/s, decode %.2f tok/s\n",
                 run == 0 ? "warm-up" : ("run " + std::to_string(run)).c_str(), pf, dc);
    if (run > 0) {
      best_prefill = std::max(best_prefill, pf);
      best_decode = std::max(best_decode, dc);
    }
  }
  // Bytes per decoded token: all weights once plus the KV cache read by attention, averaged over
  // the decode (context grows from prompt to prompt + n).
  const size_t kv_elem = a.model.kv_dtype == "f32" ? 4 : 2;
  const double kv_per_pos = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * kv_elem;
  const double avg_ctx = a.prompt + a.n / 2.0;
  const double weight_bytes = double(s.model->weights.bytes_per_token());
  const double bytes_per_token = weight_bytes + kv_per_pos * avg_ctx;
  const double gbs = bytes_per_token * best_decode / 1e9;
  // Peak memory of the model and its runs, read before the bandwidth probe allocates its 1 GiB buffer.
  const double peak_mib = peak_rss_mib();
  ThreadPool pool(a.model.threads > 0 ? a.model.threads : ThreadPool::default_threads());
  const double ceiling = measure_read_bandwidth_gbs(pool, size_t(1) << 30);
  const int ops_per_token = 1 + c.num_hidden_layers * 12 + 4;
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = s.model->source;
    j["backend"] = s.backend->name();
    j["threads"] = pool.size();
    j["prompt_tokens"] = a.prompt;
    j["generated_tokens"] = a.n;
    j["prefill_tok_s"] = best_prefill;
    j["decode_tok_s"] = best_decode;
    j["bytes_per_token"] = bytes_per_token;
    j["weight_bytes_per_token"] = weight_bytes;
    j["achieved_gb_s"] = gbs;
    j["measured_read_gb_s"] = ceiling;
    j["fraction_of_ceiling"] = gbs / ceiling;
    j["ops_per_token"] = ops_per_token;
    j["peak_rss_mib"] = peak_mib;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model              %s\n", s.model->source.c_str());
    std::printf("device             %s\n", s.backend->name().c_str());
    std::printf("prefill            %.1f tok/s (pp%d)\n", best_prefill, a.prompt);
    std::printf("decode             %.2f tok/s (tg%d, best of %d)\n", best_decode, a.n, a.runs);
    std::printf("bytes per token    %.1f MB (weights %.1f MB + KV %.1f MB)\n", bytes_per_token / 1e6,
                weight_bytes / 1e6, (bytes_per_token - weight_bytes) / 1e6);
    std::printf("achieved           %.1f GB/s of %.1f GB/s measured read bandwidth (%.0f%%)\n", gbs, ceiling,
                100.0 * gbs / ceiling);
    std::printf("ops per token      %d backend ops\n", ops_per_token);
    std::printf("peak memory        %.0f MiB RSS\n", peak_mib);
  }
  return 0;
}

Command reg("bench", "Benchmark prefill and decode speed (protocol: docs/bench-protocol.md)", 50,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<BenchArgs>();
              add_model_options(app, a->model);
              app.add_option("--prompt-tokens", a->prompt, "Prompt length in tokens (random ids), >= 1")
                  ->capture_default_str();
              app.add_option("--prompt", a->prompt)->group("");  // the old spelling, hidden
              app.add_option("-n,--max-tokens", a->n, "Tokens to generate, >= 2")->capture_default_str();
              app.add_option("--runs", a->runs, "Timed runs (the best is reported) after one warm-up")
                  ->capture_default_str();
              app.add_flag("--json", a->json, "Print JSON");
              return [a] { return run_bench(*a); };
            });

}  // namespace
}  // namespace anvil::cli
