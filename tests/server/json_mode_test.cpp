// JSON mode (response_format json_object) behind `anvil serve`: the mask over Qwen3's real
// vocabulary (never empty before the object closes, exactly EOS after, equal to testing every token,
// and its cost per step), the tiny trained model answering in JSON through the openai client, an
// unconstrained request unchanged by a constrained one in its batch, and the reasoning gate on a
// scripted thinking model.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "../cli/scripted_model.h"
#include "server/json_mode.h"
#include "server_process.h"
#include "sse.h"
#include "tokenizer/tokenizer.h"

using anvil::test::run_python_check;
using anvil::test::ServerProcess;
using anvil::test::tiny_with_template;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const std::string kShared = ANVIL_SHARED_DIR;



}  // namespace

// Qwen3's vocabulary (151,643 entries + 26 added tokens, the model's 151,936 rows): random walks
// over allowed tokens never find an empty mask before the object closes, then find exactly the
// end-of-sequence ids; the mask equals pushing every token's bytes through the automaton; added
// tokens (<think>, <tool_call>, <|im_end|>) are never allowed inside. Prints the mask's cost.
TEST(JsonMode, Qwen3VocabularyMask) {
  const std::string path = kShared + "/fixtures/qwen3-tokenizer/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "no " << path;
  auto tok = anvil::Tokenizer::load(path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const int V = 151936;
  const int32_t im_end = *(*tok)->token_to_id("<|im_end|>"), eot = *(*tok)->token_to_id("<|endoftext|>");
  const auto t0 = std::chrono::steady_clock::now();
  auto vocab = anvil::server::json_vocab(**tok, V, {im_end, eot});
  const double build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().message();
  for (const char* t : {"<think>", "</think>", "<tool_call>", "<|im_start|>"}) {
    const int32_t id = *(*tok)->token_to_id(t);
    EXPECT_TRUE((*vocab)->bytes(id).empty()) << t;
  }
  auto brute = [&](const anvil::JsonAutomaton& s, const std::vector<uint64_t>& mask) {
    for (int32_t id = 0; id < V; ++id) {
      anvil::JsonAutomaton t = s;
      const std::string& b = (*vocab)->bytes(id);
      const bool ok = !b.empty() && t.push(b);
      ASSERT_EQ(anvil::mask_has(mask, id), ok) << "token " << id << " '" << b << "'";
    }
  };
  std::mt19937 rng(5);
  double walk_ms = 0;
  int64_t steps = 0, completed = 0;
  for (int walk = 0; walk < 12; ++walk) {
    anvil::JsonConstraint c(*vocab);
    for (int step = 0; step < 800; ++step) {
      const auto s0 = std::chrono::steady_clock::now();
      const std::vector<uint64_t>& m = c.allowed();
      walk_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
      ++steps;
      std::vector<int32_t> ids;
      for (int32_t id = 0; id < V; ++id)
        if (anvil::mask_has(m, id)) ids.push_back(id);
      if (c.complete()) {
        EXPECT_EQ(ids, (std::vector<int32_t>{std::min(im_end, eot), std::max(im_end, eot)}));
        ++completed;
        break;
      }
      ASSERT_FALSE(ids.empty()) << "walk " << walk << " step " << step;
      if (step % 50 == 7) brute(c.state(), m);
      // A random token, or after a while often the first allowed of single bytes that close what
      // is open (a string first: inside one, '}' would be content), so that walks finish.
      int32_t pick = ids[rng() % ids.size()];
      if (step > 30 && rng() % 2 == 0)
        for (const char* b : {"\"", "}", "]", ":", "0", "e", "l", "u", "r", "s", "a"}) {
          const int32_t id = *(*tok)->token_to_id(b);
          if (anvil::mask_has(m, id)) {
            pick = id;
            break;
          }
        }
      ASSERT_TRUE(c.accept(pick));
    }
  }
  EXPECT_GE(completed, 6);
  // The cost of one mask, uncached, in the states a reply spends its steps in.
  struct Probe {
    const char* what;
    std::string text;
  };
  const Probe probes[] = {{"start", ""},
                          {"after '{'", "{"},
                          {"in a key", "{\"na"},
                          {"after a key", "{\"name\""},
                          {"value due", "{\"name\":"},
                          {"in a string", "{\"name\": \"Al"},
                          {"in a number", "{\"age\": 4"},
                          {"after a value", "{\"a\": [1, {\"b\": null}"}};
  std::printf("[json mode] Qwen3 vocab: %zu trie nodes, built in %.1f ms; cached walk: %.3f ms/step over %lld steps\n",
              (*vocab)->nodes(), build_ms, walk_ms / double(steps), (long long)steps);
  std::vector<uint64_t> mask;
  for (const Probe& p : probes) {
    anvil::JsonAutomaton s;
    ASSERT_TRUE(s.push(p.text));
    int64_t n = 0;
    const int reps = 20;
    const auto s0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) n = (*vocab)->allowed(s, &mask);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count() / reps;
    std::printf("[json mode]   %-14s %7lld tokens allowed, %.3f ms per mask\n", p.what, (long long)n, ms);
    brute(s, mask);
  }
}

