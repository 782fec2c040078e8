#include "cli/common.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "base/mmap_file.h"
#include "base/thread_pool.h"
#ifdef ANVIL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace anvil::cli {

void add_model_options(CLI::App& app, ModelOptions& o, bool allow_synthetic) {
  app.add_option("-m,--model", o.model, "Model directory, or a Hugging Face repo id present in the local HF cache");
  if (allow_synthetic)
    app.add_option("--synthetic", o.synthetic,
                   "Build a random-weight model in memory instead: NAME[:QUANT], e.g. qwen3-0.6b:q4g64 "
                   "(shapes: tiny, qwen3-0.6b, qwen3-8b; QUANT: bf16, q4g64, q8g64, ...)");
  app.add_option("--device", o.device, "Where the model runs: auto (CUDA when a GPU is usable, else CPU), cpu or cuda")
      ->capture_default_str();
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

Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads) {
  if (device != "auto" && device != "cpu" && device != "cuda")
    return invalid_argument("--device must be auto, cpu or cuda, got '" + device + "'");
  std::string why_not_cuda;
  if (device != "cpu") {
#ifdef ANVIL_HAVE_CUDA
    auto cb = make_cuda_backend(0);
    if (cb.is_ok()) {
      if (device == "auto") std::fprintf(stderr, "[anvil] device auto: %s\n", (*cb)->name().c_str());
      return std::move(*cb);
    }
    if (device == "cuda") return cb.status();
    why_not_cuda = cb.status().message();
#else
    why_not_cuda = "this anvil was built without the CUDA backend (ANVIL_CUDA=OFF or no nvcc at build time)";
    if (device == "cuda") return unsupported("--device cuda: " + why_not_cuda);
#endif
  }
  auto cpu = make_cpu_backend(threads > 0 ? threads : ThreadPool::default_threads());
  if (device == "auto") std::fprintf(stderr, "[anvil] device auto: %s (%s)\n", cpu->name().c_str(), why_not_cuda.c_str());
  return cpu;
}

#ifdef ANVIL_HAVE_CUDA
// Refuses a model + context that cannot fit in the GPU's free memory before anything is uploaded,
// and says what context would fit: weights + KV pool (bf16, max_seqs sequences of --ctx tokens) +
// activations for --batch tokens + one dequantized layer matrix (prefill through cuBLAS) + a fixed
// 256 MiB margin (CUDA context, attention workspace).
static Status cuda_memory_preflight(const LoadedModel& m, const ModelOptions& o, int max_seqs) {
  size_t free_b = 0, total_b = 0;
  ANVIL_RETURN_IF_ERROR(cuda_memory_info(0, &free_b, &total_b));
  const ModelConfig& c = m.config;
  const double weights = double(m.weights.total_bytes());
  const double kv_per_token = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2 * max_seqs;
  const int64_t pages = (int64_t(o.ctx) + o.page_size - 1) / o.page_size;
  const double kv = kv_per_token * double(pages * o.page_size);
  const double acts = double(o.batch) * (2.0 * (4.0 * c.hidden_size + 3.0 * c.num_attention_heads * c.head_dim +
                                               2.0 * c.intermediate_size) + 4.0 * c.vocab_size);
  const double margin = 256.0 * (1 << 20);
  const double deq = 2.0 * c.intermediate_size * c.hidden_size;  // prefill: one layer matrix as bf16 for cuBLAS
  const double need = weights + kv + acts + deq + margin;
  if (need <= double(free_b)) return Status::ok();
  auto gb = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
    return std::string(buf);
  };
  std::string msg = "the model does not fit in GPU memory: weights " + gb(weights) + " + KV cache " + gb(kv) + " (" +
                    std::to_string(o.ctx) + " tokens x " + std::to_string(max_seqs) + " sequences) + activations " +
                    gb(acts) + " + margin " + gb(margin) + " = " + gb(need) + ", but only " + gb(double(free_b)) +
                    " of " + gb(double(total_b)) + " is free";
  const double room = double(free_b) - weights - acts - deq - margin;
  const int64_t fit = room > 0 ? int64_t(room / kv_per_token) / o.page_size * o.page_size : 0;
  if (fit >= o.page_size) msg += "; a context of at most " + std::to_string(fit) + " tokens would fit (--ctx)";
  else msg += "; the weights alone do not fit (try a smaller quantization, or --device cpu)";
  return Status(StatusCode::kOutOfMemory, msg);
}
#endif

Result<Stack> build_stack(const ModelOptions& o, int max_seqs) {
  if (o.model.empty() == o.synthetic.empty())
    return invalid_argument("give exactly one of -m/--model DIR and --synthetic NAME[:QUANT]");
  Stack s;
  if (o.threads < 0) return invalid_argument("--threads must be >= 0");
  if (o.batch < 1) return invalid_argument("--batch must be >= 1");
  if (o.ctx < 1) return invalid_argument("--ctx must be >= 1");
  // The device first: a missing GPU is reported before a large model is read.
  ANVIL_ASSIGN_OR_RETURN(s.backend, make_backend(o.device, o.threads));
  if (!o.model.empty()) {
    ANVIL_ASSIGN_OR_RETURN(s.model, load_model(o.model));
  } else {
    ANVIL_ASSIGN_OR_RETURN(s.model, load_synthetic(o.synthetic));
  }
#ifdef ANVIL_HAVE_CUDA
  if (s.backend->name().rfind("cuda", 0) == 0) ANVIL_RETURN_IF_ERROR(cuda_memory_preflight(*s.model, o, max_seqs));
#endif
  UploadProgress progress;
  if (s.backend->name().rfind("cuda", 0) == 0) {
    progress = [last = -1](size_t done, size_t total) mutable {
      const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
      if (pct / 10 == last / 10 && done != total) return;
      last = pct;
      std::fprintf(stderr, "\r[anvil] uploading weights: %.2f / %.2f GB (%d%%)%s", double(done) / 1e9, double(total) / 1e9,
                   pct, done == total ? "\n" : "");
    };
  }
  ANVIL_ASSIGN_OR_RETURN(ModelWeights dw, upload_weights(s.model->weights, *s.backend, progress));
  ANVIL_ASSIGN_OR_RETURN(s.transformer, Transformer::create(s.model->config, dw, *s.backend, o.batch));
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
