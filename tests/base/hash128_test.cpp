#include "base/hash128.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <string>

namespace anvil {
namespace {

TEST(Hash128, MatchesXxh3OneShotAndStreamingInAnySplit) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s.push_back(char(i * 31 + 7));
  XXH128_hash_t ref = XXH3_128bits(s.data(), s.size());
  Hash128 one = hash128(s.data(), s.size());
  EXPECT_EQ(one.lo, ref.low64);
  EXPECT_EQ(one.hi, ref.high64);
  for (size_t cut : {size_t(0), size_t(1), size_t(17), size_t(999), size_t(1000)}) {
    Hasher128 h;
    h.update(s.data(), cut);
    h.update(s.data() + cut, s.size() - cut);
    EXPECT_EQ(h.digest(), one) << "split at " << cut;
  }
}

TEST(Hash128, HexRoundTripAndRejectsBadText) {
  Hash128 h{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(h.hex(), "fedcba98765432100123456789abcdef");
  Hash128 back;
  ASSERT_TRUE(Hash128::from_hex(h.hex(), &back));
  EXPECT_EQ(back, h);
  EXPECT_FALSE(Hash128::from_hex("xyz", &back));
  EXPECT_FALSE(Hash128::from_hex(std::string(32, 'G'), &back));
  EXPECT_FALSE(Hash128::from_hex(std::string(31, '0'), &back));
}

TEST(Hash128, OneByteChangesTheDigest) {
  std::string a(4096, 'a'), b = a;
  b[2049] = 'b';
  EXPECT_NE(hash128(a.data(), a.size()), hash128(b.data(), b.size()));
}

}  // namespace
}  // namespace anvil
