// POST /v1/responses (OpenAI's Responses API, on the chat path; stored responses continued by
// previous_response_id, or a conversation kept by anvil's `session` extension): the request's
// translation to the chat request it means (the same messages and tools a chat client would send,
// checked against parse_chat_request on the chat body written by hand), every refused or malformed
// field named in a 400; over HTTP with a scripted thinking / tool-calling model
// (tests/cli/scripted_model.h: its replies are known), the Response object and the named SSE events
// in order, equal to /v1/chat/completions' reply; and the official openai client
// (responses_check.py) on the tiny trained model and on the scripted one, a function call round trip;
// a session's turns through /v1/responses, streamed or not, equal to the same turns through chat.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../cli/scripted_model.h"
#include "server/responses_items.h"
#include "server/responses_request.h"
#include "server_process.h"

using namespace anvil::server;
using anvil::test::run_python_check;
using anvil::test::ServerProcess;
using anvil::test::tiny_with_template;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

RequestDefaults defaults() {
  RequestDefaults d;
  d.model_id = "tiny";
  d.max_context = 512;
  return d;
}

std::optional<ApiError> responses(const json& body, ApiRequest* r = nullptr, ResponsesEcho* echo = nullptr) {
  ApiRequest tmp;
  ResponsesEcho etmp;
  return parse_responses_request(body.dump(), defaults(), r ? r : &tmp, echo ? echo : &etmp);
}

ApiRequest chat(const json& body) {
  ApiRequest r;
  auto e = parse_chat_request(body.dump(), defaults(), &r);
  EXPECT_FALSE(e) << e->message;
  return r;
}

// The scripted model of the HTTP tests: after the generation prompt ("\n") it reasons
// (<think>kReasoning</think>) and answers kAnswer; after the opening a named tool_choice prefills
// (<tool_call>\n{"name": "get_weather", "arguments": ) it writes kArgs and closes the call.
const std::string kReasoning = "Checking the weather";
const std::string kAnswer = "It is sunny in Paris.";
const std::string kArgs = "{\"city\":\"Paris\"}";

std::string make_weather_model(const std::string& dir, int* reasoning_tokens) {
  if (std::string e = anvil::test::synth_tiny(dir); !e.empty()) return e;
  anvil::test::ScriptTokens tk(dir);
  std::vector<int32_t> think = {tk.id("<think>")};
  for (int32_t t : tk.text(kReasoning)) think.push_back(t);
  think.push_back(tk.id("</think>"));
  *reasoning_tokens = int(think.size());
  think.push_back(tk.text("\n\n").at(0));
  std::vector<int32_t> call = tk.text(kArgs + "}");
  call.push_back(tk.id("</tool_call>"));
  const int32_t prefill_end = tk.text("\n{\"name\": \"get_weather\", \"arguments\": ").back();
  return anvil::test::make_scripted(dir, {{tk.text("\n").at(0), think},
                                          {tk.text("\n\n").at(0), tk.text(kAnswer)},
                                          {prefill_end, call}});
}

