// The CUDA sample_rows kernel against the host Sampler (runtime/sampler.h), the reference: the same
// token id, exactly, for every row. Exact equality is the contract, not a tolerance: both sides make
// the same IEEE float/double operations in the same order (base/sample_math.h's det_exp without
// FMA contraction, integer fixed-point masses whose sums do not depend on order), so no tie at a
// top-p boundary or draw boundary can resolve differently. The CPU reference op (cpu_sample.cpp)
// is compared too, and the device's penalty counts after their updates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "base/sample_math.h"
#include "cuda_test_util.h"
#include "runtime/sampler.h"

namespace anvil::cuda_test {
namespace {

class CudaSample : public CudaFixture {
 protected:
  // Logits of one row: kind 0 normal, 1 heavy ties, 2 peaked with NaN/-inf/-0, 3 +inf entries,
  // 4 nothing possible but suppressed ids.
  std::vector<float> row(int64_t V, int kind) {
    std::normal_distribution<float> nd(0.0f, 2.5f);
    std::vector<float> l(static_cast<size_t>(V));
    for (auto& x : l) x = nd(rng_);
    if (kind == 1)
      for (auto& x : l) x = std::round(x * 2.0f) / 2.0f;
    if (kind == 2) {
      for (int i = 0; i < 20; ++i) l[size_t(rng_() % V)] += 12.0f;
      l[size_t(rng_() % V)] = NAN;
      l[size_t(rng_() % V)] = -INFINITY;
      l[3] = -0.0f, l[4] = 0.0f;
    }
    if (kind == 3) l[size_t(rng_() % V)] = INFINITY, l[size_t(rng_() % V)] = INFINITY;
    if (kind == 4)
      for (int64_t i = 0; i < V; ++i) l[size_t(i)] = i < 3 ? 5.0f : -INFINITY;
    return l;
  }

  // Each row's logit bias, as SampleArgs takes it (host memory; run() uploads it).
  struct RowBias {
    std::vector<int32_t> offsets = {0}, ids;
    std::vector<float> values;
  };

