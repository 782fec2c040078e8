// `anvil serve` as a client sees it, over loopback HTTP: every endpoint, the bad-input classes,
// auth, CORS, limits, 32 concurrent streams that each get what they get alone, a client that
// disconnects mid-stream or while waiting for a non-streaming reply, tool_choice required/named,
// SIGTERM draining, and the official openai Python client. The store and sessions: session_test.cpp.
#include <gtest/gtest.h>

#include <set>
#include <httplib.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <thread>

#include "format/npy.h"
#include "server_process.h"
#include "sse.h"

using anvil::test::RawConnection;
using anvil::test::run_python_check;
using anvil::test::ServerProcess;
using anvil::test::sse_events;
using json = nlohmann::json;

namespace {

const char* kKey = "test-key";
const char* kModel = "tiny-test";

httplib::Headers auth() { return {{"Authorization", std::string("Bearer ") + kKey}}; }

// The shared server: 32 sequences, API key, CORS for one origin, 64 KiB... (1 MiB) body limit.
class Http : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess({"--synthetic", "tiny", "-c", "512", "-np", "32", "-t", "2", "--api-key", kKey,
                                 "--cors", "http://app.example", "--max-body", "1", "--alias", kModel});
  }
  static void TearDownTestSuite() {
    if (server_) EXPECT_EQ(server_->terminate(30), 0);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(server_ && server_->ok()) << server_->startup_output(); }
  static httplib::Client client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  static json post(const std::string& path, const json& body, int* status = nullptr) {
    auto c = client();
    auto r = c.Post(path.c_str(), auth(), body.dump(), "application/json");
    if (!r) return json();
    if (status) *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
  static double metric(const std::string& name) {
    auto c = client();
    auto r = c.Get("/metrics", auth());
    if (!r) return -1;
    std::smatch m;
    std::regex re("\n" + std::regex_replace(name, std::regex(R"([{}\"/.+])"), R"(\$&)") + " ([0-9.e+-]+)\n");
    std::string body = "\n" + r->body;
    return std::regex_search(body, m, re) ? std::stod(m[1]) : -1;
  }
  static ServerProcess* server_;
};
ServerProcess* Http::server_ = nullptr;

json chat_body(const std::string& user, int max_tokens, bool stream = false) {
  return {{"model", kModel},
          {"messages", {{{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"stream", stream}};
}

}  // namespace

TEST_F(Http, HealthModelsMetricsPage) {
  auto c = client();
  auto h = c.Get("/health");  // no key needed
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["status"], "ok");
  auto m = c.Get("/v1/models", auth());
  ASSERT_TRUE(m);
  auto mj = json::parse(m->body);
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], kModel);
  EXPECT_EQ(mj["data"][0]["max_model_len"], 512);
  auto one = c.Get((std::string("/v1/models/") + kModel).c_str(), auth());
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(c.Get("/v1/models/other", auth())->status, 404);
  auto met = c.Get("/metrics", auth());
  ASSERT_TRUE(met);
  EXPECT_EQ(met->status, 200);
  for (const char* name : {"anvil_requests_total", "anvil_time_to_first_token_seconds_bucket",
                           "anvil_inter_token_latency_seconds_bucket", "anvil_requests_waiting", "anvil_kv_pages_used",
                           "anvil_prompt_tokens_cached_total"})
    EXPECT_NE(met->body.find(name), std::string::npos) << name;
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("/v1/chat/completions"), std::string::npos);
}

TEST_F(Http, MetricsCountStepsAndTheirForwardPasses) {
  // anvil_steps_total counts the scheduler's forward passes; anvil_step_seconds_total is the time of
  // the iterations that ran them, which contains their forward passes' (anvil_step_forward_...),
  // which contains the part before their kernels were issued (anvil_step_prep_...).
  // Read once the counters stand still (the scheduler idle again: it adds them after an iteration).
  auto settled = [&](double at_least) {
    double last = -1;
    for (int i = 0; i < 200; ++i) {
      const double v = metric("anvil_steps_total");
      if (v >= at_least && v == last) return v;
      last = v;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return last;
  };
  const double steps0 = settled(0);
  const double step0 = metric("anvil_step_seconds_total"), fwd0 = metric("anvil_step_forward_seconds_total");
  const double prep0 = metric("anvil_step_prep_seconds_total");
  ASSERT_GE(prep0, 0);
  ASSERT_GE(steps0, 0);
  ASSERT_GE(step0, 0);
  ASSERT_GE(fwd0, 0);
  auto r = post("/v1/chat/completions", chat_body("Hi", 6));
  ASSERT_EQ(r["usage"]["completion_tokens"], 6) << r;
  // The prompt's forward gives the first token, one more per further token.
  const double steps1 = settled(steps0 + 6);
  const double step1 = metric("anvil_step_seconds_total"), fwd1 = metric("anvil_step_forward_seconds_total");
  const double prep1 = metric("anvil_step_prep_seconds_total");
  EXPECT_GE(steps1 - steps0, 6);
  EXPECT_GT(fwd1 - fwd0, 0);
  EXPECT_GE(step1 - step0, fwd1 - fwd0);
  // The forward passes' prep (building and uploading each batch) is a part of them, and not nothing.
  EXPECT_GT(prep1 - prep0, 0);
  EXPECT_LT(prep1 - prep0, fwd1 - fwd0);
}

TEST_F(Http, TokenizeDetokenizeRoundTrip) {
  int st = 0;
  auto t = post("/tokenize", {{"content", "Hello, world! def f(x): return x"}}, &st);
  ASSERT_EQ(st, 200) << t;
  ASSERT_GT(t["count"].get<int>(), 3);
  EXPECT_EQ(t["tokens"].size(), t["count"].get<size_t>());
  auto d = post("/detokenize", {{"tokens", t["tokens"]}}, &st);
  EXPECT_EQ(st, 200);
  EXPECT_EQ(d["content"], "Hello, world! def f(x): return x");
  auto p = post("/tokenize", {{"content", "Hi"}, {"with_pieces", true}}, &st);
  EXPECT_EQ(p["tokens"][0]["piece"], "Hi");
  // The chat form counts the templated prompt, as /v1/chat/completions' usage does.
  auto ct = post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}}, &st);
  EXPECT_EQ(st, 200);
  auto r = post("/v1/chat/completions", chat_body("Hi", 1));
  EXPECT_EQ(ct["count"], r["usage"]["prompt_tokens"]);
  post("/detokenize", {{"tokens", {1, -1}}}, &st);
  EXPECT_EQ(st, 400);
  post("/detokenize", {{"tokens", {151936}}}, &st);
  EXPECT_EQ(st, 400);
}

