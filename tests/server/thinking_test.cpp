// A thinking model behind `anvil serve`: stop strings never cut the <think>/</think> tags (stream
// and not), and a chat session renders its conversation as the stateless request with the same
// messages does, reasoning_content of a tool-call turn included. The models are scripted
// (tests/cli/scripted_model.h): their replies are known, so the expectations come from the script.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <tuple>
#include <nlohmann/json.hpp>

#include "../cli/scripted_model.h"
#include "server_process.h"
#include "sse.h"

using anvil::test::ServerProcess;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Served {
  std::unique_ptr<ServerProcess> p;
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", p->port());
    c.set_read_timeout(60, 0);
    return c;
  }
  json post(const json& body, int* status = nullptr) const {
    auto r = client().Post("/v1/chat/completions", body.dump(), "application/json");
    if (status) *status = r ? r->status : -1;
    return r ? json::parse(r->body, nullptr, false) : json();
  }
  // A streamed reply's reasoning_content and content, concatenated; its finish_reason.
  void stream(json body, std::string* reasoning, std::string* content, std::string* finish) const {
    body["stream"] = true;
    auto r = client().Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    bool done = false;
    for (const json& e : anvil::test::sse_events(r->body, &done)) {
      ASSERT_FALSE(e.is_discarded()) << r->body;
      for (const json& c : e["choices"]) {
        const json& delta = c["delta"];
        if (delta.contains("reasoning_content") && delta["reasoning_content"].is_string())
          *reasoning += delta["reasoning_content"].get<std::string>();
        if (delta.contains("content") && delta["content"].is_string()) *content += delta["content"].get<std::string>();
        if (c["finish_reason"].is_string()) *finish = c["finish_reason"];
      }
    }
    EXPECT_TRUE(done) << r->body;
  }
};

std::string temp_dir(const std::string& what) {
  return (fs::temp_directory_path() / ("anvil_srv_" + what + "_" + std::to_string(::getpid()))).string();
}

}  // namespace

// The rule the CLI follows too (stop_strings.h): a stop string matches inside the reasoning or the
// answer, or a whole tag, never inside a tag or across one, so no tag fragment reaches the client.
TEST(ServeThinking, StopStringsNeverSplitTheReasoningTags) {
  const std::string dir = temp_dir("think");
  ASSERT_EQ(anvil::test::make_think_model(dir), "");
  Served s{std::make_unique<ServerProcess>(std::vector<std::string>{"-m", dir, "-c", "256", "-np", "2", "-t", "2"})};
  ASSERT_TRUE(s.p->ok()) << s.p->startup_output();
  for (std::string stop : {">", "<", "/", "think", "k>", "<th", "me", "Answer", ": ", "</think>", "<think>",
                           "think</think>", "zzz"}) {
    std::string want_r, want_c;
    anvil::test::think_reply_under_stop(stop, &want_r, &want_c);
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"temperature", 0}, {"max_tokens", 64},
                 {"stop", {stop}}};
    int status = 0;
    json r = s.post(body, &status);
    ASSERT_EQ(status, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    EXPECT_EQ(m.value("reasoning_content", ""), want_r) << "stop " << json(stop).dump();
    EXPECT_EQ(m["content"].is_string() ? m["content"].get<std::string>() : "", want_c) << "stop " << json(stop).dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    std::string sr, sc, sf;
    s.stream(body, &sr, &sc, &sf);
    EXPECT_EQ(sr, want_r) << "stream, stop " << json(stop).dump();
    EXPECT_EQ(sc, want_c) << "stream, stop " << json(stop).dump();
    EXPECT_EQ(sf, "stop");
  }
  s.p->terminate(30);
  fs::remove_all(dir);
}

