// Backend::sample_rows on the CPU: the reference of the on-device sampler, and a model of the CUDA
// kernel (src/backend/cuda/sample_rows.cu) step by step, so the algorithm the GPU runs is checked
// against the host Sampler wherever the tests run. The Sampler sorts; a GPU block cannot sort 152k
// logits per token cheaply, so both device samplers select by radix descent instead:
//   1. apply the row's count updates; logit bias, suppression, penalty, temperature (NaN -> -inf),
//      row max m;
//   2. compact the candidates: tokens with logit - m >= kMinRelLogit (every token with a nonzero
//      fixed-point weight; the rest can change no decision, see base/sample_math.h);
//   3. top-k: the k-th largest value by a 4-pass radix select on order_key over the candidates
//      (when they number more than k; otherwise every token >= the k-th survives anyway);
//   4. top-p: the last kept token is the first, in descending (value, id) order, whose cumulative
//      fixed-point weight reaches the rule; a radix descent over 64-bit keys (value key, id) finds it;
//   5. min-p: weight < min_p removed;
//   6. the draw: the first token, in the Sampler's draw order (descending (value, id) after top-p,
//      ascending id otherwise), whose cumulative weight exceeds floor(u * total): another descent.
// Removing a token sets its weight to 0: zero-weight tokens are invisible to every later step.
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "base/sample_math.h"

namespace anvil::cpu {
namespace {

using sampling::order_key;

struct Cand {
  float v;
  int32_t id;
  uint64_t q;  // fixed-point weight; 0 = removed
};

// The key of the descending (value, id) order: ties in value put the higher id first.
uint64_t value_id_key(const Cand& c) { return (uint64_t(order_key(c.v)) << 32) | uint32_t(c.id); }
// The key of the ascending id order (as a descending key).
uint64_t id_key(const Cand& c) { return uint64_t(0xffffffffu - uint32_t(c.id)); }

// The largest key (in `bits` bits) at which pred(weight of the tokens with key >= it) first holds,
// over tokens of nonzero weight(c), by 8-bit radix descent (sampling::pick_bin). Same passes as the
// CUDA kernel's block version.
template <class KeyFn, class WFn, class Pred>
uint64_t descend(const std::vector<Cand>& c, int bits, KeyFn key, WFn weight, Pred pred) {
  uint64_t prefix = 0, above = 0;
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    uint64_t bins[256] = {};
    const uint64_t hi_mask = shift + 8 >= 64 ? 0 : ~uint64_t(0) << (shift + 8);
    for (const Cand& e : c) {
      const uint64_t k = key(e);
      if ((k & hi_mask) == prefix) bins[(k >> shift) & 255] += weight(e);
    }
    const int b = sampling::pick_bin(bins, &above, pred);
    prefix |= uint64_t(b < 0 ? 0 : b) << shift;
  }
  return prefix;
}

int32_t sample_row(float* l, int64_t V, const SampleRowParams& p, const int32_t* suppress, int n_suppress,
                   const int32_t* counts, const int32_t* bias_ids, const float* bias_values, int n_bias) {
  // 1. The logit bias first, as the Sampler adds it (one float addition per id).
  for (int j = 0; j < n_bias; ++j)
    if (bias_ids[j] >= 0 && bias_ids[j] < V) l[bias_ids[j]] += bias_values[j];
  // Suppression, then the penalty and (below) the temperature: the Sampler penalizes before it
  // suppresses, but -inf stays -inf under both, and the CUDA kernel fuses the rest into one pass.
  for (int j = 0; j < n_suppress; ++j)
    if (suppress[j] >= 0 && suppress[j] < V) l[suppress[j]] = -INFINITY;
  if (counts && p.repetition_penalty != 1.0f)
    for (int64_t i = 0; i < V; ++i)
      if (counts[i] > 0) l[i] = l[i] < 0.0f ? l[i] * p.repetition_penalty : l[i] / p.repetition_penalty;
  if (p.temperature == 0.0f) {  // greedy: the first maximum, NaN never
    int32_t best = -1;
    float bv = -INFINITY;
    for (int64_t i = 0; i < V; ++i)
      if (l[i] > bv) bv = l[i], best = int32_t(i);
    return best;
  }
  float m = -INFINITY;
  for (int64_t i = 0; i < V; ++i) {
    float v = p.temperature != 1.0f ? l[i] / p.temperature : l[i];
    if (std::isnan(v)) v = -INFINITY;
    l[i] = v;
    m = std::max(m, v);
  }
  if (m == -INFINITY) return -1;
  if (m == INFINITY) {  // +inf logits share all the mass
    for (int64_t i = 0; i < V; ++i) l[i] = l[i] == INFINITY ? 0.0f : -INFINITY;
    m = 0.0f;
  }
  // 2. Candidates.
  std::vector<Cand> c;
  for (int64_t i = 0; i < V; ++i) {
    const float d = l[i] - m;
    if (d >= sampling::kMinRelLogit)
      c.push_back({l[i], int32_t(i), sampling::weight_fixed(sampling::det_exp(double(d)))});
  }
  // 3. top-k: the k-th largest value, counting ties.
  if (p.top_k > 0 && p.top_k < V && int64_t(c.size()) > p.top_k) {
    const uint64_t k = uint64_t(p.top_k);
    const uint32_t kth = uint32_t(descend(
        c, 32, [](const Cand& e) { return uint64_t(order_key(e.v)); }, [](const Cand&) { return uint64_t(1); },
        [k](uint64_t n) { return n >= k; }));
    for (Cand& e : c)
      if (order_key(e.v) < kth) e.q = 0;
  }
  // 4. top-p.
  const bool top_p = p.top_p < 1.0f;
  if (top_p) {
    uint64_t total = 0;
    for (const Cand& e : c) total += e.q;
    const float thr = sampling::top_p_threshold(p.top_p);
    const uint64_t last = descend(
        c, 64, value_id_key, [](const Cand& e) { return e.q; },
        [total, thr](uint64_t mass) { return sampling::top_p_reached(total, mass, thr); });
    for (Cand& e : c)
      if (value_id_key(e) < last) e.q = 0;
  }
  // 5. min-p.
  if (p.min_p > 0.0f)
    for (Cand& e : c)
      if (sampling::det_exp(double(e.v - m)) < double(p.min_p)) e.q = 0;
  // 6. The draw.
  uint64_t total = 0;
  for (const Cand& e : c) total += e.q;
  if (total == 0) return -1;
  const uint64_t target = sampling::draw_target(p.random, total);
  auto exceeds = [target](uint64_t mass) { return mass > target; };
  auto weight = [](const Cand& e) { return e.q; };
  if (top_p) return int32_t(uint32_t(descend(c, 64, value_id_key, weight, exceeds)));
  return int32_t(0xffffffffu - uint32_t(descend(c, 32, id_key, weight, exceeds)));
}

}  // namespace