// /tokenize's with_pieces on Qwen3's byte-level vocabulary: a piece is the token's own text, a string,
// or as llama-server gives it the list of its bytes where a token holds part of a character (" 🤗" is
// "ĠðŁ", "¤", "Ĺ": " \xF0\x9F", "\xA4", "\x97"; " 媽" is three too), which decoded alone read U+FFFD.
// The pieces joined are the text; every piece against Hugging Face tokenizers' vocabulary
// (tokenize_pieces_check.py).
TEST_F(Http, TokenizePiecesAreTheTokensOwnText) {
  int st = 0;
  const std::string text = "Hi, emoji \U0001F917 and \u5abd";
  auto p = post("/tokenize", {{"content", text}, {"with_pieces", true}}, &st);
  ASSERT_EQ(st, 200) << p;
  std::string joined;
  int lists = 0;
  for (const json& t : p["tokens"]) {
    if (t["piece"].is_string()) {
      joined += t["piece"].get<std::string>();
      EXPECT_EQ(t["piece"].get<std::string>().find("\xEF\xBF\xBD"), std::string::npos) << p;
    } else {
      ++lists;
      for (const json& c : t["piece"]) joined += char(c.get<int>());
    }
  }
  EXPECT_EQ(joined, text) << p;
  EXPECT_EQ(lists, 6) << "🤗's three tokens and \" 媽\"'s three: " << p;
  auto [code, out] = run_python_check("tokenize_pieces_check.py", server_->port(),
                                      {kKey, std::string(ANVIL_SOURCE_DIR) + "/tests/data/tokenizer/qwen3/tokenizer.json"});
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
}

