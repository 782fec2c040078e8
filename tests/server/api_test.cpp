// Request validation (every bad-input class gets a 4xx naming the parameter), the reply shaping
// (reasoning split, Qwen-style tool calls) under every chunking, and the metrics text format.
#include <gtest/gtest.h>

#include <random>

#include "server/api_request.h"
#include "server/chat_output.h"
#include "server/metrics.h"

using namespace anvil::server;

namespace {

RequestDefaults defaults() {
  RequestDefaults d;
  d.model_id = "tiny";
  d.model_alt = "/models/tiny";
  d.max_context = 512;
  return d;
}

std::optional<ApiError> chat(const std::string& body, ApiRequest* r = nullptr) {
  ApiRequest tmp;
  return parse_chat_request(body, defaults(), r ? r : &tmp);
}
std::optional<ApiError> completion(const std::string& body, ApiRequest* r = nullptr) {
  ApiRequest tmp;
  return parse_completion_request(body, defaults(), r ? r : &tmp);
}

const std::string kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

}  // namespace

TEST(ApiRequest, AcceptsEveryDocumentedParameter) {
  ApiRequest r;
  auto e = chat(R"({"model":"tiny",)" + kMsgs + R"(,"max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,
    "min_p":0.05,"seed":42,"stop":["a","b"],"presence_penalty":0.5,"frequency_penalty":-0.5,
    "repetition_penalty":1.1,"logprobs":true,"top_logprobs":5,"n":1,"stream":true,
    "stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],
    "tool_choice":"auto","chat_template_kwargs":{"enable_thinking":false},"user":"x","unknown_extra":1})",
                &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(*r.max_tokens, 7);
  EXPECT_FLOAT_EQ(r.gen.sampling.temperature, 0.5f);
  EXPECT_EQ(r.gen.sampling.top_k, 40);
  EXPECT_EQ(r.gen.sampling.seed, 42u);
  EXPECT_EQ(r.gen.stop.size(), 2u);
  EXPECT_FLOAT_EQ(r.gen.frequency_penalty, -0.5f);
  EXPECT_EQ(r.gen.top_logprobs, 5);
  EXPECT_TRUE(r.stream && r.include_usage && r.parse_tool_calls);
  EXPECT_EQ(r.enable_thinking, std::optional<bool>(false));
  EXPECT_TRUE(r.parallel_tool_calls);
  // What the SDKs send by default, or that asks for nothing anvil lacks.
  ApiRequest p;
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"parallel_tool_calls":false,"functions":[],"function_call":"auto",
    "modalities":["text"],"audio":null})", &p));
  EXPECT_FALSE(p.parallel_tool_calls);
  ApiRequest c;
  ASSERT_FALSE(completion(R"({"prompt":[1,2,3],"max_completion_tokens":3,"logprobs":2})", &c));
  EXPECT_TRUE(c.prompt_is_ids);
  EXPECT_EQ(c.gen.top_logprobs, 2);
  EXPECT_EQ(*c.max_tokens, 3);
}

// JSON mode: response_format json_object on both endpoints; with tools only when tool_choice is
// "none" (the tools are then left out of the prompt); "text" is the default.
TEST(ApiRequest, ResponseFormatJsonObject) {
  ApiRequest r, t, n, c;
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"response_format":{"type":"json_object"}})", &r));
  EXPECT_TRUE(r.gen.json_object);
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"response_format":{"type":"text"}})", &t));
  EXPECT_FALSE(t.gen.json_object);
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"response_format":{"type":"json_object"},"tool_choice":"none",
    "tools":[{"type":"function","function":{"name":"f"}}]})", &n));
  EXPECT_TRUE(n.gen.json_object && !n.parse_tool_calls);
  ASSERT_FALSE(completion(R"({"prompt":"x","response_format":{"type":"json_object"}})", &c));
  EXPECT_TRUE(c.gen.json_object);
  auto e = chat("{" + kMsgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}})");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("json_object"), std::string::npos) << e->message;
}

