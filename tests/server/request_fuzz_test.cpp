// Malformed and odd requests against a live `anvil serve`: valid requests of every endpoint, mutated
// at random (a field removed, or given a value of another type or an extreme one: huge and negative
// numbers, empty and 10 KB strings, lone surrogates, nested containers), and raw bodies truncated or
// with bytes flipped. Whatever comes, the server must answer, with a well-formed reply (200) or a
// JSON error naming what was wrong (4xx), never a server error nor a dropped connection, and keep
// serving. The one 5xx a client can cause on purpose is excepted: `tool_choice_not_followed` (a
// model that does not call the tool it was told to; the random-weight model here often does not).
// The seed is fixed, so a failure reproduces; ANVIL_FUZZ_SEED and ANVIL_FUZZ_N choose others, and
// ANVIL_FUZZ_SHOW=1 prints every refusal (status, body, message) to read the errors as a client would.
#include <gtest/gtest.h>

#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server_process.h"

using anvil::test::ServerProcess;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Base {
  std::string path;
  json body;
};

json tool(const std::string& name) {
  return {{"type", "function"},
          {"function",
           {{"name", name},
            {"description", "d"},
            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
}

// Valid requests of every endpoint, each a few tokens long.
std::vector<Base> bases() {
  const json msgs = {{{"role", "system"}, {"content", "Be brief."}},
                     {{"role", "user"}, {"content", "Hi"}},
                     {{"role", "assistant"}, {"content", "Hello"}, {"reasoning_content", "greet"}},
                     {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Weather?"}}}}}};
  const json call_msgs = {
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}};
  std::vector<Base> b;
  b.push_back({"/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 4}, {"temperature", 0}}});
  b.push_back({"/v1/chat/completions",
               {{"messages", msgs},
                {"max_tokens", 4},
                {"stream", true},
                {"stream_options", {{"include_usage", true}}},
                {"logprobs", true},
                {"top_logprobs", 2},
                {"stop", {"\n", "Hello"}},
                {"seed", 7},
                {"top_p", 0.9},
                {"top_k", 20},
                {"min_p", 0.05},
                {"presence_penalty", 0.5},
                {"frequency_penalty", 0.5},
                {"repetition_penalty", 1.1},
                {"logit_bias", {{"11", -5}}}}});
  b.push_back({"/v1/chat/completions",
               {{"messages", call_msgs},
                {"tools", {tool("get_weather"), tool("get_time")}},
                {"tool_choice", "auto"},
                {"parallel_tool_calls", false},
                {"max_tokens", 6}}});
  b.push_back({"/v1/chat/completions",
               {{"messages", msgs},
                {"tools", {tool("get_weather")}},
                {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
                {"max_tokens", 6}}});
  b.push_back({"/v1/chat/completions",
               {{"messages", msgs},
                {"response_format", {{"type", "json_object"}}},
                {"chat_template_kwargs", {{"enable_thinking", false}}},
                {"max_tokens", 6}}});
  b.push_back({"/v1/chat/completions",
               {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"session", "fuzz-a"}, {"max_tokens", 3}}});
  b.push_back({"/v1/completions",
               {{"prompt", "def fib(n):"}, {"max_tokens", 4}, {"logprobs", 2}, {"stop", "\n\n"}}});
  b.push_back({"/v1/completions", {{"prompt", {1, 2, 3, 4}}, {"max_tokens", 3}, {"stream", true}, {"ignore_eos", true}}});
  b.push_back({"/v1/completions", {{"prompt", "x = 1"}, {"session", "fuzz-doc"}, {"max_tokens", 3}}});
  b.push_back({"/v1/responses",
               {{"input", "Name a prime."}, {"instructions", "Be terse."}, {"max_output_tokens", 4}, {"temperature", 0}}});
  b.push_back({"/v1/responses",
               {{"input",
                 {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather?"}}}}},
                  {{"type", "function_call"}, {"call_id", "c1"}, {"name", "get_weather"}, {"arguments", "{}"}},
                  {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "rain"}}}},
                {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"parameters", {{"type", "object"}}}}}},
                {"stream", true},
                {"max_output_tokens", 6},
                {"reasoning", {{"effort", "none"}}},
                {"text", {{"format", {{"type", "text"}}}}}}});
  b.push_back({"/tokenize", {{"content", "Hello world"}, {"add_special", true}}});
  b.push_back({"/tokenize", {{"messages", msgs}}});
  b.push_back({"/detokenize", {{"tokens", {9707, 1879}}}});
  return b;
}

// Every place in a JSON document: a JSON pointer to each value below the root.
void places(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>* out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const auto p = at / it.key();
      out->push_back(p);
      places(it.value(), p, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      const auto p = at / i;
      out->push_back(p);
      places(j[i], p, out);
    }
  }
}

json odd_value(std::mt19937_64& rng) {
  // Plausible values of the wrong field reach further than garbage: roles, choices, small numbers.
  static const char* kWords[] = {"user", "assistant", "tool", "system", "developer", "function", "required", "none",
                                 "auto", "json_object", "json_schema", "text", "input_text", "function_call",
                                 "function_call_output", "reasoning", "message", "<think>", "{\"a\": 1", "call_1"};
  if (rng() % 3 == 0) return kWords[rng() % (sizeof kWords / sizeof *kWords)];
  if (rng() % 4 == 0) return int(rng() % 6) - 1 + (rng() % 2 ? 0 : 100000);
  switch (rng() % 20) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return false;
    case 3: return 0;
    case 4: return -1;
    case 5: return 2147483648LL;
    case 6: return -9223372036854775807LL;
    case 7: return 18446744073709551615ULL;
    case 8: return 1e308;
    case 9: return -0.5;
    case 10: return 0.5;
    case 11: return "";
    case 12: return std::string(10000, 'a');
    case 13: return "@@LONE@@";  // becomes a lone surrogate's escape in the body (mutate)
    case 14: return "\x01\x02 control \x7f <|im_end|> <think> </tool_call>";
    case 15: return json::array();
    case 16: return json::object();
    case 17: return json::array({json::array({json::array({1})}), "x", nullptr});
    case 18: return json{{"type", "function"}, {"name", 3}};
    default: return "get_weather";
  }
}

