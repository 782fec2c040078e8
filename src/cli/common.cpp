#include "cli/common.h"

#include <nlohmann/json.hpp>

#include "base/mmap_file.h"
#include "base/thread_pool.h"

namespace anvil::cli {

void add_model_options(CLI::App& app, ModelOptions& o, bool allow_synthetic) {
  app.add_option("-m,--model", o.model, "Model directory, or a Hugging Face repo id present in the local HF cache");
  if (allow_synthetic)
    app.add_option("--synthetic", o.synthetic,
                   "Build a random-weight model in memory instead: NAME[:QUANT], e.g. qwen3-0.6b:q4g64 "
                   "(shapes: tiny, qwen3-0.6b, qwen3-8b, tiny-moe, qwen3-30b-a3b, qwen3-30b-a3b-16L; QUANT: bf16, q4g64, q8g64, ...)");
  app.add_option("-t,--threads", o.threads, "CPU threads (default: all cores)");
  app.add_option("-c,--ctx", o.ctx, "Maximum context length in tokens")->capture_default_str();
  app.add_option("--batch", o.batch, "Maximum tokens per forward pass (prefill chunk)")->capture_default_str();
  app.add_option("--page-size", o.page_size, "KV cache page size in tokens")->capture_default_str();
  app.add_option("--kv-dtype", o.kv_dtype, "KV cache element type: bf16 or f32")->capture_default_str();
  app.add_flag("--no-prefix-cache", o.no_prefix_cache, "Do not reuse KV pages across sequences");
}

void add_sampling_options(CLI::App& app, SamplingOptions& o) {
  app.add_option("--temp", o.temp, "Sampling temperature; 0 = greedy (default: generation_config.json, else 0)");
  app.add_option("--top-k", o.top_k, "Keep the k most likely tokens (0 = off)");
  app.add_option("--top-p", o.top_p, "Nucleus sampling: keep the smallest set with this much probability");
  app.add_option("--min-p", o.min_p, "Drop tokens below min-p times the top probability");
  app.add_option("--repeat-penalty", o.repeat_penalty, "Repetition penalty (1 = off)");
  app.add_option("--seed", o.seed, "Random seed for sampling")->each([&](const std::string&) { o.seed_set = true; });
}

SamplingParams resolve_sampling(const SamplingOptions& o, const std::string& model_dir) {
  SamplingParams p;
  if (!model_dir.empty()) {
    auto text = read_file(model_dir + "/generation_config.json");
    if (text.is_ok()) {
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (j.is_object()) {
        bool do_sample = j.value("do_sample", true);
        if (do_sample && j.contains("temperature") && j["temperature"].is_number())
          p.temperature = j["temperature"].get<float>();
        if (j.contains("top_k") && j["top_k"].is_number_integer()) p.top_k = j["top_k"].get<int>();
        if (j.contains("top_p") && j["top_p"].is_number()) p.top_p = j["top_p"].get<float>();
        if (j.contains("min_p") && j["min_p"].is_number()) p.min_p = j["min_p"].get<float>();
        if (j.contains("repetition_penalty") && j["repetition_penalty"].is_number())
          p.repetition_penalty = j["repetition_penalty"].get<float>();
        if (!do_sample) p.temperature = 0;
      }
    }
  }
  if (o.temp >= 0) p.temperature = o.temp;
  if (o.top_k >= 0) p.top_k = o.top_k;
  if (o.top_p >= 0) p.top_p = o.top_p;
  if (o.min_p >= 0) p.min_p = o.min_p;
  if (o.repeat_penalty >= 0) p.repetition_penalty = o.repeat_penalty;
  p.seed = o.seed;
  return p;
}

Result<Stack> build_stack(const ModelOptions& o, int max_seqs) {
  if (o.model.empty() == o.synthetic.empty())
    return invalid_argument("give exactly one of -m/--model DIR and --synthetic NAME[:QUANT]");
  Stack s;
  if (!o.model.empty()) {
    ANVIL_ASSIGN_OR_RETURN(s.model, load_model(o.model));
  } else {
    ANVIL_ASSIGN_OR_RETURN(s.model, load_synthetic(o.synthetic));
  }
  if (o.threads < 0) return invalid_argument("--threads must be >= 0");
  if (o.batch < 1) return invalid_argument("--batch must be >= 1");
  if (o.ctx < 1) return invalid_argument("--ctx must be >= 1");
  s.backend = make_cpu_backend(o.threads > 0 ? o.threads : ThreadPool::default_threads());
  ANVIL_ASSIGN_OR_RETURN(ModelWeights dw, upload_weights(s.model->weights, *s.backend));
  Backend* run_on = s.backend.get();
  if (o.profile) {  // attribute time per category: linears by the weight they read
    s.profiler = std::make_unique<ProfilingBackend>(*s.backend);
    for (const LayerWeights& l : dw.layers) {
      for (const WeightMatrix* m : {&l.q, &l.k, &l.v, &l.o})
        s.profiler->set_linear_category(m->data, ProfileCategory::kAttention);
      if (!l.moe)
        for (const WeightMatrix* m : {&l.gate, &l.up, &l.down})
          s.profiler->set_linear_category(m->data, ProfileCategory::kDenseFfn);
    }
    run_on = s.profiler.get();
  }
  ANVIL_ASSIGN_OR_RETURN(s.transformer, Transformer::create(s.model->config, dw, *run_on, o.batch));
  EngineOptions eo;
  eo.page_size = o.page_size;
  eo.max_context = o.ctx;
  eo.max_seqs = max_seqs;
  eo.prefix_cache = !o.no_prefix_cache;
  if (o.kv_dtype == "bf16") eo.kv_dtype = DType::kBF16;
  else if (o.kv_dtype == "f32") eo.kv_dtype = DType::kF32;
  else return invalid_argument("--kv-dtype must be bf16 or f32, got '" + o.kv_dtype + "'");
  ANVIL_ASSIGN_OR_RETURN(s.engine, Engine::create(*s.transformer, s.model->fingerprint, eo));
  return s;
}

std::string tokenizer_dir_of(const Stack& s) {
  if (!s.model->dir.empty()) return s.model->dir;
  return default_tokenizer_dir();
}

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find_first_of(", ", i);
    if (j == std::string::npos) j = s.size();
    std::string tok = s.substr(i, j - i);
    if (!tok.empty()) {
      char* end = nullptr;
      long v = std::strtol(tok.c_str(), &end, 10);
      if (*end != 0 || v < 0 || v > INT32_MAX)
        return invalid_argument("--ids: '" + tok + "' is not a non-negative token id");
      ids.push_back(int32_t(v));
    }
    i = j + 1;
  }
  if (ids.empty()) return invalid_argument("--ids: no token ids given");
  return ids;
}

}  // namespace anvil::cli
