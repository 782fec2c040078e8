// anvil synth: write a random-weight checkpoint (MLX layout) for a benchmark shape.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/command.h"
#include "cli/common.h"
#include "model/loader.h"
#include "model/synth.h"

namespace anvil::cli {
namespace {

struct SynthArgs {
  std::string shape, quant = "q4g64", out, tokenizer;
  uint64_t seed = 0;
  bool force = false;
  bool config_only = false;
};

int run_synth(const SynthArgs& a) {
  auto shape = synth_shape(a.shape);
  if (!shape.is_ok()) return fail(shape.status().message());
  auto q = parse_synth_quant(a.quant);
  if (!q.is_ok()) return fail(q.status().message());
  if (Status st = synth_check(*shape, *q); !st.is_ok()) return fail("--quant " + st.message());
  {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (a.out.empty()) return fail("--out: an empty directory name");
    if (fs::exists(a.out, ec) && !fs::is_directory(a.out, ec))
      return fail("--out " + a.out + ": exists and is not a directory");
    if (fs::is_directory(a.out, ec) && !fs::is_empty(a.out, ec) && !a.force)
      return fail("--out " + a.out + ": the directory is not empty (it would be overwritten): choose another, or "
                  "pass --force");
  }
  std::string tok = a.tokenizer.empty() ? default_tokenizer_dir() : a.tokenizer;
  if (!a.tokenizer.empty())  // checked before anything is written
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (!std::filesystem::exists(a.tokenizer + "/" + f))
        return fail("--tokenizer " + a.tokenizer + ": no " + f + " there");
  if (tok.empty())
    std::fprintf(stderr, "anvil: warning: the Qwen3 tokenizer files were not found; writing no tokenizer "
                         "(pass --tokenizer DIR)\n");
  if (a.config_only) {
    Status st = synth_write_config(synth_config_json(*shape, *q), a.out, tok);
    if (!st.is_ok()) return fail(st.message());
    std::printf("wrote %s (%s, %s): config and tokenizer only, no weights\n", a.out.c_str(), a.shape.c_str(),
                q->name().c_str());
    return 0;
  }
  auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "[anvil] building %s %s ...\n", a.shape.c_str(), q->name().c_str());
  auto m = synth_build(*shape, *q, a.seed);
  if (!m.is_ok()) return fail(m.status().message());
  std::fprintf(stderr, "[anvil] writing %.2f GiB to %s ...\n", (*m)->total_bytes() / double(1 << 30), a.out.c_str());
  Status st = synth_write(**m, a.out, tok);
  if (!st.is_ok()) return fail(st.message());
  std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  std::printf("wrote %s (%s, %s) in %.1f s\n", a.out.c_str(), a.shape.c_str(), q->name().c_str(), dt.count());
  return 0;
}

Command reg("synth", "Write a random-weight checkpoint for a benchmark shape (no download needed)", 60,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<SynthArgs>();
              app.add_option("--shape", a->shape, "Shape: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-8b, gqa-2kv (dense); tiny-moe, qwen3-30b-a3b, qwen3-30b-a3b-16L (qwen3_moe)")->required();
              app.add_option("--quant", a->quant, "bf16, q4g64, q8g64, or any qBgG (B in 2,3,4,5,6,8; G in 32,64,128)")
                  ->capture_default_str();
              app.add_option("--out", a->out, "Output directory (new or empty)")->required();
              app.add_flag("--force", a->force, "Write into --out even when it is not empty (overwriting files)");
              app.add_flag("--config-only", a->config_only,
                           "Write config.json, generation_config.json and the tokenizer, no weights (for tools "
                           "that generate the weights themselves, e.g. scripts/bench_llamacpp_moe.sh)");
              add_int_option(app, "--seed", a->seed, "Random seed, 0 to 2^64-1", uint64_t(0), UINT64_MAX)
                  ->default_str(std::to_string(a->seed));
              app.add_option("--tokenizer", a->tokenizer, "Directory with tokenizer.json/tokenizer_config.json to copy "
                                                          "(default: the Qwen3 tokenizer shipped with anvil)");
              return [a] { return run_synth(*a); };
            });

}  // namespace
}  // namespace anvil::cli
