// Next-token sampling with the logits processors of transformers' generate(), in its order, after
// OpenAI's logit_bias:
//   logit bias -> repetition penalty -> suppressed tokens and tokens outside the allowed mask (-inf)
//   -> [sampling only] temperature
//   -> top-k -> top-p -> min-p -> draw from the renormalized distribution with a seeded PRNG.
// temperature == 0 is greedy: argmax after the bias, the penalty and suppression (ties -> lowest
// id), as generate(do_sample=False) applies no warpers.
// The bias comes first, as in vLLM (its logit-bias processor runs before the penalties) and
// llama.cpp (logit-bias is the first sampler of its chain): logits[id] += bias, one float addition
// per listed id (the device samplers do the same addition, so the draw stays bit-identical). The
// server's presence/frequency penalties (OpenAI's, scheduler.cpp) are applied to the logits before
// the Sampler sees them, so before the bias.
//
// Semantics follow transformers exactly where it is deterministic:
//  - repetition penalty (RepetitionPenaltyLogitsProcessor): each distinct id in the history window
//    (ids outside [0, vocab) ignored) has its logit divided by the penalty when > 0, multiplied when < 0;
//  - top-k keeps every token whose logit >= the k-th largest (ties at the k-th value all survive);
//  - top-p sorts ascending, removes tokens whose ascending cumulative probability <= 1 - top_p, and
//    always keeps the most probable one. Among equal logits the lower id counts as "smaller" (removed
//    first): this is torch.sort's order for small vectors, where it is stable; for large ones
//    torch's order among ties is unspecified, ours stays deterministic;
//  - min-p removes tokens whose probability < min_p * the top probability.
// The draw: u = (mt19937_64() >> 11) * 2^-53 in [0, 1), inverse CDF over the surviving tokens in a
// fixed order. Weights and masses (top-p's and the draw's) use base/sample_math.h: a deterministic
// exp and 44-bit fixed-point weights summed as integers, so a seed gives the same tokens on every
// platform and on every backend's on-device sampler (Backend::sample_rows), bit for bit. Tokens
// whose weight is below 2^-44 of the top token's are never drawn (probabilities() still reports
// their exact share).
//
// Cost for vocab V: greedy is one pass (no sort). Sampling is O(V) passes plus a sort of only the
// candidates that top-p needs (top-k selected by a heap / nth_element, top-p sorted incrementally).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "base/status.h"

namespace anvil {

// One entry of OpenAI's logit_bias: `bias` added to token `id`'s logit.
struct LogitBias {
  int32_t id = 0;
  float bias = 0.0f;
  bool operator==(const LogitBias&) const = default;
};
// logit_bias bounds: OpenAI's range of a bias, and at most this many entries per request.
inline constexpr float kMaxLogitBias = 100.0f;
inline constexpr int kMaxLogitBiasEntries = 1024;

struct SamplingParams {
  float temperature = 0.0f;        // 0 = greedy
  int top_k = 0;                   // 0 = off
  float top_p = 1.0f;              // 1 = off
  float min_p = 0.0f;              // 0 = off
  float repetition_penalty = 1.0f; // HF semantics: logits of tokens already present: >0 divided, <0 multiplied
  int repetition_window = 0;       // the last N history tokens; 0 = whole history
  uint64_t seed = 0;
  // Added to the logits before everything else; ids ascending, each once (validate() checks).
  // Ids outside [0, vocab) are ignored here; the server and the CLI refuse them first.
  std::vector<LogitBias> logit_bias;
};

// temperature >= 0 (finite), top_k >= 0, top_p in (0, 1], min_p in [0, 1), repetition_penalty > 0
// (finite), repetition_window >= 0, logit_bias: at most kMaxLogitBiasEntries entries, ids >= 0
// strictly ascending, biases in [-kMaxLogitBias, kMaxLogitBias]. The message names the parameter
// and the accepted range.
Status validate(const SamplingParams& p);

// Applies the processors above to logits [vocab] in place; removed tokens become -inf (NaN logits
// are treated as -inf when sampling). For temperature == 0 only the bias, the penalty and
// suppression apply.
// `p` must pass validate().
void apply_logit_processors(const SamplingParams& p, float* logits, int vocab, std::span<const int32_t> history,
                            std::span<const int32_t> suppressed = {});

// What a caller reports when sample() returns -1. The filters (top-k, top-p, min-p) always keep a
// token, so it means no logit was finite: NaN or -inf from the model (a checkpoint with NaN/Inf
// weights, activations overflowing), or every token suppressed.
inline constexpr const char* kNoFiniteLogit =
    "sampling: no token has a finite logit (the model's output is NaN or -inf: check the checkpoint's weights "
    "for NaN/Inf values), or every token was suppressed";

class Sampler {
 public:
  // `params` must pass validate(); use create() to check.
  explicit Sampler(const SamplingParams& params);
  static Result<Sampler> create(const SamplingParams& params);

