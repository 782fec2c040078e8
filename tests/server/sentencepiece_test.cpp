// `anvil serve` on a checkpoint with a SentencePiece-style tokenizer (tests/data/sp-tiny-llama: a
// tiny random Llama with Mistral's tokenizer.json layout, Replace "▁" -> " " + ByteFallback + Fuse +
// Strip of the text's first space; scripts/make_sentencepiece_model.py). Its replies are noise, which
// suits these checks: many kinds of tokens (words, byte-fallback pieces of CJK and emoji).
//  - logprobs: the "bytes" of a reply's tokens joined are its text's UTF-8, but for the one leading
//    space the decoder cuts (OpenAI's contract for "bytes"), chat and completions, streamed or not
//    (special tokens the model writes, [/INST] here, are left out of the text and so skipped);
//  - JSON mode: every reply that stops is a JSON object for Python's json.loads, every one cut by
//    max_tokens the beginning of one (json_mode_check.py, through the openai client);
//  - a decoder whose tokens' bytes depend on their neighbours is refused for JSON mode with a 400
//    that names it, and the same server still answers other requests.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "server_process.h"
#include "sse.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

using anvil::test::run_python_check;
using anvil::test::ServerProcess;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(ANVIL_TEST_DATA) + "/sp-tiny-llama";

std::string bytes_of(const json& token) {
  std::string b;
  for (const json& c : token["bytes"]) b += char(c.get<int>());
  return b;
}

// The decoder's rule for this layout: the text is the tokens' bytes less one leading space.
std::string cut_first_space(std::string s) { return !s.empty() && s[0] == ' ' ? s.substr(1) : s; }

}  // namespace