// A SentencePiece vocabulary (Mistral's layout: Replace "▁" -> " ", ByteFallback, Fuse, Strip) is
// taken: each token's bytes are what it adds to the text ("▁{" is " {", "<0xE4>" the byte E4), and
// the decoder only cuts the text's first space, which JSON does not need. Random walks over allowed
// tokens never find an empty mask before the object closes (the byte-fallback tokens give every
// byte), then find exactly EOS; the mask equals pushing every token's bytes through the automaton;
// [INST] and </s> are never allowed inside. The decoded text of each walk is a JSON object.
TEST(JsonMode, SentencePieceVocabularyMask) {
  const std::string path = std::string(ANVIL_TEST_DATA) + "/tokenizer/sp-llama/tokenizer.json";
  if (!fs::exists(path)) GTEST_SKIP() << "no " << path;
  auto tok = anvil::Tokenizer::load(path);
  ASSERT_TRUE(tok.is_ok()) << tok.status().message();
  const int V = (*tok)->vocab_size();
  auto vocab = anvil::server::json_vocab(**tok, V, {2});
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().message();
  for (const char* t : {"[INST]", "[/INST]", "<s>"}) EXPECT_TRUE((*vocab)->bytes(*(*tok)->token_to_id(t)).empty()) << t;
  EXPECT_EQ((*vocab)->bytes(*(*tok)->token_to_id("<0xE4>")), "\xE4");
  const int32_t space = *(*tok)->token_to_id("\u2581");
  EXPECT_EQ((*vocab)->bytes(space), " ");
  auto brute = [&](const anvil::JsonAutomaton& s, const std::vector<uint64_t>& mask) {
    for (int32_t id = 0; id < V; ++id) {
      anvil::JsonAutomaton t = s;
      const std::string& b = (*vocab)->bytes(id);
      const bool ok = !b.empty() && t.push(b);
      ASSERT_EQ(anvil::mask_has(mask, id), ok) << "token " << id << " '" << b << "'";
    }
  };
  std::mt19937 rng(7);
  int completed = 0;
  for (int walk = 0; walk < 40; ++walk) {
    anvil::JsonConstraint c(*vocab);
    std::vector<int32_t> ids;
    for (int step = 0; step < 400; ++step) {
      const std::vector<uint64_t>& m = c.allowed();
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < V; ++id)
        if (anvil::mask_has(m, id)) allowed.push_back(id);
      if (step == 0) {
        EXPECT_TRUE(anvil::mask_has(m, space)) << "a leading space (the \"▁\" a SentencePiece text starts with)";
        brute(c.state(), m);
      }
      if (c.complete()) {
        EXPECT_EQ(allowed, std::vector<int32_t>{2});
        ++completed;
        break;
      }
      ASSERT_FALSE(allowed.empty()) << "walk " << walk << " step " << step;
      if (step % 25 == 3) brute(c.state(), m);
      int32_t pick = allowed[rng() % allowed.size()];
      if (step > 20 && rng() % 2 == 0)  // often close what is open, so that walks finish
        for (const char* b : {"<0x22>", "<0x7D>", "<0x5D>", "<0x3A>", "<0x30>", "<0x65>", "<0x6C>", "<0x75>", "<0x72>"}) {
          const int32_t id = *(*tok)->token_to_id(b);
          if (anvil::mask_has(m, id)) {
            pick = id;
            break;
          }
        }
      ASSERT_TRUE(c.accept(pick));
      ids.push_back(pick);
    }
    if (!c.complete()) continue;
    // The text the reply would show: the decode of the walk, its first space cut. Still an object.
    const std::string text = (*tok)->decode(ids);
    const auto parsed = json::parse(text, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << text;
  }
  EXPECT_GE(completed, 20);
}

