#include "cli/common.h"

#include <sys/resource.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <type_traits>

#include "base/hash128.h"
#include "base/mmap_file.h"
#include "base/optional_file.h"
#include "base/thread_pool.h"
#include "format/hf_cache.h"
#include "tokenizer/byte_level.h"
#ifdef ANVIL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace anvil::cli {
namespace {

// Declares an option whose value is kept as typed (parsed later with a message naming `name`).
CLI::Option* add_text_option(CLI::App& app, const std::string& names, std::optional<std::string>& out,
                             const std::string& help, const std::string& type_name) {
  return app.add_option_function<std::string>(names, [&out](const std::string& v) { out = v; }, help)
      ->type_name(type_name);
}

// A sampling flag's value: a whole string that is a number (an integer when `integer`) for which
// `accepted` holds, else an error naming the flag, what it takes (`what`: "a number >= 0 (0 =
// greedy)") and the value, the same message whether the text is no number or one out of range.
Result<double> parse_sampling_value(const std::string& flag, const std::string& text, bool integer,
                                    const std::string& what, bool (*accepted)(double)) {
  char* end = nullptr;
  errno = 0;
  const double v = integer ? double(std::strtoll(text.c_str(), &end, 10)) : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != 0 || errno == ERANGE || !accepted(v))
    return invalid_argument(flag + " must be " + what + ", got '" + text + "'");
  return v;
}

// One sampling flag's value, checked: the number it gives (--seed: -1 for "a random one", else 0
// and the seed in *seed), or the error naming the flag, what it takes and the value. The same
// check runs as the command line is parsed (add_sampling_options: a bad value stops the command
// before a model is loaded, as docs/cli.md says of every numeric flag) and in resolve_sampling.
Result<double> sampling_flag_value(const std::string& flag, const std::string& text, uint64_t* seed = nullptr) {
  if (flag == "--temp")  // declared --temp,--temperature: named as both, as -c/--ctx and -n/--max-tokens are
    return parse_sampling_value("--temp/--temperature", text, false, "a number >= 0 (0 = greedy)",
                                [](double x) { return std::isfinite(x) && x >= 0; });
  if (flag == "--top-k")
    return parse_sampling_value(flag, text, true, "an integer in [0, 2147483647] (0 = off)",
                                [](double x) { return x >= 0 && x <= INT32_MAX; });
  if (flag == "--top-p")
    return parse_sampling_value(flag, text, false, "a number in (0, 1] (1 = off)",
                                [](double x) { return x > 0 && x <= 1; });
  if (flag == "--min-p")
    return parse_sampling_value(flag, text, false, "a number in [0, 1) (0 = off)",
                                [](double x) { return x >= 0 && x < 1; });
  if (flag == "--repeat-penalty")
    return parse_sampling_value(flag, text, false, "a number > 0 (1 = off)",
                                [](double x) { return std::isfinite(x) && x > 0; });
  // --seed
  if (text == "-1") return -1.0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || text[0] == '-' || text[0] == '+' || *end != 0 || errno == ERANGE)
    return invalid_argument("--seed must be an integer in [0, 18446744073709551615], or -1 for a random seed, got '" +
                            text + "'");
  if (seed) *seed = v;
  return 0.0;
}

// A sampling flag: kept as typed, after its value has passed sampling_flag_value.
CLI::Option* add_sampling_option(CLI::App& app, const std::string& names, std::optional<std::string>& out,
                                 const std::string& help, const std::string& type_name) {
  const std::string flag = names.substr(0, names.find(','));
  auto set = [&out, flag](const std::string& v) {
    // (A ValidationError of one argument is printed as it is: "anvil: error: <message> (see ...)".)
    if (auto r = sampling_flag_value(flag, v); !r.is_ok()) throw CLI::ValidationError(r.status().message());
    out = v;
  };
  return app.add_option_function<std::string>(names, set, help)->type_name(type_name);
}

// How build_stack's errors name the context in force: "-c/--ctx 8192 tokens", or, where the command
// computed it (ModelOptions::ctx_computed), "the context, --prompt-tokens 60 + -n 10 = 70 tokens,";
// and the flag(s) that lower it, "-c/--ctx" or "--prompt-tokens + -n" (`short_name`: "--ctx", as a
// list of flags to lower names it).
std::string context_described(const ModelOptions& o, int64_t ctx) {
  return o.ctx_computed.empty() ? "-c/--ctx " + std::to_string(ctx) + " tokens" : "the context, " + o.ctx_computed + ",";
}
std::string context_flag(const ModelOptions& o, bool short_name = false) {
  return !o.ctx_computed.empty() ? o.ctx_lowered_by : short_name ? "--ctx" : "-c/--ctx";
}