TEST(SentencePieceServer, LogprobsBytesRebuildTheText) {
  if (!fs::exists(kModel + "/model.safetensors")) GTEST_SKIP() << "no " << kModel;
  ServerProcess srv({"-m", kModel, "-c", "512", "-np", "2", "-t", "2", "--no-kv-store"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(120, 0);
  auto tok = anvil::Tokenizer::load(kModel + "/tokenizer.json");
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  std::set<std::string> specials;
  for (const auto& a : (*tok)->added_tokens())
    if (a.special) specials.insert(a.content);
  int exact = 0, leading_space = 0, partial_chars = 0;
  for (int seed = 1; seed <= 6; ++seed) {
    for (bool chat : {true, false}) {
      for (bool stream : {false, true}) {
        SCOPED_TRACE("seed " + std::to_string(seed) + (chat ? " chat" : " completions") + (stream ? " stream" : ""));
        json body = {{"max_tokens", 40}, {"temperature", 1.0}, {"seed", seed}, {"stream", stream}};
        // Half the replies leaning to "▁the" (" the" in the text's middle), some so much that they
        // begin with it: a space in the bytes that the text does not have.
        if (seed > 3) body["logit_bias"] = {{std::to_string(*(*tok)->token_to_id("\u2581the")), seed > 4 ? 40 : 12}};
        if (chat) {
          body["messages"] = {{{"role", "user"}, {"content", "Say something in Chinese and with emoji."}}};
          body["logprobs"] = true;
          body["top_logprobs"] = 2;
        } else {
          body["prompt"] = "Once upon a time";
          body["logprobs"] = 2;
        }
        auto r = c.Post(chat ? "/v1/chat/completions" : "/v1/completions", body.dump(), "application/json");
        ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
        std::string text, bytes;
        std::vector<json> entries;  // chat: logprobs content entries
        std::vector<std::string> tokens;
        auto take = [&](const json& ch) {
          if (chat) {
            const json& msg = stream ? ch["delta"] : ch["message"];
            if (msg.contains("content") && msg["content"].is_string()) text += msg["content"].get<std::string>();
            if (ch["logprobs"].is_object())
              for (const json& e : ch["logprobs"]["content"]) entries.push_back(e);
          } else {
            text += ch["text"].get<std::string>();
            if (ch["logprobs"].is_object())
              for (const json& t : ch["logprobs"]["tokens"]) tokens.push_back(t);
          }
        };
        if (stream) {
          bool done = false;
          for (const json& e : anvil::test::sse_events(r->body, &done))
            for (const json& ch : e["choices"]) take(ch);
          EXPECT_TRUE(done);
        } else {
          take(json::parse(r->body)["choices"][0]);
        }
        if (!chat) {
          // The legacy format has no bytes; its "token" strings are them as text, so where no token
          // holds part of a character they too rebuild the text.
          ASSERT_FALSE(tokens.empty()) << r->body;
          std::string joined;
          bool partial = false;
          for (const std::string& t : tokens) {
            if (specials.count(t)) continue;
            joined += t;
            partial = partial || t.find("\xEF\xBF\xBD") != std::string::npos;
          }
          if (!partial) {
            EXPECT_EQ(cut_first_space(joined), text);
            ++exact;
          }
          continue;
        }
        ASSERT_FALSE(entries.empty()) << r->body;
        for (const json& e : entries) {
          if (specials.count(e["token"])) continue;  // not in the text: the server skips special tokens
          const std::string b = bytes_of(e);
          EXPECT_EQ(e["token"].get<std::string>(), anvil::tok::utf8_lossy(b)) << e.dump();
          partial_chars += e["token"] == "\xEF\xBF\xBD";
          for (const json& t : e["top_logprobs"]) EXPECT_EQ(t["token"].get<std::string>(), anvil::tok::utf8_lossy(bytes_of(t)));
          bytes += b;
        }
        leading_space += !bytes.empty() && bytes[0] == ' ';
        const std::string rebuilt = cut_first_space(bytes);
        // A run of byte tokens that is no character decodes to U+FFFD per byte (ByteFallback); the
        // bytes keep the bytes. Such replies are held to the lossy text only.
        if (anvil::tok::is_valid_utf8(rebuilt)) {
          EXPECT_EQ(rebuilt, text);
          ++exact;
        } else {
          EXPECT_NE(text.find("\xEF\xBF\xBD"), std::string::npos) << text;
        }
      }
    }
  }
  std::printf("[sp logprobs] %d replies rebuilt exactly, %d began with a space, %d partial-character tokens\n",
              exact, leading_space, partial_chars);
  EXPECT_GE(exact, 8);
  EXPECT_GE(leading_space, 4);
}

namespace {
// The bytes of /tokenize's with_pieces pieces joined: a string piece's UTF-8, a list piece's bytes.
std::string joined_pieces(const json& tokens, int* lists) {
  std::string b;
  for (const json& t : tokens) {
    if (t["piece"].is_string()) {
      b += t["piece"].get<std::string>();
    } else {
      ++*lists;
      for (const json& c : t["piece"]) b += char(c.get<int>());
    }
  }
  return b;
}
}  // namespace

// /tokenize's with_pieces gave each token decoded alone, so "▁Hello" read "Hello" and the pieces
// joined lost every space. A piece is now the token's own text, as llama-server gives it: a string, or
// the list of its bytes where they are not UTF-8 (llama-server's README: 'á' in a SentencePiece
// vocabulary without it is the byte tokens [195] and [161]). The pieces joined are the text, but for
// the leading space the decoder cuts. Then every piece against Hugging Face tokenizers' vocabulary
// (tokenize_pieces_check.py).
TEST(SentencePieceServer, TokenizePiecesAreTheTokensOwnText) {
  if (!fs::exists(kModel + "/model.safetensors")) GTEST_SKIP() << "no " << kModel;
  ServerProcess srv({"-m", kModel, "-c", "256", "-np", "1", "-t", "2", "--no-kv-store"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(60, 0);
  auto pieces = [&](const std::string& text) {
    auto r = c.Post("/tokenize", json{{"content", text}, {"with_pieces", true}}.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    return r ? json::parse(r->body)["tokens"] : json::array();
  };
  auto t = pieces("\u00e1");
  ASSERT_EQ(t.size(), 3u) << t.dump();
  EXPECT_EQ(t[0]["piece"], " ") << t.dump();  // "▁": the space the tokenizer puts before the text
  EXPECT_EQ(t[1]["piece"], json::array({0xC3})) << t.dump();
  EXPECT_EQ(t[2]["piece"], json::array({0xA1})) << t.dump();
  for (const std::string text : {"Hello world", "This is a test string with unicode \u5abd and emoji \U0001F917"}) {
    int lists = 0;
    t = pieces(text);
    EXPECT_EQ(cut_first_space(joined_pieces(t, &lists)), text) << t.dump();
    EXPECT_EQ(t[0]["piece"].get<std::string>().substr(0, 1), " ") << t.dump();
    if (text != "Hello world") EXPECT_EQ(lists, 7) << "媽's 3 byte tokens and 🤗's 4, and none else: " << t.dump();
  }
  auto [code, out] = run_python_check("tokenize_pieces_check.py", srv.port(), {"-", kModel + "/tokenizer.json"});
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
}

// The random model held to JSON: replies that stop parse, replies cut short are beginnings.
TEST(SentencePieceServer, JsonModeRepliesParseAsObjects) {
  if (!fs::exists(kModel + "/model.safetensors")) GTEST_SKIP() << "no " << kModel;
  ServerProcess srv({"-m", kModel, "-c", "1024", "-np", "4", "-t", "2", "--no-kv-store", "--alias", "sp"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  auto [code, out] = run_python_check("json_mode_check.py", srv.port(), {"none", "sp", "1", "120"});
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
  if (const size_t at = out.rfind("summary"); at != std::string::npos) std::printf("%s", out.substr(at).c_str());
}

// A decoder that applies ByteFallback after Fuse (to the whole text, so a token's bytes depend on
// its neighbours): JSON mode is a 400 naming the step; plain requests are served.
TEST(SentencePieceServer, JsonModeRefusedWhereTokenBytesAreNotExact) {
  if (!fs::exists(kModel + "/model.safetensors")) GTEST_SKIP() << "no " << kModel;
  const std::string dir = (fs::temp_directory_path() / ("anvil_sp_inexact_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer_config.json"})
    fs::create_symlink(fs::absolute(kModel + "/" + f), dir + "/" + f);
  json tj = json::parse(std::ifstream(kModel + "/tokenizer.json"));
  tj["decoder"] = json::parse(R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},)"
                              R"("content":" "},{"type":"Fuse"},{"type":"ByteFallback"}]})");
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  {
    ServerProcess srv({"-m", dir, "-c", "256", "-np", "1", "-t", "2", "--no-kv-store"});
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    json body = {{"prompt", "x = "}, {"max_tokens", 4}, {"response_format", {{"type", "json_object"}}}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    const json err = json::parse(r->body)["error"];
    EXPECT_EQ(err["param"], "response_format") << r->body;
    EXPECT_NE(err["message"].get<std::string>().find("ByteFallback step comes after Fuse"), std::string::npos) << r->body;
    body.erase("response_format");
    r = c.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  fs::remove_all(dir);
}
