// Backend::sample_rows on the CPU (the reference of the on-device sampler and a model of the CUDA
// kernel's radix-descent algorithm) against the host Sampler: the same token id, exactly, for many
// parameter combinations, seeds, logit distributions (ties, NaN, +inf, all suppressed) and
// penalty windows maintained through count updates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/backend.h"
#include "base/sample_math.h"
#include "runtime/sampler.h"

namespace anvil::test {
namespace {

struct Combo {
  float t;
  int k;
  float top_p, min_p, pen;
  int window;
};

std::vector<Combo> combos() {
  std::vector<Combo> out;
  for (float t : {0.0f, 0.6f, 1.0f, 1.7f})
    for (int k : {0, 1, 7, 60})
      for (float top_p : {1.0f, 0.9f, 0.3f, 1e-9f})
        for (float min_p : {0.0f, 0.05f})
          out.push_back({t, k, top_p, min_p, (k + int(t * 10)) % 3 == 0 ? 1.0f : 1.3f, k % 2 ? 4 : 0});
  return out;
}

// Logits of one row: kind 0 normal, 1 heavy ties (values on a coarse grid), 2 peaked with NaN and
// -inf, 3 +inf entries, 4 everything suppressed or -inf.
std::vector<float> make_row(int V, int kind, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 2.5f);
  std::vector<float> l(static_cast<size_t>(V));
  for (auto& x : l) x = nd(rng);
  if (kind == 1)
    for (auto& x : l) x = std::round(x * 2.0f) / 2.0f;
  if (kind == 2) {
    for (int i = 0; i < 20; ++i) l[size_t(rng() % V)] += 12.0f;
    l[size_t(rng() % V)] = NAN;
    l[size_t(rng() % V)] = -INFINITY;
    l[3] = -0.0f, l[4] = 0.0f;
  }
  if (kind == 3) l[size_t(rng() % V)] = INFINITY, l[size_t(rng() % V)] = INFINITY;
  if (kind == 4)
    for (int i = 0; i < V; ++i) l[size_t(i)] = i < 3 ? 5.0f : -INFINITY;
  return l;
}

TEST(SampleRows, EqualsHostSamplerExactly) {
  auto be = make_cpu_backend(1);
  ASSERT_TRUE(be->has_sample_rows());
  const int V = 3001;
  const std::vector<int32_t> suppress = {0, 1, 2, 2999};
  std::mt19937 rng(11);
  int n = 0, minus_one = 0, distinct_nonzero = 0;
  for (const Combo& c : combos()) {
    for (int trial = 0; trial < 6; ++trial) {
      const int kind = trial % 5;
      SamplingParams p;
      p.temperature = c.t, p.top_k = c.k, p.top_p = c.top_p, p.min_p = c.min_p;
      p.repetition_penalty = c.pen, p.repetition_window = c.window;
      p.seed = rng();
      ASSERT_TRUE(validate(p).is_ok());
      std::vector<int32_t> history;
      for (int i = 0; i < 12; ++i) history.push_back(int32_t(rng() % 40));  // repeats inside the window
      const auto logits = make_row(V, kind, rng);

      Sampler host(p);
      host.set_suppressed(suppress);
      auto hl = logits;
      const int32_t want = host.sample(hl.data(), V, history);

      // Counts through updates: add the whole history, then remove what fell out of the window.
      std::vector<int32_t> counts(size_t(V) * 2, 0), updates;
      for (int32_t t : history) updates.push_back(t + 1);
      if (c.window > 0)
        for (size_t i = 0; i + size_t(c.window) < history.size(); ++i) updates.push_back(-(history[i] + 1));
      const int32_t offs[2] = {0, int32_t(updates.size())};
      SampleRowParams rp;
      rp.temperature = p.temperature, rp.top_p = p.top_p, rp.min_p = p.min_p;
      rp.repetition_penalty = p.repetition_penalty, rp.top_k = p.top_k, rp.count_row = 1;
      rp.random = Sampler(p).next_random53();
      SampleArgs a;
      a.params = &rp, a.suppress = suppress.data(), a.n_suppress = int(suppress.size());
      a.counts = counts.data(), a.updates = updates.data(), a.update_offsets = offs;
      auto dl = logits;
      int32_t got = -7;
      be->sample_rows(Act{dl.data(), 1, V, DType::kF32}, a, &got);
      ASSERT_EQ(got, want) << "T=" << c.t << " k=" << c.k << " top_p=" << c.top_p << " min_p=" << c.min_p
                           << " pen=" << c.pen << " window=" << c.window << " kind=" << kind;
      ++n;
      minus_one += want < 0;
      distinct_nonzero += want > 0 && want != int32_t(std::max_element(hl.begin(), hl.end()) - hl.begin());
    }
  }
  EXPECT_GT(minus_one, 0);           // the "no token possible" rows were exercised
  EXPECT_GT(distinct_nonzero, 100);  // and many draws that are not the argmax
  std::printf("  %d rows compared, %d with no possible token, %d draws off the argmax\n", n, minus_one,
              distinct_nonzero);
}

// OpenAI's logit_bias, rows batched with and without biases (-100 on the top token, +100 on
// another, random ones between): the same token as the host Sampler, which adds the bias first.
TEST(SampleRows, LogitBiasEqualsHostSamplerExactly) {
  auto be = make_cpu_backend(1);
  const int V = 3001, R = 8;
  const std::vector<int32_t> suppress = {1};
  std::mt19937 rng(23);
  int compared = 0, moved = 0;
  for (const Combo& c : combos()) {
    std::vector<float> logits;
    std::vector<SampleRowParams> rp;
    std::vector<int32_t> want, counts(size_t(R) * V, 0), updates, offs = {0}, bias_offs = {0}, bias_ids;
    std::vector<float> bias_values;
    for (int r = 0; r < R; ++r) {
      SamplingParams p;
      p.temperature = c.t, p.top_k = c.k, p.top_p = c.top_p, p.min_p = c.min_p;
      p.repetition_penalty = c.pen, p.repetition_window = 0, p.seed = rng();
      auto l = make_row(V, r % 3, rng);
      if (r % 3 != 2) {  // every third row has no bias
        const int32_t top = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
        std::vector<int32_t> ids = {top, int32_t(rng() % V)};
        for (int i = 0; i < 20; ++i) ids.push_back(int32_t(rng() % V));
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        std::uniform_real_distribution<float> ud(-6.0f, 6.0f);
        for (int32_t id : ids) p.logit_bias.push_back({id, id == top ? -100.0f : ud(rng)});
        if (r % 3 == 1 && p.logit_bias[0].id != top) p.logit_bias[0].bias = 100.0f;
      }
      ASSERT_TRUE(validate(p).is_ok()) << validate(p).message();
      for (const LogitBias& b : p.logit_bias) bias_ids.push_back(b.id), bias_values.push_back(b.bias);
      bias_offs.push_back(int32_t(bias_ids.size()));
      const std::vector<int32_t> history = {7, 9, 7, int32_t(rng() % V)};
      Sampler host(p);
      host.set_suppressed(suppress);
      auto hl = l;
      want.push_back(host.sample(hl.data(), V, history));
      SamplingParams np = p;
      np.logit_bias.clear();
      Sampler plain(np);
      plain.set_suppressed(suppress);
      hl = l;
      moved += plain.sample(hl.data(), V, history) != want.back();
      for (int32_t t : history) updates.push_back(t + 1);
      offs.push_back(int32_t(updates.size()));
      rp.push_back({p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, r, Sampler(p).next_random53()});
      logits.insert(logits.end(), l.begin(), l.end());
    }
    SampleArgs a;
    a.params = rp.data(), a.suppress = suppress.data(), a.n_suppress = int(suppress.size());
    a.counts = counts.data(), a.updates = updates.data(), a.update_offsets = offs.data();
    a.bias_offsets = bias_offs.data(), a.bias_ids = bias_ids.data(), a.bias_values = bias_values.data();
    std::vector<int32_t> got(R, -7);
    be->sample_rows(Act{logits.data(), R, V, DType::kF32}, a, got.data());
    ASSERT_EQ(got, want) << "T=" << c.t << " k=" << c.k << " top_p=" << c.top_p << " min_p=" << c.min_p;
    compared += R;
  }
  EXPECT_GT(moved, compared / 3) << "the biases changed many picks";
}

// Qwen3's vocabulary, several rows in one call with different parameters and seeds.
TEST(SampleRows, FullVocabBatchedRows) {
  auto be = make_cpu_backend(1);
  const int V = 151936, R = 6;
  std::mt19937 rng(5);
  std::vector<float> logits;
  for (int r = 0; r < R; ++r) {
    auto row = make_row(V, r % 3, rng);
    logits.insert(logits.end(), row.begin(), row.end());
  }
  const Combo cs[R] = {{0.7f, 20, 0.8f, 0.0f, 1.0f, 0}, {1.0f, 0, 0.95f, 0.0f, 1.1f, 0},
                       {1.3f, 0, 1.0f, 0.0f, 1.0f, 0},  {0.9f, 200, 1.0f, 0.1f, 1.0f, 0},
                       {0.0f, 0, 1.0f, 0.0f, 1.2f, 0},  {1.0f, 0, 0.99f, 0.02f, 1.0f, 0}};
  std::vector<SampleRowParams> rp(R);
  std::vector<int32_t> want(R), counts(size_t(R) * V, 0), updates, offs = {0};
  const std::vector<int32_t> history = {5, 77, 5, 151935, 1000};
  for (int r = 0; r < R; ++r) {
    SamplingParams p;
    p.temperature = cs[r].t, p.top_k = cs[r].k, p.top_p = cs[r].top_p, p.min_p = cs[r].min_p;
    p.repetition_penalty = cs[r].pen, p.seed = 1000 + r;
    Sampler host(p);
    std::vector<float> l(logits.begin() + size_t(r) * V, logits.begin() + size_t(r + 1) * V);
    want[size_t(r)] = host.sample(l.data(), V, history);
    rp[size_t(r)] = {p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, r, Sampler(p).next_random53()};
    for (int32_t t : history) updates.push_back(t + 1);
    offs.push_back(int32_t(updates.size()));
  }
  SampleArgs a;
  a.params = rp.data(), a.counts = counts.data(), a.updates = updates.data(), a.update_offsets = offs.data();
  std::vector<int32_t> got(R, -7);
  be->sample_rows(Act{logits.data(), R, V, DType::kF32}, a, got.data());
  EXPECT_EQ(got, want);
}

// The rows' flags (Engine::step_sample's mixed step): a kSampleRowSkip row is not sampled (id -1,
// its logits and counts untouched, for the host to sample it), a kSampleRowNoSuppress row samples as
// if nothing were suppressed, and the call's other rows as ever: each the host Sampler's token.
TEST(SampleRows, RowFlagsSkipAndNoSuppress) {
  auto be = make_cpu_backend(1);
  const int V = 3001, R = 9;
  std::mt19937 rng(31);
  std::vector<float> logits;
  std::vector<int32_t> suppress;  // the 3 likeliest ids of every row: suppression decides
  for (int r = 0; r < R; ++r) {
    auto l = make_row(V, r % 2 ? 0 : 2, rng);
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(), [&](int32_t x, int32_t y) {
      return l[size_t(x)] > l[size_t(y)] || (l[size_t(x)] == l[size_t(y)] && x < y);
    });
    suppress.insert(suppress.end(), idx.begin(), idx.begin() + 3);
    logits.insert(logits.end(), l.begin(), l.end());
  }
  std::vector<SampleRowParams> rp(R);
  std::vector<int32_t> want(R), counts(size_t(R) * V, 0), updates, offs = {0};
  int unsuppressed_hits = 0;
  for (int r = 0; r < R; ++r) {
    SamplingParams p;
    p.temperature = r % 3 == 0 ? 0.0f : 0.8f;
    p.repetition_penalty = r % 4 == 1 ? 1.3f : 1.0f;
    p.seed = 50 + r;
    const uint32_t flags = r % 3 == 2 ? kSampleRowSkip : (r % 2 ? kSampleRowNoSuppress : 0);
    const std::vector<int32_t> history = {int32_t(r), 40, 41};
    Sampler host(p);
    if (!(flags & kSampleRowNoSuppress)) host.set_suppressed(suppress);
    std::vector<float> l(logits.begin() + size_t(r) * V, logits.begin() + size_t(r + 1) * V);
    const int32_t t = host.sample(l.data(), V, history);
    want[size_t(r)] = flags & kSampleRowSkip ? -1 : t;
    unsuppressed_hits +=
        flags == kSampleRowNoSuppress && std::find(suppress.begin(), suppress.end(), t) != suppress.end();
    rp[size_t(r)] = {p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, r, Sampler(p).next_random53(),
                     flags};
    for (int32_t h : history) updates.push_back(h + 1);
    offs.push_back(int32_t(updates.size()));
  }
  SampleArgs a;
  a.params = rp.data(), a.suppress = suppress.data(), a.n_suppress = int(suppress.size());
  a.counts = counts.data(), a.updates = updates.data(), a.update_offsets = offs.data();
  auto w = logits;
  std::vector<int32_t> got(R, -7);
  be->sample_rows(Act{w.data(), R, V, DType::kF32}, a, got.data());
  EXPECT_EQ(got, want);
  EXPECT_GT(unsuppressed_hits, 0) << "no unsuppressed row picked a suppressed id: the test cannot tell the flag";
  for (int r = 2; r < R; r += 3) {  // the skipped rows
    const size_t at = size_t(r) * V;
    EXPECT_EQ(std::memcmp(w.data() + at, logits.data() + at, size_t(V) * 4), 0) << "row " << r << " changed";
    EXPECT_TRUE(std::all_of(counts.begin() + at, counts.begin() + at + V, [](int32_t c) { return c == 0; }))
        << "row " << r << ": its count updates were applied";
  }
}

