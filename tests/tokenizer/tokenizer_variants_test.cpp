// Exact conformance with Hugging Face tokenizers for the SentencePiece-style layouts (Mistral /
// Mixtral's Prepend+Replace normalizer, Llama 2's Metaspace in every prepend_scheme and split,
// byte fallback, unk with and without fuse_unk) and for each other normalizer, pre-tokenizer and
// decoder component. The variants (a base tokenizer.json plus replaced fields) and tokenizers'
// results are frozen by scripts/make_sentencepiece_fixtures.py under tests/data/tokenizer/.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

using nlohmann::json;
using test::fnv1a64;
using test::tokenizer_data;

using test::read_text;

const json& variants() {
  static const json v = json::parse(read_text(tokenizer_data("variants/variants.json")));
  return v;
}

std::vector<std::string> variant_names() {
  std::vector<std::string> out;
  for (const auto& v : variants()) out.push_back(v["name"]);
  return out;
}

// The variant's tokenizer.json: its base with the listed fields replaced.
std::string variant_json(const std::string& name) {
  for (const auto& v : variants()) {
    if (v["name"] != name) continue;
    json j = json::parse(read_text(tokenizer_data(v["base"].get<std::string>() + "/tokenizer.json")));
    for (auto it = v["overrides"].begin(); it != v["overrides"].end(); ++it) {
      const std::string& k = it.key();
      if (k.rfind("model.", 0) == 0) j["model"][k.substr(6)] = it.value();
      else j[k] = it.value();
    }
    return j.dump();
  }
  ADD_FAILURE() << "no variant " << name;
  return "";
}

const Tokenizer& variant_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto r = Tokenizer::from_json_text(variant_json(name), name);
    if (!r) {
      std::fprintf(stderr, "cannot load variant %s: %s\n", name.c_str(), r.status().message().c_str());
      std::abort();
    }
    it = cache.emplace(name, std::move(r).value()).first;
  }
  return *it->second;
}

std::map<std::string, std::string> corpus() {
  auto c = test::load_corpus();
  for (const auto& e : test::read_jsonl(tokenizer_data("variants/corpus_extra.jsonl"))) c[e["name"]] = e["text"];
  return c;
}

std::vector<json> expected(const std::string& name) {
  return test::read_jsonl(tokenizer_data("variants/expected_" + name + ".jsonl"));
}

// Compares a decode with the record's `key` (text), `key`_fnv (hash of a long text) or null
// (tokenizers panicked: nothing to compare). A missing decoded_skip means "same as decoded".
void expect_decoded(const json& e, std::string key, const std::string& got) {
  if (!e.contains(key) && !e.contains(key + "_fnv") && key == "decoded_skip") key = "decoded";
  if (e.contains(key)) {
    if (!e[key].is_null()) EXPECT_EQ(got, e[key].get<std::string>()) << key;
  } else {
    ASSERT_TRUE(e.contains(key + "_fnv")) << key;
    EXPECT_EQ(fnv1a64(got.data(), got.size()), e[key + "_fnv"].get<std::string>()) << key << ": got \"" << got << "\"";
  }
}

void expect_stream_matches_decode(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  StreamDecoder sd(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = sd.push(id);
    ASSERT_TRUE(tok::is_valid_utf8(chunk)) << "invalid UTF-8 chunk after id " << id;
    all += chunk;
  }
  all += sd.flush();
  ASSERT_EQ(all, tok.decode(ids, skip));
}

class Variant : public ::testing::TestWithParam<std::string> {};