TEST_F(Http, ChatStreamEqualsNonStreamAndReportsUsage) {
  int st = 0;
  auto r = post("/v1/chat/completions", chat_body("Tell me a story", 12), &st);
  ASSERT_EQ(st, 200) << r;
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 12);
  EXPECT_EQ(r["usage"]["total_tokens"].get<int>(),
            r["usage"]["prompt_tokens"].get<int>() + r["usage"]["completion_tokens"].get<int>());
  auto c = client();
  json body = chat_body("Tell me a story", 12, true);
  body["stream_options"] = {{"include_usage", true}};
  auto s = c.Post("/v1/chat/completions", auth(), body.dump(), "application/json");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->get_header_value("Content-Type"), "text/event-stream");
  bool done = false;
  auto evs = sse_events(s->body, &done);
  EXPECT_TRUE(done);
  std::string text;
  ASSERT_GE(evs.size(), 3u);
  EXPECT_EQ(evs[0]["choices"][0]["delta"]["role"], "assistant");
  for (auto& e : evs) {
    EXPECT_EQ(e["id"], evs[0]["id"]);
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content"))
      text += e["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(text, r["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_EQ(evs[evs.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(evs.back()["choices"].empty());
  EXPECT_EQ(evs.back()["usage"]["completion_tokens"], 12);
}

TEST_F(Http, RepeatedPrefixIsCachedInUsageAndMetrics) {
  std::string doc;
  for (int i = 0; i < 30; ++i) doc += "Paragraph " + std::to_string(i) + " of a long shared document. ";
  const double before = metric("anvil_prompt_tokens_cached_total");
  int st = 0;
  auto a = post("/v1/chat/completions", chat_body(doc + "First question?", 2), &st);
  ASSERT_EQ(st, 200);
  auto b = post("/v1/chat/completions", chat_body(doc + "Second question?", 2), &st);
  ASSERT_EQ(st, 200);
  const int cached = b["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, a["usage"]["prompt_tokens"].get<int>() - 32);  // all full pages of the shared part
  EXPECT_EQ(cached % 16, 0);
  EXPECT_GE(metric("anvil_prompt_tokens_cached_total") - before, cached);
}

TEST_F(Http, CompletionsWithIdsAndLogprobs) {
  int st = 0;
  auto r = post("/v1/completions", {{"prompt", {1, 2, 3, 4}}, {"max_tokens", 5}, {"temperature", 0},
                                    {"logprobs", 2}, {"ignore_eos", true}}, &st);
  ASSERT_EQ(st, 200) << r;
  auto& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0);
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    // Greedy: the chosen token is the most likely one.
    double best = -1e9;
    for (auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-6);
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], 4);
  // logprobs 0: each top_logprobs entry is the sampled token alone (OpenAI: always the sampled
  // token's logprob; vLLM likewise), not {}. Sampled at temperature 1, so not always the likeliest.
  for (double temp : {0.0, 1.0}) {
    auto z = post("/v1/completions", {{"prompt", "def f(x):"}, {"max_tokens", 6}, {"temperature", temp},
                                      {"logprobs", 0}, {"ignore_eos", true}, {"seed", 3}}, &st);
    ASSERT_EQ(st, 200) << z;
    auto& zl = z["choices"][0]["logprobs"];
    ASSERT_EQ(zl["tokens"].size(), 6u) << z;
    for (size_t i = 0; i < 6; ++i) {
      ASSERT_EQ(zl["top_logprobs"][i].size(), 1u) << zl;
      const std::string token = zl["tokens"][i].get<std::string>();
      ASSERT_TRUE(zl["top_logprobs"][i].contains(token)) << zl;
      EXPECT_DOUBLE_EQ(zl["top_logprobs"][i][token].get<double>(), zl["token_logprobs"][i].get<double>());
    }
  }
}

// Several prompts (text and ids, mixed) with n = 2 each, echo and logprobs: choice k * n + j is prompt
// k sampled with seed + j, exactly the request of that prompt and seed alone; the stream's chunks,
// gathered by index, are the body's choices, each with its finish chunk, then one usage.
TEST_F(Http, SeveralPromptsAndChoicesAreEachTheRequestAlone) {
  const json prompts = {"def f(x):", {1, 2, 3, 4}};
  json body = {{"prompt", prompts}, {"n", 2}, {"max_tokens", 6}, {"temperature", 0.9}, {"seed", 3},
               {"echo", true}, {"logprobs", 1}, {"ignore_eos", true}};
  int st = 0;
  const json all = post("/v1/completions", body, &st);
  ASSERT_EQ(st, 200) << all;
  ASSERT_EQ(all["choices"].size(), 4u) << all;
  int prompt_tokens = 0, completion_tokens = 0;
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 2; ++j) {
      json one = body;
      one.erase("n");
      one["prompt"] = prompts[size_t(k)];
      one["seed"] = 3 + j;
      const json alone = post("/v1/completions", one, &st);
      ASSERT_EQ(st, 200) << alone;
      const json& c = all["choices"][size_t(k * 2 + j)];
      EXPECT_EQ(c["index"], k * 2 + j);
      EXPECT_EQ(c["text"], alone["choices"][0]["text"]) << "prompt " << k << " choice " << j;
      EXPECT_EQ(c["logprobs"]["tokens"], alone["choices"][0]["logprobs"]["tokens"]);
      EXPECT_EQ(c["finish_reason"], alone["choices"][0]["finish_reason"]);
      if (j == 0) prompt_tokens += alone["usage"]["prompt_tokens"].get<int>();
      completion_tokens += alone["usage"]["completion_tokens"].get<int>();
    }
  EXPECT_EQ(all["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(all["usage"]["completion_tokens"], completion_tokens);

  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  auto c = client();
  auto r = c.Post("/v1/completions", auth(), body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
  bool done = false;
  std::vector<std::string> text(4);
  std::vector<int> finishes(4, 0);
  json usage;
  for (const json& ev : sse_events(r->body, &done)) {
    ASSERT_FALSE(ev.is_discarded()) << r->body;
    if (ev.contains("usage") && !ev["usage"].is_null()) usage = ev["usage"];
    for (const json& ch : ev["choices"]) {
      const size_t i = ch["index"].get<size_t>();
      ASSERT_LT(i, 4u);
      EXPECT_EQ(finishes[i], 0) << "a chunk of choice " << i << " after its finish";
      text[i] += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) ++finishes[i];
    }
  }
  EXPECT_TRUE(done);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(text[i], all["choices"][i]["text"]) << i;
    EXPECT_EQ(finishes[i], 1) << i;
  }
  EXPECT_EQ(usage["completion_tokens"], completion_tokens) << usage;
}

// Seeds: any of 0..2^64-1 is its own (those past 2^63 were once all the same), a seed reproduces its
// run, and -1 draws a fresh one each time (llama-server's meaning; once a fixed seed).
TEST_F(Http, SeedsBeyondTwoToTheSixtyThreeAndMinusOne) {
  auto text = [](const json& seed) {
    int st = 0;
    auto r = post("/v1/completions", {{"prompt", "def f("}, {"max_tokens", 24}, {"temperature", 1.0},
                                      {"ignore_eos", true}, {"seed", seed}}, &st);
    EXPECT_EQ(st, 200) << r;
    return r["choices"][0]["text"].get<std::string>();
  };
  std::set<std::string> big, minus;
  for (uint64_t s : {uint64_t(1) << 63, (uint64_t(1) << 63) + 12345, ~uint64_t(0)}) big.insert(text(s));
  // Three seeds, 24 tokens at temperature 1: equal texts mean the seeds were not used.
  EXPECT_GT(big.size(), 1u);
  EXPECT_EQ(text(~uint64_t(0)), text(~uint64_t(0)));
  for (int i = 0; i < 3; ++i) minus.insert(text(-1));
  EXPECT_GT(minus.size(), 1u) << "seed -1 is a random seed";
}

TEST_F(Http, BadInputsGetOpenAIErrors) {
  auto c = client();
  struct Case {
    std::string path, body;
    int status;
    std::string param;  // "" = null
  };
  std::string long_prompt;
  for (int i = 0; i < 600; ++i) long_prompt += "word ";
  const std::vector<Case> cases = {
      {"/v1/chat/completions", "{not json", 400, ""},
      {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\x28\"}]}", 400, ""},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"temperature":"hot"})", 400, "temperature"},
      {"/v1/chat/completions", R"({"model":"gpt-9","messages":[{"role":"user","content":"x"}]})", 404, "model"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":-1})", 400, "max_tokens"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":4000000000})", 400, "max_tokens"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"max_tokens":510})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":")" + long_prompt + R"("})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[1, 999999]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":"x","n":65})", 400, "n"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"session":"../etc"})", 400, "session"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"session":7})", 400, "session"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":5}})", 400,
       "chat_template_kwargs"},
      // A number beyond a double, even in a field the server ignores, is bad JSON (not a 500).
      {"/v1/completions", R"({"prompt":"x","max_tokens":1e400})", 400, ""},
      {"/v1/completions", R"({"prompt":"x","tools_schema":{"maximum":-1e309}})", 400, ""},
      {"/tokenize", R"({"content":"x","n":1e999})", 400, ""},
      {"/v1/completions", R"({"prompt":"","max_tokens":1})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[],"max_tokens":1})", 400, "prompt"},
  };
  for (const Case& k : cases) {
    auto r = c.Post(k.path.c_str(), auth(), k.body, "application/json");
    ASSERT_TRUE(r) << k.body;
    EXPECT_EQ(r->status, k.status) << k.body << " -> " << r->body;
    auto j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.contains("error")) << r->body;
    EXPECT_EQ(j["error"]["param"], k.param.empty() ? json() : json(k.param)) << r->body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
  }
  // Over-long prompt: the code OpenAI uses.
  auto r = c.Post("/v1/completions", auth(), R"({"prompt":")" + long_prompt + R"("})", "application/json");
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
  // Oversized body (the limit is 1 MiB): 413 with a JSON error.
  std::string huge = R"({"prompt":")" + std::string(2 << 20, 'a') + R"("})";
  auto big = c.Post("/v1/completions", auth(), huge, "application/json");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  EXPECT_EQ(json::parse(big->body)["error"]["code"], "request_too_large");
  // Nesting deep enough to overflow a recursive walk (the chat template's) is refused, and the
  // server lives on.
  std::string deep = R"({"messages":[{"role":"user","content":"x","extra":)" + std::string(20000, '[') +
                     std::string(20000, ']') + "}]}";
  auto dr = c.Post("/v1/chat/completions", auth(), deep, "application/json");
  ASSERT_TRUE(dr) << "the server died on a deeply nested body";
  EXPECT_EQ(dr->status, 400);
  EXPECT_EQ(json::parse(dr->body)["error"]["code"], "invalid_json");
  auto dt = c.Post("/tokenize", auth(), deep, "application/json");
  ASSERT_TRUE(dt);
  EXPECT_EQ(dt->status, 400);
  // Malformed JSON: the error quotes the start of what it read, not the whole body.
  auto unterminated = c.Post("/v1/completions", auth(), R"({"prompt":")" + std::string(500000, 'a'), "application/json");
  ASSERT_TRUE(unterminated);
  EXPECT_EQ(unterminated->status, 400);
  EXPECT_LT(unterminated->body.size(), 2000u);
  // A body without Content-Length (chunked) would get past --max-body: refused before it is read.
  // Only the headers are sent (a client still writing the body when the server closes could see
  // a reset instead of the answer): the 411 comes after them alone.
  {
    RawConnection raw(server_->port());
    ASSERT_TRUE(raw.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + std::string(kKey) +
                             "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string reply = raw.read_until("length_required", 10);
    EXPECT_NE(reply.find("HTTP/1.1 411"), std::string::npos) << reply;
    EXPECT_NE(reply.find("\"length_required\""), std::string::npos) << reply;
    // The body was never read, so the connection closes after the reply (its bytes would otherwise
    // be taken for the next request), and the reply says so, without a Keep-Alive header that
    // says the opposite. The server closes it well within its 5 s keep-alive wait.
    EXPECT_NE(reply.find("Connection: close"), std::string::npos) << reply;
    EXPECT_EQ(reply.find("Keep-Alive"), std::string::npos) << reply;
    EXPECT_TRUE(raw.wait_closed(3)) << "the connection stayed open after the 411";
    const size_t json_at = reply.find("\r\n\r\n");
    ASSERT_NE(json_at, std::string::npos) << reply;
    EXPECT_EQ(json::parse(reply.substr(json_at + 4), nullptr, false)["error"]["code"], "length_required") << reply;
  }
  // Unknown endpoint.
  auto nf = c.Post("/v1/embeddings", auth(), "{}", "application/json");
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(json::parse(nf->body)["error"].is_object());
  // A known endpoint under another method: 405, saying which it takes.
  auto expect_405 = [](const httplib::Result& res, const char* allow) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 405) << res->body;
    EXPECT_EQ(res->get_header_value("Allow"), allow);
    EXPECT_EQ(json::parse(res->body)["error"]["code"], "method_not_allowed") << res->body;
  };
  expect_405(c.Get("/v1/completions", auth()), "POST");
  expect_405(c.Delete("/v1/models", auth()), "GET, HEAD");
  expect_405(c.Post("/v1/sessions/x", auth(), "{}", "application/json"), "GET, HEAD, DELETE");
  // A JSON body sent as a form (curl -d sends application/x-www-form-urlencoded) is read as JSON,
  // also beyond the HTTP library's 8 KB limit for forms.
  json form = {{"prompt", "def f(x):"}, {"max_tokens", 1}, {"pad", std::string(20000, 'x')}};
  auto fr = c.Post("/v1/completions", auth(), form.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(fr);
  EXPECT_EQ(fr->status, 200) << fr->body.substr(0, 300);
  // The server is still fine.
  EXPECT_EQ(c.Get("/health")->status, 200);
}