TEST(ApiRequest, EveryBadInputNamesItsParameter) {
  struct Case {
    std::string body;
    std::string param;
    int status = 400;
  };
  const std::vector<Case> chat_cases = {
      {R"({"messages":)", ""},                                     // malformed JSON
      {"[1,2]", ""},                                               // not an object
      {"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", ""},  // invalid UTF-8
      {"{}", "messages"},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({"messages":[{"role":"robot","content":"x"}]})", "messages"},
      {R"({"messages":[{"role":"user"}]})", "messages"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", "messages"},
      {R"({"model":"gpt-4",)" + kMsgs + "}", "model", 404},
      {R"({"model":7,)" + kMsgs + "}", "model"},
      {"{" + kMsgs + R"(,"max_tokens":-5})", "max_tokens"},
      {"{" + kMsgs + R"(,"max_tokens":0})", "max_tokens"},
      {"{" + kMsgs + R"(,"max_tokens":100000000000})", "max_tokens"},
      {"{" + kMsgs + R"(,"max_tokens":"10"})", "max_tokens"},
      {"{" + kMsgs + R"(,"max_tokens":1.5})", "max_tokens"},
      {"{" + kMsgs + R"(,"max_completion_tokens":513})", "max_completion_tokens"},
      {"{" + kMsgs + R"(,"temperature":"hot"})", "temperature"},
      {"{" + kMsgs + R"(,"temperature":-1})", "temperature"},
      {"{" + kMsgs + R"(,"temperature":3})", "temperature"},
      {"{" + kMsgs + R"(,"top_p":0})", "top_p"},
      {"{" + kMsgs + R"(,"top_k":-2})", "top_k"},
      {"{" + kMsgs + R"(,"min_p":1})", "min_p"},
      {"{" + kMsgs + R"(,"seed":"x"})", "seed"},
      {"{" + kMsgs + R"(,"stop":5})", "stop"},
      {"{" + kMsgs + R"(,"stop":[""]})", "stop"},
      {"{" + kMsgs + R"(,"presence_penalty":3})", "presence_penalty"},
      {"{" + kMsgs + R"(,"frequency_penalty":-2.5})", "frequency_penalty"},
      {"{" + kMsgs + R"(,"repetition_penalty":0})", "repetition_penalty"},
      {"{" + kMsgs + R"(,"n":65})", "n"},
      {"{" + kMsgs + R"(,"n":2,"session":"s"})", "n"},
      {"{" + kMsgs + R"(,"stream":"yes"})", "stream"},
      {"{" + kMsgs + R"(,"stream_options":{"include_usage":1}})", "stream_options.include_usage"},
      {"{" + kMsgs + R"(,"logprobs":1})", "logprobs"},
      {"{" + kMsgs + R"(,"top_logprobs":3})", "top_logprobs"},
      {"{" + kMsgs + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs"},
      {"{" + kMsgs + R"(,"tools":{}})", "tools"},
      {"{" + kMsgs + R"(,"tools":[{"type":"function","function":{}}]})", "tools"},
      {"{" + kMsgs + R"(,"tool_choice":"required"})", "tool_choice"},
      {"{" + kMsgs + R"(,"tool_choice":{"type":"function","function":{"name":"f"}}})", "tool_choice"},
      {"{" + kMsgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}})", "response_format"},
      {"{" + kMsgs + R"(,"response_format":{"type":"yaml"}})", "response_format"},
      {"{" + kMsgs + R"(,"response_format":"json_object"})", "response_format"},
      {"{" + kMsgs + R"(,"response_format":{"type":"json_object"},"ignore_eos":true})", "response_format"},
      {"{" + kMsgs + R"(,"response_format":{"type":"json_object"},"tools":[{"type":"function","function":{"name":"f"}}]})", "response_format"},
      {"{" + kMsgs + R"(,"logit_bias":[1,2]})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"x":1}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"-1":1}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"1.5":1}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"":1}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"99999999999":1}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"5":100.5}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"5":-101}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"5":"1"}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"5":null}})", "logit_bias"},
      {"{" + kMsgs + R"(,"logit_bias":{"5":1,"05":2}})", "logit_bias"},  // the same token twice
      {"{" + kMsgs + R"(,"chat_template_kwargs":[]})", "chat_template_kwargs"},
      {"{" + kMsgs + R"(,"session":""})", "session"},
      {"{" + kMsgs + R"(,"parallel_tool_calls":"no"})", "parallel_tool_calls"},
      // Honoured by OpenAI, not by anvil: refused rather than silently ignored.
      {"{" + kMsgs + R"(,"functions":[{"name":"f","parameters":{"type":"object"}}]})", "functions"},
      {"{" + kMsgs + R"(,"function_call":{"name":"f"}})", "function_call"},
      {"{" + kMsgs + R"(,"modalities":["text","audio"]})", "modalities"},
      {"{" + kMsgs + R"(,"audio":{"voice":"alloy","format":"wav"}})", "audio"},
  };
  for (const Case& c : chat_cases) {
    auto e = chat(c.body);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->status, c.status) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    EXPECT_FALSE(e->message.empty());
    if (!c.param.empty()) EXPECT_NE(e->message.find(c.param.substr(0, c.param.find('.'))), std::string::npos) << e->message;
  }
  const std::vector<Case> completion_cases = {
      {"{}", "prompt"},
      {R"({"prompt":""})", "prompt"},
      {R"({"prompt":5})", "prompt"},
      {R"({"prompt":[1,-2]})", "prompt"},
      {R"({"prompt":[1,"a"]})", "prompt"},
      {R"({"prompt":["a",""]})", "prompt"},
      {R"({"prompt":["a",[1,-2]]})", "prompt"},
      {R"({"prompt":["a",5]})", "prompt"},
      {R"({"prompt":["a","b"],"n":40})", "n"},
      {R"({"prompt":["a","b"],"session":"s"})", "prompt"},
      {R"({"prompt":"x","n":2,"session":"s"})", "n"},
      {R"({"prompt":"x","n":65})", "n"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","logprobs":true})", "logprobs"},
      {R"({"prompt":"x","logprobs":21})", "logprobs"},
      {R"({"prompt":"x","echo":true,"session":"s"})", "echo"},
      {R"({"prompt":"x","echo":1})", "echo"},
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","suffix":"y"})", "suffix"},
      {R"({"prompt":"x","best_of":3})", "best_of"},
  };
  for (const Case& c : completion_cases) {
    auto e = completion(c.body);
    ASSERT_TRUE(e.has_value()) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
  }
}