TEST_P(Variant, EncodeAndDecodeMatchTokenizers) {
  const Tokenizer& tok = variant_tokenizer(GetParam());
  const auto texts = corpus();
  int checked = 0;
  for (const auto& e : expected(GetParam())) {
    const std::string name = e["name"];
    if (name == "meta") {
      EXPECT_EQ(tok.vocab_size(), e["vocab_size"].get<int>());
      for (int32_t id : e["special_ids"].get<std::vector<int32_t>>()) EXPECT_TRUE(tok.is_special(id)) << id;
      continue;
    }
    if (e.contains("decode_ids")) continue;
    SCOPED_TRACE(GetParam() + " / " + name);
    ASSERT_TRUE(texts.count(name)) << "corpus entry missing: " << name;
    const std::vector<int32_t> ids = tok.encode(texts.at(name));
    if (e.contains("ids")) {
      EXPECT_EQ(ids, e["ids"].get<std::vector<int32_t>>());
      expect_decoded(e, "decoded", tok.decode(ids));
      expect_decoded(e, "decoded_skip", tok.decode(ids, true));
    } else {
      const auto head = e["head"].get<std::vector<int32_t>>();
      ASSERT_EQ(ids.size(), e["n_ids"].get<size_t>());
      EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + ptrdiff_t(head.size())), head);
      EXPECT_EQ(fnv1a64(ids.data(), ids.size() * 4), e["ids_fnv"].get<std::string>());
      const std::string d = tok.decode(ids), ds = tok.decode(ids, true);
      EXPECT_EQ(fnv1a64(d.data(), d.size()), e["decoded_fnv"].get<std::string>());
      EXPECT_EQ(fnv1a64(ds.data(), ds.size()), e["decoded_skip_fnv"].get<std::string>());
    }
    expect_stream_matches_decode(tok, ids, false);
    expect_stream_matches_decode(tok, ids, true);
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST_P(Variant, RandomIdSequencesDecodeAndStreamLikeTokenizers) {
  const Tokenizer& tok = variant_tokenizer(GetParam());
  int checked = 0;
  for (const auto& e : expected(GetParam())) {
    if (!e.contains("decode_ids")) continue;
    SCOPED_TRACE(e["name"].get<std::string>());
    const auto ids = e["decode_ids"].get<std::vector<int32_t>>();
    expect_decoded(e, "decoded", tok.decode(ids));
    expect_decoded(e, "decoded_skip", tok.decode(ids, true));
    expect_stream_matches_decode(tok, ids, false);
    expect_stream_matches_decode(tok, ids, true);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Variant, ::testing::ValuesIn(variant_names()), [](const auto& info) {
  std::string n = info.param;
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
});

// The files the hub ships for Mistral-7B / Mixtral have exactly this shape; a regression that
// refused them would otherwise only show as a skipped model.
TEST(SentencePieceLayout, MistralStyleFileHasTheExpectedShape) {
  const json j = json::parse(read_text(tokenizer_data("sp-llama/tokenizer.json")));
  EXPECT_TRUE(j["pre_tokenizer"].is_null());
  EXPECT_EQ(j["normalizer"]["normalizers"][0]["type"], "Prepend");
  EXPECT_EQ(j["normalizer"]["normalizers"][1]["type"], "Replace");
  EXPECT_EQ(j["model"]["byte_fallback"], true);
  EXPECT_EQ(j["model"]["fuse_unk"], true);
  EXPECT_TRUE(j["model"]["vocab"].contains("<0xE4>"));
}

// Characters outside the vocabulary become byte-fallback tokens, one per UTF-8 byte; streaming
// them never emits part of a character or U+FFFD, and each character appears whole once its last
// byte arrives (here: as soon as the next non-byte token ends the run, or at flush).
TEST(SentencePieceStream, ByteFallbackCharactersSplitAcrossTokensAreNeverEmittedPartially) {
  const Tokenizer& tok = variant_tokenizer("sp-legacy");
  const std::string text = "a \xE9\xBE\x98 b \xF0\x9F\xA6\x80\xF0\x9F\xA6\xA9 c";  // 龘 and two emoji: not in the vocab
  const auto ids = tok.encode(text);
  int byte_tokens = 0;
  for (int32_t id : ids) byte_tokens += tok.id_to_token(id).rfind("<0x", 0) == 0;
  ASSERT_GE(byte_tokens, 11) << "expected the rare characters to fall back to bytes";
  StreamDecoder sd(tok);
  std::string all;
  int held = 0;
  for (int32_t id : ids) {
    const std::string chunk = sd.push(id);
    EXPECT_TRUE(tok::is_valid_utf8(chunk));
    EXPECT_EQ(chunk.find("\xEF\xBF\xBD"), std::string::npos) << "a partial character was emitted as U+FFFD";
    held += chunk.empty();
    all += chunk;
  }
  all += sd.flush();
  EXPECT_EQ(all, text);
  EXPECT_EQ(all, tok.decode(ids));
  EXPECT_GE(held, byte_tokens - 3);  // every byte token but at most one per character waited
}

// A run of byte tokens that is not valid UTF-8 decodes to one U+FFFD per byte (tokenizers'
// ByteFallback), including bytes that were valid on their own: the stream must not have emitted
// them early.
TEST(SentencePieceStream, InvalidByteRunBecomesOneReplacementPerByte) {
  const Tokenizer& tok = variant_tokenizer("sp-legacy");
  auto id = [&](const char* t) {
    auto i = tok.token_to_id(t);
    EXPECT_TRUE(i.has_value()) << t;
    return i.value_or(0);
  };
  const std::vector<int32_t> ids = {id("\xE2\x96\x81" "a"), id("<0x41>"), id("<0xE4>"), id("<0xBD>"), id("\xE2\x96\x81" "b")};
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(tok.decode(ids), "a" + R + R + R + " b");  // "<0x41>" is 'A', but its run is invalid
  StreamDecoder sd(tok);
  std::string got;
  for (int32_t i : ids) got += sd.push(i);
  got += sd.flush();
  EXPECT_EQ(got, tok.decode(ids));
}

// Strip(start=1) removes the leading space of the first token only: a stream that starts with
// "▁Hello" yields "Hello", and later tokens keep their spaces, as decode() does.
TEST(SentencePieceStream, FirstTokenLosesItsLeadingSpaceOnly) {
  for (const char* v : {"sp-legacy", "sp-metaspace-first", "sp-metaspace-always-split"}) {
    SCOPED_TRACE(v);
    const Tokenizer& tok = variant_tokenizer(v);
    const auto ids = tok.encode("Hello world, the end");
    StreamDecoder sd(tok);
    std::string got;
    for (int32_t i : ids) got += sd.push(i);
    got += sd.flush();
    EXPECT_EQ(got, "Hello world, the end");
  }
}

// Random id sequences over the byte tokens and the metaspace pieces: many invalid and valid byte
// runs; the stream equals decode() for every one.
TEST(SentencePieceStream, RandomByteHeavySequencesStreamExactly) {
  for (const char* v : {"sp-legacy", "sp-metaspace-always-split", "sp-decoder-strip-both"}) {
    SCOPED_TRACE(v);
    const Tokenizer& tok = variant_tokenizer(v);
    std::vector<int32_t> bytes, others;
    for (int32_t i = 0; i < tok.vocab_size(); ++i) (tok.id_to_token(i).rfind("<0x", 0) == 0 ? bytes : others).push_back(i);
    ASSERT_EQ(bytes.size(), 256u);
    std::mt19937 rng(7);
    for (int iter = 0; iter < 300; ++iter) {
      std::vector<int32_t> ids(1 + rng() % 24);
      for (auto& i : ids) i = rng() % 3 ? bytes[rng() % bytes.size()] : others[rng() % others.size()];
      expect_stream_matches_decode(tok, ids, iter % 2 == 1);
    }
  }
}

}  // namespace
}  // namespace anvil