// A tag that switches nothing (a "</think>" with no reasoning open, a "</tool_call>" with no call
// open) is text of the content, and a stop string matches inside it as in any text: the content
// never holds the stop string. Such tags used to be atomic wherever they stood, so stop "ink" let
// "Hi</think> there..." through whole.
TEST(ServeThinking, StopStringsMatchInsideTagsThatSwitchNothing) {
  const std::string dir = temp_dir("stray");
  ASSERT_EQ(anvil::test::make_stray_tags_model(dir), "");
  Served s{std::make_unique<ServerProcess>(std::vector<std::string>{"-m", dir, "-c", "256", "-np", "2", "-t", "2"})};
  ASSERT_TRUE(s.p->ok()) << s.p->startup_output();
  const std::string& reply = anvil::test::kStrayTagsReply;
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  for (bool with_tools : {false, true})
    for (std::string stop : {"ink", "n", "/", "ool", "l_", "zzz"}) {
      const std::string want = reply.substr(0, std::min(reply.size(), reply.find(stop)));
      json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"temperature", 0}, {"max_tokens", 64},
                   {"stop", {stop}}};
      if (with_tools) body["tools"] = tools;
      const std::string what = "stop " + json(stop).dump() + (with_tools ? " with tools" : "");
      int status = 0;
      json r = s.post(body, &status);
      ASSERT_EQ(status, 200) << r.dump();
      const json& m = r["choices"][0]["message"];
      EXPECT_FALSE(m.contains("reasoning_content")) << what;
      EXPECT_FALSE(m.contains("tool_calls")) << what;
      EXPECT_EQ(m["content"], want) << what;
      EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << what;
      std::string sr, sc, sf;
      s.stream(body, &sr, &sc, &sf);
      EXPECT_EQ(sr, "") << "stream, " << what;
      EXPECT_EQ(sc, want) << "stream, " << what;
      EXPECT_EQ(sf, "stop") << "stream, " << what;
    }
  s.p->terminate(30);
  fs::remove_all(dir);
}

// A reply that max_tokens cuts inside a character ends with the U+FFFD decode gives it, released
// when the reply ends; a stop string that completes in it ends the reply there, and the reply ended
// at a stop string: finish_reason "stop" (it said "length"), streamed or not.
TEST(ServeThinking, StopStringCompletedByTheLastHeldTextIsAStop) {
  const std::string dir = temp_dir("cutchar");
  ASSERT_EQ(anvil::test::make_cut_char_model(dir), "");
  Served s{std::make_unique<ServerProcess>(std::vector<std::string>{"-m", dir, "-c", "256", "-np", "2", "-t", "2"})};
  ASSERT_TRUE(s.p->ok()) << s.p->startup_output();
  const std::string fffd = "\xEF\xBF\xBD";
  for (const auto& [stop, content, finish] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"zzz", "Hi" + fffd, "length"}, {fffd, "Hi", "stop"}, {"i" + fffd, "H", "stop"}}) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"temperature", 0}, {"max_tokens", 3},
                 {"stop", {stop}}};
    int status = 0;
    json r = s.post(body, &status);
    ASSERT_EQ(status, 200) << r.dump();
    EXPECT_EQ(r["choices"][0]["message"]["content"], content) << json(stop).dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], finish) << json(stop).dump();
    EXPECT_EQ(r["usage"]["completion_tokens"], 3);
    std::string sr, sc, sf;
    s.stream(body, &sr, &sc, &sf);
    EXPECT_EQ(sc, content) << "stream, " << json(stop).dump();
    EXPECT_EQ(sf, finish) << "stream, " << json(stop).dump();
  }
  s.p->terminate(30);
  fs::remove_all(dir);
}

