#include <gtest/gtest.h>

#include "base/dtype.h"
#include "base/status.h"
#include "base/thread_pool.h"

#include <atomic>
#include <cmath>

using namespace anvil;

static Result<int> parse_positive(int x) {
  if (x <= 0) return invalid_argument("expected a positive value, got " + std::to_string(x));
  return x;
}
static Status twice(int x, int* out) {
  ANVIL_ASSIGN_OR_RETURN(int v, parse_positive(x));
  *out = 2 * v;
  return Status::ok();
}

TEST(Status, PropagatesErrors) {
  int out = 0;
  EXPECT_TRUE(twice(3, &out).is_ok());
  EXPECT_EQ(out, 6);
  Status s = twice(-1, &out);
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.with_context("config.json").message().find("config.json: expected a positive"), std::string::npos);
}

TEST(DType, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65280.0f, 0.5f})
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(f)), f) << f;
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 512)), 1.0f + 1.0f / 128);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripIncludingSubnormals) {
  // Every finite f16 bit pattern survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t b = uint16_t(h);
    if (((b >> 10) & 0x1f) == 0x1f) continue;
    EXPECT_EQ(f32_to_f16(f16_to_f32(b)), b) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(1e6f), 0x7c00);
}
