// qk_norm_rope_kv_append + attention on the CPU backend against a double-precision reference that
// keeps each sequence's K/V as a plain array by position (no paging), so the page-table walk,
// slot arithmetic and the KV layout of backend.h are all checked independently.
//
// Scenario: two sequences with non-contiguous page tables and page_size 5 (dividing neither
// length); step 1 prefills 12 tokens of seq 1 and 9 of seq 0 in one batch (interleaved order),
// step 2 is a mixed batch: a decode token of seq 0 plus a 2-token prefill chunk of seq 1; step 3
// continues both with contiguous chunks (5 and 6 tokens: the kernel's blocks of consecutive tokens
// plus remainders, across page boundaries).
// GQA ratios 1 (MHA), 2, 3 (odd query counts) and 4, head_dim 20 (SIMD tails) and 64, KV in F32 and BF16, q/k norm on and off,
// the whole context or a sliding window of 7 or 1 positions.
//
// Bounds: with F32 KV every quantity is a few fp32 roundings away from the double reference
// (1e-5 of the largest magnitude). With BF16 KV the reference stores the same bf16-rounded K/V, but
// the kernel's fp32 K may round to the neighbouring bf16 value (1 ulp = 2^-8 relative) where the
// double value sits near a rounding boundary; one such element moves a score by ~|q_i k_i|*4e-3,
// so 2e-3 of max|V| for the output and 1 bf16 ulp per cache element.
#include <gtest/gtest.h>

#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"