TEST_F(Http, ApiKeyAndCors) {
  auto c = client();
  auto none = c.Get("/v1/models");
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer");
  auto wrong = c.Get("/v1/models", {{"Authorization", "Bearer nope"}});
  EXPECT_EQ(wrong->status, 401);
  EXPECT_EQ(json::parse(wrong->body)["error"]["message"], "Invalid API key");
  EXPECT_EQ(c.Post("/v1/completions", R"({"prompt":"x"})", "application/json")->status, 401);
  // The auth scheme is case-insensitive (RFC 9110 §11.1), spaces and tabs around the key are
  // tolerated, and X-Api-Key carries the key too (as llama-server takes it); either header that
  // carries it is enough.
  const std::string key = kKey;
  for (const httplib::Headers& ok : std::vector<httplib::Headers>{
           {{"Authorization", "bearer " + key}},
           {{"Authorization", "BEARER   " + key + "  "}},
           {{"Authorization", "BeArEr\t" + key}},
           {{"X-Api-Key", key}},
           {{"x-api-key", " " + key}},
           {{"Authorization", "Bearer sk-placeholder"}, {"X-Api-Key", key}}}) {
    auto r = c.Get("/v1/models", ok);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << ok.begin()->first << ": " << ok.begin()->second << " -> " << r->body;
  }
  struct Refused {
    httplib::Headers headers;
    std::string says;
  };
  for (const Refused& bad : std::vector<Refused>{
           {{{"Authorization", "bearer nope"}}, "Invalid API key"},
           {{{"Authorization", "bearer"}}, "Missing API key"},
           {{{"Authorization", "Bearer " + key + "x"}}, "Invalid API key"},
           {{{"Authorization", "Bearer" + key}}, "Bearer scheme"},
           {{{"Authorization", key}}, "Bearer scheme"},
           {{{"Authorization", "Basic " + key}}, "Bearer scheme"},
           {{{"X-Api-Key", "nope"}}, "Invalid API key"},
           {{{"Authorization", ""}}, "Missing API key"}}) {
    auto r = c.Get("/v1/models", bad.headers);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401) << bad.headers.begin()->second;
    auto j = json::parse(r->body, nullptr, false);
    EXPECT_NE(j["error"]["message"].get<std::string>().find(bad.says), std::string::npos)
        << bad.headers.begin()->second << " -> " << r->body;
    EXPECT_EQ(r->body.find(key), std::string::npos) << "a 401 never quotes what was sent";
  }
  auto pre = c.Options("/v1/chat/completions", {{"Origin", "http://app.example"},
                                                {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 204);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  // The headers a browser asks about are allowed (the OpenAI SDKs send X-Stainless-* ones).
  auto sdk = c.Options("/v1/chat/completions", {{"Origin", "http://app.example"},
                                                {"Access-Control-Request-Method", "POST"},
                                                {"Access-Control-Request-Headers", "authorization,content-type,x-stainless-os"}});
  ASSERT_TRUE(sdk);
  EXPECT_NE(sdk->get_header_value("Access-Control-Allow-Headers").find("x-stainless-os"), std::string::npos);
  auto g = c.Get("/v1/models", {{"Origin", "http://app.example"}, {"Authorization", std::string("Bearer ") + kKey}});
  EXPECT_EQ(g->get_header_value("Access-Control-Allow-Origin"), "http://app.example");
}

// 32 clients stream at once (the server runs 32 sequences together); each gets exactly the text it
// gets alone (greedy).
TEST_F(Http, ThirtyTwoConcurrentStreamsMatchAlone) {
  const int kClients = 32, kTokens = 10;
  std::vector<std::string> alone(kClients);
  for (int i = 0; i < kClients; ++i) {
    auto r = post("/v1/chat/completions", chat_body("Client " + std::to_string(i) + " asks " + std::string(size_t(i % 5), '?'), kTokens));
    ASSERT_TRUE(r.contains("choices")) << r;
    alone[size_t(i)] = r["choices"][0]["message"]["content"];
  }
  std::vector<std::string> streamed(kClients), errors(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = client();
      auto body = chat_body("Client " + std::to_string(i) + " asks " + std::string(size_t(i % 5), '?'), kTokens, true);
      auto r = c.Post("/v1/chat/completions", auth(), body.dump(), "application/json");
      if (!r || r->status != 200) {
        errors[size_t(i)] = r ? r->body : "no response: " + httplib::to_string(r.error());
        return;
      }
      bool done = false;
      for (auto& e : sse_events(r->body, &done))
        if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content"))
          streamed[size_t(i)] += e["choices"][0]["delta"]["content"].get<std::string>();
      if (!done) errors[size_t(i)] = "stream did not end with [DONE]";
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(errors[size_t(i)], "") << "client " << i;
    EXPECT_EQ(streamed[size_t(i)], alone[size_t(i)]) << "client " << i;
  }
}

// A client that goes away mid-stream: its sequence is cancelled and its pages come back.
TEST_F(Http, DisconnectMidStreamCancelsAndFreesPages) {
  const double cancelled_before = metric("anvil_cancelled_total");
  {
    RawConnection conn(server_->port());
    json body = chat_body("Write forever", 400, true);
    std::string b = body.dump();
    ASSERT_TRUE(conn.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                              std::string(kKey) + "\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(b.size()) + "\r\n\r\n" + b));
    std::string got = conn.read_until("\"delta\":{\"content\":\"", 30);  // a token chunk (the role chunk has "delta":{"role")
    ASSERT_NE(got.find("chat.completion.chunk"), std::string::npos) << got;
    EXPECT_GE(metric("anvil_requests_running"), 1);
    conn.close();
  }
  // Bounded wait for the scheduler to notice (it does at the next write after the close).
  for (int i = 0; i < 100 && metric("anvil_requests_running") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(metric("anvil_requests_running"), 0);
  EXPECT_EQ(metric("anvil_cancelled_total"), cancelled_before + 1);
  // With nothing running, every used page is a prefix-cache page: the stream's own pages are free.
  EXPECT_EQ(metric("anvil_kv_pages_used"), metric("anvil_kv_prefix_cache_pages"));
  // Far fewer than 400 tokens were generated.
  EXPECT_EQ(server_ != nullptr, true);
}

// A non-streaming client that goes away: noticed while its request runs (there is no write to
// fail until the end), its sequence cancelled and its pages freed long before max_tokens. Whether
// it closes or resets the connection (SO_LINGER 0: the server's socket is then no longer
// connected, and was once not found when that came before the first look, 100 ms in).
TEST_F(Http, DisconnectWhileWaitingForANonStreamingReplyCancels) {
  for (bool reset : {false, true}) {
    SCOPED_TRACE(reset ? "reset" : "closed");
    const double cancelled_before = metric("anvil_cancelled_total");
    const double generated_before = metric("anvil_generation_tokens_total");
    const int max_tokens = 480;  // ~3 s of the tiny model on 2 cores, measured
    {
      RawConnection conn(server_->port());
      json body = {{"model", kModel}, {"prompt", "Write forever"}, {"max_tokens", max_tokens}, {"ignore_eos", true}};
      std::string b = body.dump();
      ASSERT_TRUE(conn.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                                std::string(kKey) + "\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(b.size()) + "\r\n\r\n" + b));
      for (int i = 0; i < 100 && metric("anvil_generation_tokens_total") <= generated_before; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ASSERT_GT(metric("anvil_generation_tokens_total"), generated_before) << "the request never started";
      if (reset) conn.reset();
      else conn.close();
    }
    for (int i = 0; i < 100 && metric("anvil_requests_running") != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(metric("anvil_requests_running"), 0);
    EXPECT_EQ(metric("anvil_cancelled_total"), cancelled_before + 1);
    EXPECT_LT(metric("anvil_generation_tokens_total") - generated_before, max_tokens) << "it ran to the end";
    EXPECT_EQ(metric("anvil_kv_pages_used"), metric("anvil_kv_prefix_cache_pages"));
  }
}

// tool_choice "required" / a named function: the answer is prefilled with the opening of a Qwen
// <tool_call> block (and the name), and a named choice offers the template only that tool. The
// prompt the server ran is checked by its token count against /tokenize of the same conversation.
TEST_F(Http, ToolChoiceRequiredAndNamedStartTheAnswerInsideACall) {
  auto tool = [](const std::string& name) {
    return json{{"type", "function"},
                {"function", {{"name", name}, {"description", "d"}, {"parameters", {{"type", "object"}}}}}};
  };
  json tools = {tool("get_weather"), tool("get_time")};
  json msgs = {{{"role", "user"}, {"content", "What time is it in Paris?"}}};
  auto count = [&](const json& body) {
    int st = 0;
    auto t = post("/tokenize", body, &st);
    EXPECT_EQ(st, 200) << t;
    return t["count"].get<int>();
  };
  auto text_count = [&](const std::string& text) { return count({{"content", text}}); };
  auto run = [&](const json& choice, int* status) {
    json b = {{"model", kModel}, {"messages", msgs}, {"tools", tools}, {"max_tokens", 3}, {"temperature", 0}};
    if (!choice.is_null()) b["tool_choice"] = choice;
    return post("/v1/chat/completions", b, status);
  };
  int st = 0;
  auto autoc = run("auto", &st);
  ASSERT_EQ(st, 200) << autoc;
  EXPECT_EQ(autoc["usage"]["prompt_tokens"], count({{"messages", msgs}, {"tools", tools}}));
  auto req = run("required", &st);
  ASSERT_EQ(st, 200) << req;  // 3 tokens: cut short, so not checked against tool_choice
  EXPECT_EQ(req["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(req["usage"]["prompt_tokens"],
            count({{"messages", msgs}, {"tools", tools}}) + text_count("<tool_call>\n{\"name\": \""));
  auto named = run({{"type", "function"}, {"function", {{"name", "get_time"}}}}, &st);
  ASSERT_EQ(st, 200) << named;
  EXPECT_EQ(named["usage"]["prompt_tokens"],
            count({{"messages", msgs}, {"tools", json::array({tool("get_time")})}}) +
                text_count("<tool_call>\n{\"name\": \"get_time\", \"arguments\": "));
  // Choices that cannot be honoured are refused, naming tool_choice.
  for (const json& bad : {json{{"type", "function"}, {"function", {{"name", "get_stock"}}}}, json("sometimes"),
                          json{{"type", "function"}}, json(3)}) {
    auto e = run(bad, &st);
    EXPECT_EQ(st, 400) << bad;
    EXPECT_EQ(e["error"]["param"], "tool_choice") << e;
  }
  auto e = post("/v1/chat/completions", {{"messages", msgs}, {"tool_choice", "required"}, {"max_tokens", 2}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_EQ(e["error"]["param"], "tool_choice");
}

TEST_F(Http, OpenAIPythonClient) {
  auto [code, out] = run_python_check("openai_client_check.py", server_->port(), {kKey, kModel});
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
}

// The chat page in headless Chromium: a message, the streamed reply (equal to the API's), the
// model name and tokens/s, and the stop button cancelling on the server.
TEST_F(Http, ChatPageInHeadlessChromium) {
  auto [code, out] = run_python_check("chat_page_check.py", server_->port(), {kKey});
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
}

// A small server for the limits: one sequence, one queue place. The running stream must outlast
// the queued request's arrival, the gauge poll and the refused request: this server streams the
// tiny model at ~270-450 tok/s on 2 cores (measured: 2,000 tokens in 4.5-7.5 s), so 60 tokens
// (~0.2 s) lost that race on a loaded CI machine.
TEST(HttpLimits, FullQueueGets503WithRetryAfterAndSigtermDrains) {
  ServerProcess srv({"--synthetic", "tiny", "-c", "2048", "-np", "1", "-t", "2", "--max-queue", "1"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  // One running stream and one queued one hold both places.
  RawConnection running(srv.port()), queued(srv.port());
  auto start = [&](RawConnection& c, int n) {
    json body = chat_body("Go", n, true);
    body.erase("model");
    std::string b = body.dump();
    return c.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b);
  };
  ASSERT_TRUE(start(running, 2000));
  ASSERT_NE(running.read_until("\"delta\":{\"content\":\"", 30).find("chunk"), std::string::npos);
  ASSERT_TRUE(start(queued, 3));
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(30, 0);
  // The queued request is in the queue once the queue gauge says so (bounded wait).
  bool waiting = false;
  for (int i = 0; i < 100 && !waiting; ++i) {
    auto m = c.Get("/metrics");
    waiting = m && m->body.find("\nanvil_requests_waiting 1\n") != std::string::npos;
    if (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(waiting) << "the queued request never showed in anvil_requests_waiting";
  auto r = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(r->body)["error"]["type"], "server_error");
  // SIGTERM: the running stream and the queued one still finish with [DONE]; then exit 0.
  kill(srv.pid(), SIGTERM);
  std::string a = running.read_until("data: [DONE]", 60), b = queued.read_until("data: [DONE]", 60);
  EXPECT_NE(a.find("\"finish_reason\":\"length\""), std::string::npos) << a.substr(a.size() > 500 ? a.size() - 500 : 0);
  EXPECT_NE(a.find("data: [DONE]"), std::string::npos);
  EXPECT_NE(b.find("data: [DONE]"), std::string::npos) << b;
  EXPECT_EQ(srv.terminate(30), 0);
}

// --max-queue 0: no request waits, but one that finds a free sequence is served. Every request got
// 503 ("0 requests are already waiting"), an idle server's too, since the queue the limit counted
// holds the requests about to take a free sequence as well.
TEST(HttpLimits, MaxQueueZeroServesWhileASequenceIsFree) {
  ServerProcess srv({"--synthetic", "tiny", "-c", "2048", "-np", "1", "-t", "2", "--max-queue", "0"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(30, 0);
  for (int i = 0; i < 2; ++i) {  // one after the other: the sequence is free each time
    auto r = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":2})", "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  // With the one sequence streaming, the next request has nowhere to wait: 503 at once.
  RawConnection running(srv.port());
  json body = chat_body("Go", 2000, true);
  body.erase("model");
  const std::string b = body.dump();
  ASSERT_TRUE(running.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
  ASSERT_NE(running.read_until("\"delta\":{\"content\":\"", 30).find("chunk"), std::string::npos);
  auto r = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":1})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  running.close();  // the client goes away: its request is cancelled
  EXPECT_EQ(srv.terminate(30), 0);
}

// SIGTERM with connections that hold no job: an idle keep-alive connection (its reply sent), a
// request whose body stopped midway, one whose headers did. The HTTP library would wait on them
// for its keep-alive timeout (5 s) and its read timeout (30 s) before serve() returned; the server
// ends them instead, so it exits at once with nothing running.
TEST(HttpLimits, SigtermDoesNotWaitForIdleOrHalfSentConnections) {
  ServerProcess srv({"--synthetic", "tiny", "-c", "256", "-np", "1", "-t", "2", "--shutdown-timeout", "1"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  RawConnection idle(srv.port()), half_body(srv.port()), half_headers(srv.port());
  ASSERT_TRUE(idle.send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  ASSERT_NE(idle.read_until("\"ok\"", 10).find("200 OK"), std::string::npos);
  const std::string b = R"({"prompt": "x", "max_tokens": 1})";
  ASSERT_TRUE(half_body.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b.substr(0, 5)));
  ASSERT_TRUE(half_headers.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server's threads are reading them
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(srv.terminate(15), 0) << "the server did not exit within 15 s of SIGTERM";
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 4.0);
}

// Connections that hold an HTTP thread without a job (a client that stopped sending its request
// midway, idle keep-alive connections: the openai SDKs keep theirs) do not make later clients wait:
// a server of one sequence and one queue place starts 10 HTTP threads, and 24 stalled connections
// held them all, so /health and a request waited unanswered for the read timeout (30 s). Threads
// are now started as connections need them: both are answered at once, and a burst beyond the
// queue gets its 503 at once too.
TEST(HttpLimits, StalledAndIdleConnectionsDoNotMakeOthersWait) {
  ServerProcess srv({"--synthetic", "tiny", "-c", "256", "-np", "1", "-t", "2", "--max-queue", "1"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 24; ++i) {
    held.push_back(std::make_unique<RawConnection>(srv.port()));
    if (i % 2) {
      ASSERT_TRUE(held.back()->send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));  // stalls in its headers
    } else {
      ASSERT_TRUE(held.back()->send_all("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));  // then stays idle
      ASSERT_NE(held.back()->read_until("\"ok\"", 10).find("200 OK"), std::string::npos);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // every one of them holds a thread
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(20, 0);
  auto t0 = std::chrono::steady_clock::now();
  auto h = c.Get("/health");
  ASSERT_TRUE(h) << httplib::to_string(h.error());
  EXPECT_EQ(h->status, 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  // A burst of 12 requests at one sequence and one queue place: each is answered (200 or 503) at
  // once, none waits for a thread.
  std::vector<int> status(12, 0);
  std::vector<double> took(12, 0);
  std::vector<std::thread> burst;
  for (int i = 0; i < 12; ++i)
    burst.emplace_back([&, i] {
      httplib::Client bc("127.0.0.1", srv.port());
      bc.set_read_timeout(20, 0);
      const auto b0 = std::chrono::steady_clock::now();
      auto r = bc.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "application/json");
      status[size_t(i)] = r ? r->status : -1;
      took[size_t(i)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - b0).count();
    });
  for (auto& t : burst) t.join();
  int ok = 0;
  for (int i = 0; i < 12; ++i) {
    EXPECT_TRUE(status[size_t(i)] == 200 || status[size_t(i)] == 503) << "request " << i << ": " << status[size_t(i)];
    EXPECT_LT(took[size_t(i)], 3.0) << "request " << i;
    ok += status[size_t(i)] == 200;
  }
  EXPECT_GE(ok, 1);
  EXPECT_EQ(srv.terminate(15), 0);
}

// A complete request that arrives while the server drains is read and answered 503 with
// Retry-After, and the running stream still finishes.
TEST(HttpLimits, ARequestSentAsSigtermComesIsAnswered503) {
  ServerProcess srv({"--synthetic", "tiny", "-c", "2048", "-np", "1", "-t", "2", "--shutdown-timeout", "30"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  // A running stream keeps the server draining for a while after the signal.
  RawConnection running(srv.port()), late(srv.port());
  json body = chat_body("Go", 1500, true);
  body.erase("model");
  const std::string b = body.dump();
  ASSERT_TRUE(running.send_all("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               "Content-Length: " + std::to_string(b.size()) + "\r\n\r\n" + b));
  ASSERT_NE(running.read_until("\"delta\":{\"content\":\"", 30).find("chunk"), std::string::npos);
  kill(srv.pid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string c = R"({"prompt": "x", "max_tokens": 1})";
  ASSERT_TRUE(late.send_all("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            "Content-Length: " + std::to_string(c.size()) + "\r\n\r\n" + c));
  const std::string got = late.read_until("shutting down", 30);
  EXPECT_NE(got.find("HTTP/1.1 503"), std::string::npos) << got;
  EXPECT_NE(got.find("Retry-After: 1"), std::string::npos) << got;
  const std::string a = running.read_until("data: [DONE]", 60);
  EXPECT_NE(a.find("\"finish_reason\":\"length\""), std::string::npos) << a.substr(a.size() > 500 ? a.size() - 500 : 0);
  EXPECT_EQ(srv.terminate(30), 0);
}

// The bundled model (no chat template): chat completions answer 400, and a greedy completion is
// the text `anvil generate` produces for the same prompt (a different code path: extend/decode).
TEST(HttpBundledModel, CompletionEqualsGenerateAndChatNeedsATemplate) {
  const std::string model = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
  const std::string prompt = "def fibonacci(n):\n";
  std::string cmd = std::string(ANVIL_BINARY) + " generate -m " + model + " -p '" + prompt +
                    "' -n 24 --temp 0 --ignore-eos --json -t 2 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_TRUE(p);
  std::string out;
  char b[4096];
  size_t n;
  while ((n = fread(b, 1, sizeof b, p)) > 0) out.append(b, n);
  ASSERT_EQ(pclose(p), 0) << out;
  auto gen = json::parse(out.substr(out.rfind("{\"ids\"") == std::string::npos ? 0 : out.rfind("{\"ids\"")),
                         nullptr, false);
  ASSERT_TRUE(gen.is_object()) << out;

  ServerProcess srv({"-m", model, "-c", "512", "-np", "2", "-t", "2"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(60, 0);
  json body = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"], gen["text"]);
  EXPECT_EQ(j["usage"]["prompt_tokens"], gen["prompt_tokens"]);
  EXPECT_EQ(j["usage"]["completion_tokens"], gen["ids"].size());
  EXPECT_EQ(json::parse(c.Get("/v1/models")->body)["data"][0]["id"], "anvil-tiny-code-q4");
  auto chat = c.Post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})", "application/json");
  EXPECT_EQ(chat->status, 400);
  EXPECT_EQ(json::parse(chat->body)["error"]["param"], "messages");
  EXPECT_EQ(srv.terminate(30), 0);
}

namespace {
// log_softmax(row)[i] in double.
double ref_logprob(const float* row, size_t V, int32_t i) {
  double mx = -1e300;
  for (size_t k = 0; k < V; ++k) mx = std::max(mx, double(row[k]));
  double s = 0;
  for (size_t k = 0; k < V; ++k) s += std::exp(double(row[k]) - mx);
  return double(row[size_t(i)]) - mx - std::log(s);
}
}  // namespace

// Completions' echo: the reply repeats the prompt, and with logprobs scores every prompt token under
// the model (lm-evaluation-harness's loglikelihood requests). The bundled model's scores against
// mlx-lm's float32 logits for the same prompt (tests/data/golden/anvil-tiny-code-q4, made by
// scripts/make_golden_fixtures.py), a text prompt against its ids, a stream against the whole
// reply, and a server whose forward takes 4 tokens (the prompt's rows over several steps, two echo
// requests at once) against the first.
TEST(HttpBundledModel, EchoScoresThePromptAsTheReferenceDoes) {
  const std::string model = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
  const std::string gdir = std::string(ANVIL_SOURCE_DIR) + "/tests/data/golden/anvil-tiny-code-q4";
  std::ifstream mf(gdir + "/meta.json");
  ASSERT_TRUE(mf) << gdir;
  const json meta = json::parse(mf);
  const std::vector<int32_t> ids = meta["prompts"][0].get<std::vector<int32_t>>();
  const std::string text = meta["prompt_texts"][0].get<std::string>();
  auto ref = anvil::read_npy(gdir + "/ref_0.npy");
  ASSERT_TRUE(ref.is_ok()) << ref.status().message();
  ASSERT_EQ(ref->shape.size(), 2u);
  ASSERT_EQ(size_t(ref->shape[0]), ids.size());
  const size_t V = size_t(ref->shape[1]);
  const float* R = ref->f32();

  ServerProcess srv({"-m", model, "-c", "512", "-np", "2", "-t", "2"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(60, 0);
  auto complete = [](httplib::Client& cl, const json& body) {
    auto r = cl.Post("/v1/completions", body.dump(), "application/json");
    if (!r || r->status != 200) return json{{"failed", r ? r->body : "no reply"}};
    return json::parse(r->body);
  };
  const json by_ids = complete(c, {{"prompt", ids}, {"echo", true}, {"logprobs", 3}, {"max_tokens", 1}, {"temperature", 0}});
  ASSERT_TRUE(by_ids.contains("choices")) << by_ids;
  const json& lp = by_ids["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 1) << lp;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << lp;
  EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << lp;
  EXPECT_EQ(lp["text_offset"][0], 0);
  // The prompt's text first: the ids' decode, which is the fixture's text.
  const std::string out = by_ids["choices"][0]["text"];
  ASSERT_EQ(out.substr(0, text.size()), text);
  // Token i's log-probability is row i - 1's log-softmax at ids[i]; the generated token's is the last
  // row's. Measured against mlx-lm's float32: at most 0.011 nats apart (q4 weights, bf16 activations
  // and KV here); 0.06 leaves room for another CPU's rounding while a wrong row, token or normalizer
  // is off by a nat or more.
  double worst = 0;
  for (size_t i = 1; i <= ids.size(); ++i) {
    const json& got = lp["token_logprobs"][i];
    ASSERT_TRUE(got.is_number()) << i << ": " << lp;
    const int32_t want_id = i < ids.size() ? ids[i] : -1;
    double want;
    if (want_id >= 0) {
      want = ref_logprob(R + (i - 1) * V, V, want_id);
    } else {  // greedy: the reference's likeliest
      const float* row = R + (i - 1) * V;
      want = ref_logprob(row, V, int32_t(std::max_element(row, row + V) - row));
    }
    worst = std::max(worst, std::abs(got.get<double>() - want));
    EXPECT_NEAR(got.get<double>(), want, 0.06) << "token " << i;
    // The top 3 (and the token itself): the likeliest is the reference's likeliest logprob.
    const json& top = lp["top_logprobs"][i];
    ASSERT_GE(top.size(), 3u) << top;
    double best = -1e300;
    for (auto& [k, v] : top.items()) best = std::max(best, v.get<double>());
    const float* row = R + (i - 1) * V;
    EXPECT_NEAR(best, ref_logprob(row, V, int32_t(std::max_element(row, row + V) - row)), 0.06) << "token " << i;
    EXPECT_GT(lp["text_offset"][i].get<int>(), lp["text_offset"][i - 1].get<int>() - 1) << lp["text_offset"];
  }
  std::printf("[ echo     ] prompt log-probabilities against mlx-lm float32: max |diff| %.4f nats\n", worst);

  // The text prompt: the same tokens, so the same scores; the echo is the text as sent.
  const json by_text = complete(c, {{"prompt", text}, {"echo", true}, {"logprobs", 0}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(by_text.contains("choices")) << by_text;
  const json& lt = by_text["choices"][0]["logprobs"];
  ASSERT_EQ(lt["tokens"].size(), ids.size() + 4);
  EXPECT_EQ(by_text["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(by_text["usage"]["prompt_tokens_details"]["cached_tokens"], 0);  // every prompt token computed
  for (size_t i = 1; i <= ids.size(); ++i)
    EXPECT_NEAR(lt["token_logprobs"][i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-6) << i;
  EXPECT_EQ(std::string(by_text["choices"][0]["text"]).substr(0, text.size()), text);

  // max_tokens 0: the prompt and its scores alone.
  const json only = complete(c, {{"prompt", ids}, {"echo", true}, {"logprobs", 1}, {"max_tokens", 0}});
  ASSERT_TRUE(only.contains("choices")) << only;
  EXPECT_EQ(only["choices"][0]["text"], text);
  EXPECT_EQ(only["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(only["usage"]["completion_tokens"], 0);
  const json& lo = only["choices"][0]["logprobs"];
  ASSERT_EQ(lo["tokens"].size(), ids.size());
  for (size_t i = 1; i < ids.size(); ++i)
    EXPECT_NEAR(lo["token_logprobs"][i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-6) << i;
  for (const json& bad : {json{{"prompt", ids}, {"max_tokens", 0}}, json{{"prompt", ids}, {"echo", true}, {"max_tokens", -1}}}) {
    auto r = c.Post("/v1/completions", bad.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad;
    EXPECT_EQ(json::parse(r->body)["error"]["param"], "max_tokens") << r->body;
  }

  // Without logprobs: the prompt's text, then exactly the reply the request without echo gets; the
  // stream says the same, the prompt in its first chunk.
  json plain_body = {{"prompt", text}, {"max_tokens", 6}, {"temperature", 0}};
  const json plain = complete(c, plain_body);
  json echo_body = plain_body;
  echo_body["echo"] = true;
  const json echoed = complete(c, echo_body);
  ASSERT_TRUE(plain.contains("choices") && echoed.contains("choices")) << plain << echoed;
  EXPECT_EQ(echoed["choices"][0]["text"], text + plain["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(echoed["usage"], plain["usage"]);
  echo_body["stream"] = true;
  auto sr = c.Post("/v1/completions", echo_body.dump(), "application/json");
  ASSERT_TRUE(sr && sr->status == 200);
  std::string streamed, first_chunk;
  bool done = false;
  for (const json& j : sse_events(sr->body, &done)) {
    ASSERT_FALSE(j.is_discarded()) << sr->body;
    const std::string piece = j["choices"][0]["text"];
    if (first_chunk.empty()) first_chunk = piece;
    streamed += piece;
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(first_chunk, text);
  EXPECT_EQ(streamed, echoed["choices"][0]["text"]);

  // A forward of 4 tokens: the 11-token prompt's rows come over several steps, two requests at once
  // (one prompt's rows per step); the scores are the one-step ones.
  ServerProcess small({"-m", model, "-c", "512", "-np", "2", "-t", "2", "--batch", "4"});
  ASSERT_TRUE(small.ok()) << small.startup_output();
  std::vector<json> got(2);
  std::vector<std::thread> th;
  for (int k = 0; k < 2; ++k)
    th.emplace_back([&, k] {
      httplib::Client cl("127.0.0.1", small.port());
      cl.set_read_timeout(60, 0);
      got[size_t(k)] = complete(cl, {{"prompt", ids}, {"echo", true}, {"logprobs", 3}, {"max_tokens", 1}, {"temperature", 0}});
    });
  for (auto& t : th) t.join();
  for (const json& g : got) {
    ASSERT_TRUE(g.contains("choices")) << g;
    const json& gl = g["choices"][0]["logprobs"];
    ASSERT_EQ(gl["tokens"], lp["tokens"]);
    EXPECT_TRUE(gl["token_logprobs"][0].is_null());
    // Chunks of 4 instead of 11 change the CPU kernels' blocking, not the math: within 1e-3.
    for (size_t i = 1; i <= ids.size(); ++i)
      EXPECT_NEAR(gl["token_logprobs"][i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-3) << i;
    EXPECT_EQ(gl["text_offset"], lp["text_offset"]);
  }
  EXPECT_EQ(small.terminate(30), 0);
  EXPECT_EQ(srv.terminate(30), 0);
}
