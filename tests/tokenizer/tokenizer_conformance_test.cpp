// Exact conformance with Hugging Face tokenizers on the corpus (tests/data/tokenizer/, made by
// scripts/make_tokenizer_fixtures.py): ids, decode, decode(skip_special), vocab facts.
#include <gtest/gtest.h>

#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

using test::cached_tokenizer;
using test::fnv1a64;

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, EncodeAndDecodeMatchTokenizers) {
  const Tokenizer& tok = cached_tokenizer(GetParam());
  const auto corpus = test::load_corpus();
  int checked = 0;
  for (const auto& e : test::read_jsonl(test::tokenizer_data("expected_" + GetParam() + ".jsonl"))) {
    const std::string name = e["name"];
    if (name == "meta" || e.contains("decode_ids")) continue;
    SCOPED_TRACE(GetParam() + " / " + name);
    ASSERT_TRUE(corpus.count(name)) << "corpus entry missing: " << name;
    const std::vector<int32_t> ids = tok.encode(corpus.at(name));
    if (e.contains("ids")) {
      EXPECT_EQ(ids, e["ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(tok.decode(ids), e["decoded"].get<std::string>());
      EXPECT_EQ(tok.decode(ids, true), e["decoded_skip"].get<std::string>());
    } else {
      const auto head = e["head"].get<std::vector<int32_t>>();
      ASSERT_EQ(ids.size(), e["n_ids"].get<size_t>());
      EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + ptrdiff_t(head.size())), head);
      EXPECT_EQ(fnv1a64(ids.data(), ids.size() * 4), e["ids_fnv"].get<std::string>());
      const std::string d = tok.decode(ids), ds = tok.decode(ids, true);
      EXPECT_EQ(fnv1a64(d.data(), d.size()), e["decoded_fnv"].get<std::string>());
      EXPECT_EQ(fnv1a64(ds.data(), ds.size()), e["decoded_skip_fnv"].get<std::string>());
    }
    ++checked;
  }
  EXPECT_EQ(checked, int(corpus.size()));
}

TEST_P(Conformance, RandomIdSequencesDecodeLikeTokenizers) {
  const Tokenizer& tok = cached_tokenizer(GetParam());
  int checked = 0;
  for (const auto& e : test::read_jsonl(test::tokenizer_data("expected_" + GetParam() + ".jsonl"))) {
    if (!e.contains("decode_ids")) continue;
    const auto ids = e["decode_ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(e["name"].get<std::string>());
    EXPECT_EQ(tok.decode(ids), e["decoded"].get<std::string>());
    EXPECT_EQ(tok.decode(ids, true), e["decoded_skip"].get<std::string>());
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST_P(Conformance, VocabFactsMatchTokenizers) {
  const Tokenizer& tok = cached_tokenizer(GetParam());
  const auto lines = test::read_jsonl(test::tokenizer_data("expected_" + GetParam() + ".jsonl"));
  ASSERT_FALSE(lines.empty());
  const auto& meta = lines[0];
  ASSERT_EQ(meta["name"], "meta");
  EXPECT_EQ(tok.vocab_size(), meta["vocab_size"].get<int>());
  for (auto it = meta["id_to_token"].begin(); it != meta["id_to_token"].end(); ++it) {
    const int32_t id = std::stoi(it.key());
    EXPECT_EQ(tok.id_to_token(id), it.value().get<std::string>());
    EXPECT_EQ(tok.token_to_id(it.value().get<std::string>()), id);
  }
  const auto special = meta["special_ids"].get<std::vector<int32_t>>();
  for (int32_t id : meta["added_ids"].get<std::vector<int32_t>>()) {
    const bool want = std::find(special.begin(), special.end(), id) != special.end();
    EXPECT_EQ(tok.is_special(id), want) << "id " << id;
    EXPECT_EQ(tok.token_to_id(tok.id_to_token(id)), id);
  }
  EXPECT_FALSE(tok.is_special(-1));
  EXPECT_FALSE(tok.is_special(tok.vocab_size()));
  EXPECT_EQ(tok.id_to_token(tok.vocab_size()), "");
  EXPECT_EQ(tok.token_to_id("\x01no such token\x02"), std::nullopt);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Conformance, ::testing::ValuesIn(test::fixture_tokenizers()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// Encoding is deterministic and the pre-token cache does not change results: encode the corpus
// twice, in reverse order the second time, and compare.
TEST(TokenizerCache, SecondPassMatchesFirst) {
  const Tokenizer& tok = cached_tokenizer("qwen3");
  const auto corpus = test::load_corpus();
  std::vector<std::vector<int32_t>> first;
  for (const auto& [name, text] : corpus) first.push_back(tok.encode(text));
  size_t i = first.size();
  for (auto it = corpus.rbegin(); it != corpus.rend(); ++it) EXPECT_EQ(tok.encode(it->second), first[--i]) << it->first;
}

// Invalid UTF-8 input is treated as its lossy repair (tokenizers accepts only valid strings).
TEST(TokenizerInput, InvalidUtf8IsRepairedLikeLossyDecoding) {
  const Tokenizer& tok = cached_tokenizer("qwen3");
  EXPECT_EQ(tok.encode("a\xff" "b\xe2\x82"), tok.encode("a\xEF\xBF\xBD" "b\xEF\xBF\xBD"));
}

}  // namespace
}  // namespace anvil