uint64_t random_seed() {
  std::random_device rd;
  // 53 bits, so the seed --json reports survives any JSON parser (doubles) exactly.
  return ((uint64_t(rd()) << 32) ^ uint64_t(rd())) & ((uint64_t(1) << 53) - 1);
}

}  // namespace

std::string int_range_error(const std::string& flags, const std::string& lo, const std::string& hi,
                            const std::string& note, const std::string& value) {
  std::string names = flags;
  std::replace(names.begin(), names.end(), ',', '/');
  return names + " must be an integer in [" + lo + ", " + hi + "]" + (note.empty() ? "" : " (" + note + ")") +
         ", got '" + value + "'";
}

template <class T>
CLI::Option* add_int_option(CLI::App& app, const std::string& names, T& out, const std::string& help, T lo, T hi,
                            const std::string& note, std::function<void()> on_value) {
  auto set = [&out, names, lo, hi, note, on_value](const std::string& v) {
    // Digits with an optional sign, nothing else (strtoll alone takes " 12", "0x1f" in base 0, ...).
    bool ok = !v.empty() && v.size() <= 40;
    for (size_t i = 0; ok && i < v.size(); ++i)
      ok = std::isdigit(static_cast<unsigned char>(v[i])) || (i == 0 && (v[0] == '-' || v[0] == '+') && v.size() > 1);
    T value{};
    if (ok) {
      errno = 0;
      if constexpr (std::is_signed_v<T>) {
        const long long x = std::strtoll(v.c_str(), nullptr, 10);
        ok = errno != ERANGE && x >= (long long)lo && x <= (long long)hi;
        value = T(x);
      } else {
        const unsigned long long x = std::strtoull(v.c_str(), nullptr, 10);
        ok = v[0] != '-' && errno != ERANGE && x >= (unsigned long long)lo && x <= (unsigned long long)hi;
        value = T(x);
      }
    }
    // (A ValidationError of one argument is printed as it is: "anvil: error: <message> (see ...)".)
    if (!ok) throw CLI::ValidationError(int_range_error(names, std::to_string(lo), std::to_string(hi), note, v));
    out = value;
    if (on_value) on_value();
  };
  return app.add_option_function<std::string>(names, set, help)->type_name(std::is_signed_v<T> ? "INT" : "UINT");
}
template CLI::Option* add_int_option<int>(CLI::App&, const std::string&, int&, const std::string&, int, int,
                                          const std::string&, std::function<void()>);
template CLI::Option* add_int_option<int64_t>(CLI::App&, const std::string&, int64_t&, const std::string&, int64_t,
                                              int64_t, const std::string&, std::function<void()>);
template CLI::Option* add_int_option<uint64_t>(CLI::App&, const std::string&, uint64_t&, const std::string&, uint64_t,
                                               uint64_t, const std::string&, std::function<void()>);

void add_model_options(CLI::App& app, ModelOptions& o, bool allow_synthetic) {
  app.add_option("-m,--model", o.model, "Model directory, or a Hugging Face repo id present in the local HF cache");
  add_revision_option(app, o.revision);
  if (allow_synthetic)
    app.add_option("--synthetic", o.synthetic,
                   "Build a random-weight model in memory instead: NAME[:QUANT], e.g. qwen3-0.6b:q4g64 "
                   "(shapes: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-8b, gqa-2kv, tiny-moe, qwen3-30b-a3b, qwen3-30b-a3b-16L; QUANT: bf16, q4g64, q8g64, ...)");
  app.add_option("--device", o.device, "Where the model runs: auto (CUDA when a GPU is usable, else CPU), cpu or cuda")
      ->capture_default_str();
  add_int_option(app, "-t,--threads", o.threads, "CPU threads, 0 to 4096 (default: all cores)", 0, 4096, "0 = all cores");
  add_int_option(app, "-c,--ctx", o.ctx,
                 "Maximum context length in tokens, prompt and output together, >= 1 (default: 4096, or the "
                 "model's max_position_embeddings when smaller)",
                 1, INT32_MAX, "", [&o] { o.ctx_given = true; });
  add_int_option(app, "--batch", o.batch,
                 "Maximum tokens per forward pass (prefill chunk); default " + std::to_string(kCudaDefaultBatch) +
                     " on CUDA, " + std::to_string(kCpuDefaultBatch) + " on the CPU (0: that default)",
                 0, INT32_MAX, "0 = the device's default");
  add_int_option(app, "--page-size", o.page_size,
                 "KV cache page size in tokens, 1 to " + std::to_string(kMaxPageSize), 1, kMaxPageSize)
      ->default_str(std::to_string(o.page_size));
  app.add_option("--kv-dtype", o.kv_dtype, "KV cache element type: bf16 or f32")->capture_default_str();
  app.add_flag("--no-prefix-cache", o.no_prefix_cache, "Do not reuse KV pages across sequences");
}

