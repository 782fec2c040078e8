// linear on the CPU backend against a double-precision reference built from the integer truth of
// the packed weights (backend_test_util.h), for every bit width x group size x scale dtype,
// mat-vec (T = 1), small batches and prefill-sized batches (T = 2, 7, 9, 17: tiles of 4 activation
// rows plus a remainder), with and without bias, output row counts that are not a multiple of the
// kernel's 4-row tile.
//
// Error measure: max |y - ref| / max_r sum_k |W[r,k] x[k]| (+|bias|), i.e. relative to the largest
// magnitude any output could have, so it is scale-free and cannot be met by an all-zero answer.
// Bounds:
//  - fp32 paths (scalar, dense, matmul): n fp32 roundings in a sum of n terms stay below ~n*6e-8
//    worst case (here n <= 2112 gives 1.3e-4; typical error is ~1e-6), so 2e-4;
//  - the AVX2 integer kernels (every bit width, any T) quantize x to int16 per group (step max|x_g|/32767: each term off
//    by at most |w|*max|x_g|/65534, i.e. <= 1/65534 relative for |x| ~ U(-1,1) against E|x| = 1/2,
//    ~3e-5) plus fp32 accumulation: 3e-4.
// A wrong nibble order, group index or scale/bias mix-up gives errors of order 1e-1..1.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend_test_util.h"

namespace anvil::test {
namespace {

struct LinearRef {
  std::vector<double> y, mag;
};

LinearRef reference_linear(const TestWeight& t, const std::vector<float>& x, int64_t T) {
  const int64_t N = t.w.rows, K = t.w.cols;
  LinearRef r;
  r.y.resize(size_t(T * N));
  r.mag.resize(size_t(T * N));
  for (int64_t i = 0; i < T; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double s = t.bias_ref[size_t(n)], m = std::fabs(t.bias_ref[size_t(n)]);
      for (int64_t k = 0; k < K; ++k) {
        const double p = t.ref[size_t(n * K + k)] * double(x[size_t(i * K + k)]);
        s += p;
        m += std::fabs(p);
      }
      r.y[size_t(i * N + n)] = s;
      r.mag[size_t(i * N + n)] = m;
    }
  return r;
}

double run_linear(Backend& be, const TestWeight& t, const std::vector<float>& x, int64_t T, std::vector<float>* y_out) {
  auto up = be.upload_weight(t.w);
  EXPECT_TRUE(up.is_ok()) << up.status().to_string();
  if (!up.is_ok()) return INFINITY;
  Guarded y(size_t(T * t.w.rows));
  be.linear(Act{const_cast<float*>(x.data()), T, t.w.cols, DType::kF32}, *up, y.act(T, t.w.rows));
  EXPECT_TRUE(y.guards_intact()) << "linear wrote outside its output";
  if (y_out) y_out->assign(y.data(), y.data() + y.size());
  LinearRef ref = reference_linear(t, x, T);
  return normalized_error(y.data(), ref.y, ref.mag);
}

// bits, group, scale dtype, T, bias
using QuantParam = std::tuple<int, int, DType, int, bool>;
class QuantLinearTest : public ::testing::TestWithParam<QuantParam> {
 protected:
  void TearDown() override { cpu_set_force_scalar(false); }
};

TEST_P(QuantLinearTest, MatchesReference) {
  const auto [bits, group, sdt, T, bias] = GetParam();
  const int64_t N = 37, K = 256;
  TestWeight t = make_quant_weight(N, K, bits, group, sdt, bias, 1000u + bits * 10 + group);
  std::vector<float> x = random_floats(size_t(T * K), 7u + T);
  auto be = make_cpu_backend(2);
  for (bool scalar : {false, true}) {
    cpu_set_force_scalar(scalar);
    const bool int16_path = !scalar && cpu_has_avx2();  // (every bit width since session 31)
    EXPECT_LT(run_linear(*be, t, x, T, nullptr), int16_path ? 3e-4 : 2e-4) << (scalar ? "scalar" : "default") << " path";
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, QuantLinearTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 8), ::testing::Values(32, 64, 128),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(1, 2, 7, 9, 17), ::testing::Bool()));

// Column counts that stress the kernels' blocking: a 4-bit g32 row of 96 (not a whole 64-element
// block: generic path), and rows of 2112 (66 groups of 32: more than one staged chunk of 64 groups
// plus a tail of 2 that is not a multiple of 8).
TEST(QuantLinear, BlockingEdgeShapes) {
  auto be = make_cpu_backend(2);
  for (int bits : {4, 8})
    for (int64_t K : {int64_t(96), int64_t(2112)})
      for (int T : {1, 3}) {
        TestWeight t = make_quant_weight(19, K, bits, 32, DType::kBF16, true, 55u + bits);
        std::vector<float> x = random_floats(size_t(T * K), 9u);
        EXPECT_LT(run_linear(*be, t, x, T, nullptr), 3e-4) << "bits " << bits << " K " << K << " T " << T;
      }
}

// The packed-stream kernels (2, 3, 5, 6 bits) load 16 bytes per 16 elements, of which they use
// 2 * bits: a matrix whose last byte is the last readable one (the next page unmapped, as the end of
// an mmapped checkpoint can be) must be read without touching the page after it, and give the
// same result as anywhere else.
TEST(QuantLinear, PackedWidthsNeverReadPastTheWeights) {
  const long page = sysconf(_SC_PAGESIZE);
  auto be = make_cpu_backend(2);
  for (int bits : {2, 3, 5, 6})
    for (int T : {1, 5}) {
      TestWeight t = make_quant_weight(13, 256, bits, 64, DType::kBF16, false, 900u + bits);
      const size_t bytes = t.packed.size() * sizeof(uint32_t);
      ASSERT_LE(bytes, size_t(page));
      void* m = mmap(nullptr, size_t(2 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      ASSERT_NE(m, MAP_FAILED);
      ASSERT_EQ(mprotect(static_cast<uint8_t*>(m) + page, size_t(page), PROT_NONE), 0);
      uint8_t* data = static_cast<uint8_t*>(m) + page - bytes;  // ends where the unmapped page begins
      std::memcpy(data, t.packed.data(), bytes);
      std::vector<float> x = random_floats(size_t(T * 256), 21u);
      std::vector<float> y_heap, y_edge;
      EXPECT_LT(run_linear(*be, t, x, T, &y_heap), 3e-4) << "bits " << bits;
      t.w.data = data;
      EXPECT_LT(run_linear(*be, t, x, T, &y_edge), 3e-4) << "bits " << bits << " at the page edge";
      EXPECT_EQ(y_heap, y_edge) << "bits " << bits;
      munmap(m, size_t(2 * page));
    }
}

// The AVX2 kernels and the portable scalar path must agree (when this CPU has AVX2).
TEST(QuantLinear, Avx2AgreesWithScalar) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  auto be = make_cpu_backend(2);
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128})
      for (int T : {1, 9}) {
        TestWeight t = make_quant_weight(41, 512, bits, group, DType::kBF16, false, 77u + bits + group);
        std::vector<float> x = random_floats(size_t(T * 512), 3u);
        std::vector<float> ya, ys;
        cpu_set_force_scalar(false);
        run_linear(*be, t, x, T, &ya);
        cpu_set_force_scalar(true);
        run_linear(*be, t, x, T, &ys);
        cpu_set_force_scalar(false);
        LinearRef ref = reference_linear(t, x, T);
        std::vector<double> ysd(ys.begin(), ys.end());
        EXPECT_LT(normalized_error(ya.data(), ysd, ref.mag), 3e-4) << "bits " << bits << " group " << group << " T " << T;
      }
}

