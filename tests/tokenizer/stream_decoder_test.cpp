// StreamDecoder property: for any id sequence, concat(push...) + flush() == decode(all) and every
// chunk is valid UTF-8. decode() itself is checked against tokenizers in the conformance test.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

void expect_stream_matches_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder sd(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = sd.push(id);
    ASSERT_TRUE(tok::is_valid_utf8(chunk)) << "invalid UTF-8 chunk after id " << id;
    all += chunk;
  }
  const std::string tail = sd.flush();
  ASSERT_TRUE(tok::is_valid_utf8(tail));
  all += tail;
  ASSERT_EQ(all, tok.decode(ids, skip));
}

class StreamDecode : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamDecode, CorpusEncodingsStreamExactly) {
  const Tokenizer& tok = test::cached_tokenizer(GetParam());
  for (const auto& [name, text] : test::load_corpus()) {
    SCOPED_TRACE(name);
    const auto ids = tok.encode(text);
    expect_stream_matches_decode(tok, ids, false);
    expect_stream_matches_decode(tok, ids, true);
  }
}

TEST_P(StreamDecode, RandomIdSequencesStreamExactly) {
  const Tokenizer& tok = test::cached_tokenizer(GetParam());
  std::mt19937 rng(99);
  // Byte-level tokens that are lone UTF-8 lead/continuation bytes make partial scalars likely.
  std::vector<int32_t> byte_ids;
  for (int b = 0x80; b < 0x100; ++b) {
    std::string tokstr;
    tok::append_utf8(tokstr, tok::byte_to_codepoint()[b]);
    if (auto id = tok.token_to_id(tokstr)) byte_ids.push_back(*id);
  }
  ASSERT_FALSE(byte_ids.empty());
  for (int iter = 0; iter < 400; ++iter) {
    std::vector<int32_t> ids(1 + rng() % 20);
    for (auto& id : ids) id = (rng() % 2) ? int32_t(rng() % uint32_t(tok.vocab_size())) : byte_ids[rng() % byte_ids.size()];
    expect_stream_matches_decode(tok, ids, iter % 2 == 1);
  }
}

TEST_P(StreamDecode, EmojiAndCjkSplitAcrossTokensAreHeldBack) {
  const Tokenizer& tok = test::cached_tokenizer(GetParam());
  // Encode each byte separately so that every multi-byte scalar spans several tokens.
  const std::string text = "你好👨‍👩‍👧 é\xCC\x81 日本";
  std::vector<int32_t> ids;
  for (unsigned char c : text) {
    std::string t;
    tok::append_utf8(t, tok::byte_to_codepoint()[c]);
    auto id = tok.token_to_id(t);
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
  }
  StreamDecoder sd(tok);
  std::string all;
  int empty_pushes = 0;
  for (int32_t id : ids) {
    const std::string chunk = sd.push(id);
    EXPECT_TRUE(tok::is_valid_utf8(chunk));
    empty_pushes += chunk.empty();
    all += chunk;
  }
  EXPECT_EQ(sd.flush(), "");
  EXPECT_EQ(all, text);
  EXPECT_GT(empty_pushes, 10);  // partial scalars were held back, not emitted as U+FFFD
}

TEST_P(StreamDecode, UnfinishedScalarBecomesReplacementOnFlush) {
  const Tokenizer& tok = test::cached_tokenizer(GetParam());
  std::vector<int32_t> ids;
  for (unsigned char c : std::string("a\xF0\x9F\x98")) {  // a + the first 3 bytes of an emoji
    std::string t;
    tok::append_utf8(t, tok::byte_to_codepoint()[c]);
    ids.push_back(*tok.token_to_id(t));
  }
  StreamDecoder sd(tok);
  std::string got;
  for (int32_t id : ids) got += sd.push(id);
  EXPECT_EQ(got, "a");
  EXPECT_EQ(sd.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(ids), "a\xEF\xBF\xBD");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, StreamDecode, ::testing::ValuesIn(test::fixture_tokenizers()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

// Lossy decoding follows "substitution of maximal subparts" (Unicode ch. 3, U+FFFD), as Rust's
// from_utf8_lossy does; these are the standard's own examples.
TEST(Utf8Lossy, MaximalSubparts) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(tok::utf8_lossy("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64"), "a" + R + R + R + "b" + R + "c" + R + R + "d");
  EXPECT_EQ(tok::utf8_lossy("\xC0\xAF\xE0\x80\xBF\xF0\x81\x82\x41"), R + R + R + R + R + R + R + R + "A");
  EXPECT_EQ(tok::utf8_lossy("\xED\xA0\x80\xED\xBF\xBF\xED\xAF\x41"), R + R + R + R + R + R + R + R + "A");
  EXPECT_EQ(tok::utf8_lossy("\xF4\x91\x92\x93\xFF\x41\x80\xBF\x42"), R + R + R + R + R + "A" + R + R + "B");
  EXPECT_EQ(tok::utf8_lossy("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF\x41"), R + R + R + R + "A");
}

TEST(ByteLevelTable, IsABijectionOntoPrintableCodePoints) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = tok::byte_to_codepoint()[b];
    EXPECT_TRUE(seen.insert(cp).second);
    EXPECT_EQ(tok::codepoint_to_byte(cp), b);
    EXPECT_FALSE(cp <= 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) << b;  // never space/control
  }
  EXPECT_EQ(tok::byte_to_codepoint()[' '], 0x120u);  // 'Ġ', the mark every GPT-2 style vocab uses
}

}  // namespace
}  // namespace anvil
