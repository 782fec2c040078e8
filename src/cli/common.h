// What the model-running subcommands share: the -m/--synthetic options, and building the
// backend -> weights -> transformer -> engine stack from them.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/profile_backend.h"
#include "model/loader.h"
#include "model/transformer.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace anvil::cli {

struct ModelOptions {
  std::string model;      // -m
  std::string synthetic;  // --synthetic NAME[:QUANT]
  int threads = 0;        // 0 = all cores
  int ctx = 4096;
  int batch = 256;        // max tokens per forward (prefill chunk)
  int page_size = 16;
  std::string kv_dtype = "bf16";
  bool no_prefix_cache = false;
  bool profile = false;   // anvil bench --profile: run through a ProfilingBackend (Stack::profiler)
};
void add_model_options(CLI::App& app, ModelOptions& o, bool allow_synthetic = true);

struct SamplingOptions {
  float temp = -1, top_p = -1, min_p = -1, repeat_penalty = -1;
  int top_k = -1;
  uint64_t seed = 0;
  bool seed_set = false;
};
void add_sampling_options(CLI::App& app, SamplingOptions& o);
// Flags win; then generation_config.json (temperature/top_k/top_p/min_p/repetition_penalty,
// do_sample=false means greedy); else greedy.
SamplingParams resolve_sampling(const SamplingOptions& o, const std::string& model_dir);

struct Stack {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ProfilingBackend> profiler;  // with ModelOptions::profile: wraps backend, feeds the model
  std::unique_ptr<Transformer> transformer;
  std::unique_ptr<Engine> engine;
};
Result<Stack> build_stack(const ModelOptions& o, int max_seqs = 1);

// The tokenizer directory of a model: its own dir, or the shipped Qwen3 tokenizer for synthetic models.
std::string tokenizer_dir_of(const Stack& s);

// "1,2,3" -> ids.
Result<std::vector<int32_t>> parse_ids(const std::string& s);

}  // namespace anvil::cli
