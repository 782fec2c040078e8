// OpenAI's Responses API request (POST /v1/responses) -> the chat request it means. anvil serves
// it on the chat path (same template, scheduler job, reply parsing and `session` extension), so the body is
// translated to a chat completion's and validated by parse_chat_object:
//   instructions                 -> a system message first
//   input (a string)             -> one user message
//   input items: message (role user/system/developer/assistant; content a string or
//     input_text/output_text/refusal parts) -> that message; function_call -> a tool call of the
//     assistant turn it follows (or a new one), function_call_output -> a tool message; reasoning
//     (its reasoning_text content) -> reasoning_content of the next assistant turn
//   max_output_tokens -> max_tokens; tools [{type: function, name, description, parameters}] ->
//     chat tools; tool_choice {type: function, name} -> chat's named choice; text.format
//     {type: text | json_object} -> response_format; reasoning.effort "none" -> enable_thinking false
// The sampling fields chat takes (temperature, top_p, top_k, min_p, seed, stop, penalties,
// logit_bias, ignore_eos, chat_template_kwargs), stream, parallel_tool_calls and session pass unchanged.
// store and previous_response_id are the server's (response_store.h). Accepted and not acted on:
// metadata, user, include "reasoning.encrypted_content", reasoning.summary, text.verbosity, service_tier, safety_identifier, prompt_cache_key, stream_options; unknown fields are ignored, as
// chat ignores them. Refused, naming the field: conversation, background, prompt, truncation
// "auto", max_tool_calls, top_logprobs, other include values, hosted tools, json_schema, media
// parts, item_reference and other item types, and chat's own names (messages, max_tokens,
// response_format) with the Responses name to use.
#pragma once
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/api_request.h"

namespace anvil::server {

// What the response object repeats of the request (OpenAI's Response echoes them): instructions,
// max_output_tokens, metadata, parallel_tool_calls, reasoning, text, tool_choice, tools (in the
// Responses shape), user. Sampling values are filled in from the parsed request.
struct ResponsesEcho {
  nlohmann::ordered_json fields = nlohmann::ordered_json::object();
  // `previous_response_id` ("" none) and `store` (default true) as asked: the server decides what it
  // can honour (response_store.h) and sets fields["store"] / ["previous_response_id"] accordingly.
  std::string previous_response_id;
  bool store = true;
};

// `body` is the raw request body. Returns the error (its param a Responses field), or nullopt with
// *out filled as parse_chat_request fills it and *echo with the fields above.
std::optional<ApiError> parse_responses_request(const std::string& body, const RequestDefaults& d, ApiRequest* out,
                                                ResponsesEcho* echo);

}  // namespace anvil::server
