// The small CPU ops (embed, rmsnorm, add_rmsnorm, swiglu, add, to_host_f32) against double-precision
// references, with guard floats around every output.
//
// Bounds (normalized by the largest reference magnitude): these ops do O(1) fp32 operations per
// element after at most one fp32 reduction of n <= 1000 squares (relative error <= n*6e-8 = 6e-5
// worst case), so 1e-5 elementwise / embed and 1e-4 for the norms; exp in swiglu is accurate to a
// few ulp (1e-6).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend_test_util.h"

namespace anvil::test {
namespace {

std::vector<double> abs_of(const std::vector<double>& v) {
  std::vector<double> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

TEST(Embed, DenseAndQuantizedTables) {
  auto be = make_cpu_backend(2);
  const std::vector<int32_t> ids = {5, 0, 22, 5, 13};
  const int64_t T = int64_t(ids.size()), V = 23, K = 192;
  std::vector<TestWeight> tables;
  tables.push_back(make_dense_weight(V, K, DType::kBF16, false, 1u));
  tables.push_back(make_dense_weight(V, K, DType::kF32, false, 2u));
  for (int bits : {2, 3, 4, 5, 6, 8}) tables.push_back(make_quant_weight(V, K, bits, 64, DType::kF16, false, 3u + bits));
  for (const TestWeight& t : tables) {
    Guarded out(size_t(T * K));
    be->embed(t.w, ids.data(), out.act(T, K));
    std::vector<double> want(size_t(T * K));
    for (int64_t i = 0; i < T; ++i)
      for (int64_t k = 0; k < K; ++k) want[size_t(i * K + k)] = t.ref[size_t(ids[size_t(i)] * K + k)];
    EXPECT_LT(normalized_error(out.data(), want, abs_of(want)), 1e-5) << "bits " << t.w.bits;
    EXPECT_TRUE(out.guards_intact());
  }
}

std::vector<double> ref_rmsnorm(const std::vector<double>& x, const FloatArray& w, int64_t rows, int64_t n, double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[size_t(r * n + i)] * x[size_t(r * n + i)];
    const double inv = 1.0 / std::sqrt(ss / double(n) + eps);
    for (int64_t i = 0; i < n; ++i) y[size_t(r * n + i)] = x[size_t(r * n + i)] * inv * w.value[size_t(i)];
  }
  return y;
}

TEST(RmsNorm, MatchesReference) {
  auto be = make_cpu_backend(2);
  for (DType wdt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t rows : {int64_t(1), int64_t(37)})
      for (int64_t n : {int64_t(1000), int64_t(13)}) {
        std::vector<float> x = random_floats(size_t(rows * n), 21u, -3.0f, 3.0f);
        FloatArray w = make_float_array(random_floats(size_t(n), 22u, 0.5f, 1.5f), wdt);
        Guarded out(size_t(rows * n));
        be->rmsnorm(Act{x.data(), rows, n, DType::kF32}, WeightVector{n, wdt, w.data()}, 1e-6f, out.act(rows, n));
        std::vector<double> want = ref_rmsnorm(std::vector<double>(x.begin(), x.end()), w, rows, n, 1e-6);
        EXPECT_LT(normalized_error(out.data(), want, abs_of(want)), 1e-4);
        EXPECT_TRUE(out.guards_intact());
      }
}

TEST(AddRmsNorm, UpdatesResidualAndNormalizes) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 9, n = 515;
  std::vector<float> res = random_floats(size_t(rows * n), 31u), x = random_floats(size_t(rows * n), 32u);
  FloatArray w = make_float_array(random_floats(size_t(n), 33u, 0.5f, 1.5f), DType::kBF16);
  std::vector<double> sum(res.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(res[i]) + double(x[i]);
  Guarded out(size_t(rows * n));
  be->add_rmsnorm(Act{res.data(), rows, n, DType::kF32}, Act{x.data(), rows, n, DType::kF32},
                  WeightVector{n, DType::kBF16, w.data()}, 1e-5f, out.act(rows, n));
  EXPECT_LT(normalized_error(res.data(), sum, abs_of(sum)), 1e-6);
  std::vector<double> want = ref_rmsnorm(sum, w, rows, n, 1e-5);
  EXPECT_LT(normalized_error(out.data(), want, abs_of(want)), 1e-4);
  EXPECT_TRUE(out.guards_intact());
}

TEST(SwiGlu, MatchesReference) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 5, n = 40001;  // more than one parallel chunk, odd length
  std::vector<float> g = random_floats(size_t(rows * n), 41u, -8.0f, 8.0f), u = random_floats(size_t(rows * n), 42u);
  Guarded out(size_t(rows * n));
  be->swiglu(Act{g.data(), rows, n, DType::kF32}, Act{u.data(), rows, n, DType::kF32}, out.act(rows, n));
  std::vector<double> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * double(u[i]);
  EXPECT_LT(normalized_error(out.data(), want, abs_of(want)), 1e-5);
  EXPECT_TRUE(out.guards_intact());
}

TEST(Add, AddsInPlace) {
  auto be = make_cpu_backend(2);
  const int64_t rows = 3, n = 70001;
  std::vector<float> a = random_floats(size_t(rows * n), 51u), b = random_floats(size_t(rows * n), 52u);
  std::vector<double> want(a.size());
  for (size_t i = 0; i < a.size(); ++i) want[i] = double(a[i]) + double(b[i]);
  Guarded ga(a.size());
  std::copy(a.begin(), a.end(), ga.data());
  be->add(ga.act(rows, n), Act{b.data(), rows, n, DType::kF32});
  EXPECT_LT(normalized_error(ga.data(), want, abs_of(want)), 1e-6);
  EXPECT_TRUE(ga.guards_intact());
}

TEST(ToHostF32, CopiesExactly) {
  auto be = make_cpu_backend(1);
  std::vector<float> x = random_floats(77, 61u);
  auto dev = be->alloc(x.size() * 4);
  ASSERT_TRUE(dev.is_ok());
  be->copy_to_device(*dev, x.data(), x.size() * 4);
  Guarded out(x.size());
  be->to_host_f32(Act{*dev, 7, 11, DType::kF32}, out.data());
  EXPECT_EQ(std::vector<float>(out.data(), out.data() + x.size()), x);
  EXPECT_TRUE(out.guards_intact());
  be->free(*dev);
}

TEST(CpuBackend, ReportsF32Activations) {
  auto be = make_cpu_backend(2);
  EXPECT_EQ(be->act_dtype(), DType::kF32);
  EXPECT_NE(be->name().find("cpu"), std::string::npos);
}

}  // namespace
}  // namespace anvil::test