const json kTool = {{"type", "function"},
                    {"name", "get_weather"},
                    {"description", "Weather in a city"},
                    {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
const json kChatTool = {{"type", "function"},
                        {"function",
                         {{"name", "get_weather"},
                          {"description", "Weather in a city"},
                          {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};

// Named SSE events: (event name, data) in order; the data's "type" must be the event's name.
std::vector<std::pair<std::string, json>> named_events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  size_t pos = 0;
  while ((pos = body.find("event: ", pos)) != std::string::npos) {
    const size_t nl = body.find('\n', pos);
    const std::string name = body.substr(pos + 7, nl - pos - 7);
    EXPECT_EQ(body.compare(nl + 1, 6, "data: "), 0) << body.substr(pos, 200);
    const size_t end = body.find("\n\n", nl);
    out.push_back({name, json::parse(body.substr(nl + 7, end - nl - 7), nullptr, false)});
    pos = end;
  }
  return out;
}

}  // namespace

// instructions, every input item kind and the tools become the chat request a chat client sends
// for the same conversation: the function_call joins the assistant turn it follows, the reasoning
// item becomes that turn's reasoning_content, the output its tool message.
TEST(ResponsesRequest, TranslatesToTheChatRequest) {
  const json body = {
      {"model", "tiny"},
      {"instructions", "Be terse."},
      {"input",
       {{{"role", "developer"}, {"content", "Use tools."}},
        {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather"}},
                                                             {{"type", "input_text"}, {"text", "in Paris?"}}}}},
        {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()},
         {"content", {{{"type", "reasoning_text"}, {"text", "Need the tool."}}}}},
        {{"type", "message"}, {"role", "assistant"}, {"id", "msg_1"}, {"status", "completed"},
         {"content", {{{"type", "output_text"}, {"text", "Let me look."}, {"annotations", json::array()}}}}},
        {{"type", "function_call"}, {"id", "fc_1"}, {"call_id", "call_1"}, {"name", "get_weather"},
         {"arguments", "{\"city\":\"Paris\"}"}},
        {{"type", "function_call"}, {"call_id", "call_2"}, {"name", "get_weather"}, {"arguments", "{}"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "sunny"}},
        {{"type", "function_call_output"}, {"call_id", "call_2"},
         {"output", {{{"type", "input_text"}, {"text", "rain"}}}}}}},
      {"tools", {kTool}},
      {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}},
      {"max_output_tokens", 9},
      {"temperature", 0.5},
      {"top_p", 0.9},
      {"parallel_tool_calls", false},
      {"stream", true},
      {"store", true},
      {"metadata", {{"k", "v"}}},
      {"user", "u1"},
      {"reasoning", {{"effort", "high"}, {"summary", "auto"}}},
      {"include", {"reasoning.encrypted_content"}},
      {"text", {{"format", {{"type", "text"}}}, {"verbosity", "low"}}},
      {"service_tier", "auto"},
      {"top_k", 5}};
  ApiRequest r;
  ResponsesEcho echo;
  auto e = responses(body, &r, &echo);
  ASSERT_FALSE(e) << e->param << ": " << e->message;
  const ApiRequest want = chat(
      {{"model", "tiny"},
       {"messages",
        {{{"role", "system"}, {"content", "Be terse."}},
         {{"role", "developer"}, {"content", "Use tools."}},
         {{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather"}},
                                         {{"type", "input_text"}, {"text", "in Paris?"}}}}},
         {{"role", "assistant"},
          {"content", {{{"type", "output_text"}, {"text", "Let me look."}, {"annotations", json::array()}}}},
          {"reasoning_content", "Need the tool."},
          {"tool_calls",
           {{{"id", "call_1"}, {"type", "function"},
             {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}},
            {{"id", "call_2"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{}"}}}}}}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}},
         {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", {{{"type", "input_text"}, {"text", "rain"}}}}}}},
       {"tools", {kChatTool}},
       {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
       {"max_tokens", 9},
       {"temperature", 0.5},
       {"top_p", 0.9},
       {"top_k", 5},
       {"parallel_tool_calls", false},
       {"stream", true}});
  // (Compared as unordered JSON: the literals here sort their keys; the HTTP tests hold the prompts equal.)
  auto plain = [](const nlohmann::ordered_json& j) { return json::parse(j.dump()); };
  EXPECT_EQ(plain(r.messages), plain(want.messages));
  EXPECT_EQ(plain(r.tools), plain(want.tools));
  EXPECT_EQ(r.tool_choice, "function");
  EXPECT_EQ(r.forced_tool, "get_weather");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_k, 5);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.enable_thinking.has_value()) << "effort other than none: the template's default";
  // What the response repeats.
  const auto& f = echo.fields;
  EXPECT_EQ(f["instructions"], "Be terse.");
  EXPECT_EQ(f["max_output_tokens"], 9);
  EXPECT_EQ(plain(f["metadata"]), json({{"k", "v"}}));
  EXPECT_EQ(f["store"], false);
  EXPECT_EQ(plain(f["tool_choice"]), body["tool_choice"]);
  ASSERT_EQ(f["tools"].size(), 1u);
  EXPECT_EQ(f["tools"][0]["name"], "get_weather");
  EXPECT_EQ(plain(f["tools"][0]["parameters"]), kTool["parameters"]);
  EXPECT_EQ(f["reasoning"]["effort"], "high");
  EXPECT_EQ(f["user"], "u1");

  // A string input is one user message; reasoning effort "none" turns thinking off; json_object.
  ApiRequest s;
  ASSERT_FALSE(responses({{"input", "hi"}, {"reasoning", {{"effort", "none"}}},
                          {"text", {{"format", {{"type", "json_object"}}}}}},
                         &s));
  EXPECT_EQ(plain(s.messages), json::array({{{"role", "user"}, {"content", "hi"}}}));
  EXPECT_EQ(s.enable_thinking, false);
  EXPECT_TRUE(s.gen.json_object);
  EXPECT_FALSE(s.max_tokens.has_value());
}

// Every malformed or unsupported field: a 400 naming it (the Responses name, also where the chat
// parser found the fault), nothing silently ignored that would change the answer.
// A stored response's input items (GET /v1/responses/{id}/input_items) are the items its request sent,
// back from the chat messages they became (the conversation is stored as those): every type in order
// (a reasoning item, the assistant's text, its parallel function calls, their outputs, developer and
// user messages; a developer message comes back as the system one it was run as), with their texts,
// call ids, names, arguments and outputs; the reply (the last
// message) is not an input item, nor are the instructions. Ids are unique and stable.
TEST(ResponsesItems, InputItemsAreTheItemsTheRequestSent) {
  const json input = {
      {{"role", "developer"}, {"content", "Be brief."}},
      {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather in Oslo and Rome?"}}}}},
      {{"type", "reasoning"}, {"summary", json::array()}, {"content", {{{"type", "reasoning_text"}, {"text", "Two calls."}}}}},
      {{"role", "assistant"}, {"content", "Checking."}},
      {{"type", "function_call"}, {"call_id", "c1"}, {"name", "weather"}, {"arguments", "{\"city\":\"Oslo\"}"}},
      {{"type", "function_call"}, {"call_id", "c2"}, {"name", "weather"}, {"arguments", "{\"city\":\"Rome\"}"}},
      {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "4 C"}},
      {{"type", "function_call_output"}, {"call_id", "c2"}, {"output", "18 C"}},
      {{"role", "user"}, {"content", "Thanks."}}};
  ApiRequest r;
  ASSERT_FALSE(responses({{"input", input}, {"instructions", "You answer."}}, &r));
  nlohmann::ordered_json conv = nlohmann::ordered_json::array();
  for (size_t i = 1; i < r.messages.size(); ++i) conv.push_back(r.messages[i]);  // (instructions apart, as stored)
  conv.push_back({{"role", "assistant"}, {"content", "You are welcome."}});   // the reply
  const json items = json::parse(input_items(conv, "resp_abc").dump());
  const std::vector<std::string> types = {"message", "message", "reasoning", "message", "function_call",
                                          "function_call", "function_call_output", "function_call_output", "message"};
  ASSERT_EQ(items.size(), types.size()) << items.dump(1);
  std::set<std::string> ids;
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(items[i]["type"], types[i]) << i << ": " << items[i];
    EXPECT_EQ(items[i]["status"], "completed") << i;
    ids.insert(items[i]["id"].get<std::string>());
  }
  EXPECT_EQ(ids.size(), items.size()) << "item ids are not unique";
  EXPECT_EQ(items[0]["role"], "system");  // a developer message is run (and kept) as the chat's system role
  EXPECT_EQ(items[0]["content"][0], (json{{"type", "input_text"}, {"text", "Be brief."}}));
  EXPECT_EQ(items[1]["content"][0]["text"], "Weather in Oslo and Rome?");
  EXPECT_EQ(items[2]["content"][0]["text"], "Two calls.");
  EXPECT_EQ(items[3]["role"], "assistant");
  EXPECT_EQ(items[3]["content"][0]["type"], "output_text");
  EXPECT_EQ(items[3]["content"][0]["text"], "Checking.");
  for (int k : {4, 5}) {
    EXPECT_EQ(items[size_t(k)]["call_id"], input[size_t(k)]["call_id"]);
    EXPECT_EQ(items[size_t(k)]["name"], "weather");
    EXPECT_EQ(items[size_t(k)]["arguments"], input[size_t(k)]["arguments"]);
  }
  for (int k : {6, 7}) {
    EXPECT_EQ(items[size_t(k)]["call_id"], input[size_t(k)]["call_id"]);
    EXPECT_EQ(items[size_t(k)]["output"], input[size_t(k)]["output"]);
  }
  EXPECT_EQ(items[8]["content"][0]["text"], "Thanks.");
  EXPECT_EQ(json::parse(input_items(conv, "resp_abc").dump()), items) << "ids differ between calls";
  // The page: newest first by default, `after` continues, and a page past the end is empty.
  auto page = [&](std::optional<std::string> limit, std::optional<std::string> order, std::optional<std::string> after) {
    auto p = input_items_page(input_items(conv, "resp_abc"), limit, order, after);
    EXPECT_TRUE(std::holds_alternative<nlohmann::ordered_json>(p));
    return std::holds_alternative<nlohmann::ordered_json>(p) ? json::parse(std::get<nlohmann::ordered_json>(p).dump())
                                                             : json();
  };
  json p1 = page("4", std::nullopt, std::nullopt);
  ASSERT_EQ(p1["data"].size(), 4u);
  EXPECT_EQ(p1["data"][0], items[8]);
  EXPECT_EQ(p1["has_more"], true);
  json p3 = page("4", "desc", items[1]["id"].get<std::string>());
  ASSERT_EQ(p3["data"].size(), 1u);
  EXPECT_EQ(p3["data"][0], items[0]);
  EXPECT_EQ(p3["has_more"], false);
  json end = page(std::nullopt, "asc", items[8]["id"].get<std::string>());
  EXPECT_TRUE(end["data"].empty());
  EXPECT_TRUE(end["first_id"].is_null());
}

TEST(ResponsesRequest, RefusesWhatItCannotHonourNamingTheField) {
  const json in = "hi";
  struct Case {
    json body;
    std::string param, says;
  };
  const std::vector<Case> cases = {
      {{{"input", in}, {"previous_response_id", 3}}, "previous_response_id", "must be a response id"},
      {{{"input", in}, {"previous_response_id", ""}}, "previous_response_id", "must be a response id"},
      {{{"input", in}, {"conversation", "conv_1"}}, "conversation", "previous_response_id"},
      {{{"input", in}, {"background", true}}, "background", "not supported"},
      {{{"input", in}, {"prompt", {{"id", "p"}}}}, "prompt", "not supported"},
      {{{"input", in}, {"truncation", "auto"}}, "truncation", "disabled"},
      {{{"input", in}, {"max_tool_calls", 2}}, "max_tool_calls", "not supported"},
      {{{"input", in}, {"top_logprobs", 3}}, "top_logprobs", "not supported"},
      {{{"input", in}, {"include", {"message.output_text.logprobs"}}}, "include", "not supported"},
      {{{"input", in}, {"metadata", {{"k", 1}}}}, "metadata", "must be a string"},
      {{{"input", in}, {"store", "yes"}}, "store", "boolean"},
      {{{"input", in}, {"messages", json::array()}}, "messages", "'input'"},
      {{{"input", in}, {"max_tokens", 5}}, "max_tokens", "'max_output_tokens'"},
      {{{"input", in}, {"response_format", {{"type", "json_object"}}}}, "response_format", "'text'"},
      {{{"input", in}, {"session", "-s"}}, "session", "1 to 128 characters"},
      {{{"input", in}, {"session", 3}}, "session", "must be a string"},
      {json::object(), "input", "required"},
      {{{"input", 3}}, "input", "a string or an array"},
      {{{"input", json::array()}}, "input", "must not be empty"},
      {{{"input", {{{"role", "tool"}, {"content", "x"}}}}}, "input", "function_call_output"},
      {{{"input", {{{"role", "user"}}}}}, "input", "input[0].content' is required"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}}, "input",
       "reads text only"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_text"}}}}}}}}, "input",
       "input[0].content[0].text' must be a string"},
      {{{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}}, "input", "call_id"},
      {{{"input", {{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", json::object()}}}}},
       "input", "arguments' must be a string"},
      {{{"input", {{{"type", "function_call_output"}, {"call_id", "c"}}}}}, "input", "output' is required"},
      {{{"input", {{{"type", "item_reference"}, {"id", "msg_1"}}}}}, "input", "keeps no item ids"},
      {{{"input", {{{"type", "web_search_call"}, {"id", "ws_1"}}}}}, "input", "'web_search_call' is not supported"},
      {{{"input", in}, {"instructions", 5}}, "instructions", "must be a string"},
      {{{"input", in}, {"tools", {{{"type", "web_search"}}}}}, "tools", "no hosted tools"},
      {{{"input", in}, {"tools", {kChatTool}}}, "tools", "top level"},
      {{{"input", in}, {"tools", {{{"type", "function"}}}}}, "tools", "tools[0].name"},
      {{{"input", in}, {"tools", {kTool}}, {"tool_choice", {{"type", "function"}}}}, "tool_choice", "name"},
      {{{"input", in}, {"tools", {kTool}}, {"tool_choice", {{"type", "function"}, {"name", "nope"}}}}, "tool_choice",
       "not in 'tools'"},
      {{{"input", in}, {"tools", {kTool}}, {"tool_choice", {{"type", "allowed_tools"}}}}, "tool_choice",
       "allowed_tools"},
      {{{"input", in}, {"tool_choice", "required"}}, "tool_choice", "needs 'tools'"},
      {{{"input", in}, {"text", {{"format", {{"type", "json_schema"}, {"name", "x"}}}}}}, "text.format",
       "json_schema"},
      {{{"input", in}, {"text", {{"format", {{"type", "json_object"}}}}}, {"tools", {kTool}}}, "text.format",
       "'text.format' json_object cannot be combined"},
      {{{"input", in}, {"reasoning", {{"effort", "max"}}}}, "reasoning.effort", "one of"},
      {{{"input", in}, {"reasoning", {{"effort", "none"}}}, {"chat_template_kwargs", {{"enable_thinking", true}}}},
       "reasoning.effort", "disagrees"},
      {{{"input", in}, {"max_output_tokens", 0}}, "max_output_tokens", "'max_output_tokens' must be in [1, 512]"},
      {{{"input", in}, {"temperature", 3}}, "temperature", "[0, 2]"},
      {{{"input", in}, {"model", "other"}}, "model", "does not exist"},
  };
  for (const Case& c : cases) {
    auto e = responses(c.body);
    ASSERT_TRUE(e) << c.body.dump();
    EXPECT_EQ(e->param, c.param) << c.body.dump() << " -> " << e->message;
    EXPECT_NE(e->message.find(c.says), std::string::npos) << c.body.dump() << " -> " << e->message;
  }
}

namespace {

// The scripted weather model behind anvil serve.
class ResponsesServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("anvil_srv_responses_" + std::to_string(::getpid()))).string();
    setup_error_ = make_weather_model(dir_, &reasoning_tokens_);
    if (!setup_error_.empty()) return;
    server_ = new ServerProcess({"-m", dir_, "-c", "512", "-np", "4", "-t", "2", "--no-kv-store", "--alias", "w"});
  }
  static void TearDownTestSuite() {
    if (server_) EXPECT_EQ(server_->terminate(30), 0);
    delete server_;
    server_ = nullptr;
    fs::remove_all(dir_);
  }
  void SetUp() override {
    ASSERT_EQ(setup_error_, "");
    ASSERT_TRUE(server_ && server_->ok()) << server_->startup_output();
  }
  static httplib::Result post(const std::string& path, const json& body) {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(60, 0);
    return c.Post(path.c_str(), body.dump(), "application/json");
  }
  static inline ServerProcess* server_ = nullptr;
  static inline std::string dir_, setup_error_;
  static inline int reasoning_tokens_ = 0;
};

}  // namespace

// Not streamed: a reasoning item and a message item, equal to the chat reply's reasoning_content and
// content, the same prompt and completion token counts; reasoning_tokens: <think>..</think>.
TEST_F(ResponsesServe, ResponseObjectEqualsTheChatReply) {
  const json msgs = {{{"role", "system"}, {"content", "Be terse."}}, {{"role", "user"}, {"content", "Weather?"}}};
  auto c = post("/v1/chat/completions", {{"messages", msgs}, {"temperature", 0}});
  ASSERT_TRUE(c && c->status == 200) << (c ? c->body : "no reply");
  const json cj = json::parse(c->body);
  auto r = post("/v1/responses", {{"model", "w"}, {"instructions", "Be terse."}, {"input", "Weather?"},
                                  {"temperature", 0}, {"metadata", {{"k", "v"}}}});
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_TRUE(j["created_at"].is_number_integer());
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["incomplete_details"].is_null() && j["error"].is_null());
  EXPECT_EQ(j["model"], "w");
  EXPECT_EQ(j["instructions"], "Be terse.");
  EXPECT_EQ(j["metadata"], json({{"k", "v"}}));
  EXPECT_EQ(j["tool_choice"], "auto");
  EXPECT_EQ(j["tools"], json::array());
  EXPECT_EQ(j["parallel_tool_calls"], true);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["store"], false);
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  const json& rs = j["output"][0];
  EXPECT_EQ(rs["type"], "reasoning");
  EXPECT_EQ(rs["id"].get<std::string>().rfind("rs_", 0), 0u);
  EXPECT_EQ(rs["summary"], json::array());
  EXPECT_EQ(rs["content"], json::array({{{"type", "reasoning_text"}, {"text", kReasoning}}}));
  const json& m = j["output"][1];
  EXPECT_EQ(m["type"], "message");
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["status"], "completed");
  ASSERT_EQ(m["content"].size(), 1u);
  EXPECT_EQ(m["content"][0]["type"], "output_text");
  EXPECT_EQ(m["content"][0]["text"], kAnswer);
  EXPECT_EQ(m["content"][0]["annotations"], json::array());
  const json& msg = cj["choices"][0]["message"];
  EXPECT_EQ(msg["content"], kAnswer);
  EXPECT_EQ(msg["reasoning_content"], kReasoning);
  const json& u = j["usage"];
  EXPECT_EQ(u["input_tokens"], cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(u["output_tokens"], cj["usage"]["completion_tokens"]);
  EXPECT_EQ(u["total_tokens"], cj["usage"]["total_tokens"]);
  EXPECT_TRUE(u["input_tokens_details"]["cached_tokens"].is_number_integer());
  EXPECT_EQ(u["output_tokens_details"]["reasoning_tokens"], reasoning_tokens_);

  // Cut short by max_output_tokens: incomplete, and the item that was cut says so.
  auto cut = post("/v1/responses", {{"input", "Weather?"}, {"temperature", 0}, {"max_output_tokens", 3}});
  ASSERT_TRUE(cut && cut->status == 200);
  const json k = json::parse(cut->body);
  EXPECT_EQ(k["status"], "incomplete");
  EXPECT_EQ(k["incomplete_details"], json({{"reason", "max_output_tokens"}}));
  EXPECT_EQ(k["max_output_tokens"], 3);
  EXPECT_EQ(k["usage"]["output_tokens"], 3);
  ASSERT_EQ(k["output"].size(), 1u);
  EXPECT_EQ(k["output"][0]["type"], "reasoning");
  EXPECT_EQ(k["output"][0]["status"], "incomplete");
}

// A named tool_choice: one function_call item (call_id, name, arguments), the chat reply's call.
// Then the round trip: the call and its output as input items, and the model answers.
TEST_F(ResponsesServe, FunctionCallRoundTrip) {
  const json first = {{"input", "Weather in Paris?"}, {"tools", {kTool}}, {"temperature", 0},
                      {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}}};
  auto r = post("/v1/responses", first);
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
  const json j = json::parse(r->body);
  EXPECT_EQ(j["status"], "completed");
  EXPECT_EQ(j["tools"][0]["name"], "get_weather");
  EXPECT_EQ(j["tool_choice"], first["tool_choice"]);
  ASSERT_EQ(j["output"].size(), 1u) << j.dump();
  const json& call = j["output"][0];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["id"].get<std::string>().rfind("fc_", 0), 0u);
  EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["arguments"], kArgs);
  EXPECT_EQ(call["status"], "completed");
  auto c = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
                                         {"tools", {kChatTool}}, {"temperature", 0},
                                         {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}});
  ASSERT_TRUE(c && c->status == 200);
  const json cj = json::parse(c->body);
  EXPECT_EQ(cj["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], kArgs);
  EXPECT_EQ(j["usage"]["input_tokens"], cj["usage"]["prompt_tokens"]);
  EXPECT_EQ(j["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);

  json second = {{"tools", {kTool}}, {"temperature", 0}};
  second["input"] = {{{"role", "user"}, {"content", "Weather in Paris?"}}, call,
                     {{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "sunny, 24 C"}}};
  auto a = post("/v1/responses", second);
  ASSERT_TRUE(a && a->status == 200) << (a ? a->body : "no reply");
  const json aj = json::parse(a->body);
  ASSERT_EQ(aj["output"].size(), 2u) << aj.dump();
  EXPECT_EQ(aj["output"][1]["content"][0]["text"], kAnswer);
  // The chat request with the same history: the same prompt.
  auto ac = post("/v1/chat/completions",
                 {{"messages",
                   {{{"role", "user"}, {"content", "Weather in Paris?"}},
                    {{"role", "assistant"},
                     {"content", nullptr},
                     {"tool_calls", {{{"id", call["call_id"]}, {"type", "function"},
                                      {"function", {{"name", "get_weather"}, {"arguments", kArgs}}}}}}},
                    {{"role", "tool"}, {"tool_call_id", call["call_id"]}, {"content", "sunny, 24 C"}}}},
                  {"tools", {kChatTool}},
                  {"temperature", 0}});
  ASSERT_TRUE(ac && ac->status == 200);
  EXPECT_EQ(aj["usage"]["input_tokens"], json::parse(ac->body)["usage"]["prompt_tokens"]);
}

// Streamed: the named events in order, sequence_number 0, 1, 2..., each data's type its event's
// name; the deltas make the items, and response.completed carries the non-streamed output.
TEST_F(ResponsesServe, StreamedEventsInOrder) {
  auto events_of = [&](json body) {
    body["stream"] = true;
    auto r = post("/v1/responses", body);
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
    EXPECT_EQ(r ? r->get_header_value("Content-Type") : "", "text/event-stream");
    auto ev = named_events(r ? r->body : "");
    for (size_t i = 0; i < ev.size(); ++i) {
      EXPECT_FALSE(ev[i].second.is_discarded());
      EXPECT_EQ(ev[i].second["type"], ev[i].first);
      EXPECT_EQ(ev[i].second["sequence_number"], int(i));
    }
    return ev;
  };
  auto names = [](const std::vector<std::pair<std::string, json>>& ev) {
    std::vector<std::string> n;
    for (const auto& [name, data] : ev)
      if (n.empty() || n.back() != name || name.find(".delta") == std::string::npos) n.push_back(name);  // deltas once
    return n;
  };
  const json text_req = {{"input", "Weather?"}, {"temperature", 0}};
  auto ev = events_of(text_req);
  const std::vector<std::string> want = {
      "response.created",           "response.in_progress",       "response.output_item.added",
      "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.done",
      "response.content_part.done", "response.output_item.done",  "response.output_item.added",
      "response.content_part.added", "response.output_text.delta", "response.output_text.done",
      "response.content_part.done", "response.output_item.done",  "response.completed"};
  EXPECT_EQ(names(ev), want);
  std::string reasoning, text;
  for (const auto& [name, d] : ev) {
    if (name == "response.reasoning_text.delta") reasoning += d["delta"].get<std::string>();
    if (name == "response.output_text.delta") {
      text += d["delta"].get<std::string>();
      EXPECT_EQ(d["output_index"], 1);
      EXPECT_EQ(d["content_index"], 0);
    }
  }
  EXPECT_EQ(reasoning, kReasoning);
  EXPECT_EQ(text, kAnswer);
  ASSERT_FALSE(ev.empty());
  EXPECT_EQ(ev[0].second["response"]["status"], "in_progress");
  const json& done = ev.back().second["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["id"], ev[0].second["response"]["id"]);
  auto plain = post("/v1/responses", text_req);
  ASSERT_TRUE(plain && plain->status == 200);
  json p = json::parse(plain->body);
  json o = done["output"];
  for (json* out : {&p["output"], &o})
    for (json& item : *out) item.erase("id");  // fresh ids per reply
  EXPECT_EQ(o, p["output"]);
  EXPECT_EQ(done["usage"], p["usage"]);

  // A forced call: its item, the arguments' delta and done, then response.completed.
  auto fe = events_of({{"input", "Weather in Paris?"}, {"tools", {kTool}}, {"temperature", 0},
                       {"tool_choice", {{"type", "function"}, {"name", "get_weather"}}}});
  const std::vector<std::string> want_call = {
      "response.created", "response.in_progress", "response.output_item.added",
      "response.function_call_arguments.delta", "response.function_call_arguments.done",
      "response.output_item.done", "response.completed"};
  EXPECT_EQ(names(fe), want_call);
  if (names(fe) == want_call) {
    EXPECT_EQ(fe[2].second["item"]["type"], "function_call");
    EXPECT_EQ(fe[2].second["item"]["name"], "get_weather");
    EXPECT_EQ(fe[3].second["delta"], kArgs);
    EXPECT_EQ(fe[4].second["arguments"], kArgs);
    EXPECT_EQ(fe[5].second["item"]["arguments"], kArgs);
    EXPECT_EQ(fe[5].second["item"]["call_id"], fe[2].second["item"]["call_id"]);
  }

  // Cut short: response.incomplete.
  auto ce = events_of({{"input", "Weather?"}, {"temperature", 0}, {"max_output_tokens", 3}});
  ASSERT_FALSE(ce.empty());
  EXPECT_EQ(ce.back().first, "response.incomplete");
  EXPECT_EQ(ce.back().second["response"]["incomplete_details"]["reason"], "max_output_tokens");
}

// Bad input over HTTP: 400 with OpenAI's error body naming the field; the endpoint takes POST only.
TEST_F(ResponsesServe, BadInputIsA400NamingTheField) {
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"input":"hi","previous_response_id":"resp_x"})", "previous_response_id"},
           {R"({"input":[{"type":"function_call"}]})", "input"},
           {R"({"input":"hi","max_output_tokens":100000})", "max_output_tokens"},
           {R"({"input":"hi","text":{"format":{"type":"json_schema"}}})", "text.format"},
           {R"({"input":"hi")", ""}}) {
    httplib::Client c("127.0.0.1", server_->port());
    auto r = c.Post("/v1/responses", body, "application/json");
    ASSERT_TRUE(r) << body;
    EXPECT_EQ(r->status, 400) << body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.contains("error")) << r->body;
    EXPECT_EQ(e["error"]["type"], "invalid_request_error");
    EXPECT_EQ(e["error"]["param"], param.empty() ? json() : json(param)) << r->body;
  }
  // A prompt past the context is named as 'input'; max_output_tokens past the room as itself.
  std::string longer;
  for (int i = 0; i < 600; ++i) longer += " word" + std::to_string(i);
  auto r = post("/v1/responses", {{"input", longer}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "input");
  r = post("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 510}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "max_output_tokens") << r->body;
  httplib::Client c("127.0.0.1", server_->port());
  auto g = c.Get("/v1/responses");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 405);
  EXPECT_EQ(g->get_header_value("Allow"), "POST");
}

