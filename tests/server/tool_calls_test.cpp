// Tool calls behind `anvil serve`, from a scripted model (tests/cli/scripted_model.h) whose reply is
// known: parallel_tool_calls false keeps the reply's first call only, streamed or not (OpenAI's
// meaning; vLLM keeps the first call likewise), and the default keeps every call.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../cli/scripted_model.h"
#include "server_process.h"
#include "sse.h"

using anvil::test::ServerProcess;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A chat reply's tool calls and finish_reason, streamed (the calls of every delta) or not.
void ask(int port, json body, bool stream, json* calls, std::string* finish, std::string* content) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  body["stream"] = stream;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
  *calls = json::array();
  content->clear();
  if (!stream) {
    json j = json::parse(r->body);
    const json& m = j["choices"][0]["message"];
    if (m.contains("tool_calls")) *calls = m["tool_calls"];
    if (m["content"].is_string()) *content = m["content"];
    *finish = j["choices"][0]["finish_reason"];
    return;
  }
  bool done = false;
  for (const json& e : anvil::test::sse_events(r->body, &done)) {
    ASSERT_FALSE(e.is_discarded() || e.contains("error")) << r->body;
    for (const json& ch : e["choices"]) {
      const json& delta = ch["delta"];
      if (delta.contains("tool_calls"))
        for (const json& tc : delta["tool_calls"]) calls->push_back(tc);
      if (delta.contains("content") && delta["content"].is_string()) *content += delta["content"].get<std::string>();
      if (ch["finish_reason"].is_string()) *finish = ch["finish_reason"];
    }
  }
  EXPECT_TRUE(done) << r->body;
}

}  // namespace

TEST(ServeToolCalls, ParallelToolCallsFalseKeepsTheFirstCall) {
  const std::string dir =
      (fs::temp_directory_path() / ("anvil_srv_toolcalls_" + std::to_string(::getpid()))).string();
  ASSERT_EQ(anvil::test::synth_tiny(dir), "");
  // After the generation prompt's "\n": a call of f, and after every call another one, so a reply
  // of max_tokens = two calls' tokens holds exactly two complete calls.
  int call_tokens = 0;
  {
    anvil::test::ScriptTokens tk(dir);
    std::vector<int32_t> call = {tk.id("<tool_call>")};
    for (int32_t t : tk.text("{\"name\":\"f\",\"arguments\":{\"n\":1}}")) call.push_back(t);
    call.push_back(tk.id("</tool_call>"));
    call_tokens = int(call.size());
    ASSERT_EQ(anvil::test::make_scripted(dir, {{tk.text("\n").at(0), call}, {tk.id("</tool_call>"), {tk.id("<tool_call>")}}}),
              "");
  }
  ServerProcess srv({"-m", dir, "-c", "256", "-np", "2", "-t", "2", "--no-kv-store"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  const json tools = json::array(
      {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {{"type", "object"}}}}}}});
  json body = {{"messages", {{{"role", "user"}, {"content", "call f twice"}}}}, {"tools", tools},
               {"temperature", 0}, {"max_tokens", 2 * call_tokens}};
  for (bool stream : {false, true}) {
    for (json parallel : {json(), json(true), json(false)}) {
      json b = body;
      if (!parallel.is_null()) b["parallel_tool_calls"] = parallel;
      json calls;
      std::string finish, content;
      ask(srv.port(), b, stream, &calls, &finish, &content);
      const std::string what = std::string(stream ? "stream" : "non-stream") + ", parallel_tool_calls " + parallel.dump();
      const size_t want = parallel == json(false) ? 1 : 2;
      ASSERT_EQ(calls.size(), want) << what << ": " << calls.dump();
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(calls[i]["function"]["name"], "f") << what;
        EXPECT_EQ(calls[i]["function"]["arguments"], R"({"n":1})") << what;
        if (stream) EXPECT_EQ(calls[i]["index"], int(i)) << what;
      }
      EXPECT_EQ(content, "") << what << ": a dropped call is not content either";
      EXPECT_EQ(finish, "length") << what;
    }
  }
  EXPECT_EQ(srv.terminate(30), 0);
  fs::remove_all(dir);
}
