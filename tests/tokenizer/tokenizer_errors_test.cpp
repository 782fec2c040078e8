// Unsupported or malformed tokenizer.json content is rejected at load with an error that names
// the offending field; each case has its own test.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace anvil {
namespace {

using nlohmann::json;

// A minimal valid byte-level tokenizer: a, b, c, ab, abc plus the space byte (Ġ).
json minimal() {
  return json::parse(R"({
    "version": "1.0",
    "added_tokens": [{"id": 6, "content": "<|end|>", "special": true, "lstrip": false, "rstrip": false,
                      "normalized": false, "single_word": false}],
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "byte_fallback": false, "ignore_merges": false,
              "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4, "Ġ": 5},
              "merges": ["a b", "ab c"]}
  })");
}

Status load_error(const json& j) {
  auto r = Tokenizer::from_json_text(j.dump(), "test.json");
  EXPECT_FALSE(r.is_ok()) << "expected a load error";
  return r.is_ok() ? Status::ok() : r.status();
}

#define EXPECT_ERROR_MENTIONS(st, code_, text)                                    \
  do {                                                                             \
    const Status _s = (st);                                                        \
    EXPECT_EQ(_s.code(), code_) << _s.message();                                   \
    EXPECT_NE(_s.message().find(text), std::string::npos) << _s.message();         \
    EXPECT_NE(_s.message().find("test.json"), std::string::npos) << _s.message();  \
  } while (0)

TEST(TokenizerLoad, MinimalIsValidAndMerges) {
  auto r = Tokenizer::from_json_text(minimal().dump(), "test.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ((*r)->encode("abc ab<|end|>"), (std::vector<int32_t>{4, 5, 3, 6}));
  EXPECT_EQ((*r)->vocab_size(), 7);
}

TEST(TokenizerLoad, MergesAsPairsEqualMergesAsStrings) {
  json j = minimal();
  j["model"]["merges"] = json::parse(R"([["a", "b"], ["ab", "c"]])");
  auto r = Tokenizer::from_json_text(j.dump(), "test.json");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ((*r)->encode("abc ab"), (std::vector<int32_t>{4, 5, 3}));
}

TEST(TokenizerLoad, IgnoreMergesEmitsWholeVocabWords) {
  json j = minimal();
  j["model"]["merges"] = json::parse(R"(["a b"])");  // no path from "ab c" to "abc"
  auto plain = Tokenizer::from_json_text(j.dump(), "test.json");
  ASSERT_TRUE(plain.is_ok());
  EXPECT_EQ((*plain)->encode("abc"), (std::vector<int32_t>{3, 2}));
  j["model"]["ignore_merges"] = true;
  auto ignore = Tokenizer::from_json_text(j.dump(), "test.json");
  ASSERT_TRUE(ignore.is_ok());
  EXPECT_EQ((*ignore)->encode("abc"), (std::vector<int32_t>{4}));
}

TEST(TokenizerLoad, MissingFile) {
  auto r = Tokenizer::load("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/dir/tokenizer.json"), std::string::npos);
}

TEST(TokenizerLoad, MalformedJson) {
  auto r = Tokenizer::from_json_text("{\"model\": {\"type\": \"BPE\",", "test.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("malformed JSON"), std::string::npos) << r.status().message();
}

TEST(TokenizerLoad, MissingModel) {
  json j = minimal();
  j.erase("model");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "model: missing");
}

TEST(TokenizerLoad, ModelTypeNotBpe) {
  json j = minimal();
  j["model"]["type"] = "WordPiece";
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "model.type");
}

TEST(TokenizerLoad, UnigramModelRefusedByName) {
  json j = minimal();
  j["model"] = json::parse(R"({"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]], "byte_fallback": false})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "model \"Unigram\" is not supported");
}

TEST(TokenizerLoad, UnknownDecoderInsideSequence) {
  json j = minimal();
  j["decoder"] = json::parse(R"({"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "CTC"}]})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "decoder.decoders[1].type: decoder \"CTC\"");
}

TEST(TokenizerLoad, BadMetaspaceReplacement) {
  json j = minimal();
  j["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "ab", "prepend_scheme": "always", "split": true})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "pre_tokenizer.replacement");
  j["pre_tokenizer"] = json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "sometimes"})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "pre_tokenizer.prepend_scheme");
}

TEST(TokenizerLoad, BadReplaceNormalizerRegex) {
  json j = minimal();
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Replace", "pattern": {"Regex": "(x"}, "content": ""}]})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "normalizer.normalizers[0].pattern.Regex");
}

TEST(TokenizerLoad, StripNormalizerNeedsItsFlags) {
  json j = minimal();
  j["normalizer"] = json::parse(R"({"type": "Strip", "strip_left": true})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "normalizer.strip_right");
}

TEST(TokenizerLoad, StripDecoderContentIsOneCharacter) {
  json j = minimal();
  j["decoder"] = json::parse(R"({"type": "Strip", "content": "  ", "start": 1, "stop": 0})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "decoder.content");
  j["decoder"] = json::parse(R"({"type": "Strip", "content": " ", "start": -1, "stop": 0})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "decoder.start");
}

TEST(TokenizerLoad, UnknownPunctuationBehavior) {
  json j = minimal();
  j["pre_tokenizer"] = json::parse(R"({"type": "Punctuation", "behavior": "Sideways"})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "pre_tokenizer.behavior");
}

// byte_fallback is SentencePiece-style BPE's: refused together with a ByteLevel pre-tokenizer.
TEST(TokenizerLoad, ByteFallbackRejected) {
  json j = minimal();
  j["model"]["byte_fallback"] = true;
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "model.byte_fallback");
}

TEST(TokenizerLoad, MissingVocab) {
  json j = minimal();
  j["model"].erase("vocab");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "model.vocab");
}

TEST(TokenizerLoad, MissingMerges) {
  json j = minimal();
  j["model"].erase("merges");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "model.merges");
}

TEST(TokenizerLoad, MergeWithUnknownToken) {
  json j = minimal();
  j["model"]["merges"][1] = "ab zz";
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "model.merges[1]: token \"zz\"");
}

TEST(TokenizerLoad, MergeWithUnknownResult) {
  json j = minimal();
  j["model"]["merges"][1] = "b c";  // "bc" is not in the vocab
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "model.merges[1]: merged token \"bc\"");
}