// The openai client on the scripted model: responses.create (streamed and not) and
// responses.stream, a function call round trip, reasoning items, equal to chat's replies.
TEST_F(ResponsesServe, OpenAIPythonClientToolRoundTrip) {
  auto [code, out] = run_python_check("responses_check.py", server_->port(), {"w", "tools"});
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
}

// The openai client on the tiny trained model (a plain chat template beside it): greedy
// /v1/responses equals /v1/chat/completions for the same messages, streamed and not; JSON mode;
// refused fields as the client's errors.
TEST(ResponsesTiny, OpenAIPythonClientEqualsChat) {
  const std::string dir = tiny_with_template("resp_tiny");
  if (dir.empty()) GTEST_SKIP() << "no " << ANVIL_SHARED_DIR << "/fixtures/anvil-tiny-code";
  const std::string store = (fs::temp_directory_path() / ("anvil_resp_client_kv_" + std::to_string(::getpid()))).string();
  fs::remove_all(store);
  ServerProcess srv({"-m", dir, "-c", "1024", "-np", "4", "-t", "2", "--kv-store", store, "--alias", "tiny"});
  ASSERT_TRUE(srv.ok()) << srv.startup_output();
  auto [code, out] = run_python_check("responses_check.py", srv.port(), {"tiny", "text"});
  EXPECT_EQ(srv.terminate(30), 0);
  fs::remove_all(dir);
  fs::remove_all(store);
  if (code == 77) GTEST_SKIP() << out;
  EXPECT_EQ(code, 0) << out;
}