namespace anvil {
namespace {

// Split patterns are Oniguruma's in tokenizers: \s is White_Space (not U+180E, as PCRE2's is) and
// \w takes marks, decimal digits, connector punctuation and Alphabetic symbols (PCRE2's takes none
// of the marks and no Pc but '_'). The Qwen3 tokenizer, and the same with its Split pattern
// replaced by one made of \s and \w, encode characters on those edges as tokenizers does (run
// here from Python; the test skips without it).
TEST(OnigurumaClasses, WhitespaceAndWordEscapesMatchTokenizers) {
  if (!test::python_tokenizers_available()) GTEST_SKIP() << test::kNoPythonTokenizers;
  const std::string dir = test::scratch_dir("onig_classes");
  json base = json::parse(read_text(tokenizer_data("qwen3/tokenizer.json")));
  json words = base;
  ASSERT_EQ(words["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
  words["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = R"(\w+|\s+|[^\s\w]+|\W)";
  std::ofstream(dir + "/qwen3.json") << base.dump();
  std::ofstream(dir + "/words.json") << words.dump();
  const std::vector<std::string> texts = {
      " \u180e1",   "x\u180e\n",   "a\u0301b c", "a_b a\u203fb", "\u24b6\u24b7 x", "a\u00b2b \u00bd",
      "a\u200db",   "a\x1c b",     "a\u00a0b\u3000c", "\u2160\u2161 \u0660\u0661", "\u16ee x\u200bz",
      "tab\there\r\nnew  line", "I'M DON'T \u0301\u0301",
  };
  const json want = test::reference_encodings(dir, {"qwen3", "words"}, texts);  // each loaded once (11 MB)
  ASSERT_FALSE(want.is_null());
  for (const char* name : {"qwen3", "words"}) {
    auto tok = Tokenizer::from_json_text(read_text(dir + "/" + name + ".json"), name);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    for (size_t i = 0; i < texts.size(); ++i)
      EXPECT_EQ(json((*tok)->encode(texts[i], false)), want[name][i]) << name << ": " << json(texts[i]).dump();
  }
  std::filesystem::remove_all(dir);
}

// An added token with single_word matches only where no word character of the regex crate's \w
// (Alphabetic, M, Nd, Pc, Join_Control) is next to it: '_' and combining marks next to it refuse the
// match, '½' does not, whatever the token's own edges. Reference: tokenizers, from Python (skips
// without it).
TEST(OnigurumaClasses, SingleWordAddedTokensMatchTokenizers) {
  if (!test::python_tokenizers_available()) GTEST_SKIP() << test::kNoPythonTokenizers;
  const std::string dir = test::scratch_dir("single_word");
  const std::vector<std::string> texts = {"_ab", "ab\u00bd", "ab\u0301", "x ab y", "ab", "aab", "ab1", "a\u200dab",
                                          "q<x>q", "<x>", "\u00bdab\u00bd", "ab_ ab"};
  std::ofstream(dir + "/texts.json") << json(texts).dump();
  const std::string py =
      "import json, sys\n"
      "from tokenizers import Tokenizer, models, pre_tokenizers, AddedToken\n"
      "d = sys.argv[1]\n"
      "chars = ['<unk>', '_', 'a', 'b', 'q', 'x', 'y', '1', '<', '>', '\\u00bd', '\\u0301', '\\u200d']\n"
      "tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(chars)}, merges=[], unk_token='<unk>'))\n"
      "tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()\n"
      "tok.add_tokens([AddedToken('ab', single_word=True), AddedToken('<x>', single_word=True)])\n"
      "tok.save(d + '/tokenizer.json')\n"
      "texts = json.load(open(d + '/texts.json'))\n"
      "json.dump([tok.encode(t, add_special_tokens=False).ids for t in texts], open(d + '/expected.json', 'w'))\n";
  const json want = test::run_python_reference(dir, py);
  ASSERT_FALSE(want.is_null());
  auto tok = Tokenizer::load(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  for (size_t i = 0; i < texts.size(); ++i)
    EXPECT_EQ(json((*tok)->encode(texts[i], false)), want[i]) << json(texts[i]).dump();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace anvil