// Where a token's bytes depend on its neighbours, or the decoder cuts what JSON may need, or some
// byte is no token's (the mask could run empty), JSON mode is refused with the reason named.
TEST(JsonMode, RefusesTokenizersWithoutExactTokenBytes) {
  const std::string sp = std::string(ANVIL_TEST_DATA) + "/tokenizer/sp-llama/tokenizer.json";
  const std::string comp = std::string(ANVIL_TEST_DATA) + "/tokenizer/comp-bpe/tokenizer.json";
  if (!fs::exists(sp) || !fs::exists(comp)) GTEST_SKIP() << "no tokenizer fixtures";
  struct Case {
    std::string path;
    json decoder;  // null: unchanged
    const char* expect;
  };
  const Case cases[] = {
      {sp, json::parse(R"({"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"ByteFallback"}]})"),
       "ByteFallback step comes after Fuse"},
      {sp, json::parse(R"({"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"\u2581"},"content":" "},)"
                       R"({"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":"}","start":0,"stop":1}]})"),
       "Strip cuts '}'"},
      {comp, nullptr, "no token is the single byte 0x00"},
  };
  for (const Case& c : cases) {
    json j = json::parse(std::ifstream(c.path));
    if (!c.decoder.is_null()) j["decoder"] = c.decoder;
    auto tok = anvil::Tokenizer::from_json_text(j.dump(), c.path);
    ASSERT_TRUE(tok.is_ok()) << tok.status().message();
    auto v = anvil::server::json_vocab(**tok, (*tok)->vocab_size(), {2});
    ASSERT_FALSE(v.is_ok()) << c.expect;
    EXPECT_NE(v.status().message().find(c.expect), std::string::npos) << v.status().message();
    EXPECT_NE(v.status().message().find("json_object"), std::string::npos) << v.status().message();
  }
}

