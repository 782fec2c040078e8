// One /v1/responses reply: the chat Reply (openai_reply.h: ChatOutput's reasoning, content and
// tool calls, tool_choice checked) rendered as OpenAI's Response object and, streaming, its named
// SSE events ("event: NAME\ndata: {..., "sequence_number": N}"):
//   response.created, response.in_progress,
//   per output item in order: response.output_item.added, then
//     reasoning: content_part.added (reasoning_text), reasoning_text.delta..., reasoning_text.done,
//                content_part.done
//     message:   content_part.added (output_text), output_text.delta..., output_text.done,
//                content_part.done
//     function_call: function_call_arguments.delta, function_call_arguments.done
//   response.output_item.done; last response.completed (status "completed") or response.incomplete
//   (status "incomplete", incomplete_details.reason "max_output_tokens": the reply reached its limit),
//   each with the whole response. A failure after the stream began is an "error" event (code,
//   message, param), the stream's last.
// Output items follow the text as the model wrote it: a new item begins where the text changes kind
// (reasoning, answer text, a tool call), so the streamed items and the non-streamed output are the
// same list. A reply with no item at all gets an empty message (output_text "").
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_reply.h"
#include "server/responses_request.h"

namespace anvil::server {

class ResponsesReply {
 public:
  // `chat`: the chat reply it renders (not streaming: it accumulates); `echo`: the request's fields
  // the response repeats. think_open/think_close: the reasoning tags' ids (-1: none), and whether
  // the reply starts inside the reasoning, to count reasoning_tokens.
  ResponsesReply(std::shared_ptr<Reply> chat, ResponsesEcho echo, bool stream, int32_t think_open,
                 int32_t think_close, bool starts_in_reasoning);

  const std::string& id() const { return id_; }
  // The SSE text to write now ("" when nothing; always "" when not streaming).
  std::string on_start();                           // response.created, response.in_progress
  std::string on_delta(const JobEvent& e);
  // Closes the items; completed / incomplete. `commit` (may be empty) runs once the reply is whole
  // (its items closed, its status set), before the last event (a session's turn ends there, and a
  // stored response is stored, so that both are durable when the client reads that event); an error
  // it returns, where the reply kept its tool_choice, goes out as the error event instead of
  // response.completed / .incomplete.
  std::string on_done(const std::string& reason, const std::function<std::optional<ApiError>()>& commit = nullptr);
  std::string on_error(const ApiError& e);          // the "error" event
  // After on_done: the tool_choice violation ("" when none; the reply is then an error), and the body.
  const std::string& violation() const { return chat_->violation; }
  nlohmann::ordered_json response() const;

 private:
  struct Item {
    std::string type;  // reasoning, message, function_call
    std::string id, text, status = "in_progress";
    ToolCall call;
  };
  std::string event(const char* type, nlohmann::ordered_json body);
  nlohmann::ordered_json item_json(const Item& it) const;
  nlohmann::ordered_json part_json(const Item& it) const;
  nlohmann::ordered_json object(const char* status) const;
  nlohmann::ordered_json usage() const;
  // What the chat reply gained since the last call, as items (and events).
  std::string take_new();
  std::string append_text(const char* type, const std::string& text);
  std::string close_open(const std::string& status);

  std::shared_ptr<Reply> chat_;
  ResponsesEcho echo_;
  bool stream_;
  std::string id_;
  int64_t created_ = 0;
  int seq_ = 0;
  std::vector<Item> items_;
  bool open_ = false;  // the last item still takes text
  size_t seen_reasoning_ = 0, seen_content_ = 0, seen_calls_ = 0;
  int32_t think_open_, think_close_;
  bool in_reasoning_;
  int reasoning_tokens_ = 0;
  std::string status_ = "in_progress";
};

}  // namespace anvil::server