// The penalty reads the counts, so a wrong update (or none) must change the result: the top token
// is penalized away only while it is counted.
TEST(SampleRows, PenaltyFollowsTheCounts) {
  auto be = make_cpu_backend(1);
  std::vector<float> l = {1.0f, 3.0f, 2.9f, 0.5f};
  SampleRowParams rp;
  rp.repetition_penalty = 2.0f, rp.count_row = 0;  // greedy with a penalty
  std::vector<int32_t> counts(4, 0);
  const int32_t add1[] = {2}, rem1[] = {-2};
  const int32_t offs[2] = {0, 1};
  SampleArgs a;
  a.params = &rp, a.counts = counts.data(), a.update_offsets = offs;
  int32_t id = -1;
  a.updates = add1;
  auto w = l;
  be->sample_rows(Act{w.data(), 1, 4, DType::kF32}, a, &id);
  EXPECT_EQ(id, 2);  // 3.0 / 2 < 2.9
  EXPECT_EQ(counts[1], 1);
  a.updates = rem1;
  w = l;
  be->sample_rows(Act{w.data(), 1, 4, DType::kF32}, a, &id);
  EXPECT_EQ(id, 1);
  EXPECT_EQ(counts[1], 0);
}

}  // namespace
}  // namespace anvil::test
