// The OpenAI reply objects built from job events: streamed chunks and the one-shot response agree,
// and reasoning, tool calls, finish reasons, usage and logprobs have OpenAI's shapes.
#include <gtest/gtest.h>

#include "model/loader.h"
#include "server/openai_reply.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/stream_decoder.h"

using namespace anvil;
using namespace anvil::server;

namespace {

const Tokenizer& qwen_tokenizer() {
  static std::unique_ptr<Tokenizer> t = std::move(Tokenizer::load(default_tokenizer_dir() + "/tokenizer.json")).value();
  return *t;
}

std::unique_ptr<Reply> make_reply(bool chat, bool stream, bool tools, bool logprobs = false) {
  auto r = std::make_unique<Reply>();
  r->chat = chat;
  r->stream = stream;
  r->include_usage = true;
  r->logprobs = logprobs;
  r->id = "x";
  r->model = "m";
  GenerationParams p;
  p.prompt = {1, 2, 3};
  r->job = std::make_shared<Job>(p);
  r->job->set_prompt_stats(3, 0);
  r->tok = &qwen_tokenizer();
  if (chat) r->out = std::make_unique<ChatOutput>(true, false, tools);
  return r;
}

JobEvent delta(const std::string& text, int32_t id = 100) {
  JobEvent e;
  e.kind = JobEvent::kDelta;
  e.text = text;
  TokenInfo t;
  t.id = id;
  t.logprob = -0.5f;
  t.top = {{id, -0.5f}, {id + 1, -1.5f}};
  e.tokens.push_back(t);
  return e;
}

std::vector<nlohmann::ordered_json> parse_sse(const std::string& s, bool* done) {
  std::vector<nlohmann::ordered_json> out;
  *done = false;
  size_t pos = 0;
  while ((pos = s.find("data: ", pos)) != std::string::npos) {
    size_t end = s.find("\n\n", pos);
    std::string d = s.substr(pos + 6, end - pos - 6);
    pos = end;
    if (d == "[DONE]") *done = true;
    else out.push_back(nlohmann::ordered_json::parse(d));
  }
  return out;
}

const std::vector<std::string> kPieces = {"<think>", "\nweigh", " options\n", "</think>", "\n\n", "Calling.",
                                          "\n<tool_call>\n{\"name\": \"get", "_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
                                          "\n</tool_call>"};

}  // namespace

TEST(Reply, ChatStreamAndNonStreamAgreeOnReasoningAndToolCalls) {
  auto one = make_reply(true, false, true);
  auto st = make_reply(true, true, true);
  std::string sse;
  for (auto& p : kPieces) {
    one->on_delta(delta(p));
    st->job->add_completion_tokens(1);
    one->job->add_completion_tokens(1);
    sse += st->on_delta(delta(p));
  }
  one->on_done("stop");
  sse += st->on_done("stop");
  auto r = one->response();
  auto& msg = r["choices"][0]["message"];
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(msg["reasoning_content"], "weigh options");
  EXPECT_EQ(msg["content"], "Calling.\n");  // as generated before the block (vLLM's hermes parser too)
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_FALSE(msg["tool_calls"][0].contains("index"));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(r["usage"]["completion_tokens"], int(kPieces.size()));
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  bool done = false;
  auto chunks = parse_sse(sse, &done);
  EXPECT_TRUE(done);
  std::string reasoning, content;
  nlohmann::ordered_json calls = nlohmann::ordered_json::array();
  std::string finish;
  for (auto& c : chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"].empty()) {
      EXPECT_EQ(c["usage"]["total_tokens"], 3 + int(kPieces.size()));
      continue;
    }
    auto& d = c["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
    if (d.contains("tool_calls"))
      for (auto& tc : d["tool_calls"]) calls.push_back(tc);
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(reasoning, "weigh options");
  EXPECT_EQ(content, "Calling.\n");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["index"], 0);
  EXPECT_EQ(calls[0]["function"]["arguments"], R"({"city":"Oslo"})");
  EXPECT_EQ(finish, "tool_calls");
}

