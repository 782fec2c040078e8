// The CPU references of the ops that let a backend sample on the device (backend.h argmax_rows,
// gather_rows) and of the multi-output linears: argmax_rows must pick exactly what the host Sampler
// picks for greedy decoding with suppressed tokens (generate.cpp switches between the two), and the
// fused linears must equal their one-op-at-a-time composition.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "backend_test_util.h"
#include "runtime/sampler.h"

namespace anvil::test {
namespace {

TEST(ArgmaxRows, EqualsGreedySamplerWithSuppression) {
  auto be = make_cpu_backend(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int V = 5003, R = 40;
  std::vector<float> logits(size_t(R) * V);
  for (auto& x : logits) x = nd(rng);
  for (int r = 0; r < R; ++r) {
    float* row = logits.data() + size_t(r) * V;
    if (r % 4 == 1) row[r * 7] = row[r * 7 + 100] = 50.0f;    // a tie: the lower id wins
    if (r % 4 == 2) row[r * 11] = std::nanf(""), row[5] = 40.0f;  // NaN is never chosen
    if (r % 4 == 3) row[17] = 60.0f;                           // the max is suppressed
  }
  const std::vector<int32_t> suppress = {17, 4999};
  std::vector<int32_t> got(R);
  be->argmax_rows(Act{logits.data(), R, V, DType::kF32}, suppress.data(), int(suppress.size()), got.data());
  SamplingParams p;  // temperature 0: greedy
  Sampler s(p);
  s.set_suppressed(suppress);
  for (int r = 0; r < R; ++r) {
    std::vector<float> row(logits.begin() + size_t(r) * V, logits.begin() + size_t(r + 1) * V);
    EXPECT_EQ(got[size_t(r)], s.sample(row.data(), V, {})) << "row " << r;
    EXPECT_NE(got[size_t(r)], 17);
  }
  EXPECT_EQ(got[1], 7);  // row 1: tie between ids 7 and 107
  // No possible token: -1.
  std::vector<float> dead(8, -INFINITY);
  int32_t id = 0;
  be->argmax_rows(Act{dead.data(), 1, 8, DType::kF32}, nullptr, 0, &id);
  EXPECT_EQ(id, -1);
}

TEST(GatherRows, CopiesTheListedRows) {
  auto be = make_cpu_backend(2);
  std::vector<float> src(7 * 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = float(i);
  const std::vector<int32_t> rows = {6, 0, 3, 3};
  std::vector<float> dst(4 * 5, -1.0f);
  be->gather_rows(Act{src.data(), 7, 5, DType::kF32}, rows.data(), Act{dst.data(), 4, 5, DType::kF32});
  for (size_t i = 0; i < rows.size(); ++i)
    for (int c = 0; c < 5; ++c) EXPECT_EQ(dst[i * 5 + c], src[size_t(rows[i]) * 5 + c]);
}

TEST(FusedLinears, EqualTheirComposition) {
  auto be = make_cpu_backend(2);
  const int64_t T = 3, K = 128;
  TestWeight q = make_quant_weight(96, K, 4, 64, DType::kBF16, false, 11u);
  TestWeight k = make_quant_weight(32, K, 4, 64, DType::kBF16, true, 12u);
  TestWeight g = make_dense_weight(48, K, DType::kBF16, false, 13u);
  TestWeight u = make_dense_weight(48, K, DType::kBF16, false, 14u);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> x(size_t(T * K));
  for (auto& v : x) v = nd(rng);
  Act xa{x.data(), T, K, DType::kF32};
  std::vector<float> oq(size_t(T * 96)), ok(size_t(T * 32)), rq(oq.size()), rk(ok.size());
  const WeightMatrix* ws[2] = {&q.w, &k.w};
  const Act outs[2] = {Act{oq.data(), T, 96, DType::kF32}, Act{ok.data(), T, 32, DType::kF32}};
  be->linear_multi(xa, ws, outs);
  be->linear(xa, q.w, Act{rq.data(), T, 96, DType::kF32});
  be->linear(xa, k.w, Act{rk.data(), T, 32, DType::kF32});
  EXPECT_EQ(oq, rq);
  EXPECT_EQ(ok, rk);
  std::vector<float> sw(size_t(T * 48)), gg(sw.size()), uu(sw.size()), ref(sw.size());
  be->linear_swiglu(xa, g.w, u.w, Act{sw.data(), T, 48, DType::kF32});
  be->linear(xa, g.w, Act{gg.data(), T, 48, DType::kF32});
  be->linear(xa, u.w, Act{uu.data(), T, 48, DType::kF32});
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = gg[i] / (1.0f + std::exp(-gg[i])) * uu[i];
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_NEAR(sw[i], ref[i], 1e-6f * (1.0f + std::fabs(ref[i]))) << i;
}

}  // namespace
}  // namespace anvil::test