  // Samples R rows on both backends; the rows' histories are given as count updates applied to
  // counts rows 0..R-1 (the device keeps its counts across calls: dev_counts persists).
  void run(int64_t V, const std::vector<SampleRowParams>& rp, const std::vector<float>& logits,
           const std::vector<int32_t>& suppress, const std::vector<int32_t>& updates,
           const std::vector<int32_t>& offsets, std::vector<int32_t>* cpu_counts, Guarded* dev_counts,
           std::vector<int32_t>* cpu_ids, std::vector<int32_t>* gpu_ids, const RowBias* bias = nullptr,
           std::vector<float>* cpu_logits = nullptr, std::vector<float>* gpu_logits = nullptr) {
    const int R = int(rp.size());
    auto cl = logits;
    SampleArgs a;
    a.params = rp.data(), a.suppress = suppress.data(), a.n_suppress = int(suppress.size());
    a.counts = cpu_counts->data(), a.updates = updates.data(), a.update_offsets = offsets.data();
    if (bias) a.bias_offsets = bias->offsets.data(), a.bias_ids = bias->ids.data(), a.bias_values = bias->values.data();
    cpu_ids->assign(size_t(R), -7);
    cpu_->sample_rows(Act{cl.data(), R, V, DType::kF32}, a, cpu_ids->data());
    if (cpu_logits) *cpu_logits = cl;

    Guarded gl = dev_bytes(logits.data(), logits.size() * 4), gp = dev_bytes(rp.data(), rp.size() * sizeof rp[0]);
    std::vector<int32_t> sp = suppress, up = updates;  // one spare element: never an empty buffer
    sp.push_back(-1), up.push_back(0);
    Guarded gs = dev_bytes(sp.data(), sp.size() * 4), gu = dev_bytes(up.data(), up.size() * 4);
    Guarded go = dev_bytes(offsets.data(), offsets.size() * 4);
    const std::vector<int32_t> poison(size_t(R), -7);  // not -1: a row never written must not pass as "no token"
    Guarded gsc = guarded(gpu_->sample_scratch_bytes(R, V)), gi = dev_bytes(poison.data(), size_t(R) * 4);
    SampleArgs d;
    d.params = static_cast<const SampleRowParams*>(gp.data());
    d.suppress = static_cast<const int32_t*>(gs.data()), d.n_suppress = int(suppress.size());
    d.counts = static_cast<int32_t*>(dev_counts->data());
    d.updates = static_cast<const int32_t*>(gu.data()), d.update_offsets = static_cast<const int32_t*>(go.data());
    d.scratch = gsc.data();
    std::vector<int32_t> bi;
    std::vector<float> bv;
    if (bias) bi = bias->ids, bv = bias->values;
    bi.push_back(0), bv.push_back(0.0f);  // never an empty buffer
    Guarded gbo = dev_bytes(bias ? bias->offsets.data() : offsets.data(), offsets.size() * 4);
    Guarded gbi = dev_bytes(bi.data(), bi.size() * 4), gbv = dev_bytes(bv.data(), bv.size() * 4);
    if (bias) {
      d.bias_offsets = static_cast<const int32_t*>(gbo.data());
      d.bias_ids = static_cast<const int32_t*>(gbi.data()), d.bias_values = static_cast<const float*>(gbv.data());
    }
    gpu_->sample_rows(Act{gl.data(), R, V, DType::kF32}, d, static_cast<int32_t*>(gi.data()));
    gpu_ids->assign(size_t(R), -7);
    gpu_->copy_to_host(gpu_ids->data(), gi.data(), size_t(R) * 4);
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    read(gi, DType::kF32, "sample_rows ids");  // guard bytes around the ids untouched
    if (gpu_logits) {
      gpu_logits->assign(logits.size(), 0.0f);
      gpu_->copy_to_host(gpu_logits->data(), gl.data(), logits.size() * 4);
      ASSERT_TRUE(gpu_->synchronize().is_ok());
    }
    std::vector<int32_t> gc(cpu_counts->size());
    gpu_->copy_to_host(gc.data(), dev_counts->data(), gc.size() * 4);
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    EXPECT_EQ(gc, *cpu_counts) << "device penalty counts differ after the updates";
  }
};

TEST_F(CudaSample, RowsEqualHostSamplerExactly) {
  struct Combo { float t; int k; float top_p, min_p, pen; int window; };
  std::vector<Combo> combos;
  for (float t : {0.0f, 0.6f, 1.0f, 1.7f})
    for (int k : {0, 1, 7, 60})
      for (float top_p : {1.0f, 0.9f, 0.3f, 1e-9f})
        for (float min_p : {0.0f, 0.05f})
          combos.push_back({t, k, top_p, min_p, (k + int(t * 10)) % 3 == 0 ? 1.0f : 1.3f, k % 2 ? 4 : 0});
  const std::vector<int32_t> suppress = {0, 1, 2, 2999};
  int compared = 0, off_argmax = 0;
  for (int64_t V : {int64_t(3001), int64_t(151936)}) {
    const int R = 16;  // rows per call, each with its own parameters
    for (size_t c0 = 0; c0 < combos.size(); c0 += R) {
      std::vector<SampleRowParams> rp;
      std::vector<float> logits;
      std::vector<int32_t> updates, offsets = {0}, want;
      for (int r = 0; r < R; ++r) {
        const Combo& c = combos[(c0 + size_t(r)) % combos.size()];
        SamplingParams p;
        p.temperature = c.t, p.top_k = c.k, p.top_p = c.top_p, p.min_p = c.min_p;
        p.repetition_penalty = c.pen, p.repetition_window = c.window, p.seed = rng_();
        std::vector<int32_t> history;
        for (int i = 0; i < 12; ++i) history.push_back(int32_t(rng_() % 40));
        auto l = row(V, (r + int(c0 / R)) % 5);
        Sampler host(p);
        host.set_suppressed(suppress);
        auto hl = l;
        want.push_back(host.sample(hl.data(), int(V), history));
        off_argmax += want.back() > 0 && want.back() != int32_t(std::max_element(hl.begin(), hl.end()) - hl.begin());
        logits.insert(logits.end(), l.begin(), l.end());
        for (int32_t t : history) updates.push_back(t + 1);
        if (c.window > 0)
          for (size_t i = 0; i + size_t(c.window) < history.size(); ++i) updates.push_back(-(history[i] + 1));
        offsets.push_back(int32_t(updates.size()));
        rp.push_back({p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, r, Sampler(p).next_random53()});
      }
      std::vector<int32_t> cpu_counts(size_t(R) * V, 0), cpu_ids, gpu_ids;
      Guarded dc = dev_bytes(cpu_counts.data(), cpu_counts.size() * 4);
      run(V, rp, logits, suppress, updates, offsets, &cpu_counts, &dc, &cpu_ids, &gpu_ids);
      ASSERT_EQ(cpu_ids, want) << "vocab " << V << " combos from " << c0;
      ASSERT_EQ(gpu_ids, want) << "vocab " << V << " combos from " << c0;
      compared += R;
    }
  }
  EXPECT_GT(off_argmax, 30);
  std::printf("  %d rows equal on the GPU, the CPU reference and the host Sampler (%d off the argmax)\n", compared,
              off_argmax);
}

// OpenAI's logit_bias on the device: every row with its own biases (none, small ones, -100 on the
// top token, +100 on a low one), with every processor after it; the GPU, the CPU reference and the
// host Sampler (which adds the bias first, runtime/sampler.h) pick the same token, exactly.
TEST_F(CudaSample, RowsWithLogitBiasEqualHostSamplerExactly) {
  const std::vector<int32_t> suppress = {0, 2};
  int compared = 0, forced = 0, moved = 0;
  for (int64_t V : {int64_t(3001), int64_t(151936)}) {
    const int R = 16;
    for (int call = 0; call < 8; ++call) {
      std::vector<SampleRowParams> rp;
      std::vector<float> logits;
      std::vector<int32_t> updates, offsets = {0}, want, plain;
      RowBias bias;
      for (int r = 0; r < R; ++r) {
        SamplingParams p;
        const float temps[] = {0.0f, 0.7f, 1.0f, 1.3f};
        p.temperature = temps[(r + call) % 4];
        p.top_k = r % 3 == 0 ? 40 : 0;
        p.top_p = r % 4 == 1 ? 0.9f : 1.0f;
        p.min_p = r % 5 == 2 ? 0.05f : 0.0f;
        p.repetition_penalty = r % 2 ? 1.3f : 1.0f;
        p.seed = rng_();
        auto l = row(V, r % 3);
        const int32_t top = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
        std::set<int32_t> ids;
        const int n_bias = r % 4 == 3 ? 0 : 1 + int(rng_() % 300);  // some rows have none
        while (int(ids.size()) < n_bias) ids.insert(int32_t(rng_() % uint32_t(V)));
        if (n_bias > 0) ids.insert(top);
        std::uniform_real_distribution<float> ud(-10.0f, 10.0f);
        const int32_t low = ids.empty() ? -1 : *ids.begin();
        for (int32_t id : ids) {
          const float b = id == top ? -100.0f : (id == low && r % 2 ? 100.0f : ud(rng_));
          p.logit_bias.push_back({id, b});
          bias.ids.push_back(id), bias.values.push_back(b);
        }
        bias.offsets.push_back(int32_t(bias.ids.size()));
        ASSERT_TRUE(validate(p).is_ok()) << validate(p).message();
        std::vector<int32_t> history;
        for (int i = 0; i < 12; ++i) history.push_back(int32_t(rng_() % 40));
        Sampler host(p);
        host.set_suppressed(suppress);
        auto hl = l;
        want.push_back(host.sample(hl.data(), int(V), history));
        SamplingParams np = p;
        np.logit_bias.clear();
        Sampler unbiased(np);
        unbiased.set_suppressed(suppress);
        hl = l;
        plain.push_back(unbiased.sample(hl.data(), int(V), history));
        moved += want.back() != plain.back();
        forced += low >= 0 && r % 2 && low != top && want.back() == low;
        logits.insert(logits.end(), l.begin(), l.end());
        for (int32_t t : history) updates.push_back(t + 1);
        offsets.push_back(int32_t(updates.size()));
        rp.push_back({p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, r, Sampler(p).next_random53()});
      }
      std::vector<int32_t> cpu_counts(size_t(R) * V, 0), cpu_ids, gpu_ids;
      Guarded dc = dev_bytes(cpu_counts.data(), cpu_counts.size() * 4);
      run(V, rp, logits, suppress, updates, offsets, &cpu_counts, &dc, &cpu_ids, &gpu_ids, &bias);
      ASSERT_EQ(cpu_ids, want) << "vocab " << V << " call " << call;
      ASSERT_EQ(gpu_ids, want) << "vocab " << V << " call " << call;
      compared += R;
    }
  }
  EXPECT_GT(moved, compared / 2) << "the biases changed most picks";
  EXPECT_GT(forced, 10) << "+100 forced its token";
  std::printf("  %d biased rows equal on the GPU, the CPU reference and the host Sampler (%d moved by the bias)\n",
              compared, moved);
}

// The rows' flags (a mixed server step, Engine::step_sample): a kSampleRowSkip row is not sampled
// (id -1, its logits and its counts row untouched, so the host can sample it from them), a
// kSampleRowNoSuppress row samples as if nothing were suppressed, and the other rows of the same
// call are sampled as ever. The GPU, the CPU reference and the host Sampler agree exactly.
TEST_F(CudaSample, RowFlagsSkipAndNoSuppress) {
  const int64_t V = 151936;
  const int R = 12;
  std::vector<SampleRowParams> rp;
  std::vector<float> logits;
  std::vector<int32_t> updates, offsets = {0}, want, suppress;
  // Rows of kind 2 (peaked): suppress the likeliest ids of every row, so that suppression decides.
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < R; ++r) {
    rows.push_back(row(V, 2));
    const auto& l = rows.back();
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) idx[size_t(i)] = int32_t(i);
    std::partial_sort(idx.begin(), idx.begin() + 4, idx.end(), [&](int32_t x, int32_t y) {
      return l[size_t(x)] > l[size_t(y)] || (l[size_t(x)] == l[size_t(y)] && x < y);
    });
    suppress.insert(suppress.end(), idx.begin(), idx.begin() + 4);
  }
  int unsuppressed_hits = 0;
  for (int r = 0; r < R; ++r) {
    SamplingParams p;
    p.temperature = r % 3 == 0 ? 0.0f : 0.9f;
    p.top_k = r % 2 ? 50 : 0;
    p.repetition_penalty = r % 4 == 1 ? 1.3f : 1.0f;
    p.seed = rng_();
    const uint32_t flags = r % 3 == 2 ? kSampleRowSkip : (r % 2 ? kSampleRowNoSuppress : 0);
    std::vector<int32_t> history = {int32_t(r), int32_t(r + 7), 30};
    Sampler host(p);
    if (!(flags & kSampleRowNoSuppress)) host.set_suppressed(suppress);
    auto hl = rows[size_t(r)];
    const int32_t t = host.sample(hl.data(), int(V), history);
    want.push_back(flags & kSampleRowSkip ? -1 : t);
    unsuppressed_hits +=
        flags == kSampleRowNoSuppress && std::find(suppress.begin(), suppress.end(), t) != suppress.end();
    logits.insert(logits.end(), rows[size_t(r)].begin(), rows[size_t(r)].end());
    for (int32_t h : history) updates.push_back(h + 1);
    offsets.push_back(int32_t(updates.size()));
    rp.push_back(
        {p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, r, Sampler(p).next_random53(), flags});
  }
  std::vector<int32_t> cpu_counts(size_t(R) * V, 0), cpu_ids, gpu_ids;
  Guarded dc = dev_bytes(cpu_counts.data(), cpu_counts.size() * 4);
  std::vector<float> cpu_logits, gpu_logits;
  run(V, rp, logits, suppress, updates, offsets, &cpu_counts, &dc, &cpu_ids, &gpu_ids, nullptr, &cpu_logits,
      &gpu_logits);
  EXPECT_EQ(cpu_ids, want);
  EXPECT_EQ(gpu_ids, want);
  EXPECT_GT(unsuppressed_hits, 0) << "no unsuppressed row picked a suppressed id: the test cannot tell the flag";
  for (int r = 0; r < R; ++r) {
    if (!(rp[size_t(r)].flags & kSampleRowSkip)) continue;
    const size_t at = size_t(r) * size_t(V);
    EXPECT_EQ(std::memcmp(gpu_logits.data() + at, logits.data() + at, size_t(V) * 4), 0) << "GPU row " << r;
    EXPECT_EQ(std::memcmp(cpu_logits.data() + at, logits.data() + at, size_t(V) * 4), 0) << "CPU row " << r;
    for (int64_t i = 0; i < V; ++i)
      ASSERT_EQ(cpu_counts[at + size_t(i)], 0) << "row " << r << ": a skipped row's count updates were applied";
  }
}

