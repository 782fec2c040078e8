// base/sample_math.h: the deterministic exp against libm (it must be a faithful exp, not just a
// reproducible one), the integer draw target against 128-bit arithmetic, and the order key.
#include "base/sample_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace anvil::sampling {
namespace {

TEST(SampleMath, DetExpIsAccurate) {
  EXPECT_EQ(det_exp(0.0), 1.0);  // the top token's weight is exactly 2^44
  EXPECT_EQ(det_exp(-INFINITY), 0.0);
  EXPECT_EQ(det_exp(NAN), 0.0);
  EXPECT_EQ(det_exp(-709.0), 0.0);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> ud(-708.0, 0.0);
  double worst = 0.0;
  for (int i = 0; i < 200000; ++i) {
    // Inputs are float differences in the sampler; test doubles of both kinds.
    const double x = i % 2 ? ud(rng) : double(float(ud(rng) * (i % 4 == 1 ? 1e-3 : 1.0)));
    const double want = std::exp(x);
    worst = std::max(worst, std::abs(det_exp(x) - want) / want);
  }
  // Measured worst relative error 3.2e-16 (about 1.4 ulp); a broken coefficient or reduction
  // constant gives >1e-13.
  EXPECT_LT(worst, 6e-16) << worst;
}

TEST(SampleMath, DrawTargetIsFloorOfProduct) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t u = rng() >> 11, total = rng() >> (1 + i % 40);
    const unsigned __int128 p = (unsigned __int128)u * total;
    const uint64_t want = uint64_t(p >> 53);
    ASSERT_EQ(draw_target(u, total), want) << u << " " << total;
    ASSERT_LT(draw_target(u, total), total == 0 ? 1 : total);
  }
  EXPECT_EQ(draw_target((1ull << 53) - 1, 1ull << 62), (1ull << 62) - (1ull << 9));
}

TEST(SampleMath, OrderKeyFollowsFloatOrder) {
  const float v[] = {-INFINITY, -3e38f, -1.0f, -1e-30f, -0.0f, 0.0f, 1e-30f, 1.0f, 2.5f, 3e38f, INFINITY};
  for (size_t i = 0; i + 1 < std::size(v); ++i) {
    if (v[i] == v[i + 1]) EXPECT_EQ(order_key(v[i]), order_key(v[i + 1]));
    else EXPECT_LT(order_key(v[i]), order_key(v[i + 1])) << v[i] << " " << v[i + 1];
  }
}

TEST(SampleMath, WeightsBelowTheCutoffAreZero) {
  EXPECT_EQ(weight_fixed(det_exp(double(kMinRelLogit))), 0u);
  EXPECT_EQ(weight_fixed(det_exp(0.0)), uint64_t(1) << kWeightBits);
  EXPECT_GT(weight_fixed(det_exp(-30.0)), 0u);
}

}  // namespace
}  // namespace anvil::sampling
