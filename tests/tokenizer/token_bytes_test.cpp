// A token's own bytes (Tokenizer::token_raw_bytes) for every decoder: the invariant stated at its
// declaration, decode(ids) == utf8_lossy(join_raw_bytes(ids)) with join_raw_bytes the tokens' bytes
// joined and changed only by removed spaces (the decoder's text-edge rules), held against Hugging
// Face tokenizers' decode on SentencePiece layouts (Mistral's legacy Replace+ByteFallback+Fuse+
// Strip, Llama 2's Metaspace in every prepend_scheme, Strip at both ends), the null decoder, Fuse
// alone and byte-level ones, over texts with CJK, emoji, leading and double spaces and random id
// sequences (tests/data/tokenizer/token_bytes/, frozen by scripts/make_token_bytes_fixtures.py).
#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

using nlohmann::json;
using test::read_jsonl;
using test::read_text;
using test::tokenizer_data;

// The variant's tokenizer.json text: its base with the listed fields replaced.
std::string variant_json(const json& v) {
  json j = json::parse(read_text(tokenizer_data(v["base"].get<std::string>() + "/tokenizer.json")));
  for (auto it = v["overrides"].begin(); it != v["overrides"].end(); ++it) {
    const std::string& k = it.key();
    if (k.rfind("model.", 0) == 0) j["model"][k.substr(6)] = it.value();
    else j[k] = it.value();
  }
  return j.dump();
}

// Whether `to` is `from` with some spaces deleted and nothing else changed.
bool deletes_only_spaces(const std::string& from, const std::string& to) {
  size_t j = 0;
  for (size_t i = 0; i < from.size(); ++i) {
    if (j < to.size() && from[i] == to[j]) ++j;
    else if (from[i] != ' ') return false;
  }
  return j == to.size();
}

std::string show(const std::string& s) { return json(tok::utf8_lossy(s)).dump(); }

TEST(TokenBytes, JoinedBytesAreDecodeForEveryDecoder) {
  const json variants = json::parse(read_text(tokenizer_data("token_bytes/variants.json")));
  ASSERT_GE(variants.size(), 15u);
  for (const json& v : variants) {
    const std::string name = v["name"];
    SCOPED_TRACE(name);
    const std::string text = variant_json(v);
    auto tok = Tokenizer::from_json_text(text, name);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    const Tokenizer& t = **tok;
    EXPECT_TRUE(t.decoder().check_exact_token_bytes().is_ok()) << t.decoder().check_exact_token_bytes().message();
    const json dec = json::parse(text)["decoder"];
    const bool byte_fallback = dec.dump().find("\"ByteFallback\"") != std::string::npos;
    int exact = 0, lossy = 0;
    for (const json& r : read_jsonl(tokenizer_data("token_bytes/" + name + ".jsonl"))) {
      const std::vector<int32_t> ids = r["ids"].get<std::vector<int32_t>>();
      const std::string want = r["decoded"];
      std::string concat;
      for (int32_t id : ids) concat += t.token_raw_bytes(id);
      const std::string joined = t.join_raw_bytes(ids);
      EXPECT_TRUE(deletes_only_spaces(concat, joined)) << r["ids"].dump() << ": " << show(concat) << " -> " << show(joined);
      // A run of byte-fallback tokens that is not valid UTF-8 decodes to U+FFFD per byte, where
      // utf8_lossy gives one per invalid sequence: there the text is only held to decode().
      if (byte_fallback && !tok::is_valid_utf8(joined)) {
        ++lossy;
        EXPECT_EQ(t.decode(ids), want) << r["ids"].dump();
        continue;
      }
      ++exact;
      EXPECT_EQ(tok::utf8_lossy(joined), want) << r["ids"].dump() << ": bytes " << show(joined);
      // Special tokens skipped: the same rule over the tokens that remain (decode's skip_special is
      // held to tokenizers by the conformance tests).
      const std::string kept = t.join_raw_bytes(ids, /*skip_special=*/true);
      if (tok::is_valid_utf8(kept)) EXPECT_EQ(kept, t.decode(ids, /*skip_special=*/true)) << r["ids"].dump();
    }
    EXPECT_GE(exact, 160) << lossy << " lossy";
  }
}