// A generation: the counts live on the device across steps, updated by one add and (with a window)
// one removal per step, and every step's token equals the host Sampler's over the same history and
// the same random stream.
TEST_F(CudaSample, StepsKeepCountsAndRandomStream) {
  const int64_t V = 151936;
  SamplingParams p;
  p.temperature = 0.8f, p.top_k = 40, p.top_p = 0.9f, p.repetition_penalty = 1.5f, p.repetition_window = 6;
  p.seed = 77;
  Sampler host(p), stream(p);
  std::vector<int32_t> history = {10, 11, 12};
  std::vector<int32_t> cpu_counts(size_t(V), 0), cpu_ids, gpu_ids;
  Guarded dc = dev_bytes(cpu_counts.data(), cpu_counts.size() * 4);
  size_t counted = 0;
  // Logits that favour recent tokens, so the penalty decides often.
  for (int step = 0; step < 40; ++step) {
    auto l = row(V, 0);
    for (int32_t t : history) l[size_t(t)] += 6.0f;
    std::vector<int32_t> updates;
    for (size_t i = counted; i < history.size(); ++i) updates.push_back(history[i] + 1);
    const size_t lo_old = counted > 6 ? counted - 6 : 0, lo_new = history.size() > 6 ? history.size() - 6 : 0;
    for (size_t i = lo_old; i < lo_new; ++i) updates.push_back(-(history[i] + 1));
    counted = history.size();
    const std::vector<int32_t> offsets = {0, int32_t(updates.size())};
    SampleRowParams rp{p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, 0, stream.next_random53()};
    run(V, {rp}, l, {}, updates, offsets, &cpu_counts, &dc, &cpu_ids, &gpu_ids);
    const int32_t want = host.sample(l.data(), int(V), history);
    ASSERT_EQ(cpu_ids[0], want) << "step " << step;
    ASSERT_EQ(gpu_ids[0], want) << "step " << step;
    history.push_back(want);
  }
}

}  // namespace
}  // namespace anvil::cuda_test