namespace anvil::test {
namespace {

// The attention softmax's vectorized exp against double-precision exp: every length 1..40 (vector
// body and padded tail), arguments from 0 down to -100 (clamped below -87).
TEST(CpuKernels, ExpShiftSumMatchesExp) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<float> base = random_floats(64, 1234u, -100.0f, 0.0f);
  base[0] = 0.0f;
  base[1] = -1e-8f;
  base[2] = -0.34657359f;  // ln2/2: the edge of the reduced range
  base[3] = -86.9f;
  for (int n = 1; n <= 40; ++n) {
    std::vector<float> s(base.begin(), base.begin() + n);
    const float mx = 0.5f;  // s - mx is what gets exponentiated
    for (float& v : s) v += mx;
    std::vector<float> in = s;
    const float sum = cpu::exp_shift_sum_avx2(s.data(), n, mx);
    double want_sum = 0.0;
    for (int j = 0; j < n; ++j) {
      const double x = double(in[size_t(j)]) - double(mx);
      const double want = std::exp(x);
      want_sum += want;
      if (x >= -87.0)
        EXPECT_NEAR(s[size_t(j)], want, 1e-6 * want) << "n " << n << " x " << x;
      else
        EXPECT_LE(s[size_t(j)], 2e-38) << "n " << n << " x " << x;
    }
    EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum + 1e-37) << "n " << n;
  }
}

}  // namespace
}  // namespace anvil::test
