// What the model-running subcommands share: one flag vocabulary (-m/--model, --synthetic, -t, -c/--ctx,
// -p/--prompt, -f/--file, -n/--max-tokens, the sampling flags, --json) declared here once, and
// building the backend -> weights -> transformer -> engine stack from them.
//
// Adding a shared flag: put the field in the options struct it belongs to, declare it in the
// matching add_*_options(), and check it where the struct is consumed (build_stack /
// resolve_sampling / read_prompt). Every error message names the flag as the user types it and the
// valid range.
#pragma once
#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/profile_backend.h"
#include "model/loader.h"
#include "model/transformer.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace anvil::cli {

// The default context when --ctx is not given: this, or the model's max_position_embeddings when smaller.
inline constexpr int kDefaultContext = 4096;

// --batch's default per device (prefill chunk, tokens per forward). The CUDA prefill dequantizes
// each q4 matrix once per chunk for cuBLAS, so larger chunks amortize it: on the H200, qwen3-8b q4g64
// pp4096 ran at 5.8k tok/s in 256-token chunks and 9.7k in 2048-token chunks (docs/benchmarks.md).
inline constexpr int kCpuDefaultBatch = 256, kCudaDefaultBatch = 2048;
inline int default_batch(bool on_cuda, int max_seqs) {
  return std::max(on_cuda ? kCudaDefaultBatch : kCpuDefaultBatch, max_seqs);
}
// Rows of one forward that get logits (fp32 [rows, vocab] of scratch): one per sequence of a step,
// and at least 256 (--dump-logits' chunks), never more than --batch.
inline int logit_rows_for(int batch, int max_seqs) { return std::min(batch, std::max(max_seqs, 256)); }

// --page-size's range. Any size in it works with every kernel (they index pages by division, with no
// multiple required); above it a page only wastes memory (a context rounds up to whole pages, and the
// store's writer keeps --kv-queue pages of token ids).
inline constexpr int kMaxPageSize = 65536;

// Integer flags. add_int_option declares one bound to `out`: a value that is not a whole number in
// [lo, hi] ("abc", "1e3", "1.5", "2147483648" for an int) is refused while the command line is
// parsed, naming the flag, the value and what it takes: "-c/--ctx must be an integer in [1,
// 2147483647], got 'abc'"; `note` follows the range ("0 = all cores"). `on_value` runs after a
// value is stored (e.g. to note that the flag was given). For a default in --help, chain
// ->default_str(). Defined for int, int64_t and uint64_t.
template <class T>
CLI::Option* add_int_option(CLI::App& app, const std::string& names, T& out, const std::string& help, T lo, T hi,
                            const std::string& note = "", std::function<void()> on_value = nullptr);
// The message of a value outside [lo, hi] (or not an integer): "<flags> must be an integer in [lo, hi]
// (note), got 'value'", `flags` as declared ("-c,--ctx" reads "-c/--ctx").
std::string int_range_error(const std::string& flags, const std::string& lo, const std::string& hi,
                            const std::string& note, const std::string& value);

struct ModelOptions {
  std::string model;      // -m
  std::string revision;   // --revision: of a repo id -m names (empty: main)
  std::string synthetic;  // --synthetic NAME[:QUANT]
  std::string device = "auto";  // --device auto|cpu|cuda
  int threads = 0;        // 0 = all cores
  int ctx = 0;            // --ctx, when ctx_given; else kDefaultContext capped by the model
  bool ctx_given = false;
  // Set by a command that computes ctx itself from other flags (bench, bench-kv: the prompt and the
  // tokens it generates; size_context_for_run): how, "--prompt-tokens 60 + -n 10 = 70 tokens", and the
  // flags that lower it, "--prompt-tokens + -n". An error about the context then names these, not -c/--ctx.
  std::string ctx_computed, ctx_lowered_by;
  // The flag that sets build_stack's max_seqs, as errors about the KV cache name it (bench-kv: --seqs).
  std::string seqs_flag = "-np/--parallel";
  int batch = 0;          // max tokens per forward (prefill chunk); 0 = default_batch() for the device
  int page_size = 16;
  std::string kv_dtype = "bf16";
  bool no_prefix_cache = false;
  bool profile = false;   // anvil bench --profile: run through a ProfilingBackend (Stack::profiler)
};
void add_model_options(CLI::App& app, ModelOptions& o, bool allow_synthetic = true);
// For a command whose run needs `prompt` + `n` positions of context (bench, bench-kv): the context is
// that sum unless a larger -c/--ctx was given (a smaller one is raised to it, said on stderr), and
// when it is the sum, ctx_computed / ctx_lowered_by say so, so that build_stack's errors name
// --prompt-tokens + -n, the flags the user typed, instead of -c/--ctx.
void size_context_for_run(ModelOptions& o, int prompt, int n);
// --revision REV, for every command whose -m may name a Hugging Face repo id (format/hf_cache.h).
void add_revision_option(CLI::App& app, std::string& revision);