void size_context_for_run(ModelOptions& o, int prompt, int n) {
  const int needed = prompt + n;  // (each at most 2^24: no overflow)
  if (!o.ctx_given || o.ctx < needed) {
    if (o.ctx_given)  // said, not silent: the run needs the room
      std::fprintf(stderr, "[anvil] --ctx %d is below --prompt-tokens + -n = %d; using %d\n", o.ctx, needed, needed);
    o.ctx = needed;
    o.ctx_given = true;  // build_stack keeps it: the default context (4096) may be smaller
  }
  // The context is the run's own size unless a larger -c/--ctx was given: an error about it (a KV
  // cache too large) then names the flags that set it, not -c/--ctx.
  if (o.ctx == needed) {
    o.ctx_computed = "--prompt-tokens " + std::to_string(prompt) + " + -n " + std::to_string(n) + " = " +
                     std::to_string(needed) + " tokens";
    o.ctx_lowered_by = "--prompt-tokens + -n";
  }
}

void add_revision_option(CLI::App& app, std::string& revision) {
  app.add_option("--revision", revision,
                 "With -m REPO_ID: the revision to use from the local HF cache: a branch or tag name (as in the "
                 "cache's refs/), or a commit hash, whole or its first 4+ digits (default: main)")
      ->type_name("REV");
}

void add_sampling_options(CLI::App& app, SamplingOptions& o) {
  add_sampling_option(app, "--temp,--temperature", o.temp,
                      "Sampling temperature >= 0; 0 = greedy (default: generation_config.json, else 0)", "FLOAT");
  add_sampling_option(app, "--top-k", o.top_k, "Keep the k most likely tokens, k >= 0 (0 = off)", "INT");
  add_sampling_option(app, "--top-p", o.top_p,
                      "Nucleus sampling, in (0, 1]: keep the smallest set with this much probability (1 = off)",
                      "FLOAT");
  add_sampling_option(app, "--min-p", o.min_p,
                      "Drop tokens below min-p times the top probability, in [0, 1) (0 = off)", "FLOAT");
  add_sampling_option(app, "--repeat-penalty", o.repeat_penalty, "Repetition penalty > 0 (1 = off)", "FLOAT");
  add_sampling_option(app, "--seed", o.seed,
                      "Random seed for sampling, 0 to 2^64-1 (default or -1: a random seed, which generate --json "
                      "reports)",
                      "INT");
}

