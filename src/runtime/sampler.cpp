#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "base/sample_math.h"

namespace anvil {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Top-k at or below this size keeps a min-heap of k values (one compare per logit); above it, an
// nth_element over a copy.
constexpr int kHeapTopK = 256;
// Top-p sorts the candidates in chunks of growing size: usually the kept mass is reached within the
// first few hundred tokens of a 152k vocabulary, so a full sort is rarely needed.
constexpr size_t kTopPFirstChunk = 256;
}  // namespace

Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    return invalid_argument("sampling parameter 'temperature': expected a finite value >= 0 (0 = greedy), got " +
                            std::to_string(p.temperature));
  if (p.top_k < 0)
    return invalid_argument("sampling parameter 'top_k': expected >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    return invalid_argument("sampling parameter 'top_p': expected a value in (0, 1] (1 = off), got " +
                            std::to_string(p.top_p));
  if (!(p.min_p >= 0.0f && p.min_p < 1.0f))
    return invalid_argument("sampling parameter 'min_p': expected a value in [0, 1) (0 = off), got " +
                            std::to_string(p.min_p));
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    return invalid_argument("sampling parameter 'repetition_penalty': expected a finite value > 0 (1 = off), got " +
                            std::to_string(p.repetition_penalty));
  if (p.repetition_window < 0)
    return invalid_argument("sampling parameter 'repetition_window': expected >= 0 (0 = whole history), got " +
                            std::to_string(p.repetition_window));
  if (p.logit_bias.size() > size_t(kMaxLogitBiasEntries))
    return invalid_argument("sampling parameter 'logit_bias': at most " + std::to_string(kMaxLogitBiasEntries) +
                            " entries, got " + std::to_string(p.logit_bias.size()));
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const LogitBias& b = p.logit_bias[i];
    if (b.id < 0 || (i > 0 && b.id <= p.logit_bias[i - 1].id))
      return invalid_argument("sampling parameter 'logit_bias': token ids must be >= 0, each once, in ascending "
                              "order; got " + std::to_string(b.id) + " at entry " + std::to_string(i));
    if (!(b.bias >= -kMaxLogitBias && b.bias <= kMaxLogitBias))
      return invalid_argument("sampling parameter 'logit_bias': the bias of token " + std::to_string(b.id) +
                              " must be in [-100, 100], got " + std::to_string(b.bias));
  }
  return Status::ok();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

Result<Sampler> Sampler::create(const SamplingParams& params) {
  ANVIL_RETURN_IF_ERROR(validate(params));
  return Sampler(params);
}

void Sampler::penalize_and_suppress(float* logits, int vocab, std::span<const int32_t> history) {
  for (const LogitBias& b : params_.logit_bias)
    if (b.id < vocab) logits[b.id] += b.bias;
  const float penalty = params_.repetition_penalty;
  if (penalty != 1.0f && !history.empty()) {
    if (seen_.size() < size_t(vocab)) seen_.assign(size_t(vocab), 0u);
    if (++epoch_ == 0) {  // the stamps wrapped: clear them once
      std::fill(seen_.begin(), seen_.end(), 0u);
      epoch_ = 1;
    }
    const size_t window = size_t(params_.repetition_window);
    const size_t start = window > 0 && history.size() > window ? history.size() - window : 0;
    for (size_t i = start; i < history.size(); ++i) {
      const int32_t t = history[i];
      if (t < 0 || t >= vocab || seen_[size_t(t)] == epoch_) continue;  // each distinct id once
      seen_[size_t(t)] = epoch_;
      const float v = logits[t];
      logits[t] = v < 0.0f ? v * penalty : v / penalty;
    }
  }
  for (int32_t id : suppressed_)
    if (id >= 0 && id < vocab) logits[id] = kNegInf;
  if (allowed_)
    for (int i = 0; i < vocab; ++i)
      if (!((allowed_[size_t(i) / 64] >> (i % 64)) & 1)) logits[i] = kNegInf;
}

int32_t Sampler::argmax(const float* logits, int vocab) const {
  int32_t best = -1;
  float best_v = kNegInf;
  for (int i = 0; i < vocab; ++i)
    if (logits[i] > best_v) {  // strict: ties keep the lowest id; NaN never wins
      best_v = logits[i];
      best = i;
    }
  return best;
}

void Sampler::select_top_k(const float* logits, int vocab) {
  const int k = params_.top_k;
  float kth;
  if (k <= kHeapTopK) {
    heap_.assign(logits, logits + k);
    std::make_heap(heap_.begin(), heap_.end(), std::greater<float>());  // front = smallest of the top k
    for (int i = k; i < vocab; ++i) {
      if (logits[i] > heap_.front()) {
        std::pop_heap(heap_.begin(), heap_.end(), std::greater<float>());
        heap_.back() = logits[i];
        std::push_heap(heap_.begin(), heap_.end(), std::greater<float>());
      }
    }
    kth = heap_.front();
  } else {
    heap_.assign(logits, logits + vocab);
    std::nth_element(heap_.begin(), heap_.begin() + (k - 1), heap_.end(), std::greater<float>());
    kth = heap_[size_t(k - 1)];
  }
  // Every token tied with the k-th value survives (transformers: scores < kth are removed).
  cand_.clear();
  for (int i = 0; i < vocab; ++i)
    if (logits[i] >= kth && logits[i] != kNegInf) cand_.push_back(i);
}