// The tiny trained model, which writes Python, held to JSON: every reply that stops is an object
// for json.loads, every reply cut short is the beginning of one (tests/server/json_mode_check.py,
// through the openai client: chat and completions, greedy and seeded at several temperatures,
// streamed and not).
TEST(JsonMode, TinyModelRepliesParseAsObjects) {
  const std::string dir = tiny_with_template("json_tiny");
  if (dir.empty()) GTEST_SKIP() << "no " << kShared << "/fixtures/anvil-tiny-code";
  ServerProcess srv({"-m", dir, "-c", "1024", "-np", "4", "-t", "2", "--no-kv-store", "--alias", "tiny"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  auto [code, out] = run_python_check("json_mode_check.py", srv.port(), {"none", "tiny", "1", "200"});
  fs::remove_all(dir);
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
  if (const size_t at = out.rfind("summary"); at != std::string::npos) std::printf("%s", out.substr(at).c_str());
}

// A constrained request in the batch changes nothing for an unconstrained one: the same tokens as
// alone. Under ANVIL_CUDA_DEVICE_SAMPLER=1 the request alone is sampled by the backend's sampler
// and in the constrained one's company by the host Sampler (the mask is host work), so this also
// holds them to each other.
TEST(JsonMode, UnconstrainedNeighbourGetsTheSameTokens) {
  const std::string dir = tiny_with_template("json_tiny");
  if (dir.empty()) GTEST_SKIP() << "no " << kShared << "/fixtures/anvil-tiny-code";
  for (const char* device : {"0", "1"}) {
    ::setenv("ANVIL_CUDA_DEVICE_SAMPLER", device, 1);
    ServerProcess srv({"-m", dir, "-c", "1024", "-np", "2", "-t", "2", "--no-kv-store"});
    ::unsetenv("ANVIL_CUDA_DEVICE_SAMPLER");
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    auto complete = [&](json body) {
      httplib::Client c("127.0.0.1", srv.port());
      c.set_read_timeout(120, 0);
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
      return r ? json::parse(r->body) : json();
    };
    const json plain = {{"prompt", "def fib(n):\n"}, {"max_tokens", 60}, {"temperature", 0.9}, {"seed", 11},
                        {"logprobs", 0}};
    const json alone = complete(plain);
    // The constrained request first (streamed, so it is running), then the plain one beside it.
    anvil::test::RawConnection stream(srv.port());
    const std::string b = json({{"prompt", "config = "}, {"max_tokens", 300}, {"temperature", 1.0}, {"seed", 3},
                                {"response_format", {{"type", "json_object"}}}, {"stream", true}})
                              .dump();
    ASSERT_TRUE(stream.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
    ASSERT_NE(stream.read_until("\"text\":", 60).find("\"text\":"), std::string::npos);
    const json beside = complete(plain);
    const std::string constrained = stream.read_until("[DONE]", 120);
    ASSERT_FALSE(alone.is_null() || beside.is_null());
    EXPECT_EQ(alone["choices"][0]["text"], beside["choices"][0]["text"]) << "device sampler " << device;
    EXPECT_EQ(alone["choices"][0]["logprobs"]["tokens"], beside["choices"][0]["logprobs"]["tokens"]);
    EXPECT_NE(constrained.find("\"finish_reason\""), std::string::npos) << constrained;
  }
  fs::remove_all(dir);
}

// A thinking model's reasoning is not held to JSON, its content is: the scripted model (after the
// generation prompt's "\n") writes <think> text that is no JSON </think>, then an object, then
// <|im_end|>. With json_object the reasoning comes back as written and the content parses; the
// same script asked for JSON with thinking off (its "</think>\n\n" prompt) gives the object too.
TEST(JsonMode, ReasoningComesFirstUnconstrained) {
  const std::string dir = (fs::temp_directory_path() / ("anvil_srv_json_think_" + std::to_string(::getpid()))).string();
  ASSERT_EQ(anvil::test::synth_tiny(dir), "");
  {
    anvil::test::ScriptTokens tk(dir);
    // (A script's tokens are each followed by one token: none repeats.)
    std::vector<int32_t> reply = {tk.id("<think>")};
    for (int32_t t : tk.text("not json: {[")) reply.push_back(t);
    reply.push_back(tk.id("</think>"));
    for (int32_t t : tk.text("\n\n{\"ok\": [true, 15]}")) reply.push_back(t);
    ASSERT_EQ(anvil::test::make_scripted(dir, {{tk.text("\n").at(0), reply}}), "");
  }
  ServerProcess srv({"-m", dir, "-c", "256", "-np", "2", "-t", "2", "--no-kv-store"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(60, 0);
  for (bool stream : {false, true}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "answer in JSON"}}}}, {"temperature", 0},
                 {"max_tokens", 60}, {"response_format", {{"type", "json_object"}}}, {"stream", stream}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    std::string content, reasoning, finish;
    if (!stream) {
      json j = json::parse(r->body);
      content = j["choices"][0]["message"]["content"];
      reasoning = j["choices"][0]["message"].value("reasoning_content", "");
      finish = j["choices"][0]["finish_reason"];
    } else {
      bool done = false;
      for (const json& e : anvil::test::sse_events(r->body, &done))
        for (const json& ch : e["choices"]) {
          const json& d = ch["delta"];
          if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
          if (d.contains("reasoning_content") && d["reasoning_content"].is_string())
            reasoning += d["reasoning_content"].get<std::string>();
          if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
        }
      EXPECT_TRUE(done);
    }
    EXPECT_EQ(finish, "stop") << r->body;
    EXPECT_EQ(reasoning, "not json: {[") << r->body;
    EXPECT_EQ(json::parse(content), json::parse("{\"ok\": [true, 15]}")) << content;
  }
  fs::remove_all(dir);
}