// OpenAI's logit_bias: token id strings to biases in [-100, 100], kept by ascending id; ids at or
// above the vocabulary and more than kMaxLogitBiasEntries entries are refused, naming logit_bias.
TEST(ApiRequest, LogitBias) {
  ApiRequest r;
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"logit_bias":{"30":-100,"7":2.5,"0":100,"12":0}})", &r));
  const std::vector<anvil::LogitBias> want = {{0, 100.0f}, {7, 2.5f}, {12, 0.0f}, {30, -100.0f}};
  EXPECT_EQ(r.gen.sampling.logit_bias, want);
  ApiRequest c;
  ASSERT_FALSE(completion(R"({"prompt":"x","logit_bias":{"3":-1}})", &c));
  EXPECT_EQ(c.gen.sampling.logit_bias, (std::vector<anvil::LogitBias>{{3, -1.0f}}));
  ApiRequest none;
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"logit_bias":{}})", &none));
  EXPECT_TRUE(none.gen.sampling.logit_bias.empty());
  ASSERT_FALSE(chat("{" + kMsgs + R"(,"logit_bias":null})", &none));
  EXPECT_TRUE(none.gen.sampling.logit_bias.empty());

  RequestDefaults d = defaults();
  d.vocab_size = 100;
  ApiRequest tmp;
  EXPECT_FALSE(parse_chat_request("{" + kMsgs + R"(,"logit_bias":{"99":1}})", d, &tmp));
  auto e = parse_chat_request("{" + kMsgs + R"(,"logit_bias":{"100":1}})", d, &tmp);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "logit_bias");
  EXPECT_NE(e->message.find("outside the vocabulary [0, 100)"), std::string::npos) << e->message;

  std::string many = "{";
  for (int i = 0; i <= anvil::kMaxLogitBiasEntries; ++i) many += (i ? ",\"" : "\"") + std::to_string(i) + "\":1";
  many += "}";
  e = chat("{" + kMsgs + R"(,"logit_bias":)" + many + "}");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "logit_bias");
  EXPECT_NE(e->message.find("at most 1024"), std::string::npos) << e->message;
  e = chat("{" + kMsgs + R"(,"logit_bias":{"5":101}})");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("'logit_bias[\"5\"]' must be in [-100, 100], got 101"), std::string::npos) << e->message;
}