void Sampler::apply_top_p(const float* logits, uint64_t total) {
  // Descending by logit; among ties the higher id first, so that the lower id sits lower in
  // transformers' ascending order and is removed first.
  auto before = [logits](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a > b); };
  const float max_logit = max_logit_;
  const float threshold = sampling::top_p_threshold(params_.top_p);
  const size_t n = cand_.size();
  size_t sorted = 0, keep = n, chunk = std::min(n, kTopPFirstChunk);
  uint64_t above = 0;  // fixed-point mass of the tokens before position j in descending order
  while (true) {
    if (chunk < n) {
      std::nth_element(cand_.begin() + sorted, cand_.begin() + chunk, cand_.end(), before);
      std::sort(cand_.begin() + sorted, cand_.begin() + chunk, before);
    } else {
      std::sort(cand_.begin() + sorted, cand_.end(), before);
    }
    for (size_t j = sorted; j < chunk; ++j) {
      // Ascending cumulative probability of token j = mass of token j and everything below it.
      if (j > 0 && sampling::top_p_reached(total, above, threshold)) {
        keep = j;
        break;
      }
      above += sampling::weight_fixed(sampling::det_exp(double(logits[cand_[j]] - max_logit)));
    }
    if (keep != n || chunk == n) break;
    sorted = chunk;
    chunk = std::min(n, chunk * 8);
  }
  cand_.resize(keep);
}

uint64_t Sampler::filter(float* logits, int vocab, std::span<const int32_t> history) {
  penalize_and_suppress(logits, vocab, history);
  const float temperature = params_.temperature;
  float m = kNegInf;
  for (int i = 0; i < vocab; ++i) {
    float v = temperature != 1.0f ? logits[i] / temperature : logits[i];
    if (std::isnan(v)) v = kNegInf;
    logits[i] = v;
    m = std::max(m, v);
  }
  cand_.clear();
  w_.clear();
  q_.clear();
  if (m == kNegInf) return 0;
  if (std::isinf(m)) {  // +inf logits: they share all the mass equally
    for (int i = 0; i < vocab; ++i) logits[i] = std::isinf(logits[i]) && logits[i] > 0 ? 0.0f : kNegInf;
    m = 0.0f;
  }
  max_logit_ = m;

  if (params_.top_k > 0 && params_.top_k < vocab) {
    select_top_k(logits, vocab);
  } else {
    for (int i = 0; i < vocab; ++i)
      if (logits[i] != kNegInf) cand_.push_back(i);
  }
  if (params_.top_p < 1.0f) {
    uint64_t total = 0;  // exact: integer weights, any summation order gives the same total
    for (int32_t c : cand_) total += sampling::weight_fixed(sampling::det_exp(double(logits[c] - m)));
    apply_top_p(logits, total);
  }
  // The most probable token survives top-k and top-p, so its weight is exp(0) = 1 and min-p's
  // "p < min_p * p_max" is "weight < min_p", independent of the normalization.
  const double min_p = params_.min_p;
  size_t kept = 0;
  uint64_t total = 0;
  w_.resize(cand_.size());
  q_.resize(cand_.size());
  for (size_t j = 0; j < cand_.size(); ++j) {
    const double w = sampling::det_exp(double(logits[cand_[j]] - m));
    if (min_p > 0.0 && w < min_p) continue;
    cand_[kept] = cand_[j];
    w_[kept] = w;
    q_[kept] = sampling::weight_fixed(w);
    total += q_[kept];
    ++kept;
  }
  cand_.resize(kept);
  w_.resize(kept);
  q_.resize(kept);
  return total;
}

int32_t Sampler::sample(float* logits, int vocab, std::span<const int32_t> history) {
  if (params_.temperature == 0.0f) {
    penalize_and_suppress(logits, vocab, history);
    return argmax(logits, vocab);
  }
  const uint64_t total = filter(logits, vocab, history);
  if (cand_.empty() || total == 0) return -1;
  // 53 random bits; the target is floor(u * total) in integers, identical on every platform.
  const uint64_t target = sampling::draw_target(next_random53(), total);
  uint64_t acc = 0;
  for (size_t j = 0; j < cand_.size(); ++j) {
    acc += q_[j];
    if (acc > target) return cand_[j];
  }
  return -1;  // unreachable: target < total
}

std::vector<float> Sampler::probabilities(float* logits, int vocab, std::span<const int32_t> history) {
  std::vector<float> probs(size_t(vocab), 0.0f);
  if (params_.temperature == 0.0f) {
    penalize_and_suppress(logits, vocab, history);
    const int32_t a = argmax(logits, vocab);
    if (a >= 0) probs[size_t(a)] = 1.0f;
    return probs;
  }
  if (filter(logits, vocab, history) == 0) return probs;
  double total = 0.0;
  for (double w : w_) total += w;
  for (size_t j = 0; j < cand_.size(); ++j) probs[size_t(cand_[j])] = float(w_[j] / total);
  return probs;
}

void apply_logit_processors(const SamplingParams& p, float* logits, int vocab, std::span<const int32_t> history,
                            std::span<const int32_t> suppressed) {
  Sampler s(p);
  s.set_suppressed(std::vector<int32_t>(suppressed.begin(), suppressed.end()));
  if (p.temperature == 0.0f) {
    s.penalize_and_suppress(logits, vocab, history);
    return;
  }
  s.filter(logits, vocab, history);
  std::vector<uint8_t> keep(size_t(vocab), 0);
  for (int32_t c : s.cand_) keep[size_t(c)] = 1;
  for (int i = 0; i < vocab; ++i)
    if (!keep[size_t(i)]) logits[i] = kNegInf;
}

}  // namespace anvil
