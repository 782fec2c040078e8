// OpenAI request bodies -> validated requests. Every rejection is an ApiError whose message and
// `param` name the offending field and what was expected, rendered as OpenAI's error body:
//   {"error": {"message": ..., "type": "invalid_request_error", "param": ..., "code": ...}}
// Accepted (chat and completions): model, max_tokens / max_completion_tokens, temperature, top_p,
// top_k, min_p, seed, stop, presence_penalty, frequency_penalty, repetition_penalty, logit_bias
// (token id strings -> a bias in [-100, 100], at most kMaxLogitBiasEntries), n (= 1),
// stream, stream_options.include_usage (with stream only), ignore_eos (vLLM/llama-server extension),
// session; chat: messages (text parts: text, input_text, output_text; an assistant's refusal parts;
// an assistant's content may be null), tools, tool_choice ("auto" / "none" / "required" / a named function),
// parallel_tool_calls, logprobs, top_logprobs, chat_template_kwargs, reasoning_effort is ignored;
// completions: prompt (string, [string], token ids), logprobs (0..20), echo=false. Unknown fields
// are ignored, as OpenAI's SDKs send extras; fields whose meaning anvil cannot honour are refused
// rather than silently ignored.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvstore/kvstore.h"
#include "server/job.h"

namespace anvil::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // "" -> null
  std::string type = "invalid_request_error";
  std::string code;   // "" -> null
  // More fields of the error object, after those (an object, or null: none): what a client should not
  // lose with the error, e.g. the reply of a session turn that was not saved.
  nlohmann::ordered_json extra;
};
nlohmann::ordered_json error_body(const ApiError& e);

struct RequestDefaults {
  std::string model_id;   // the name /v1/models lists
  std::string model_alt;  // also accepted (the -m argument)
  SamplingParams sampling;
  int max_context = 4096;
  int vocab_size = 0;  // logit_bias ids must be below it (0: not checked)
};

struct ApiRequest {
  bool chat = false;
  std::string model;
  // chat
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // template-ready
  nlohmann::ordered_json tools;                                        // null: none
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  std::optional<bool> enable_thinking;  // unset: the template's own default
  bool parse_tool_calls = false;
  std::string tool_choice = "auto";  // auto, none, required, function (forced_tool names it)
  std::string forced_tool;           // tool_choice naming a function: tools holds only it
  bool parallel_tool_calls = true;   // false: the reply keeps its first tool call only (vLLM)
  // completions: the (first) prompt; with several, the others in more_prompts, in order
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
    bool is_ids = false;
  };
  std::vector<Prompt> more_prompts;
  int n = 1;  // choices per prompt
  bool add_special_tokens = true;  // a text prompt gets the tokenizer's BOS/EOS (vLLM's parameter)
  // both
  std::optional<int> max_tokens;
  GenerationParams gen;  // prompt and max_tokens filled in later
  bool seed_given = false;
  bool seed_random = false;  // seed -1: a fresh random seed, even where the server has a fixed --seed
  bool stream = false, include_usage = false, logprobs = false;
  std::string session;
};

// The most choices one request may ask for (n times its prompts): each is a sequence of its own.
inline constexpr int kMaxChoices = 64;

// `body` is the raw request body. Returns the error, or nullopt with *out filled.
std::optional<ApiError> parse_chat_request(const std::string& body, const RequestDefaults& d, ApiRequest* out);
// The same, for a body already parsed (parse_json_object): /v1/responses translates its own body to
// a chat request's (responses_request.h).
std::optional<ApiError> parse_chat_object(const nlohmann::ordered_json& body, const RequestDefaults& d,
                                          ApiRequest* out);
std::optional<ApiError> parse_completion_request(const std::string& body, const RequestDefaults& d,
                                                 ApiRequest* out);
// The body as a JSON object, or the error (invalid UTF-8, malformed JSON, not an object).
std::optional<ApiError> parse_json_object(const std::string& body, nlohmann::ordered_json* out);
bool is_valid_utf8(std::string_view s);
// "a string", "an object", "null"...: what an error says a field was.
std::string json_type_name(const nlohmann::ordered_json& v);
// A session name: 1..128 of [A-Za-z0-9._-], not starting with '.' or '-' (kvstore.h: the CLI's rule too).
using anvil::valid_session_name;

}  // namespace anvil::server
