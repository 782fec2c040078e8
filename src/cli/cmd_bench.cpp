// anvil bench: the standard decode/prefill benchmark (the protocol is docs/bench-protocol.md).
//   prompt: N synthetic ids (seed 0, uniform over the vocabulary), no template; generate M tokens
//   greedy with EOS suppressed; one warm-up run, then the best of R timed runs in one process.
#include <algorithm>
#include <cmath>
#include <chrono>
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
  bool json = false;
  bool profile = false;
};

// --profile: one more generation through the ProfilingBackend, counting only the decode steps (the
// totals are reset when the first token, the one prefill produced, arrives). Every op is synchronized
// and timed, so the per-token sum is a little above the plain decode time.
struct DecodeProfile {
  ProfileTotals totals;
  int steps = 0;
  double wall_s = 0;
};
Result<DecodeProfile> profile_decode(Stack& s, const GenerateRequest& req) {
  ANVIL_ASSIGN_OR_RETURN(int seq, s.engine->seq_create());
  DecodeProfile p;
  int seen = 0;
  std::chrono::steady_clock::time_point t0;
  auto r = generate(*s.engine, seq, req, [&](int32_t) {
    if (seen++ == 0) {
      s.profiler->reset();
      t0 = std::chrono::steady_clock::now();
    }
    return true;
  });
  s.engine->seq_release(seq);
  if (!r.is_ok()) return r.status();
  p.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  p.totals = s.profiler->totals();
  p.steps = int(r->ids.size()) - 1;
  return p;
}

int run_bench(BenchArgs& a) {
  // (The flags' ranges are checked as the command line is parsed: add_int_option.)
  a.model.no_prefix_cache = true;  // every run must prefill for real
  a.model.profile = a.profile;
  size_context_for_run(a.model, a.prompt, a.n);  // prompt + n, or a larger -c/--ctx
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
  // Bytes per decoded token: all weights once plus the KV cache read by attention, averaged over
  // the decode (context grows from prompt to prompt + n).
  const size_t kv_elem = a.model.kv_dtype == "f32" ? 4 : 2;
  const double kv_per_pos = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * kv_elem;
  // With a sliding window W, attention reads at most the last W positions.
  double kv_positions = 0;
  for (int i = 0; i < a.n; ++i) {
    const double ctx = double(a.prompt) + i + 0.5;
    kv_positions += c.sliding_window > 0 ? std::min(ctx, double(c.sliding_window)) : ctx;
  }
  const double avg_ctx = a.n > 0 ? kv_positions / a.n : double(a.prompt);
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
  // Backend ops per decoded token, as the profiled run counts them (every op the forward pass calls,
  // fused ones once). Without --profile, the count of the unfused op list instead, said as such:
  // embed; per layer norm, q, k, v, rope+append, attention, o, norm and then gate, up, swiglu, down
  // (dense) or one moe_ffn (MoE), + 2 q/k rmsnorms for olmoe; final add, norm, lm_head, copy-out.
  int ops_per_token = 1 + 4;
  for (int l = 0; l < c.num_hidden_layers; ++l) ops_per_token += 8 + (c.is_moe_layer(l) ? 1 : 4) + (c.qk_norm_full ? 2 : 0);
  bool ops_counted = false;
  DecodeProfile prof;
  if (a.profile) {
    auto p = profile_decode(s, req);
    if (!p.is_ok()) return fail(p.status().message());
    prof = *p;
    int64_t ops = 0;
    for (int k = 0; k < int(ProfileCategory::kCount); ++k) ops += prof.totals.ops[k];
    if (prof.steps > 0) ops_per_token = int(std::lround(double(ops) / prof.steps)), ops_counted = true;
  }
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
    j["ops_per_token_counted"] = ops_counted;  // false: the unfused op list's count (no --profile)
    j["kernels_per_token"] = kernels_per_token;
    j["peak_rss_mib"] = peak_mib;
    if (on_cuda) j["device_memory_used_mib"] = device_used_mib;
    if (a.profile) {
      nlohmann::ordered_json pj;
      pj["decode_steps"] = prof.steps;
      pj["ms_per_token"] = 1e3 * prof.wall_s / std::max(1, prof.steps);
      for (int c = 0; c < int(ProfileCategory::kCount); ++c)
        pj[profile_category_name(ProfileCategory(c))] = {
            {"ms_per_token", 1e3 * prof.totals.seconds[c] / std::max(1, prof.steps)},
            {"ops_per_token", double(prof.totals.ops[c]) / std::max(1, prof.steps)}};
      pj["moe_skip_experts"] = moe_skip_experts();
      j["profile"] = pj;
    }
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
    std::printf("ops per token      %d backend ops%s", ops_per_token,
                ops_counted ? "" : " (unfused op list; --profile counts them)");
    if (kernels_per_token > 0) std::printf(", %.1f kernels", kernels_per_token);
    std::printf("\n");
    std::printf("peak memory        %.0f MiB RSS", peak_mib);
    if (on_cuda) std::printf(", %.0f MiB device memory in use", device_used_mib);
    std::printf("\n");
    if (a.profile) {
      double sum = 0;
      int64_t ops = 0;
      for (int c = 0; c < int(ProfileCategory::kCount); ++c) sum += prof.totals.seconds[c], ops += prof.totals.ops[c];
      const int n = std::max(1, prof.steps);
      std::printf("decode profile     %d steps, %.2f ms/token wall (ops synchronized and timed one by one)%s\n",
                  prof.steps, 1e3 * prof.wall_s / n,
                  moe_skip_experts() ? "; ANVIL_MOE_SKIP_EXPERTS=1: routed experts skipped" : "");
      for (int c = 0; c < int(ProfileCategory::kCount); ++c)
        std::printf("  %-16s %8.3f ms/token  %5.1f%%  %6.1f ops/token\n", profile_category_name(ProfileCategory(c)),
                    1e3 * prof.totals.seconds[c] / n, sum > 0 ? 100.0 * prof.totals.seconds[c] / sum : 0.0,
                    double(prof.totals.ops[c]) / n);
      std::printf("  %-16s %8.3f ms/token          %6.1f ops/token\n", "total", 1e3 * sum / n, double(ops) / n);
    }
  }
  return 0;
}

Command reg("bench", "Benchmark prefill and decode speed (protocol: docs/bench-protocol.md)", 50,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<BenchArgs>();
              add_model_options(app, a->model);
              add_int_option(app, "--prompt-tokens", a->prompt, "Prompt length in tokens (random ids), 1 to 2^24", 1,
                             1 << 24)
                  ->default_str(std::to_string(a->prompt));
              add_int_option(app, "--prompt", a->prompt, "", 1, 1 << 24)->group("");  // the old spelling, hidden
              add_int_option(app, "-n,--max-tokens", a->n, "Tokens to generate, 2 to 2^24", 2, 1 << 24)
                  ->default_str(std::to_string(a->n));
              add_int_option(app, "--runs", a->runs, "Timed runs (the best is reported) after one warm-up, >= 1", 1,
                             INT32_MAX)
                  ->default_str(std::to_string(a->runs));
              app.add_flag("--json", a->json, "Print JSON");
              app.add_flag("--profile", a->profile,
                           "After the timed runs, one more run with every backend op timed: decode time per token "
                           "split into routing, expert FFN, attention, dense FFN and the rest, with ops per token "
                           "(ANVIL_MOE_SKIP_EXPERTS=1 skips the routed experts, for attribution)");
              return [a] { return run_bench(*a); };
            });

}  // namespace
}  // namespace anvil::cli