// One mutation of a valid request: its serialized body.
std::string mutate(const Base& base, std::mt19937_64& rng) {
  json j = base.body;
  const int kind = int(rng() % 10);
  if (kind >= 8) {  // the raw body: cut short, or a few bytes changed
    std::string s = j.dump();
    if (kind == 8) return s.substr(0, rng() % s.size());
    for (int i = 0; i < 3; ++i) s[rng() % s.size()] = char(rng() % 256);
    return s;
  }
  const int edits = rng() % 4 == 0 ? 2 : 1;
  for (int e = 0; e < edits; ++e) {
    std::vector<json::json_pointer> ps;
    places(j, json::json_pointer(), &ps);
    if (ps.empty()) break;
    const auto p = ps[rng() % ps.size()];
    if (rng() % 4 == 0) {
      const auto parent = p.parent_pointer();
      if (j.at(parent).is_object()) j.at(parent).erase(p.back());
      else j.at(parent).erase(size_t(std::stoul(p.back())));
    } else {
      j.at(p) = odd_value(rng);
    }
  }
  std::string s = j.dump();
  for (size_t at = s.find("@@LONE@@"); at != std::string::npos; at = s.find("@@LONE@@")) s.replace(at, 8, "\\ud800x");
  return s;
}

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

}  // namespace