  // Picks the next token from logits [vocab] (modified in place by the processors). Returns -1 when
  // no token is possible (every logit -inf or NaN, e.g. all suppressed).
  int32_t sample(float* logits, int vocab, std::span<const int32_t> history);

  // The distribution sample() draws from, [vocab] (0 for removed tokens; one-hot for greedy).
  // Also modifies logits in place; does not advance the PRNG.
  std::vector<float> probabilities(float* logits, int vocab, std::span<const int32_t> history);

  // The next 53-bit random number of this sampler's stream (what sample() draws with); the device
  // sampler is handed it per step, so it draws exactly what this sampler would.
  uint64_t next_random53() { return rng_() >> 11; }
  const std::vector<int32_t>& suppressed() const { return suppressed_; }

  // Tokens that are never produced (e.g. EOS when ignoring it): their logits become -inf.
  void set_suppressed(std::vector<int32_t> ids) { suppressed_ = std::move(ids); }
  // Only the tokens of this bitset (bit id % 64 of word id / 64, at least vocab bits) are produced:
  // every other logit becomes -inf with the suppressed ones, so greedy and seeded draws pick from
  // the masked distribution exactly (JSON mode, runtime/json_mask.h). Not owned: it must stay valid
  // through the calls that use it; nullptr (the default) allows every token.
  void set_allowed(const uint64_t* bits) { allowed_ = bits; }
  const SamplingParams& params() const { return params_; }

 private:
  // Runs the processors; leaves the survivors in cand_ (in draw order) with weights w_ (unnormalized,
  // exp(logit - max)) and their fixed-point q_, and returns the sum of q_; 0 when no token survives.
  // Greedy: not used.
  uint64_t filter(float* logits, int vocab, std::span<const int32_t> history);
  // The bias, the repetition penalty and suppression: the processors greedy applies too.
  void penalize_and_suppress(float* logits, int vocab, std::span<const int32_t> history);
  int32_t argmax(const float* logits, int vocab) const;
  void select_top_k(const float* logits, int vocab);
  void apply_top_p(const float* logits, uint64_t total);

  SamplingParams params_;
  std::vector<int32_t> suppressed_;
  const uint64_t* allowed_ = nullptr;
  std::mt19937_64 rng_;
  // Scratch reused across calls (no allocation per token once sized).
  std::vector<uint32_t> seen_;  // [vocab] epoch stamps for distinct history ids
  uint32_t epoch_ = 0;
  std::vector<int32_t> cand_;
  std::vector<double> w_;
  std::vector<uint64_t> q_;
  std::vector<float> heap_;
  float max_logit_ = 0.0f;  // max processed logit of the current call (weights are exp(logit - max))

  friend void apply_logit_processors(const SamplingParams&, float*, int, std::span<const int32_t>,
                                     std::span<const int32_t>);
};

}  // namespace anvil