Result<SamplingParams> resolve_sampling(const SamplingOptions& o, const std::string& model_dir) {
  SamplingParams p;
  if (!model_dir.empty()) {
    // Absent: no defaults from it. There but unreadable or not a JSON object: an error naming it
    // (load_model_config reads it too, for the stop ids).
    const std::string gen_path = model_dir + "/generation_config.json";
    ANVIL_ASSIGN_OR_RETURN(std::optional<std::string> text, read_optional_file(gen_path));
    if (text) {
      auto j = nlohmann::json::parse(*text, nullptr, false);
      if (j.is_discarded()) return invalid_argument(gen_path + ": not valid JSON");
      if (!j.is_object()) return invalid_argument(gen_path + ": expected a JSON object at the top level");
      bool do_sample = true;
      if (j.contains("do_sample") && !j["do_sample"].is_null()) {
        if (!j["do_sample"].is_boolean())
          return invalid_argument(gen_path + ": do_sample must be true or false, got " + j["do_sample"].dump());
        do_sample = j["do_sample"].get<bool>();
      }
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
  if (o.temp) {
    ANVIL_ASSIGN_OR_RETURN(double v, sampling_flag_value("--temp", *o.temp));
    p.temperature = float(v);
  }
  if (o.top_k) {
    ANVIL_ASSIGN_OR_RETURN(double v, sampling_flag_value("--top-k", *o.top_k));
    p.top_k = int(v);
  }
  if (o.top_p) {
    ANVIL_ASSIGN_OR_RETURN(double v, sampling_flag_value("--top-p", *o.top_p));
    p.top_p = float(v);
  }
  if (o.min_p) {
    ANVIL_ASSIGN_OR_RETURN(double v, sampling_flag_value("--min-p", *o.min_p));
    p.min_p = float(v);
  }
  if (o.repeat_penalty) {
    ANVIL_ASSIGN_OR_RETURN(double v, sampling_flag_value("--repeat-penalty", *o.repeat_penalty));
    p.repetition_penalty = float(v);
  }
  p.seed = random_seed();
  if (o.seed) ANVIL_RETURN_IF_ERROR(sampling_flag_value("--seed", *o.seed, &p.seed).status());  // -1 keeps it
  p.logit_bias = o.logit_bias;
  // generation_config.json values the sampler cannot take are the checkpoint's problem: say where.
  Status st = validate(p);
  if (!st.is_ok()) return invalid_argument(st.message() + " (from " + model_dir + "/generation_config.json)");
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
static Status cuda_memory_preflight(const LoadedModel& m, const ModelOptions& o, int batch, int ctx, int max_seqs) {
  size_t free_b = 0, total_b = 0;
  ANVIL_RETURN_IF_ERROR(cuda_memory_info(0, &free_b, &total_b));
  const ModelConfig& c = m.config;
  const double weights = double(m.weights.total_bytes());
  const double kv_per_token = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 2 * max_seqs;
  const int64_t pages = (int64_t(ctx) + o.page_size - 1) / o.page_size;
  const double kv = kv_per_token * double(pages * o.page_size);
  const double acts = double(batch) * 2.0 * (4.0 * c.hidden_size + 3.0 * c.num_attention_heads * c.head_dim +
                                             2.0 * c.intermediate_size) +
                      double(logit_rows_for(batch, max_seqs)) * 4.0 * c.vocab_size;
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
                    std::to_string(ctx) + " tokens x " + std::to_string(max_seqs) + " sequences) + activations " +
                    gb(acts) + " + margin " + gb(margin) + " = " + gb(need) + ", but only " + gb(double(free_b)) +
                    " of " + gb(double(total_b)) + " is free";
  const double room = double(free_b) - weights - acts - deq - margin;
  const int64_t fit = room > 0 ? int64_t(room / kv_per_token) / o.page_size * o.page_size : 0;
  if (fit >= o.page_size)
    msg += "; a context of at most " + std::to_string(fit) + " tokens would fit (" + context_flag(o, true) + ")";
  else msg += "; the weights alone do not fit (try a smaller quantization, or --device cpu)";
  return Status(StatusCode::kOutOfMemory, msg);
}
#endif

void add_prompt_options(CLI::App& app, PromptOptions& o, const std::string& what) {
  add_text_option(app, "-p,--prompt", o.text, what + "; '-' reads it from stdin", "TEXT");
  add_text_option(app, "-f,--file", o.file, "Read the -p text from this file instead ('-': stdin)", "FILE");
}

Result<std::string> read_input_file(const std::string& flag, const std::string& path) {
  if (path == "-") {
    std::string text(std::istreambuf_iterator<char>(std::cin), {});
    if (std::cin.bad()) return io_error(flag + " -: cannot read stdin");
    return text;
  }
  auto got = read_file(path);  // (a directory: "Is a directory", not an exception)
  if (!got.is_ok()) return io_error(flag + " " + got.status().message());
  return got;
}

Result<std::optional<std::string>> read_prompt(const PromptOptions& o, bool allow_empty) {
  if (o.text && o.file) return invalid_argument("give the prompt once: -p/--prompt TEXT or -f/--file FILE, not both");
  std::string text;
  if (o.file) {
    ANVIL_ASSIGN_OR_RETURN(text, read_input_file("-f/--file", *o.file));
    if (text.empty() && !allow_empty)
      return invalid_argument(*o.file == "-" ? "-f -: stdin was empty, so the prompt is empty"
                                             : "-f/--file " + *o.file + ": the file is empty, so the prompt is empty");
  } else if (o.text && *o.text == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    if (text.empty() && !allow_empty) return invalid_argument("-p -: stdin was empty, so the prompt is empty");
  } else if (o.text) {
    if (o.text->empty() && !allow_empty) return invalid_argument("-p/--prompt: the prompt is empty");
    text = *o.text;
  } else {
    return std::optional<std::string>();
  }
  return std::optional<std::string>(std::move(text));
}

std::string valid_utf8_input(std::string text, const std::string& what) {
  if (tok::is_valid_utf8(text)) return text;
  size_t at = 0;
  for (uint32_t cp; at < text.size();) {
    const size_t n = tok::utf8_decode_one(text, at, &cp);
    if (n == 0) break;
    at += n;
  }
  std::fprintf(stderr, "[anvil] %s is not valid UTF-8 (the first invalid byte, 0x%02X, is at byte offset %zu): "
                       "invalid bytes are replaced by U+FFFD\n", what.c_str(), unsigned(uint8_t(text[at])), at);
  return tok::utf8_lossy(text);
}

Result<std::string> model_dir_of(const ModelOptions& o) {
  if (o.model.empty()) return std::string();
  return resolve_model_path(o.model, o.revision);
}

Result<uint64_t> kv_cache_bytes(uint64_t per_token, int64_t ctx, int64_t seqs, const std::string& ctx_flag,
                                const std::string& seqs_flag) {
  uint64_t tokens = 0, bytes = 0;
  if (ctx >= 0 && seqs >= 0 && !__builtin_mul_overflow(uint64_t(ctx), uint64_t(seqs), &tokens) &&
      !__builtin_mul_overflow(tokens, per_token, &bytes))
    return bytes;
  char exact[64];
  std::snprintf(exact, sizeof exact, "%.3Le", (long double)per_token * ctx * seqs);
  return invalid_argument("the KV cache for a context of " + std::to_string(ctx) + " tokens (" + ctx_flag + ") x " +
                          std::to_string(seqs) + " sequence(s) (" + seqs_flag + ") at " + std::to_string(per_token) +
                          " bytes per token would be " + exact +
                          " bytes, more than 64-bit memory can address: lower " + ctx_flag + " or " + seqs_flag);
}

Result<Stack> build_stack(const ModelOptions& o, int max_seqs) {
  if (o.model.empty() == o.synthetic.empty())
    return invalid_argument("give exactly one of -m/--model DIR and --synthetic NAME[:QUANT]");
  if (!o.revision.empty() && o.model.empty())
    return invalid_argument("--revision selects a revision of the repo id -m names; --synthetic has none");
  if (o.threads < 0 || o.threads > 4096)
    return invalid_argument(int_range_error("-t,--threads", "0", "4096", "0 = all cores", std::to_string(o.threads)));
  if (const unsigned cores = std::thread::hardware_concurrency(); cores > 0 && o.threads > int(cores))
    std::fprintf(stderr, "[anvil] warning: --threads %d is more than this machine's %u cores: the threads share them "
                         "and wait on each other (slower)\n", o.threads, cores);
  if (o.batch < 0)
    return invalid_argument(int_range_error("--batch", "0", std::to_string(INT32_MAX), "0 = the device's default",
                                            std::to_string(o.batch)));
  if (o.ctx_given && o.ctx < 1)
    return invalid_argument(int_range_error("-c,--ctx", "1", std::to_string(INT32_MAX), "", std::to_string(o.ctx)));
  if (o.page_size < 1 || o.page_size > kMaxPageSize)
    return invalid_argument(
        int_range_error("--page-size", "1", std::to_string(kMaxPageSize), "", std::to_string(o.page_size)));
  EngineOptions eo;
  if (o.kv_dtype == "bf16") eo.kv_dtype = DType::kBF16;
  else if (o.kv_dtype == "f32") eo.kv_dtype = DType::kF32;
  else return invalid_argument("--kv-dtype must be bf16 or f32, got '" + o.kv_dtype + "'");
  Stack s;
  // The device first: a missing GPU is reported before a large model is read.
  ANVIL_ASSIGN_OR_RETURN(s.backend, make_backend(o.device, o.threads));
  if (!o.model.empty()) {
    ANVIL_ASSIGN_OR_RETURN(s.model, load_model(o.model, o.revision));
  } else {
    ANVIL_ASSIGN_OR_RETURN(s.model, load_synthetic(o.synthetic));
  }
  // auto must pick a device that can run this model: a backend without MoE kernels gives way to the
  // CPU for MoE models; an explicit --device is left to Transformer::create's error.
  if (o.device == "auto" && s.model->config.is_moe() && !s.backend->has_moe_ffn()) {
    std::fprintf(stderr, "[anvil] device auto: the %s backend has no MoE kernels; using the CPU for this MoE model\n",
                 s.backend->name().c_str());
    ANVIL_ASSIGN_OR_RETURN(s.backend, make_backend("cpu", o.threads));
  }
  if (o.device == "auto") {
    const ModelConfig& c = s.model->config;
    if (const std::string why =
            s.backend->attention_unsupported(c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rotary_dim);
        !why.empty()) {
      std::fprintf(stderr, "[anvil] device auto: the %s backend cannot run this model's attention (%s); using the CPU\n",
                   s.backend->name().c_str(), why.c_str());
      ANVIL_ASSIGN_OR_RETURN(s.backend, make_backend("cpu", o.threads));
    }
  }
  const int max_pos = s.model->config.max_position_embeddings;  // 0: the config does not say
  s.ctx = o.ctx;
  if (!o.ctx_given) {
    s.ctx = max_pos > 0 ? std::min(kDefaultContext, max_pos) : kDefaultContext;
  } else if (max_pos > 0 && s.ctx > max_pos) {
    const std::string what = o.ctx_computed.empty() ? "--ctx " + std::to_string(s.ctx) : "the context, " + o.ctx_computed + ",";
    std::fprintf(stderr,
                 "anvil: warning: %s is above the model's max_position_embeddings (%d): positions past %d "
                 "were never trained and the output may degrade\n",
                 what.c_str(), max_pos, max_pos);
  }
  if (RopeScaling& rs = s.model->config.rope_scaling; rs.type == "longrope") {
    // LongRoPE's long factors for a context past the one the model was first trained at, for every
    // position (llama.cpp's rule; transformers switches when a forward's sequence passes it, mlx-lm
    // always takes the long ones), else the short ones, which transformers uses for any sequence up
    // to that length. The choice changes every K: it is part of the pages' identity.
    rs.longrope_long = s.ctx > rs.original_max_position_embeddings;
    if (rs.longrope_long) {
      Hasher128 h;
      static constexpr char kTag[] = "anvil.longrope.long_factors";
      h.update(s.model->fingerprint);
      h.update(kTag, sizeof kTag);
      s.model->fingerprint = h.digest();
    }
  }
  {
    // The KV pool holds max_seqs sequences of the context rounded up to whole pages; an absurd
    // --ctx x -np is refused here, before anything is allocated from it.
    const ModelConfig& c = s.model->config;
    const uint64_t per_token = uint64_t(2) * uint64_t(c.num_hidden_layers) * uint64_t(c.num_key_value_heads) *
                               uint64_t(c.head_dim) * dtype_size(eo.kv_dtype);
    const int64_t pages = (int64_t(s.ctx) + o.page_size - 1) / o.page_size;
    auto kv = kv_cache_bytes(per_token, s.ctx, max_seqs, context_flag(o), o.seqs_flag);
    if (kv.is_ok()) kv = kv_cache_bytes(per_token, pages * o.page_size, max_seqs, context_flag(o), o.seqs_flag);
    if (!kv.is_ok()) return kv.status();
  }
  const bool on_cuda = s.backend->name().rfind("cuda", 0) == 0;
  // No forward pass holds more tokens than every sequence's whole context: a larger --batch (or
  // default) is lowered to that, as llama.cpp lowers n_batch to n_ctx, instead of allocating
  // activations for rows no step can fill (--batch 100000000 failed to allocate 143 GiB).
  const int batch = int(std::min<int64_t>(o.batch > 0 ? o.batch : default_batch(on_cuda, max_seqs),
                                          int64_t(s.ctx) * max_seqs));
#ifdef ANVIL_HAVE_CUDA
  if (on_cuda) ANVIL_RETURN_IF_ERROR(cuda_memory_preflight(*s.model, o, batch, s.ctx, max_seqs));
#endif
  UploadProgress progress;
  if (on_cuda) {
    progress = [last = -1](size_t done, size_t total) mutable {
      const int pct = total ? int(100.0 * double(done) / double(total)) : 100;
      if (pct / 10 == last / 10 && done != total) return;
      last = pct;
      std::fprintf(stderr, "\r[anvil] uploading weights: %.2f / %.2f GB (%d%%)%s", double(done) / 1e9, double(total) / 1e9,
                   pct, done == total ? "\n" : "");
    };
  }
  ANVIL_ASSIGN_OR_RETURN(ModelWeights dw, upload_weights(s.model->weights, *s.backend, progress));
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
  auto transformer = Transformer::create(s.model->config, dw, *run_on, batch, logit_rows_for(batch, max_seqs));
  if (!transformer.is_ok() && transformer.status().code() == StatusCode::kOutOfMemory)  // scratch sized by the batch
    return Status(transformer.status().code(), "the activations for --batch " + std::to_string(batch) +
                                                   " tokens per forward pass: " + transformer.status().message() +
                                                   " (lower --batch or " + context_flag(o, true) + ")");
  if (!transformer.is_ok()) return transformer.status();
  s.transformer = std::move(transformer).value();
  eo.page_size = o.page_size;
  eo.max_context = s.ctx;
  eo.max_seqs = max_seqs;
  eo.prefix_cache = !o.no_prefix_cache;
  auto engine = Engine::create(*s.transformer, s.model->fingerprint, eo);
  if (!engine.is_ok() && engine.status().code() == StatusCode::kOutOfMemory)  // the KV pool, sized by the flags
    return Status(engine.status().code(),
                  "the KV cache for " + context_described(o, s.ctx) + " x " + std::to_string(max_seqs) +
                      " sequence(s), in pages of --page-size " + std::to_string(o.page_size) + " tokens: " +
                      engine.status().message() + " (lower " + context_flag(o, true) +
                      (max_seqs > 1 ? ", " + o.seqs_flag : "") + " or --page-size)");
  if (!engine.is_ok()) return engine.status();
  s.engine = std::move(engine).value();
  return s;
}

std::string tokenizer_dir_of(const Stack& s) {
  if (!s.model->dir.empty()) return s.model->dir;
  return default_tokenizer_dir();
}

Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  // Ids separated by commas and/or spaces ("1,2,3", "1 2 3", "1, 2"); an empty field between two
  // commas, or a comma at either end, is a typo, not nothing.
  {
    std::string fields = s;
    for (char& c : fields)
      if (c == ' ' || c == '\t') c = ' ';
    size_t a = fields.find_first_not_of(' '), b = fields.find_last_not_of(' ');
    if (a != std::string::npos && (fields[a] == ',' || fields[b] == ','))
      return invalid_argument("--ids: a comma with no id on one side in '" + s + "'");
    for (size_t k = 0, last_comma = std::string::npos; k < fields.size(); ++k) {
      if (fields[k] == ',') {
        if (last_comma != std::string::npos && fields.find_first_not_of(' ', last_comma + 1) == k)
          return invalid_argument("--ids: an empty id between two commas in '" + s + "'");
        last_comma = k;
      }
    }
  }
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find_first_of(", \t", i);
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

std::string generation_summary(const GenerateResult& r, const std::string& finish) {
  const double prefill_tps = r.prefill_s > 0 ? (r.prompt_done - r.reused_tokens) / r.prefill_s : 0;
  const double decode_tps = r.decode_s > 0 && r.ids.size() > 1 ? (r.ids.size() - 1) / r.decode_s : 0;
  // A prefill stopped midway (Ctrl-C during a long prompt) says how far it got.
  const std::string prompt = r.prompt_done < r.prompt_tokens ? std::to_string(r.prompt_done) + " of " +
                                                                   std::to_string(r.prompt_tokens) + " prompt tokens"
                                                             : "prompt " + std::to_string(r.prompt_tokens) + " tokens";
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (%.1f tok/s), generated %zu tokens (%.1f tok/s), finish: %s, peak memory %.0f MiB",
                prompt.c_str(), prefill_tps, r.ids.size(), decode_tps, finish.c_str(), peak_rss_mib());
  return buf;
}

double peak_rss_mib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;
}

}  // namespace anvil::cli
