// The CPU backend's numerical contract (docs/architecture.md): an output row of linear depends only
// on its input row and the weights — not on how many rows are in the batch, which other rows they
// are, or how many threads run it (1, 2, and 16: more threads than this machine has cores). Results
// are compared bit for bit. Every shape below is checked to split into several thread chunks, so a
// thread-dependent reduction would show.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend_test_util.h"

namespace anvil::test {
namespace {

struct Case {
  const char* name;
  int bits;  // 0: dense
  int group;
  DType dt;
};

std::vector<float> run(Backend& be, const WeightMatrix& w, const float* x, int64_t T) {
  auto up = be.upload_weight(w);
  EXPECT_TRUE(up.is_ok());
  std::vector<float> y(size_t(T * w.rows), -1.0f);
  be.linear(Act{const_cast<float*>(x), T, w.cols, DType::kF32}, *up, Act{y.data(), T, w.rows, DType::kF32});
  return y;
}

void check_invariance(bool force_scalar) {
  const Case cases[] = {{"q4g64/bf16", 4, 64, DType::kBF16}, {"q8g32/f16", 8, 32, DType::kF16},
                        {"q3g32/bf16", 3, 32, DType::kBF16}, {"q4g128/f32", 4, 128, DType::kF32},
                        {"dense bf16", 0, 0, DType::kBF16},   {"dense f32", 0, 0, DType::kF32},
                        {"dense f16", 0, 0, DType::kF16}};
  const int64_t K = 1028;  // dense: a tail past the 8-lane steps
  const int64_t T = 9;  // tiles of 3 activation rows, parallel x quantization (T >= 8), a remainder
  cpu_set_force_scalar(force_scalar);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t k = c.bits ? 1024 : K;
    const int64_t N = 2003;  // not a multiple of any tile or block
    TestWeight t = c.bits ? make_quant_weight(N, k, c.bits, c.group, c.dt, true, 77u)
                          : make_dense_weight(N, k, c.dt, true, 78u);
    const int64_t min_chunk = cpu::linear_min_chunk_rows(t.w, T);
    ASSERT_GE(N, 3 * min_chunk) << "the shape must split into several thread chunks";
    std::vector<float> x = random_floats(size_t(T * k), 9u);
    std::vector<float> ref;
    for (int threads : {1, 2, 16}) {
      auto be = make_cpu_backend(threads);
      std::vector<float> all = run(*be, t.w, x.data(), T);
      if (ref.empty()) ref = all;
      EXPECT_EQ(0, std::memcmp(all.data(), ref.data(), ref.size() * 4)) << threads << " threads";
      // Each row alone (mat-vec) and in a batch of 2 with another row gives the same bits.
      for (int64_t r = 0; r < T; ++r) {
        std::vector<float> one = run(*be, t.w, x.data() + r * k, 1);
        EXPECT_EQ(0, std::memcmp(one.data(), ref.data() + r * N, size_t(N) * 4)) << "row " << r << " alone, " << threads;
        std::vector<float> pair(x.begin() + r * k, x.begin() + (r + 1) * k);
        pair.insert(pair.end(), x.begin() + ((r + 3) % T) * k, x.begin() + ((r + 3) % T + 1) * k);
        std::vector<float> two = run(*be, t.w, pair.data(), 2);
        EXPECT_EQ(0, std::memcmp(two.data(), ref.data() + r * N, size_t(N) * 4)) << "row " << r << " in a pair";
      }
      // Small decode batches (3 and 4 rows: the in-register bf16/f16 path's tiles) give each row's bits.
      for (int64_t n : {3, 4}) {
        std::vector<float> xs;
        for (int64_t i = 0; i < n; ++i) xs.insert(xs.end(), x.begin() + ((2 * i + 1) % T) * k, x.begin() + ((2 * i + 1) % T + 1) * k);
        std::vector<float> got = run(*be, t.w, xs.data(), n);
        for (int64_t i = 0; i < n; ++i)
          EXPECT_EQ(0, std::memcmp(got.data() + i * N, ref.data() + ((2 * i + 1) % T) * N, size_t(N) * 4))
              << "row " << (2 * i + 1) % T << " in a batch of " << n << ", " << threads << " threads";
      }
    }
  }
  cpu_set_force_scalar(false);
}

}  // namespace

TEST(CpuInvariance, LinearRowsIndependentOfBatchAndThreads) { check_invariance(false); }
TEST(CpuInvariance, LinearRowsIndependentOfBatchAndThreadsScalar) { check_invariance(true); }

}  // namespace anvil::test

namespace anvil::test {
namespace {

// The AVX-512 VNNI form of the quantized mat-vec (cpu_qdot_avx2.cpp) gives the AVX2 kernel's results
// bit for bit, for every format it takes, an odd number of groups (the single-block tail), batches of
// 1..4 rows and more (several passes), so which one a machine runs never changes an output.
TEST(CpuInvariance, Avx512MatVecEqualsAvx2BitForBit) {
  cpu_set_avx512(true);
  if (!cpu_use_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 VNNI (or no AVX2): nothing to compare";
  struct F {
    int bits, group;
    DType dt;
  };
  int compared = 0;
  for (const F& f : {F{4, 64, DType::kBF16}, F{4, 128, DType::kF16}, F{8, 32, DType::kBF16}, F{8, 64, DType::kF32},
                     F{8, 128, DType::kBF16}, F{4, 32, DType::kBF16}})
    for (int64_t K : {int64_t(1024), int64_t(64 * 17), int64_t(128 * 9)}) {  // even and odd group counts
      if (K % f.group != 0 || K % (16 * (16 / f.bits)) != 0) continue;
      SCOPED_TRACE("q" + std::to_string(f.bits) + "g" + std::to_string(f.group) + " K=" + std::to_string(K));
      TestWeight t = make_quant_weight(301, K, f.bits, f.group, f.dt, true, 91u + unsigned(K));
      for (int64_t T : {1, 2, 3, 4, 7}) {
        std::vector<float> x = random_floats(size_t(T * K), 5u + unsigned(T));
        auto be = make_cpu_backend(2);
        cpu_set_avx512(false);
        const std::vector<float> ref = run(*be, t.w, x.data(), T);
        cpu_set_avx512(true);
        const std::vector<float> got = run(*be, t.w, x.data(), T);
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 4)) << "T=" << T;
        ++compared;
      }
    }
  cpu_set_avx512(true);
  EXPECT_GT(compared, 40);
}

}  // namespace
}  // namespace anvil::test
