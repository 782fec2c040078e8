// The NFC normalizer only runs utf8proc on segments that can change; the result must equal
// utf8proc's NFC of the whole text (the reference), for texts mixing inert and composing characters.
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <random>

#include "tokenizer/normalizer.h"

namespace anvil {
namespace {

std::string reference_nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                              utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  EXPECT_GE(n, 0);
  std::string r(reinterpret_cast<char*>(out), size_t(n));
  std::free(out);
  return r;
}

TEST(TokenizerNormalizer, SegmentedNfcEqualsWholeTextNfc) {
  auto nfc = tok::Normalizer::from_json(nlohmann::json{{"type", "NFC"}});
  ASSERT_TRUE(nfc.is_ok());
  const std::vector<std::string> pieces = {
      "e", "\xCC\x81" /*U+0301*/, "\xCC\xA3" /*U+0323*/, "A", "\xCC\x8A" /*U+030A*/, "\xC3\xA9", " ", "\n", "\xE1\x84\x80" /*U+1100 L*/,
      "\xE1\x85\xA1" /*U+1161 V*/, "\xE1\x86\xA8" /*U+11A8 T*/, "\xEA\xB0\x80" /*U+AC00*/, "\xE3\x81\x8B" /*か*/,
      "\xE3\x82\x99" /*U+3099*/, "\xE4\xBD\xA0", "\xF0\x9F\x91\x8D", "\xE2\x84\xAB" /*U+212B Angstrom*/,
      "\xCD\x84" /*U+0344*/, "\xE1\xBA\x9B" /*U+1E9B*/, "x", "\xEF\xAC\x81" /*U+FB01 ligature (compat only)*/};
  std::mt19937 rng(5);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    for (size_t k = 0, n = rng() % 12; k < n; ++k) s += pieces[rng() % pieces.size()];
    ASSERT_EQ(nfc->apply(s), reference_nfc(s)) << s;
  }
}

TEST(TokenizerNormalizer, NullNormalizerIsIdentity) {
  auto none = tok::Normalizer::from_json(nlohmann::json());
  ASSERT_TRUE(none.is_ok());
  EXPECT_EQ(none->apply("e\xCC\x81"), "e\xCC\x81");
}

}  // namespace
}  // namespace anvil