// The sampling flags, kept as the user typed them and parsed by resolve_sampling(), so a bad value
// ("-1", "nan", "abc") is refused with the flag's name and range instead of being read as "unset".
struct SamplingOptions {
  std::optional<std::string> temp, top_k, top_p, min_p, repeat_penalty, seed;
  // -l/--logit-bias (generate and run only: cli/logit_bias_option.h), checked as parsed, ascending ids.
  std::vector<LogitBias> logit_bias;
};
void add_sampling_options(CLI::App& app, SamplingOptions& o);
// Flags win; then DIR/generation_config.json (temperature/top_k/top_p/min_p/repetition_penalty,
// do_sample=false means greedy); else greedy. The logit bias is -l/--logit-bias's. The seed is
// --seed, or a random one when it is absent or -1 (report it: SamplingParams::seed reproduces the
// run). `model_dir` may be empty.
Result<SamplingParams> resolve_sampling(const SamplingOptions& o, const std::string& model_dir);

// What a flag that names an input file reads: FILE's bytes, or all of stdin for "-" (the Unix
// convention; a file named "-" is ./-). `flag` starts the error ("-f/--file x: No such file ...").
Result<std::string> read_input_file(const std::string& flag, const std::string& path);

// The prompt: -p TEXT, -p - or -f - (all of stdin), or -f FILE.
struct PromptOptions {
  std::optional<std::string> text, file;
};
void add_prompt_options(CLI::App& app, PromptOptions& o, const std::string& what);
// nullopt when no prompt was given; an error when both -p and -f are, when the file or stdin
// cannot be read, or when the prompt is empty.
// allow_empty: an empty text is a text (tokenize: no ids), not an error.
Result<std::optional<std::string>> read_prompt(const PromptOptions& o, bool allow_empty = false);

// User text (a prompt, a typed line, --system) as valid UTF-8: invalid bytes become U+FFFD, as the
// tokenizer would encode them anyway (Rust's from_utf8_lossy), and a line on stderr names `what`
// and the byte offset of the first one. The text is then what the model sees, what a session
// records and what the chat template renders. (The server instead refuses a body that is not
// UTF-8 with 400 invalid_utf8: JSON text must be UTF-8.)
std::string valid_utf8_input(std::string text, const std::string& what);

// The bytes of a KV cache of `seqs` sequences of `ctx` tokens at `per_token` bytes a token, or a
// clear error naming the flags as the user typed them (`ctx_flag`, `seqs_flag`) when that product
// does not fit in 64 bits: an absurd context or sequence count must never wrap around to a small
// figure or allocation.
Result<uint64_t> kv_cache_bytes(uint64_t per_token, int64_t ctx, int64_t seqs, const std::string& ctx_flag,
                                const std::string& seqs_flag);

struct Stack {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<ProfilingBackend> profiler;  // with ModelOptions::profile: wraps backend, feeds the model
  std::unique_ptr<Transformer> transformer;
  std::unique_ptr<Engine> engine;
  int ctx = 0;  // the context limit in force, in tokens (exact)
};
Result<Stack> build_stack(const ModelOptions& o, int max_seqs = 1);
// The backend --device asks for: cuda (an error when none is usable), cpu, or auto (CUDA when
// usable, else the CPU; the choice is printed to stderr).
Result<std::unique_ptr<Backend>> make_backend(const std::string& device, int threads);

// The model directory -m names (resolving a Hugging Face repo id); empty for --synthetic.
Result<std::string> model_dir_of(const ModelOptions& o);

// The tokenizer directory of a model: its own dir, or the Qwen3 tokenizer built into anvil for
// synthetic models.
std::string tokenizer_dir_of(const Stack& s);

// "1,2,3" -> ids.
Result<std::vector<int32_t>> parse_ids(const std::string& s);

// One line for stderr after an answer: "prompt 12 tokens (340.1 tok/s), generated 64 tokens
// (55.2 tok/s), finish: length, peak memory 131 MiB".
std::string generation_summary(const GenerateResult& r, const std::string& finish);

// Peak resident memory of this process so far, in MiB (getrusage ru_maxrss).
double peak_rss_mib();

}  // namespace anvil::cli
