// The input items of a stored response: GET /v1/responses/{id}/input_items (OpenAI's "list input
// items"). A stored response keeps its conversation as chat messages (response_store.h): the
// request's input, after the conversation of the response it continued (previous_response_id), with
// the reply last; instructions apart. Its input items are those messages before the reply, in the
// Responses API's item shapes, as OpenAI lists them (the continued conversation's items included):
//   user / system / developer  -> {"type": "message", "role", "content": [input_text parts]}
//   assistant                  -> a "reasoning" item (its reasoning_content), a "message" with
//                                 output_text parts (its text), then a "function_call" per tool call
//   tool                       -> {"type": "function_call_output", "call_id", "output"}
// Every item has "status": "completed" and an id derived from the response's id and the item's
// place (stable across calls, so that `after` pages through them); anvil keeps no item ids of its own.
#pragma once
#include <optional>
#include <string>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api_request.h"

namespace anvil::server {

// conversation: the stored messages, the reply last (it is left out).
nlohmann::ordered_json input_items(const nlohmann::ordered_json& conversation, const std::string& response_id);

// One page of items as OpenAI's list object ({"object": "list", "data", "first_id", "last_id",
// "has_more"}), from the query's limit (1-100, default 20), order ("asc" or "desc", the default:
// newest first) and after (an item id of this list: the page starts after it). A bad value is an
// ApiError naming its parameter.
std::variant<nlohmann::ordered_json, ApiError> input_items_page(const nlohmann::ordered_json& items,
                                                                const std::optional<std::string>& limit,
                                                                const std::optional<std::string>& order,
                                                                const std::optional<std::string>& after);

}  // namespace anvil::server