TEST(Reply, LogprobsShapes) {
  auto chat = make_reply(true, false, false, true);
  chat->on_delta(delta("Hi", 13048));
  chat->on_done("length");
  auto r = chat->response();
  auto& lp = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 1u);
  EXPECT_EQ(lp[0]["token"], "Hi");
  EXPECT_EQ(lp[0]["bytes"], nlohmann::ordered_json::array({72, 105}));
  EXPECT_FLOAT_EQ(lp[0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");

  auto comp = make_reply(false, false, false, true);
  comp->on_delta(delta("Hi", 13048));
  comp->on_delta(delta("Hi", 13048));
  comp->on_done("stop");
  auto c = comp->response();
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "HiHi");
  auto& l = c["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], nlohmann::ordered_json::array({"Hi", "Hi"}));
  EXPECT_EQ(l["text_offset"], nlohmann::ordered_json::array({0, 2}));
  EXPECT_EQ(l["top_logprobs"][0].size(), 2u);
}

// A character split over tokens (an emoji, CJK in a byte-level vocabulary): each token's "bytes"
// are its own bytes, which together rebuild the text, and the legacy text_offset counts characters
// (OpenAI's), not bytes.
TEST(Reply, LogprobsOfTokensThatSplitACharacter) {
  const Tokenizer& tok = qwen_tokenizer();
  const std::string text = "a\xF0\xA0\x80\x80" "b";  // a, U+20000, b: 3 characters, U+20000 in 3 tokens
  const auto ids = tok.encode(text);
  auto chat = make_reply(true, false, false, true);
  auto comp = make_reply(false, false, false, true);
  for (int32_t id : ids) {
    chat->on_delta(delta(tok.decode(std::span<const int32_t>(&id, 1)), id));
    comp->on_delta(delta(tok.decode(std::span<const int32_t>(&id, 1)), id));
  }
  chat->on_done("stop");
  comp->on_done("stop");
  const auto chat_json = chat->response();
  const auto& lp = chat_json["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), ids.size());
  std::string rebuilt;
  bool split = false;
  for (const auto& e : lp) {
    std::string b;
    for (const auto& c : e["bytes"]) b += char(c.get<int>());
    split = split || e["token"].get<std::string>() != b;  // a partial character: U+FFFD in "token"
    rebuilt += b;
  }
  EXPECT_EQ(rebuilt, text);
  EXPECT_TRUE(split) << "U+20000 should take more than one token here";
  const auto comp_json = comp->response();
  const auto& offsets = comp_json["choices"][0]["logprobs"]["text_offset"];
  ASSERT_EQ(offsets.size(), ids.size());
  EXPECT_EQ(offsets[0], 0);
  EXPECT_EQ(offsets[1], 1) << "after 'a', one character in";
  for (size_t i = 1; i < offsets.size(); ++i) EXPECT_LE(offsets[i - 1], offsets[i]);
  EXPECT_EQ(offsets.back(), 2) << "'b' is the third character";
}

// What a random-weight model writes: bytes that never form a character (a lone continuation
// byte, a lead byte cut short, E0 80, which is two invalid bytes, a lone surrogate), a special token in the middle of
// the text (skipped by the server's decoder) and a character split over tokens. text_offset counts
// the characters of the text returned, so the offset of token i is the length of decode(ids[0, i))
// in characters (tokenizers decodes every invalid sequence to one U+FFFD). It used to count the
// tokens' lead bytes: an invalid continuation byte's U+FFFD was missed and a skipped special
// token's own text ("<|im_start|>", 12 characters) was counted, so the offsets ran off the text.
TEST(Reply, TextOffsetsFollowTheTextOfArbitraryTokens) {
  const Tokenizer& tok = qwen_tokenizer();
  auto byte_token = [&](uint8_t b) {
    std::string s;
    tok::append_utf8(s, tok::byte_to_codepoint()[b]);
    return *tok.token_to_id(s);
  };
  auto text_ids = [&](const std::string& t) { return tok.encode(t); };
  std::vector<int32_t> ids;
  auto add = [&](std::vector<int32_t> v) { ids.insert(ids.end(), v.begin(), v.end()); };
  add(text_ids("a"));
  add({byte_token(0x80)});                           // a lone continuation byte: one U+FFFD
  add(text_ids("b"));
  add({byte_token(0xF0), byte_token(0x9F)});         // an emoji's first two bytes, never finished
  add(text_ids("c"));
  add({*tok.token_to_id("<|im_start|>")});           // special: not in the text
  add(text_ids("d"));
  add({byte_token(0xE0), byte_token(0x80)});         // E0 80: two invalid bytes, two U+FFFD
  add(text_ids("e\xF0\xA0\x80\x80" "f"));          // U+20000 over several tokens
  add({byte_token(0xED), byte_token(0xA0), byte_token(0x80)});  // a UTF-16 surrogate's bytes: three U+FFFD
  add({byte_token(0xE4)});                           // a lead byte at the very end
  const std::string text = tok.decode(ids, /*skip_special=*/true);
  for (bool stream : {false, true}) {
    auto comp = make_reply(false, stream, false, true);
    StreamDecoder dec(tok, /*skip_special=*/true);  // as the scheduler makes the deltas
    std::string sse;
    for (int32_t id : ids) sse += comp->on_delta(delta(dec.push(id), id));
    JobEvent last;
    last.text = dec.flush();
    sse += comp->on_delta(last);
    sse += comp->on_done("length");
    nlohmann::ordered_json offsets = nlohmann::ordered_json::array();
    std::string got_text;
    if (stream) {
      bool done = false;
      for (const auto& c : parse_sse(sse, &done))
        if (c.contains("choices") && !c["choices"].empty()) {
          got_text += c["choices"][0]["text"].get<std::string>();
          if (!c["choices"][0]["logprobs"].is_null())
            for (const auto& o : c["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o);
        }
    } else {
      const auto j = comp->response();
      got_text = j["choices"][0]["text"];
      offsets = j["choices"][0]["logprobs"]["text_offset"];
    }
    EXPECT_EQ(got_text, text);
    ASSERT_EQ(offsets.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const std::string before = tok.decode(std::span<const int32_t>(ids.data(), i), /*skip_special=*/true);
      size_t chars = 0;
      for (unsigned char c : before) chars += (c & 0xC0) != 0x80;
      EXPECT_EQ(offsets[i].get<size_t>(), chars) << "token " << i << " (id " << ids[i] << "), stream " << stream;
    }
    // By hand: "a" 0, the lone byte 1, "b" 2, F0 3, 9F 4 (in F0's character), "c" 4, <|im_start|> 5, "d" 5.
    EXPECT_EQ(offsets[2], 2);
    EXPECT_EQ(offsets[5], 4);
    EXPECT_EQ(offsets[6], 5);
    EXPECT_EQ(offsets[7], 5);
    EXPECT_EQ(offsets[9], 7) << "E0 80 are two characters";
  }
}

// A SentencePiece-style tokenizer (Replace "▁" -> " ", ByteFallback, Fuse, Strip): a token decoded
// alone loses its leading space (the Strip of the text's start), so counting each token's own
// decode ran one character short for every word after the first, the error growing along the
// text. The offsets are the lengths of the prefixes' decodes; tokenizers gives, for "hello world
// 中文 ok" (▁hello ▁world ▁ <0xE4> <0xB8> <0xAD> <0xE6> <0x96> <0x87> ▁o k), 0 5 11 12 13 14 13 16 17 14 16.
TEST(Reply, TextOffsetsOfASentencePieceTokenizer) {
  const std::string path = std::string(ANVIL_TEST_DATA) + "/tokenizer/sp-llama/tokenizer.json";
  auto loaded = Tokenizer::load(path);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const Tokenizer& tok = **loaded;
  const std::vector<int32_t> ids = tok.encode("hello world \xE4\xB8\xAD\xE6\x96\x87 ok");
  ASSERT_EQ(ids.size(), 11u) << "the tokenizer fixture changed";
  auto comp = make_reply(false, false, false, true);
  comp->tok = &tok;
  StreamDecoder dec(tok, /*skip_special=*/true);
  for (int32_t id : ids) comp->on_delta(delta(dec.push(id), id));
  JobEvent last;
  last.text = dec.flush();
  comp->on_delta(last);
  comp->on_done("length");
  const auto j = comp->response();
  EXPECT_EQ(j["choices"][0]["text"], "hello world \xE4\xB8\xAD\xE6\x96\x87 ok");
  const auto& offsets = j["choices"][0]["logprobs"]["text_offset"];
  ASSERT_EQ(offsets.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    size_t chars = 0;
    for (unsigned char c : tok.decode(std::span<const int32_t>(ids.data(), i))) chars += (c & 0xC0) != 0x80;
    EXPECT_EQ(offsets[i].get<size_t>(), chars) << "token " << i;
  }
  EXPECT_EQ(offsets, nlohmann::ordered_json::array({0, 5, 11, 12, 13, 14, 13, 16, 17, 14, 16}));
}

// The same tokenizer's logprobs: "bytes" are each token's own bytes, so joined they are the reply's
// text, but for the one leading space the decoder's Strip cuts from it (OpenAI's contract: the
// bytes rebuild the text). They were each token's decode alone: a word's "▁" lost its space and a
// byte-fallback token of a longer character gave U+FFFD's bytes, so nothing rebuilt the text.
// "token" is those bytes as text: " world" (vLLM's for a "▁" token), U+FFFD for a partial character.
TEST(Reply, LogprobsBytesOfASentencePieceTokenizer) {
  const std::string path = std::string(ANVIL_TEST_DATA) + "/tokenizer/sp-llama/tokenizer.json";
  auto loaded = Tokenizer::load(path);
  ASSERT_TRUE(loaded.is_ok()) << loaded.status().message();
  const Tokenizer& tok = **loaded;
  const std::string text = "hello  world \xE4\xB8\xAD\xE6\x96\x87 {\"k\": \"\xF0\x9F\xA6\x80\"}";  // 中文, 🦀
  const std::vector<int32_t> ids = tok.encode(text);
  // What each token should show, from its vocab entry: "▁w..." is " w...", "<0xNN>" the byte NN
  // (U+FFFD as text when NN is not ASCII), anything else itself.
  std::vector<std::string> want_bytes;
  int partial = 0;
  for (int32_t id : ids) {
    const std::string v = tok.id_to_token(id);
    if (v.size() == 6 && v.rfind("<0x", 0) == 0) {
      want_bytes.push_back(std::string(1, char(std::stoi(v.substr(3, 2), nullptr, 16))));
      partial += (unsigned char)want_bytes.back()[0] >= 0x80;
    } else {
      std::string w;
      for (size_t i = 0; i < v.size();) {
        if (v.compare(i, 3, "\u2581") == 0) {
          w += ' ';
          i += 3;
        } else {
          w += v[i++];
        }
      }
      want_bytes.push_back(w);
    }
  }
  ASSERT_GE(partial, 6) << "中文 should be byte-fallback tokens in this small vocabulary";
  for (bool chat : {true, false}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    auto r = make_reply(chat, false, false, true);
    r->tok = &tok;
    StreamDecoder dec(tok, /*skip_special=*/true);
    for (int32_t id : ids) {
      JobEvent e = delta(dec.push(id), id);
      e.tokens[0].top = {{id, -0.5f}, {ids[0], -1.5f}};
      r->on_delta(e);
    }
    JobEvent last;
    last.text = dec.flush();
    r->on_delta(last);
    r->on_done("length");
    const auto j = r->response();
    std::vector<std::string> tokens;
    if (chat) {
      EXPECT_EQ(j["choices"][0]["message"]["content"], text);
      const auto& lp = j["choices"][0]["logprobs"]["content"];
      ASSERT_EQ(lp.size(), ids.size());
      std::string joined;
      for (size_t i = 0; i < ids.size(); ++i) {
        std::string b;
        for (const auto& c : lp[i]["bytes"]) b += char(c.get<int>());
        EXPECT_EQ(b, want_bytes[i]) << "token " << i << " " << tok.id_to_token(ids[i]);
        joined += b;
        tokens.push_back(lp[i]["token"]);
        const auto& alt = lp[i]["top_logprobs"][1];  // ids[0], "▁hello"
        EXPECT_EQ(alt["token"], " hello");
        EXPECT_EQ(alt["bytes"], nlohmann::ordered_json::array({32, 104, 101, 108, 108, 111}));
      }
      EXPECT_EQ(joined, " " + text) << "the bytes are the text, with the space the decoder cuts at its start";
    } else {
      EXPECT_EQ(j["choices"][0]["text"], text);
      for (const auto& t : j["choices"][0]["logprobs"]["tokens"]) tokens.push_back(t);
      ASSERT_EQ(tokens.size(), ids.size());
      EXPECT_TRUE(j["choices"][0]["logprobs"]["top_logprobs"][1].contains(" hello"));
    }
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tokens[i], tok::utf8_lossy(want_bytes[i])) << "token " << i;
    EXPECT_EQ(tokens[0], " hello");
  }
}

TEST(Reply, WithoutToolsTheTagsAreContent) {
  auto r = make_reply(true, false, false);
  r->on_delta(delta("<tool_call>{\"name\": \"f\"}</tool_call>"));
  r->on_done("stop");
  auto j = r->response();
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "<tool_call>{\"name\": \"f\"}</tool_call>");
}

// tool_choice required / named (http_server.cpp): the answer is prefilled with the opening of a
// call, which the parser is fed first; a reply that ends (stop) without a valid call of an allowed
// function does not follow tool_choice, streamed or not; one cut short by max_tokens is left alone.
TEST(Reply, ForcedToolCallIsParsedFromThePrefillAndValidated) {
  const std::string forced = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ";
  for (bool stream : {false, true}) {
    auto run = [&](const std::vector<std::string>& allowed, const std::vector<std::string>& pieces,
                   const std::string& reason, std::string* sse) {
      auto r = make_reply(true, stream, true);
      r->out->push(forced);
      r->tool_required = true;
      r->allowed_tools = allowed;
      sse->clear();
      for (auto& p : pieces) *sse += r->on_delta(delta(p));
      *sse += r->on_done(reason);
      return r;
    };
    std::string sse;
    auto ok = run({"get_time"}, {"{\"city\": ", "\"Paris\"}}", "\n</tool_call>"}, "stop", &sse);
    EXPECT_EQ(ok->violation, "") << stream;
    ASSERT_EQ(ok->calls.size(), 1u);
    EXPECT_EQ(ok->calls[0].name, "get_time");
    EXPECT_EQ(ok->calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(ok->finish, "tool_calls");
    EXPECT_EQ(ok->assistant_message()["tool_calls"][0]["function"]["name"], "get_time");
    auto bad = run({"get_time"}, {"the time is noon"}, "stop", &sse);
    EXPECT_NE(bad->violation.find("no valid <tool_call>"), std::string::npos) << bad->violation;
    if (stream) {
      bool done = false;
      auto evs = parse_sse(sse, &done);
      ASSERT_FALSE(evs.empty());
      EXPECT_EQ(evs.back()["error"]["code"], "tool_choice_not_followed");
      EXPECT_TRUE(done);
      for (auto& e : evs)  // the unclosed call's text is not sent as content before the error
        if (e.contains("choices"))
          for (auto& ch : e["choices"])
            EXPECT_FALSE(ch["delta"].contains("content") && ch["delta"]["content"].get<std::string>().find("tool_call") !=
                                                                std::string::npos)
                << e.dump();
    }
    auto other = run({"get_weather"}, {"{}}\n</tool_call>"}, "stop", &sse);  // prefilled get_time, allowed get_weather
    EXPECT_NE(other->violation.find("called 'get_time'"), std::string::npos) << other->violation;
    auto cut = run({"get_time"}, {"{\"ci"}, "length", &sse);
    EXPECT_EQ(cut->violation, "");
    EXPECT_EQ(cut->finish, "length");
  }
}

// The legacy completions format keys the alternatives by their text. Tokens that each hold part of a
// character all decode to U+FFFD: the key keeps the likeliest of them (the alternatives come most
// likely first), so the top entry is never below the chosen token's own logprob.
TEST(Reply, LegacyTopLogprobsKeepTheLikeliestOfTokensThatDecodeAlike) {
  const Tokenizer& tok = qwen_tokenizer();
  const auto ids = tok.encode("\xF0\xA0\x80\x80");  // U+20000: several tokens, each a partial character
  auto one = [&](int32_t id) { return tok.decode(std::span<const int32_t>(&id, 1)); };
  std::vector<int32_t> alike;  // the tokens of it that decode to one U+FFFD
  for (int32_t id : ids)
    if (one(id) == "\xEF\xBF\xBD") alike.push_back(id);
  ASSERT_GE(alike.size(), 2u) << "U+20000 should take two tokens that decode alike";
  auto comp = make_reply(false, false, false, true);
  JobEvent e = delta(one(alike[0]), alike[0]);
  e.tokens[0].logprob = -0.25f;
  e.tokens[0].top = {{alike[0], -0.25f}, {alike[1], -1.0f}, {tok.encode("x")[0], -2.0f}};
  comp->on_delta(e);
  comp->on_done("length");
  const auto j = comp->response();
  const auto& top = j["choices"][0]["logprobs"]["top_logprobs"][0];
  ASSERT_EQ(top.size(), 2u) << top;
  EXPECT_FLOAT_EQ(top["\xEF\xBF\xBD"].get<float>(), -0.25f) << top;
  EXPECT_FLOAT_EQ(top["x"].get<float>(), -2.0f) << top;
}

// Legacy completions: top_logprobs holds the sampled token too ("the API will always return the
// logprob of the sampled token, so there may be up to logprobs+1 elements", OpenAI; vLLM likewise):
// logprobs 0 gives it alone (it was {}), and a sampled token outside the top ones is added to them;
// streamed or not.
TEST(Reply, LegacyTopLogprobsHoldTheSampledToken) {
  const Tokenizer& tok = qwen_tokenizer();
  const int32_t hi = tok.encode("Hi")[0], x = tok.encode("x")[0], y = tok.encode("y")[0];
  auto event = [&](int32_t id, float lp, std::vector<TokenLogprob> top) {
    JobEvent e = delta(tok.decode(std::span<const int32_t>(&id, 1)), id);
    e.tokens[0].logprob = lp;
    e.tokens[0].top = std::move(top);
    return e;
  };
  for (bool stream : {false, true}) {
    auto comp = make_reply(false, stream, false, true);
    std::string sse;
    sse += comp->on_delta(event(hi, -0.25f, {}));                             // logprobs 0
    sse += comp->on_delta(event(y, -3.0f, {{x, -0.5f}, {hi, -1.0f}}));        // sampled outside the top 2
    sse += comp->on_delta(event(x, -0.5f, {{x, -0.5f}, {hi, -1.0f}}));        // sampled among them
    sse += comp->on_done("length");
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    if (stream) {
      bool done = false;
      for (const auto& ev : parse_sse(sse, &done))
        if (ev.contains("choices") && !ev["choices"].empty() && ev["choices"][0]["logprobs"].is_object())
          for (const auto& t : ev["choices"][0]["logprobs"]["top_logprobs"]) top.push_back(t);
    } else {
      top = comp->response()["choices"][0]["logprobs"]["top_logprobs"];
    }
    ASSERT_EQ(top.size(), 3u) << top;
    EXPECT_EQ(top[0], nlohmann::ordered_json({{"Hi", -0.25f}})) << stream;
    ASSERT_EQ(top[1].size(), 3u) << top[1];
    EXPECT_FLOAT_EQ(top[1]["y"].get<float>(), -3.0f);
    EXPECT_FLOAT_EQ(top[1]["x"].get<float>(), -0.5f);
    EXPECT_EQ(top[2].size(), 2u) << top[2];
  }
}