// A tool-call loop through a session gives the prompt (and reply) of the stateless request that
// echoes the reply back as the client got it: reasoning_content included, which Qwen3's template
// renders for the assistant turns after the last user message.
TEST(ServeThinking, SessionRendersAsTheStatelessRequest) {
  const std::string dir = temp_dir("thinktool"), store = temp_dir("thinktool_store");
  fs::remove_all(store);
  ASSERT_EQ(anvil::test::synth_tiny(dir), "");
  {
    anvil::test::ScriptTokens tk(dir);
    std::vector<int32_t> think = {tk.id("<think>")};
    for (int32_t t : tk.text("I should")) think.push_back(t);
    think.push_back(tk.id("</think>"));
    think.push_back(tk.text("\n\n").at(0));
    std::vector<int32_t> call = tk.text("Sure");
    call.push_back(tk.id("<tool_call>"));
    for (int32_t t : tk.text("{\"name\":\"f\",\"arguments\":{}}")) call.push_back(t);
    call.push_back(tk.id("</tool_call>"));
    ASSERT_EQ(anvil::test::make_scripted(dir, {{tk.text("\n").at(0), think}, {tk.text("\n\n").at(0), call}}), "");
  }
  Served s{std::make_unique<ServerProcess>(
      std::vector<std::string>{"-m", dir, "-c", "512", "-np", "2", "-t", "2", "--kv-store", store})};
  ASSERT_TRUE(s.p->ok()) << s.p->startup_output();
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}, {"properties", json::object()}}}}}}});
  const json user = {{"role", "user"}, {"content", "call f"}};
  int status = 0;
  json first = s.post({{"messages", {user}}, {"tools", tools}, {"temperature", 0}, {"session", "loop"}}, &status);
  ASSERT_EQ(status, 200) << first.dump();
  const json reply = first["choices"][0]["message"];
  ASSERT_EQ(reply.value("reasoning_content", ""), "I should") << reply.dump();
  ASSERT_EQ(reply["tool_calls"].size(), 1u) << reply.dump();
  const json result = {{"role", "tool"}, {"tool_call_id", reply["tool_calls"][0]["id"]}, {"content", "42"}};

  json stateless = s.post({{"messages", {user, reply, result}}, {"tools", tools}, {"temperature", 0}}, &status);
  ASSERT_EQ(status, 200) << stateless.dump();
  json session = s.post({{"messages", {result}}, {"tools", tools}, {"temperature", 0}, {"session", "loop"}}, &status);
  ASSERT_EQ(status, 200) << session.dump();
  EXPECT_EQ(session["usage"]["prompt_tokens"], stateless["usage"]["prompt_tokens"]);
  EXPECT_GT(session["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
  json a = session["choices"][0]["message"], b = stateless["choices"][0]["message"];
  a["tool_calls"][0].erase("id");
  b["tool_calls"][0].erase("id");
  EXPECT_EQ(a, b);
  // The session holds the reply as the client got it (content, reasoning_content, tool_calls).
  auto got = s.client().Get("/v1/sessions/loop");
  ASSERT_TRUE(got && got->status == 200) << (got ? got->body : "");
  json detail = json::parse(got->body);
  ASSERT_TRUE(detail.contains("messages")) << detail.dump();
  EXPECT_EQ(detail["messages"][1].value("reasoning_content", ""), "I should") << detail.dump();
  // With tools, <tool_call> and </tool_call> are whole too: a stop string made of their characters
  // leaves the call intact (before, stop ">" gave content "Sure<tool_call"); one in the text before
  // the call ends the reply there.
  for (const std::string stop : {">", "<", "/", "_call", "Sure"}) {
    json r = s.post({{"messages", {user}}, {"tools", tools}, {"temperature", 0}, {"stop", {stop}}}, &status);
    ASSERT_EQ(status, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    if (stop == "Sure") {
      EXPECT_EQ(m["content"].is_string() ? m["content"].get<std::string>() : "", "") << m.dump();
      EXPECT_FALSE(m.contains("tool_calls")) << m.dump();
      EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
    } else {
      EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << "stop " << stop << ": " << r.dump();
      ASSERT_EQ(m["tool_calls"].size(), 1u) << "stop " << stop << ": " << m.dump();
      EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "f");
    }
  }
  s.p->terminate(30);
  fs::remove_all(dir);
  fs::remove_all(store);
}