void sample_rows(const Act& logits, const SampleArgs& a, int32_t* ids) {
  const int64_t V = logits.cols;
  for (int64_t r = 0; r < logits.rows; ++r) {
    const SampleRowParams& p = a.params[r];
    if (p.flags & kSampleRowSkip) {  // sampled on the host: logits and counts stay as they are
      ids[r] = -1;
      continue;
    }
    const int n_suppress = (p.flags & kSampleRowNoSuppress) ? 0 : a.n_suppress;
    int32_t* counts = p.count_row >= 0 && a.counts ? a.counts + int64_t(p.count_row) * V : nullptr;
    if (counts && a.update_offsets)
      for (int32_t u = a.update_offsets[r]; u < a.update_offsets[r + 1]; ++u) {
        const int32_t e = a.updates[u], id = (e > 0 ? e : -e) - 1;
        if (e != 0 && id < V) counts[id] += e > 0 ? 1 : -1;
      }
    const int32_t b0 = a.bias_offsets ? a.bias_offsets[r] : 0, b1 = a.bias_offsets ? a.bias_offsets[r + 1] : 0;
    ids[r] = sample_row(static_cast<float*>(logits.data) + r * V, V, p, a.suppress, n_suppress, counts,
                        a.bias_ids + b0, a.bias_values + b0, b1 - b0);
  }
}

}  // namespace anvil::cpu