// The bytes a token adds in the middle of a text, on the Mistral-style tokenizer: a word's "▁" is
// its leading space and a byte-fallback token its byte, where decode() of the token alone strips the
// text's first space and repairs the byte to U+FFFD; an added token gives its content.
TEST(TokenBytes, SentencePieceTokenOwnBytes) {
  auto tok = Tokenizer::load(tokenizer_data("sp-llama/tokenizer.json"));
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const Tokenizer& t = **tok;
  const std::vector<int32_t> hello = t.encode("Hello");  // "▁Hello" or "▁" pieces
  ASSERT_FALSE(hello.empty());
  EXPECT_EQ(t.id_to_token(hello[0]).rfind("\u2581", 0), 0u) << t.id_to_token(hello[0]);
  EXPECT_EQ(t.token_raw_bytes(hello[0]), " " + t.id_to_token(hello[0]).substr(3));
  EXPECT_NE(t.token_raw_bytes(hello[0]), t.decode(std::span<const int32_t>(&hello[0], 1)));
  for (int b : {0x00, 0x0A, 0x41, 0x80, 0xE4, 0xFF}) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto id = t.token_to_id(name);
    ASSERT_TRUE(id.has_value()) << name;
    EXPECT_EQ(t.token_raw_bytes(*id), std::string(1, char(b))) << name;
  }
  // "雨" written as byte tokens: each alone decodes to U+FFFD, their bytes join to the character.
  std::vector<int32_t> rain;
  std::string joined;
  for (unsigned char c : std::string("\u96e8")) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", c);
    rain.push_back(*t.token_to_id(name));
    EXPECT_EQ(t.decode(std::span<const int32_t>(&rain.back(), 1)), "\xEF\xBF\xBD");
    joined += t.token_raw_bytes(rain.back());
  }
  EXPECT_EQ(joined, "\u96e8");
  EXPECT_EQ(t.decode(rain), "\u96e8");
  EXPECT_EQ(t.token_raw_bytes(*t.token_to_id("[INST]")), "[INST]");
  EXPECT_EQ(t.token_raw_bytes(*t.token_to_id("</s>")), "</s>");
  EXPECT_EQ(t.token_raw_bytes(-1), "");
  EXPECT_EQ(t.token_raw_bytes(t.vocab_size()), "");
}

// Decoders whose steps make a token's bytes depend on its neighbours are named; the others pass.
TEST(TokenBytes, DecodersWithoutExactTokenBytesAreNamed) {
  struct Case {
    const char* decoder;
    const char* expect;  // "" when exact
  };
  const Case cases[] = {
      {R"({"type":"ByteLevel"})", ""},
      {R"(null)", ""},
      {R"({"type":"Metaspace","replacement":"▁","prepend_scheme":"always"})", ""},
      {R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},)"
       R"({"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})",
       ""},
      {R"({"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"ByteFallback"}]})", "ByteFallback step comes after Fuse"},
      {R"({"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Replace","pattern":{"String":"ab"},"content":"c"}]})",
       "Replace step comes after Fuse"},
      {R"({"type":"Sequence","decoders":[{"type":"ByteLevel"},{"type":"Metaspace","replacement":"▁"}]})",
       "Metaspace step comes after ByteLevel"},
      {R"({"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0},)"
       R"({"type":"Replace","pattern":{"String":" "},"content":"_"}]})",
       "Replace step comes after a Strip of the whole text"},
      {R"({"type":"Sequence","decoders":[{"type":"ByteFallback"},{"type":"Strip","content":" ","start":1,"stop":0}]})",
       "Strip step comes after ByteFallback"},
  };
  for (const Case& c : cases) {
    auto d = tok::Decoder::from_json(json::parse(c.decoder));
    ASSERT_TRUE(d.is_ok()) << c.decoder << ": " << d.status().message();
    const Status s = d->check_exact_token_bytes();
    if (!*c.expect) {
      EXPECT_TRUE(s.is_ok()) << c.decoder << ": " << s.message();
    } else {
      EXPECT_FALSE(s.is_ok()) << c.decoder;
      EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.decoder << ": " << s.message();
    }
  }
}

}  // namespace
}  // namespace anvil