// A conversation kept by the `session` extension through /v1/responses: each turn's answer and the
// stored conversation equal the same turns through /v1/chat/completions' session (greedy), the
// second turn streamed. The instructions, which the Responses API sends with every request, are
// the session's system message once; other instructions are a 400 naming them and leave the
// session as it was.
TEST(ResponsesTiny, SessionTurnsEqualChatSessionTurns) {
  const std::string dir = tiny_with_template("resp_session");
  if (dir.empty()) GTEST_SKIP() << "no " << ANVIL_SHARED_DIR << "/fixtures/anvil-tiny-code";
  const std::string store = (fs::temp_directory_path() / ("anvil_resp_store_" + std::to_string(::getpid()))).string();
  fs::remove_all(store);
  {
    ServerProcess srv({"-m", dir, "-c", "1024", "-np", "2", "-t", "2", "--kv-store", store, "--alias", "tiny"});
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    auto post = [&](const std::string& path, const json& body, int* st) {
      auto r = c.Post(path.c_str(), body.dump(), "application/json");
      if (!r) return json();
      *st = r->status;
      return json::parse(r->body, nullptr, false);
    };
    const std::string ins = "You write Python.";
    const std::vector<std::string> turns = {"Write a function that adds two numbers.", "Now one that multiplies them."};
    int st = 0;
    std::vector<std::string> want;
    for (size_t i = 0; i < turns.size(); ++i) {
      json msgs = json::array();
      if (i == 0) msgs.push_back({{"role", "system"}, {"content", ins}});
      msgs.push_back({{"role", "user"}, {"content", turns[i]}});
      json r = post("/v1/chat/completions",
                    {{"messages", msgs}, {"session", "via-chat"}, {"temperature", 0}, {"max_tokens", 24}}, &st);
      ASSERT_EQ(st, 200) << r;
      want.push_back(r["choices"][0]["message"]["content"].get<std::string>());
      EXPECT_FALSE(want.back().empty()) << r;
    }
    for (size_t i = 0; i < turns.size(); ++i) {
      const bool stream = i == 1;
      const json body = {{"input", turns[i]}, {"instructions", ins},       {"session", "via-responses"},
                         {"temperature", 0},  {"max_output_tokens", 24}, {"stream", stream}};
      std::string text;
      if (!stream) {
        json r = post("/v1/responses", body, &st);
        ASSERT_EQ(st, 200) << r;
        for (const json& item : r["output"])
          if (item["type"] == "message") text += item["content"][0]["text"].get<std::string>();
      } else {
        auto r = c.Post("/v1/responses", body.dump(), "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        for (size_t at = r->body.find("data: "); at != std::string::npos; at = r->body.find("data: ", at + 1)) {
          const json ev = json::parse(r->body.substr(at + 6, r->body.find('\n', at) - at - 6), nullptr, false);
          if (ev.is_object() && ev["type"] == "response.output_text.delta") text += ev["delta"].get<std::string>();
          EXPECT_NE(ev.value("type", ""), "error") << ev;
        }
      }
      EXPECT_EQ(text, want[i]) << "turn " << i;
    }
    auto conv = [&](const std::string& name) {
      auto r = c.Get(("/v1/sessions/" + name).c_str());
      EXPECT_TRUE(r && r->status == 200);
      return r ? json::parse(r->body, nullptr, false) : json();
    };
    const json ref = conv("via-chat"), got = conv("via-responses");
    EXPECT_EQ(got["messages"], ref["messages"]);
    EXPECT_EQ(got["messages"].size(), 5u) << got;  // system, then two user + assistant turns
    EXPECT_EQ(got["tokens"], ref["tokens"]);
    // Other instructions: refused, naming them; the session is as it was.
    json bad = post("/v1/responses",
                    {{"input", "And subtracts?"}, {"instructions", "Be terse."}, {"session", "via-responses"}}, &st);
    EXPECT_EQ(st, 400) << bad;
    EXPECT_EQ(bad["error"]["param"], "instructions") << bad;
    EXPECT_EQ(conv("via-responses")["messages"], ref["messages"]);
    // No instructions: the session's own go on.
    json ok = post("/v1/responses", {{"input", "And subtracts?"}, {"session", "via-responses"}, {"max_output_tokens", 4}},
                   &st);
    EXPECT_EQ(st, 200) << ok;
    EXPECT_EQ(conv("via-responses")["messages"].size(), 7u);
    EXPECT_EQ(srv.terminate(30), 0);
  }
  fs::remove_all(store);
  fs::remove_all(dir);
}