// dtype, T, bias, cols
using DenseParam = std::tuple<DType, int, bool, int>;
class DenseLinearTest : public ::testing::TestWithParam<DenseParam> {
 protected:
  void TearDown() override { cpu_set_force_scalar(false); }
};

TEST_P(DenseLinearTest, MatchesReference) {
  const auto [dt, T, bias, K] = GetParam();
  TestWeight t = make_dense_weight(29, K, dt, bias, 300u + K);
  std::vector<float> x = random_floats(size_t(T * K), 11u);
  auto be = make_cpu_backend(2);
  for (bool scalar : {false, true}) {
    cpu_set_force_scalar(scalar);
    EXPECT_LT(run_linear(*be, t, x, T, nullptr), 2e-4) << (scalar ? "scalar" : "default") << " path";
  }
}

// 100 and 47 columns leave tails after the 32/16/8-wide SIMD loops.
INSTANTIATE_TEST_SUITE_P(AllDtypes, DenseLinearTest,
                         ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                                            ::testing::Values(1, 5), ::testing::Bool(), ::testing::Values(256, 100, 47)));

TEST(UploadWeight, RejectsUnsupportedFormats) {
  auto be = make_cpu_backend(1);
  TestWeight t = make_quant_weight(4, 128, 4, 64, DType::kBF16, false, 1u);
  WeightMatrix w = t.w;
  w.bits = 7;
  EXPECT_FALSE(be->upload_weight(w).is_ok());
  w = t.w;
  w.group_size = 48;
  EXPECT_FALSE(be->upload_weight(w).is_ok());
  w = t.w;
  w.scales = nullptr;
  EXPECT_FALSE(be->upload_weight(w).is_ok());
  EXPECT_TRUE(be->upload_weight(t.w).is_ok());
}

}  // namespace
}  // namespace anvil::test