TEST(ApiRequest, ErrorBodyHasOpenAIShape) {
  auto e = chat("{" + kMsgs + R"(,"temperature":"hot"})");
  ASSERT_TRUE(e);
  auto j = error_body(*e);
  EXPECT_EQ(j["error"]["param"], "temperature");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(j["error"]["code"].is_null());
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(ApiRequest, MessagesBecomeTemplateInput) {
  ApiRequest r;
  ASSERT_FALSE(chat(R"({"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"user","content":"q"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
      {"role":"tool","tool_call_id":"c1","content":"42"}]})",
                    &r));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[0]["content"], "a\nb");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "c1");
}

// Text parts under the Responses API's names ("input_text", "output_text", which some clients send
// to chat completions, and vLLM takes) are text; an assistant turn's "refusal" parts are its text.
TEST(ApiRequest, TextPartsUnderEveryNameAndAnAssistantsRefusal) {
  ApiRequest r;
  auto e = chat(R"({"messages":[{"role":"system","content":[{"type":"input_text","text":"be "},{"type":"text","text":"terse"}]},
      {"role":"user","content":[{"type":"input_text","text":"q"}]},
      {"role":"assistant","content":[{"type":"output_text","text":"no: "},{"type":"refusal","refusal":"I can't."}]},
      {"role":"user","content":"again"}]})",
                &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["content"], "be \nterse");
  EXPECT_EQ(r.messages[1]["content"], "q");
  EXPECT_EQ(r.messages[2]["content"], "no: \nI can't.");
}

// A message's text parts are joined with "\n", leaving out empty ones, as vLLM joins them (its
// "string" content format: "\n".join of the parts that are not empty) and llama.cpp's server for a
// template that takes string content. They were joined with "": two blocks ran into one word
// ("Hello" + "world" = "Helloworld"), and the same request rendered another prompt than on vLLM.
TEST(ApiRequest, TextPartsAreJoinedWithANewlineAsVllmJoinsThem) {
  struct Case {
    std::vector<std::string> parts;
    std::string joined;  // "\n".join(p for p in parts if p), vLLM's rule
  };
  const std::vector<Case> cases = {
      {{"Hello", "world"}, "Hello\nworld"},
      {{"one"}, "one"},
      {{"a", "", "b"}, "a\nb"},
      {{"", "q", ""}, "q"},
      {{"", ""}, ""},
      {{"line\n", "next"}, "line\n\nnext"},
  };
  for (const Case& c : cases) {
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    for (const std::string& t : c.parts) parts.push_back({{"type", "text"}, {"text", t}});
    nlohmann::ordered_json body = {{"messages", nlohmann::ordered_json::array({{{"role", "user"}, {"content", parts}}})}};
    ApiRequest r;
    auto e = chat(body.dump(), &r);
    ASSERT_FALSE(e) << e->message;
    ASSERT_EQ(r.messages.size(), 1u);
    EXPECT_EQ(r.messages[0]["content"], c.joined) << body.dump();
  }
}

// Every part anvil refuses names the part, its type, and what to send instead.
TEST(ApiRequest, RefusedContentPartsNameThePartAndWhatToSend) {
  struct Case {
    std::string messages;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}])",
       {"'messages[0].content[1].type' 'image_url'", "text only", R"({"type": "text", "text": ...})"}},
      {R"([{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}]}])",
       {"'messages[0].content[0].type' 'input_audio'", "text only"}},
      {R"([{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}])", {"'file'", "text only"}},
      {R"([{"role":"user","content":[{"type":"input_image","image_url":"http://x"}]}])", {"'input_image'", "text only"}},
      {R"([{"role":"user","content":[{"type":"txt","text":"a"}]}])",
       {"'txt' is not a content part type", R"({"type": "text", "text": ...})"}},
      {R"([{"role":"user","content":[{"type":"refusal","refusal":"no"}]}])",
       {"'messages[0].content[0].type' 'refusal' is only valid in an assistant message"}},
      {R"([{"role":"user","content":[{"type":"input_text"}]}])", {"'messages[0].content[0].text' must be a string"}},
      {R"([{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"refusal","text":"no"}]}])",
       {"'messages[1].content[0].refusal' must be a string"}},
  };
  for (const Case& c : cases) {
    auto e = chat(R"({"messages":)" + c.messages + "}");
    ASSERT_TRUE(e) << c.messages;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, "messages");
    for (const std::string& s : c.says) EXPECT_NE(e->message.find(s), std::string::npos) << e->message;
    EXPECT_EQ(e->message.find("this model takes text only"), std::string::npos) << e->message;
  }
}