namespace anvil::test {
namespace {

constexpr int kLayers = 2, kLayer = 1, kPage = 5, kKvHeads = 2, kMaxPages = 4, kPages = 8;
constexpr int32_t kPageTable[2][kMaxPages] = {{5, 1, 7, -1}, {2, 6, 0, 4}};

struct Step {
  std::vector<int32_t> seq, pos;
};

struct Outputs {
  std::vector<std::vector<float>> q_rot, attn;  // per step
  std::vector<uint8_t> cache;
};

struct AttnConfig {
  int ratio, head_dim;
  DType kv_dtype;
  bool qk_norm;
  int window = 0;  // KVCacheView::window (sliding-window attention); 0: the whole context
};

std::vector<Step> scenario() {
  Step s1, s2;
  for (int i = 0; i < 12; ++i) {
    s1.seq.push_back(1);
    s1.pos.push_back(i);
    if (i < 9) {
      s1.seq.push_back(0);
      s1.pos.push_back(i);
    }
  }
  s2.seq = {1, 0, 1};
  s2.pos = {12, 9, 13};
  Step s3;
  for (int p = 10; p < 15; ++p) s3.seq.push_back(0), s3.pos.push_back(p);
  for (int p = 14; p < 20; ++p) s3.seq.push_back(1), s3.pos.push_back(p);
  return {s1, s2, s3};
}

size_t kv_elem(const AttnConfig& c, int page, int which, int slot, int head, int d) {
  return size_t(((((page * kLayers + kLayer) * 2 + which) * kKvHeads + head) * kPage + slot) * c.head_dim + d);
}

// Rounds v as the cache stores it.
double kv_round(double v, DType dt) {
  if (dt == DType::kF32) return double(float(v));
  uint16_t h = f32_to_bf16(float(v));
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void norm_rope_ref(double* x, int D, const FloatArray* w, double eps, int pos, const std::vector<float>& inv_freq) {
  if (w) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += x[i] * x[i];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int i = 0; i < D; ++i) x[i] = x[i] * inv * w->value[size_t(i)];
  }
  const int h = D / 2;
  for (int i = 0; i < h; ++i) {
    const double a = double(pos) * double(inv_freq[size_t(i)]);
    const double x1 = x[i], x2 = x[i + h];
    x[i] = x1 * std::cos(a) - x2 * std::sin(a);
    x[i + h] = x2 * std::cos(a) + x1 * std::sin(a);
  }
}

Outputs run_scenario(Backend& be, const AttnConfig& c, bool check) {
  const int D = c.head_dim, H = kKvHeads * c.ratio, Hkv = kKvHeads;
  const double eps = 1e-6;
  std::vector<float> inv_freq(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = float(std::pow(10000.0, -2.0 * i / D));
  FloatArray qn = make_float_array(random_floats(size_t(D), 91u, 0.5f, 1.5f), DType::kBF16);
  FloatArray kn = make_float_array(random_floats(size_t(D), 92u, 0.5f, 1.5f), DType::kF32);
  WeightVector qnv{D, DType::kBF16, c.qk_norm ? qn.data() : nullptr};
  WeightVector knv{D, DType::kF32, c.qk_norm ? kn.data() : nullptr};

  KVCacheView kv;
  kv.dtype = c.kv_dtype;
  kv.n_layers = kLayers;
  kv.n_kv_heads = Hkv;
  kv.head_dim = D;
  kv.page_size = kPage;
  kv.n_pages = kPages;
  kv.window = c.window;
  std::vector<uint8_t> cache(kv.page_bytes() * kPages, 0xA5);  // 0xA5 bytes mark never-written elements
  kv.base = cache.data();

  // Reference K/V per sequence, by position: [seq][pos][head*D + d], stored-rounded.
  std::vector<std::vector<std::vector<double>>> kref(2), vref(2);
  Outputs outs;
  uint32_t seed = 500;
  for (const Step& st : scenario()) {
    const int T = int(st.seq.size());
    std::vector<float> q = random_floats(size_t(T * H * D), seed++, -2.0f, 2.0f);
    std::vector<float> k = random_floats(size_t(T * Hkv * D), seed++, -2.0f, 2.0f);
    std::vector<float> v = random_floats(size_t(T * Hkv * D), seed++);
    std::vector<double> qref(q.begin(), q.end());
    for (int t = 0; t < T; ++t) {
      for (int h = 0; h < H; ++h) norm_rope_ref(&qref[size_t((t * H + h) * D)], D, c.qk_norm ? &qn : nullptr, eps, st.pos[size_t(t)], inv_freq);
      std::vector<double> kr(k.begin() + t * Hkv * D, k.begin() + (t + 1) * Hkv * D), vr(size_t(Hkv * D));
      for (int h = 0; h < Hkv; ++h) norm_rope_ref(&kr[size_t(h * D)], D, c.qk_norm ? &kn : nullptr, eps, st.pos[size_t(t)], inv_freq);
      for (size_t i = 0; i < kr.size(); ++i) {
        kr[i] = kv_round(kr[i], c.kv_dtype);
        vr[i] = kv_round(v[size_t(t * Hkv * D) + i], c.kv_dtype);
      }
      auto& ks = kref[size_t(st.seq[size_t(t)])];
      auto& vs = vref[size_t(st.seq[size_t(t)])];
      const size_t p = size_t(st.pos[size_t(t)]);
      if (ks.size() <= p) ks.resize(p + 1), vs.resize(p + 1);
      ks[p] = kr;
      vs[p] = vr;
    }

    BatchView b;
    b.n_tokens = T;
    b.n_seqs = 2;
    b.max_pages = kMaxPages;
    b.pos = st.pos.data();
    b.seq = st.seq.data();
    b.page_table = &kPageTable[0][0];
    be.qk_norm_rope_kv_append(Act{q.data(), T, H * D, DType::kF32}, Act{k.data(), T, Hkv * D, DType::kF32},
                              Act{v.data(), T, Hkv * D, DType::kF32}, qnv, knv, float(eps), inv_freq.data(), kv, kLayer, b);
    const float scale = 1.0f / std::sqrt(float(D));
    Guarded out(size_t(T * H * D));
    be.attention(Act{q.data(), T, H * D, DType::kF32}, kv, kLayer, b, scale, out.act(T, H * D));
    outs.q_rot.push_back(q);
    outs.attn.emplace_back(out.data(), out.data() + out.size());
    if (!check) continue;
    EXPECT_TRUE(out.guards_intact()) << "attention wrote outside its output";

    std::vector<double> qmag(qref.size());
    for (size_t i = 0; i < qref.size(); ++i) qmag[i] = std::fabs(qref[i]);
    EXPECT_LT(normalized_error(q.data(), qref, qmag), 1e-5) << "q after norm + rope";

    // Reference attention: token t attends positions 0..pos[t] of its sequence (all appended above),
    // with a window W the last W of them only.
    std::vector<double> want(size_t(T * H * D)), vmag(want.size(), 0.0);
    for (int t = 0; t < T; ++t) {
      const auto& ks = kref[size_t(st.seq[size_t(t)])];
      const auto& vs = vref[size_t(st.seq[size_t(t)])];
      const int n = st.pos[size_t(t)] + 1;
      const int j0 = c.window > 0 ? std::max(0, n - c.window) : 0;
      for (int h = 0; h < H; ++h) {
        const int kvh = h / c.ratio;
        std::vector<double> s(static_cast<size_t>(n), -INFINITY);
        double mx = -INFINITY;
        for (int j = j0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += qref[size_t((t * H + h) * D + d)] * ks[size_t(j)][size_t(kvh * D + d)];
          s[size_t(j)] = dot * double(scale);
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int d = 0; d < D; ++d) {
          double o = 0, m = 0;
          for (int j = j0; j < n; ++j) {
            o += s[size_t(j)] / z * vs[size_t(j)][size_t(kvh * D + d)];
            m = std::max(m, std::fabs(vs[size_t(j)][size_t(kvh * D + d)]));
          }
          want[size_t((t * H + h) * D + d)] = o;
          vmag[size_t((t * H + h) * D + d)] = m;
        }
      }
    }
    EXPECT_LT(normalized_error(out.data(), want, vmag), c.kv_dtype == DType::kF32 ? 1e-5 : 2e-3) << "attention output";
  }

  if (check) {
    // Every appended K/V element sits where backend.h's layout says; nothing else was written.
    std::vector<bool> written(cache.size() / dtype_size(c.kv_dtype), false);
    int bad = 0;
    for (int s = 0; s < 2; ++s)
      for (size_t p = 0; p < kref[size_t(s)].size(); ++p)
        for (int which = 0; which < 2; ++which)
          for (int h = 0; h < Hkv; ++h)
            for (int d = 0; d < D; ++d) {
              const size_t at = kv_elem(c, kPageTable[s][p / kPage], which, int(p % kPage), h, d);
              written[at] = true;
              const double want = (which == 0 ? kref : vref)[size_t(s)][p][size_t(h * D + d)];
              const double got = load_float(cache.data(), c.kv_dtype, at);
              const double tol = c.kv_dtype == DType::kF32 ? 1e-5 * (1 + std::fabs(want)) : std::fabs(want) / 256 + 1e-6;
              if (!(std::fabs(got - want) <= tol) && ++bad < 5)
                ADD_FAILURE() << "cache seq " << s << " pos " << p << " kv " << which << " head " << h << " d " << d
                              << ": got " << got << " want " << want;
            }
    const size_t es = dtype_size(c.kv_dtype);
    size_t stray = 0;
    for (size_t i = 0; i < written.size(); ++i)
      if (!written[i])
        for (size_t b = 0; b < es; ++b) stray += cache[i * es + b] != 0xA5;
    EXPECT_EQ(stray, 0u) << "bytes written outside the appended slots";
  }
  outs.cache = cache;
  return outs;
}

using AttnParam = std::tuple<int, int, DType, bool, int>;
class AttentionTest : public ::testing::TestWithParam<AttnParam> {
 protected:
  void TearDown() override { cpu_set_force_scalar(false); }
};

TEST_P(AttentionTest, MultiSequencePagedGqa) {
  const auto [ratio, head_dim, kv_dtype, qk_norm, window] = GetParam();
  auto be = make_cpu_backend(2);
  for (bool scalar : {false, true}) {
    SCOPED_TRACE(scalar ? "scalar path" : "default path");
    cpu_set_force_scalar(scalar);
    run_scenario(*be, AttnConfig{ratio, head_dim, kv_dtype, qk_norm, window}, true);
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, AttentionTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(20, 64),
                                            ::testing::Values(DType::kF32, DType::kBF16), ::testing::Bool(),
                                            // Sliding windows: 7 positions (across the pages of 5, shorter
                                            // than most contexts here, so blocks see pages wholly before
                                            // the window), 1 (each token sees only itself).
                                            ::testing::Values(0, 7, 1)));

// Work is split over (token, kv head); the thread count must not change any bit of the results.
TEST(Attention, ThreadCountDoesNotChangeResults) {
  auto one = make_cpu_backend(1), two = make_cpu_backend(2);
  const AttnConfig c{4, 64, DType::kBF16, true};
  Outputs a = run_scenario(*one, c, false), b = run_scenario(*two, c, false);
  EXPECT_EQ(a.q_rot, b.q_rot);
  EXPECT_EQ(a.attn, b.attn);
  EXPECT_EQ(a.cache, b.cache);
}

}  // namespace
}  // namespace anvil::test