TEST(ServeFuzz, MutatedRequestsGetAReplyOrAClearErrorAndTheServerStaysUp) {
  const std::string dir = (fs::temp_directory_path() / ("anvil_serve_fuzz_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  {
    ServerProcess srv({"--synthetic", "tiny", "-c", "512", "-np", "4", "-t", "2", "--kv-store", dir});
    ASSERT_TRUE(srv.ok()) << srv.startup_output();
    httplib::Client c("127.0.0.1", srv.port());
    c.set_read_timeout(60, 0);
    const uint64_t seed = uint64_t(env_int("ANVIL_FUZZ_SEED", 20261207));
    const int n = env_int("ANVIL_FUZZ_N", 240);
    std::mt19937_64 rng(seed);
    const std::vector<Base> all = bases();
    int ok = 0, refused = 0, busy = 0;
    // The unmutated requests first: each must succeed, or the mutations test nothing.
    for (const Base& b : all) {
      auto r = c.Post(b.path.c_str(), b.body.dump(), "application/json");
      ASSERT_TRUE(r) << b.path << " " << b.body.dump();
      EXPECT_EQ(r->status, 200) << b.path << " " << b.body.dump() << " -> " << r->body.substr(0, 400);
    }
    for (int i = 0; i < n; ++i) {
      const Base& b = all[rng() % all.size()];
      const std::string body = mutate(b, rng);
      const std::string what = "case " + std::to_string(i) + " (seed " + std::to_string(seed) + ") " + b.path + " " +
                               body.substr(0, 600);
      auto r = c.Post(b.path.c_str(), body, "application/json");
      ASSERT_TRUE(r) << what << ": no reply (" << httplib::to_string(r.error()) << ")";
      if (r->status == 200) {
        ++ok;
        const bool streamed = r->get_header_value("Content-Type").find("text/event-stream") != std::string::npos;
        if (!streamed) {
          const json reply = json::parse(r->body, nullptr, false);
          EXPECT_FALSE(reply.is_discarded()) << what << ": the reply is not JSON: " << r->body.substr(0, 400);
        } else {
          EXPECT_NE(r->body.find("data: "), std::string::npos) << what << ": an empty stream";
          // A stream that failed after it began ends with an error event; only the client-caused one counts.
          if (r->body.find("event: error") != std::string::npos || r->body.find("data: {\"error\"") != std::string::npos)
            EXPECT_NE(r->body.find("tool_choice_not_followed"), std::string::npos) << what << ": " << r->body.substr(0, 800);
        }
        continue;
      }
      const json err = json::parse(r->body, nullptr, false);
      ASSERT_FALSE(err.is_discarded()) << what << ": status " << r->status << ", not JSON: " << r->body.substr(0, 400);
      ASSERT_TRUE(err.contains("error") && err["error"].is_object() && err["error"].contains("message"))
          << what << ": " << r->body.substr(0, 400);
      const std::string msg = err["error"]["message"].is_string() ? err["error"]["message"].get<std::string>() : "";
      EXPECT_FALSE(msg.empty()) << what << ": an error without a message";
      if (std::getenv("ANVIL_FUZZ_SHOW")) std::printf("[fuzz] %d %s\n   -> %s\n", r->status, body.substr(0, 300).c_str(), msg.substr(0, 300).c_str());
      if (r->status >= 500) {
        EXPECT_EQ(err["error"].value("code", json()).dump(), "\"tool_choice_not_followed\"")
            << what << ": a server error: " << r->body.substr(0, 600);
      } else if (r->status == 409) {
        ++busy;  // a session another mutated request left claimed would be a bug: 409 is only a live holder's
        EXPECT_TRUE(false) << what << ": 409 with no other request running: " << r->body.substr(0, 400);
      } else {
        EXPECT_TRUE(r->status == 400 || r->status == 404 || r->status == 413 || r->status == 422)
            << what << ": status " << r->status << ": " << r->body.substr(0, 400);
        ++refused;
      }
    }
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200);
    std::printf("[fuzz] seed %llu: %d requests, %d answered, %d refused (4xx), %d busy\n",
                static_cast<unsigned long long>(seed), n, ok, refused, busy);
    EXPECT_GT(ok, n / 10) << "few mutations were still valid requests: the cases test little";
    EXPECT_GT(refused, n / 4) << "few mutations were refused: the mutations are too mild";
    EXPECT_EQ(srv.terminate(30), 0);
  }
  fs::remove_all(dir);
}