// stream_options without stream: 400, as OpenAI and vLLM answer (it asks for a stream's usage
// chunk that a one-shot reply never sends); null or an empty object asks for nothing and passes.
TEST(ApiRequest, StreamOptionsNeedAStream) {
  for (bool is_chat : {true, false}) {
    auto parse = [&](const std::string& extra) {
      return is_chat ? chat("{" + kMsgs + extra + "}") : completion(R"({"prompt":"x")" + extra + "}");
    };
    for (const char* extra : {R"(,"stream_options":{"include_usage":true})",
                              R"(,"stream":false,"stream_options":{"include_usage":false})"}) {
      auto e = parse(extra);
      ASSERT_TRUE(e) << extra;
      EXPECT_EQ(e->param, "stream_options");
      EXPECT_NE(e->message.find("'stream': true"), std::string::npos) << e->message;
    }
    for (const char* extra : {R"(,"stream_options":null)", R"(,"stream":false,"stream_options":null)",
                              R"(,"stream_options":{})", R"(,"stream":true,"stream_options":{"include_usage":true})"}) {
      auto e = parse(extra);
      EXPECT_FALSE(e) << extra << " -> " << e->message;
    }
  }
}

// An assistant turn without content or tool_calls (a replayed history, vLLM takes it): empty content.
// Other roles still need content.
TEST(ApiRequest, AnAssistantTurnWithoutContentIsEmpty) {
  ApiRequest r;
  auto e = chat(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":null},
      {"role":"user","content":"q2"},{"role":"assistant"},{"role":"user","content":"q3"}]})",
                &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[1]["content"], "");
  EXPECT_EQ(r.messages[3]["content"], "");
  for (const char* role : {"user", "system", "tool"}) {
    auto u = chat(std::string(R"({"messages":[{"role":")") + role + R"(","content":null}]})");
    ASSERT_TRUE(u) << role;
    EXPECT_NE(u->message.find("'messages[0].content' is required"), std::string::npos) << u->message;
  }
}

// The deprecated function_call in a history (and role 'function', its result) would reach the
// template, which knows tool_calls only and drops it: refused, naming what to send instead, as the
// request's own 'functions' / 'function_call' are. A null one (a replayed response object) passes
// and is not handed to the template.
TEST(ApiRequest, DeprecatedFunctionCallInTheHistoryIsRefused) {
  auto e = chat(R"({"messages":[{"role":"user","content":"q"},
      {"role":"assistant","content":null,"function_call":{"name":"f","arguments":"{}"}}]})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages");
  EXPECT_NE(e->message.find("'messages[1].function_call'"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("'tool_calls'"), std::string::npos) << e->message;
  auto f = chat(R"({"messages":[{"role":"user","content":"q"},{"role":"function","name":"f","content":"42"}]})");
  ASSERT_TRUE(f);
  EXPECT_NE(f->message.find("'messages[1].role' 'function'"), std::string::npos) << f->message;
  EXPECT_NE(f->message.find("role 'tool'"), std::string::npos) << f->message;
  ApiRequest r;
  auto ok = chat(R"({"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a","function_call":null},
      {"role":"user","content":"q2"}]})",
                 &r);
  ASSERT_FALSE(ok) << ok->message;
  EXPECT_FALSE(r.messages[1].contains("function_call")) << r.messages[1];
}