TEST(TokenizerLoad, MalformedMergeEntry) {
  json j = minimal();
  j["model"]["merges"][0] = 42;
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "model.merges[0]");
}

TEST(TokenizerLoad, UnknownNormalizer) {
  json j = minimal();
  j["normalizer"] = json{{"type", "BertNormalizer"}};
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "normalizer.type: normalizer \"BertNormalizer\"");
}

TEST(TokenizerLoad, UnknownNormalizerInsideSequence) {
  json j = minimal();
  j["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Precompiled", "precompiled_charsmap": ""}]})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "normalizer.normalizers[1].type");
}

TEST(TokenizerLoad, NullNormalizerAndSequenceOfNfcAreAccepted) {
  for (const char* n : {"null", R"({"type": "Sequence", "normalizers": [{"type": "NFC"}]})"}) {
    json j = minimal();
    j["normalizer"] = json::parse(n);
    EXPECT_TRUE(Tokenizer::from_json_text(j.dump(), "test.json").is_ok()) << n;
  }
}

TEST(TokenizerLoad, UnknownPreTokenizer) {
  json j = minimal();
  j["pre_tokenizer"] = json{{"type", "BertPreTokenizer"}};
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "pre_tokenizer.type: pre-tokenizer \"BertPreTokenizer\"");
}

TEST(TokenizerLoad, UnknownSplitBehavior) {
  json j = minimal();
  j["pre_tokenizer"] = json::parse(
      R"({"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Sideways", "invert": false}]})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers[0].behavior");
}

TEST(TokenizerLoad, BadSplitRegex) {
  json j = minimal();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"})");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "pre_tokenizer.pattern.Regex");
}

TEST(TokenizerLoad, UnknownDecoder) {
  json j = minimal();
  j["decoder"] = json{{"type", "WordPiece"}};
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kUnsupported, "decoder.type: decoder \"WordPiece\"");
}

TEST(TokenizerLoad, MalformedAddedToken) {
  json j = minimal();
  j["added_tokens"][0].erase("content");
  EXPECT_ERROR_MENTIONS(load_error(j), StatusCode::kInvalidArgument, "added_tokens[0].content");
}

// Ids index dense tables: one far past any vocabulary (2^31 - 1 once overflowed the table size and
// aborted; 4e8 asked for gigabytes) is refused by name, in the added tokens and in the model's vocab.
TEST(TokenizerLoad, HugeTokenIdsAreRefused) {
  for (int64_t id : {int64_t(2147483647), int64_t(400000000), int64_t(1) << 24}) {
    json a = minimal();
    a["added_tokens"][0]["id"] = id;
    EXPECT_ERROR_MENTIONS(load_error(a), StatusCode::kInvalidArgument, "added_tokens[0].id: " + std::to_string(id) + " is too large");
    json v = minimal();
    v["model"]["vocab"]["abc"] = id;
    EXPECT_ERROR_MENTIONS(load_error(v), StatusCode::kInvalidArgument, "is too large (at most 16777215)");
  }
  json ok = minimal();
  ok["added_tokens"][0]["id"] = (int64_t(1) << 24) - 1;  // the largest id taken
  EXPECT_TRUE(Tokenizer::from_json_text(ok.dump(), "test.json").is_ok());
}

// Split behaviors other than Isolated, checked on a literal "-" pattern with encode/decode of a
// byte-level vocab: the pieces each behavior produces are visible in the ids.
TEST(TokenizerLoad, SplitBehaviorsShapePreTokens) {
  json j = minimal();
  j["model"]["vocab"] = json::parse(R"({"a": 0, "-": 1, "a-": 2, "-a": 3, "--": 4})");
  j["model"]["merges"] = json::parse(R"(["a -", "- a", "- -"])");
  j["added_tokens"] = json::array();
  auto ids_for = [&](const char* behavior) {
    json k = j;
    k["pre_tokenizer"] = json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
    auto t = Tokenizer::from_json_text(k.dump(), "test.json");
    EXPECT_TRUE(t.is_ok()) << t.status().message();
    return t.is_ok() ? (*t)->encode("a--a") : std::vector<int32_t>{};
  };
  EXPECT_EQ(ids_for("Isolated"), (std::vector<int32_t>{0, 1, 1, 0}));            // a | - | - | a
  EXPECT_EQ(ids_for("Removed"), (std::vector<int32_t>{0, 0}));                   // a | a
  EXPECT_EQ(ids_for("MergedWithPrevious"), (std::vector<int32_t>{2, 1, 0}));     // a- | - | a
  EXPECT_EQ(ids_for("MergedWithNext"), (std::vector<int32_t>{0, 1, 3}));         // a | - | -a
  EXPECT_EQ(ids_for("Contiguous"), (std::vector<int32_t>{0, 4, 0}));             // a | -- | a
}

}  // namespace
}  // namespace anvil