// Stored responses (`store`, the default, with the durable KV store): a response continued by
// `previous_response_id` answers as the stateless request with the whole conversation as input
// (greedy, the tiny trained model), with this request's instructions and not the previous one's;
// GET /v1/responses/{id} returns the response as it was sent, also after a restart; DELETE removes
// it; `store: false` keeps nothing; --responses-keep bounds what is kept, the oldest dropped first;
// an id not kept, or with a session, or on a server without the store, is a 400 naming the field.
TEST(ResponsesTiny, StoredResponsesAreContinuedFetchedAndDeleted) {
  const std::string dir = tiny_with_template("resp_stored");
  if (dir.empty()) GTEST_SKIP() << "no " << ANVIL_SHARED_DIR << "/fixtures/anvil-tiny-code";
  const std::string store = (fs::temp_directory_path() / ("anvil_resp_kvstore_" + std::to_string(::getpid()))).string();
  fs::remove_all(store);
  auto text_of = [](const json& r) {
    std::string t;
    for (const json& item : r["output"])
      if (item["type"] == "message") t += item["content"][0]["text"].get<std::string>();
    return t;
  };
  const std::string ins = "You write Python.";
  const std::string t1 = "Write a function that adds two numbers.", t2 = "Now one that multiplies them.";
  std::string id3;
  json r3;
  {
    ServerProcess srv({"-m", dir, "-c", "1024", "-np", "2", "-t", "2", "--kv-store", store, "--responses-keep", "3"});
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    auto post = [&](const json& body, int* st) {
      auto r = c.Post("/v1/responses", body.dump(), "application/json");
      *st = r ? r->status : -1;
      return r ? json::parse(r->body, nullptr, false) : json();
    };
    auto get = [&](const std::string& id, int* st) {
      auto r = c.Get(("/v1/responses/" + id).c_str());
      *st = r ? r->status : -1;
      return r ? json::parse(r->body, nullptr, false) : json();
    };
    int st = 0;
    const json r1 = post({{"input", t1}, {"instructions", ins}, {"temperature", 0}, {"max_output_tokens", 24}}, &st);
    ASSERT_EQ(st, 200) << r1;
    EXPECT_EQ(r1["store"], true);
    EXPECT_TRUE(r1["previous_response_id"].is_null());
    const std::string id1 = r1["id"];
    EXPECT_EQ(get(id1, &st), r1);
    EXPECT_EQ(st, 200);
    ASSERT_FALSE(text_of(r1).empty()) << r1;

    // Continued, streamed: the stateless request with the conversation as input answers the same.
    auto r2raw = c.Post("/v1/responses",
                        json{{"previous_response_id", id1}, {"input", t2}, {"instructions", ins}, {"temperature", 0},
                             {"max_output_tokens", 24}, {"stream", true}}
                            .dump(),
                        "application/json");
    ASSERT_TRUE(r2raw && r2raw->status == 200) << (r2raw ? r2raw->body : "no reply");
    json r2;
    for (size_t at = r2raw->body.find("data: "); at != std::string::npos; at = r2raw->body.find("data: ", at + 1)) {
      const json ev = json::parse(r2raw->body.substr(at + 6, r2raw->body.find('\n', at) - at - 6), nullptr, false);
      if (ev.is_object() && (ev["type"] == "response.completed" || ev["type"] == "response.incomplete")) r2 = ev["response"];
    }
    ASSERT_TRUE(r2.is_object()) << r2raw->body;
    EXPECT_EQ(r2["previous_response_id"], id1);
    EXPECT_EQ(r2["store"], true);
    const json history = {{{"role", "user"}, {"content", t1}}, {{"role", "assistant"}, {"content", text_of(r1)}},
                          {{"role", "user"}, {"content", t2}}};
    const json ref2 = post({{"input", history}, {"instructions", ins}, {"temperature", 0}, {"max_output_tokens", 24},
                            {"store", false}},
                           &st);
    ASSERT_EQ(st, 200) << ref2;
    EXPECT_EQ(text_of(r2), text_of(ref2));
    EXPECT_EQ(r2["usage"]["input_tokens"], ref2["usage"]["input_tokens"]);
    EXPECT_EQ(get(r2["id"], &st), r2) << "the stored response is not the one streamed";

    // r2's input items: the continued conversation's and its own, instructions apart, newest first by
    // default; pages by limit / order / after.
    auto items = [&](const std::string& query, int* st) {
      auto r = c.Get(("/v1/responses/" + r2["id"].get<std::string>() + "/input_items" + query).c_str());
      *st = r ? r->status : -1;
      return r ? json::parse(r->body, nullptr, false) : json();
    };
    auto text_part = [](const json& item) { return item["content"][0]["text"]; };
    json li = items("", &st);
    ASSERT_EQ(st, 200) << li;
    EXPECT_EQ(li["object"], "list");
    ASSERT_EQ(li["data"].size(), 3u) << li;
    EXPECT_EQ(li["has_more"], false);
    EXPECT_EQ(li["data"][0]["role"], "user");
    EXPECT_EQ(text_part(li["data"][0]), t2);
    EXPECT_EQ(li["data"][0]["content"][0]["type"], "input_text");
    EXPECT_EQ(li["data"][1]["role"], "assistant");
    EXPECT_EQ(li["data"][1]["content"][0]["type"], "output_text");
    EXPECT_EQ(text_part(li["data"][1]), text_of(r1));
    EXPECT_EQ(text_part(li["data"][2]), t1);
    for (const json& it : li["data"]) {
      EXPECT_EQ(it["type"], "message");
      EXPECT_EQ(it["status"], "completed");
      EXPECT_TRUE(it["id"].is_string() && !it["id"].get<std::string>().empty()) << it;
    }
    EXPECT_EQ(li["first_id"], li["data"][0]["id"]);
    EXPECT_EQ(li["last_id"], li["data"][2]["id"]);
    EXPECT_EQ(items("", &st), li) << "item ids change between calls";
    json asc = items("?order=asc&limit=2", &st);
    ASSERT_EQ(st, 200) << asc;
    ASSERT_EQ(asc["data"].size(), 2u) << asc;
    EXPECT_EQ(asc["has_more"], true);
    EXPECT_EQ(text_part(asc["data"][0]), t1);
    EXPECT_EQ(asc["data"][0]["id"], li["data"][2]["id"]);
    json rest = items("?order=asc&limit=2&after=" + asc["last_id"].get<std::string>(), &st);
    ASSERT_EQ(st, 200) << rest;
    ASSERT_EQ(rest["data"].size(), 1u) << rest;
    EXPECT_EQ(text_part(rest["data"][0]), t2);
    EXPECT_EQ(rest["has_more"], false);
    for (const auto& [query, param] : std::vector<std::pair<std::string, std::string>>{
             {"?limit=0", "limit"}, {"?limit=101", "limit"}, {"?limit=x", "limit"}, {"?order=up", "order"},
             {"?after=msg_nothing", "after"}}) {
      const json e = items(query, &st);
      EXPECT_EQ(st, 400) << query << ": " << e;
      EXPECT_EQ(e["error"]["param"], param) << query << ": " << e;
    }
    {
      auto r = c.Get("/v1/responses/resp_nothing/input_items");
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 404) << r->body;
      r = c.Delete(("/v1/responses/" + r2["id"].get<std::string>() + "/input_items").c_str());
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 405) << r->body;
      EXPECT_EQ(r->get_header_value("Allow"), "GET, HEAD");
      EXPECT_EQ(get(r2["id"], &st), r2) << "a DELETE of its input items touched the response";
    }

    // Without instructions: the previous response's are not carried over.
    r3 = post({{"previous_response_id", id1}, {"input", t2}, {"temperature", 0}, {"max_output_tokens", 24}}, &st);
    ASSERT_EQ(st, 200) << r3;
    id3 = r3["id"];
    const json ref3 =
        post({{"input", history}, {"temperature", 0}, {"max_output_tokens", 24}, {"store", false}}, &st);
    ASSERT_EQ(st, 200) << ref3;
    EXPECT_EQ(text_of(r3), text_of(ref3));
    EXPECT_EQ(r3["usage"]["input_tokens"], ref3["usage"]["input_tokens"]);
    EXPECT_LT(r3["usage"]["input_tokens"].get<int>(), r2["usage"]["input_tokens"].get<int>());

    // store: false keeps nothing.
    const json r4 = post({{"input", "x = 1"}, {"store", false}, {"max_output_tokens", 2}}, &st);
    ASSERT_EQ(st, 200) << r4;
    EXPECT_EQ(r4["store"], false);
    get(r4["id"], &st);
    EXPECT_EQ(st, 404);
    json e = post({{"previous_response_id", r4["id"]}, {"input", "y"}}, &st);
    EXPECT_EQ(st, 400) << e;
    EXPECT_EQ(e["error"]["param"], "previous_response_id") << e;
    EXPECT_EQ(e["error"]["code"], "previous_response_not_found") << e;
    e = post({{"previous_response_id", id1}, {"input", "y"}, {"session", "s1"}}, &st);
    EXPECT_EQ(st, 400) << e;
    EXPECT_EQ(e["error"]["param"], "previous_response_id") << e;

    // Kept: the last 3 (r1, r2, r3); one more drops r1.
    const json r5 = post({{"input", "z = 2"}, {"max_output_tokens", 2}}, &st);
    ASSERT_EQ(st, 200) << r5;
    get(id1, &st);
    EXPECT_EQ(st, 404) << "the oldest stored response was kept beyond --responses-keep 3";
    get(r2["id"], &st);
    EXPECT_EQ(st, 200);
    // DELETE.
    auto d = c.Delete(("/v1/responses/" + r2["id"].get<std::string>()).c_str());
    ASSERT_TRUE(d);
    EXPECT_EQ(d->status, 200) << d->body;
    EXPECT_EQ(json::parse(d->body, nullptr, false)["deleted"], true) << d->body;
    get(r2["id"], &st);
    EXPECT_EQ(st, 404);
    d = c.Delete(("/v1/responses/" + r2["id"].get<std::string>()).c_str());
    ASSERT_TRUE(d);
    EXPECT_EQ(d->status, 404);
    EXPECT_EQ(srv.terminate(30), 0);
  }
  {
    // After a restart on the same store: still there, and still continued.
    ServerProcess srv({"-m", dir, "-c", "1024", "-np", "2", "-t", "2", "--kv-store", store, "--responses-keep", "3"});
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    auto g = c.Get(("/v1/responses/" + id3).c_str());
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 200);
    EXPECT_EQ(json::parse(g->body, nullptr, false), r3);
    auto p = c.Post("/v1/responses", json{{"previous_response_id", id3}, {"input", "Thanks."}, {"max_output_tokens", 2}}.dump(),
                    "application/json");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->status, 200) << p->body;
    EXPECT_EQ(srv.terminate(30), 0);
  }
  {
    // Without the store: nothing is stored, and a previous_response_id is refused naming it.
    ServerProcess srv({"-m", dir, "-c", "1024", "-np", "2", "-t", "2", "--no-kv-store"});
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    auto p = c.Post("/v1/responses", json{{"input", "x"}, {"max_output_tokens", 2}}.dump(), "application/json");
    ASSERT_TRUE(p && p->status == 200);
    EXPECT_EQ(json::parse(p->body, nullptr, false)["store"], false);
    p = c.Post("/v1/responses", json{{"previous_response_id", id3}, {"input", "x"}}.dump(), "application/json");
    ASSERT_TRUE(p);
    EXPECT_EQ(p->status, 400);
    EXPECT_NE(p->body.find("previous_response_id"), std::string::npos) << p->body;
    auto g = c.Get(("/v1/responses/" + id3).c_str());
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 404);
    EXPECT_EQ(srv.terminate(30), 0);
  }
  fs::remove_all(store);
  fs::remove_all(dir);
}