TEST(ApiRequest, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain"));
  EXPECT_TRUE(is_valid_utf8("h\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xc0\x80"));          // overlong NUL
  EXPECT_FALSE(is_valid_utf8("\xe0\x80\xaf"));      // overlong '/'
  EXPECT_FALSE(is_valid_utf8("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_FALSE(is_valid_utf8("ab\xe2\x82"));        // truncated
  EXPECT_FALSE(is_valid_utf8("\x80"));              // lone continuation
}

namespace {
// Feeds `text` to a fresh ChatOutput in pieces of `n` bytes and returns the concatenated result.
ChatOutput::Delta run(const std::string& text, size_t n, bool starts_in_reasoning, bool tools) {
  ChatOutput out(true, starts_in_reasoning, tools);
  ChatOutput::Delta all;
  auto add = [&](ChatOutput::Delta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
  };
  for (size_t i = 0; i < text.size(); i += n) add(out.push(text.substr(i, n)));
  add(out.flush());
  return all;
}
}  // namespace

TEST(ChatOutput, ReasoningSplitAndTrimUnderAnyChunking) {
  const std::string text = "<think>\nLet me think.\n\nYes.\n</think>\n\nThe answer is 4.";
  for (size_t n : {1, 2, 3, 5, 8, 100}) {
    auto d = run(text, n, false, false);
    EXPECT_EQ(d.reasoning, "Let me think.\n\nYes.") << n;
    EXPECT_EQ(d.content, "The answer is 4.") << n;
  }
  // The template opened <think> already.
  auto d = run("hmm\n</think>\n\nok", 1, true, false);
  EXPECT_EQ(d.reasoning, "hmm");
  EXPECT_EQ(d.content, "ok");
  // No reasoning at all: content untouched, leading newline included.
  d = run("\nplain", 1, false, false);
  EXPECT_EQ(d.content, "\nplain");
}

// A reply is the same however its text is chunked (per token, or several tokens at once when a
// stop string held text back), also for the arbitrary tags a random-weight model writes. Newlines
// the content starts with before any <think> are the model's text: only those after a reasoning
// block are template formatting. They were dropped when the <think> after them came in the same
// push, so a stop string that never matched changed the content. Likewise whitespace after content
// that follows a tool call was dropped when it came in a piece of its own.
TEST(ChatOutput, SameReplyUnderAnyChunkingOfArbitraryTags) {
  for (size_t n : {1, 2, 3, 1000}) {
    auto d = run("\n<think>r</think>\n\nx", n, false, false);
    EXPECT_EQ(d.content, "\n\n\nx") << n;
    EXPECT_EQ(d.reasoning, "r") << n;
    d = run("\n\n\xE4\xB8\xAD<think>\n\n</think>y", n, false, true);
    EXPECT_EQ(d.content, "\n\n\xE4\xB8\xADy") << n;
    d = run("\n</think><think>", n, false, false);
    EXPECT_EQ(d.content, "\n</think>") << n;
    // After a call, whitespace is dropped until content comes; whitespace after that content is
    // content (it was dropped when it came in a piece of its own).
    d = run("<tool_call>{\"name\": \"f\"}</tool_call>\n x\n", n, false, true);
    EXPECT_EQ(d.content, "\n x\n") << n;
    d = run("<tool_call>{\"name\": \"f\"}</tool_call>\n<tool_call>{\"name\": \"g\"}</tool_call>\n", n, false, true);
    EXPECT_EQ(d.content, "") << n;
  }
  std::mt19937 rng(3);
  const std::vector<std::string> pieces = {"<think>", "</think>", "<tool_call>", "</tool_call>",
                                           "{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "{\"name\": 5}", "{", "\"",
                                           "\n", "\n\n", "x", " ", "\xE4\xB8\xAD", "<", "</", "think>", "tool_call>"};
  auto calls = [](const ChatOutput::Delta& d) {
    std::vector<std::string> v;
    for (const auto& c : d.tool_calls) v.push_back(c.name + "|" + c.arguments);
    return v;
  };
  for (int it = 0; it < 3000; ++it) {
    std::string text;
    for (int k = 0, m = int(rng() % 14); k < m; ++k) text += pieces[rng() % pieces.size()];
    const bool starts = rng() % 3 == 0, tools = rng() % 2 == 0;
    const auto whole = run(text, text.size() + 1, starts, tools);
    for (size_t n : {size_t(1), size_t(1 + rng() % 7)}) {
      const auto parts = run(text, n, starts, tools);
      ASSERT_EQ(parts.reasoning, whole.reasoning) << testing::PrintToString(text) << " in pieces of " << n;
      ASSERT_EQ(parts.content, whole.content) << testing::PrintToString(text) << " in pieces of " << n;
      ASSERT_EQ(calls(parts), calls(whole)) << testing::PrintToString(text) << " in pieces of " << n;
    }
  }
}

TEST(ChatOutput, QwenToolCallsUnderAnyChunking) {
  const std::string text =
      "I will call it.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2]}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n";
  for (size_t n : {1, 2, 7, 1000}) {
    auto d = run(text, n, false, true);
    ASSERT_EQ(d.tool_calls.size(), 2u) << n;
    EXPECT_EQ(d.tool_calls[0].name, "get_weather");
    EXPECT_EQ(d.tool_calls[0].arguments, R"({"city":"Paris","n":[1,2]})");
    EXPECT_EQ(d.tool_calls[1].name, "now");
    EXPECT_EQ(d.tool_calls[1].arguments, "{}");
    EXPECT_EQ(d.content, "I will call it.\n") << n;
    EXPECT_EQ(d.tool_calls[0].id.rfind("call_", 0), 0u);
    EXPECT_NE(d.tool_calls[0].id, d.tool_calls[1].id);
  }
  // A block that is not a call stays text; a block cut off by the token limit too.
  auto d = run("<tool_call>not json</tool_call> after", 3, false, true);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "<tool_call>not json</tool_call> after");
  d = run("x <tool_call>\n{\"name\": \"f\"", 4, false, true);
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_EQ(d.content, "x <tool_call>\n{\"name\": \"f\"");
  // parallel_tool_calls false (max_tool_calls 1): the first call only; the later blocks are
  // neither calls nor content, a block that is not a call stays text.
  for (size_t n : {1, 2, 7, 1000}) {
    ChatOutput out(true, false, true, 1);
    ChatOutput::Delta all;
    const std::string more = text + "<tool_call>oops</tool_call>";
    for (size_t i = 0; i < more.size(); i += n) {
      auto d = out.push(more.substr(i, n));
      all.content += d.content;
      for (auto& c : d.tool_calls) all.tool_calls.push_back(c);
    }
    all.content += out.flush().content;
    ASSERT_EQ(all.tool_calls.size(), 1u) << n;
    EXPECT_EQ(all.tool_calls[0].name, "get_weather");
    EXPECT_EQ(all.content, "I will call it.\n\n<tool_call>oops</tool_call>") << n;
  }
  // Without tools, the tags are plain text.
  d = run("<tool_call>{\"name\":\"f\"}</tool_call>", 2, false, false);
  EXPECT_TRUE(d.tool_calls.empty());
  // Reasoning, then a call.
  d = run("<think>\nplan\n</think>\n\n<tool_call>\n{\"name\":\"f\",\"arguments\":\"{}\"}\n</tool_call>", 1, false, true);
  EXPECT_EQ(d.reasoning, "plan");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{}");
  EXPECT_EQ(d.content, "");
}

TEST(Metrics, PrometheusTextFormat) {
  Metrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 400);
  m.ttft.observe(0.003);
  m.ttft.observe(0.2);
  m.ttft.observe(100);
  m.generation_tokens += 5;
  m.add_gauge("anvil_requests_running", "running", [] { return 3.0; });
  std::string t = m.render();
  EXPECT_NE(t.find("anvil_requests_total{endpoint=\"/v1/completions\",code=\"200\"} 2\n"), std::string::npos) << t;
  EXPECT_NE(t.find("anvil_requests_total{endpoint=\"/v1/completions\",code=\"400\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("anvil_generation_tokens_total 5\n"), std::string::npos);
  // Cumulative buckets: 0.003 lands in le=0.005, 0.2 in le=0.25, 100 only in +Inf.
  EXPECT_NE(t.find("anvil_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0\n"), std::string::npos) << t;
  EXPECT_NE(t.find("anvil_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("anvil_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("anvil_time_to_first_token_seconds_bucket{le=\"60\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("anvil_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(t.find("anvil_time_to_first_token_seconds_count 3\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE anvil_requests_running gauge\nanvil_requests_running 3\n"), std::string::npos);
  // Every non-comment line is "name{labels} value".
  size_t pos = 0;
  while (pos < t.size()) {
    size_t end = t.find('\n', pos);
    std::string line = t.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.find("anvil_"), 0u) << line;
    EXPECT_NE(line.rfind(' '), std::string::npos) << line;
  }
}
