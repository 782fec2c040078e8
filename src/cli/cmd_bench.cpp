// anvil bench: the standard decode/prefill benchmark (the protocol is docs/bench-protocol.md).
//   prompt: N synthetic ids (seed 0, uniform over the vocabulary), no template; generate M tokens
//   greedy with EOS suppressed; one warm-up run, then the best of R timed runs in one process.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "base/thread_pool.h"
#include "cli/command.h"
#include "cli/common.h"
#include "runtime/generate.h"
#ifdef ANVIL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace anvil::cli {
namespace {

struct BenchArgs {
  ModelOptions model;
  int prompt = 512, n = 128, runs = 3;
  bool json = false, profile = false;
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
  // Kernel launches per decoded token (CUDA: graph nodes replayed): a run of n tokens minus a
  // prefill-only run, over the n - 1 decode steps.
  auto launches_of = [&](int n_tokens) -> uint64_t {
    GenerateRequest r1 = req;
    r1.max_new_tokens = n_tokens;
    auto seq = s.engine->seq_create();
    if (!seq.is_ok()) return 0;
    const uint64_t before = s.backend->launch_count();
    auto r = generate(*s.engine, *seq, r1, nullptr);
    s.engine->seq_release(*seq);
    return r.is_ok() ? s.backend->launch_count() - before : 0;
  };
  // (Two more prefills: skipped for long prompts, where they would dominate the benchmark's time.)
  const bool count_kernels = a.prompt <= 4096;
  const uint64_t l1 = count_kernels ? launches_of(1) : 0, ln = count_kernels ? launches_of(a.n) : 0;
  const double kernels_per_token = ln > l1 ? double(ln - l1) / double(a.n - 1) : 0.0;
  const bool on_cuda = s.backend->name().rfind("cuda", 0) == 0;
  std::vector<std::pair<std::string, double>> profile;
#ifdef ANVIL_HAVE_CUDA
  if (on_cuda && a.profile) {
    // Per-family decode time: a profiled run of n tokens minus a profiled prefill-only run.
    auto prof_of = [&](int n_tokens) {
      cuda_set_profiling(*s.backend, true);
      launches_of(n_tokens);
      auto r = cuda_profile_report(*s.backend);
      cuda_set_profiling(*s.backend, false);
      return r;
    };
    auto p1 = prof_of(1), pn = prof_of(a.n);
    for (auto& [fam, ms] : pn) {
      double pre = 0;
      for (auto& [f1, m1] : p1)
        if (f1 == fam) pre = m1;
      profile.emplace_back(fam, (ms - pre) / double(a.n - 1));
    }
    std::sort(profile.begin(), profile.end(), [](auto& x, auto& y) { return x.second > y.second; });
  }
#endif
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
  double ceiling = 0;
  double device_used_mib = 0;
#ifdef ANVIL_HAVE_CUDA
  if (on_cuda) {
    auto bw = cuda_copy_bandwidth_gbs(*s.backend, size_t(2) << 30);  // copy rate: bytes read + written
    if (!bw.is_ok()) return fail(bw.status().message());
    ceiling = *bw;
    size_t fr = 0, tot = 0;
    if (cuda_memory_info(0, &fr, &tot).is_ok()) device_used_mib = double(tot - fr) / (1 << 20);
  }
#endif
  if (!on_cuda) ceiling = measure_read_bandwidth_gbs(pool, size_t(1) << 30);
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
    j["kernels_per_token"] = kernels_per_token;
    j["peak_rss_mib"] = peak_mib;
    if (on_cuda) j["device_memory_used_mib"] = device_used_mib;
    for (auto& [fam, ms] : profile) j["profile_ms_per_token"][fam] = ms;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model              %s\n", s.model->source.c_str());
    std::printf("device             %s\n", s.backend->name().c_str());
    std::printf("prefill            %.1f tok/s (pp%d)\n", best_prefill, a.prompt);
    std::printf("decode             %.2f tok/s (tg%d, best of %d)\n", best_decode, a.n, a.runs);
    std::printf("bytes per token    %.1f MB (weights %.1f MB + KV %.1f MB)\n", bytes_per_token / 1e6,
                weight_bytes / 1e6, (bytes_per_token - weight_bytes) / 1e6);
    std::printf("achieved           %.1f GB/s of %.1f GB/s measured %s bandwidth (%.0f%%)\n", gbs, ceiling,
                on_cuda ? "device copy" : "read", 100.0 * gbs / ceiling);
    std::printf("ops per token      %d backend ops", ops_per_token);
    if (kernels_per_token > 0) std::printf(", %.1f kernels", kernels_per_token);
    std::printf("\n");
    std::printf("peak memory        %.0f MiB RSS", peak_mib);
    if (on_cuda) std::printf(", %.0f MiB device memory in use", device_used_mib);
    std::printf("\n");
    if (!profile.empty()) {
      double total = 0;
      for (auto& [fam, ms] : profile) total += ms;
      std::printf("decode profile     per token, by kernel family (events around each op, graphs off):\n");
      for (auto& [fam, ms] : profile)
        std::printf("  %-14s %8.3f ms  %5.1f%%\n", fam.c_str(), ms, total > 0 ? 100.0 * ms / total : 0.0);
    }
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
              app.add_flag("--profile", a->profile, "CUDA: print the share of decode time per kernel family");
              return [a] { return run_bench(*a); };
            });

}  // namespace
}  // namespace anvil::cli
