#include "server/responses_reply.h"

#include <chrono>
#include <random>

namespace anvil::server {

namespace {

std::string new_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

const char* item_prefix(const std::string& type) {
  return type == "reasoning" ? "rs_" : type == "message" ? "msg_" : "fc_";
}

}  // namespace

ResponsesReply::ResponsesReply(std::shared_ptr<Reply> chat, ResponsesEcho echo, bool stream, int32_t think_open,
                               int32_t think_close, bool starts_in_reasoning)
    : chat_(std::move(chat)),
      echo_(std::move(echo)),
      stream_(stream),
      id_(new_id("resp_")),
      think_open_(think_open),
      think_close_(think_close),
      in_reasoning_(starts_in_reasoning) {
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string ResponsesReply::event(const char* type, ojson body) {
  ojson e = ojson::object();
  e["type"] = type;
  for (auto it = body.begin(); it != body.end(); ++it) e[it.key()] = std::move(it.value());
  e["sequence_number"] = seq_++;
  return std::string("event: ") + type + "\ndata: " + dump_json(e) + "\n\n";
}

ojson ResponsesReply::part_json(const Item& it) const {
  if (it.type == "reasoning") return {{"type", "reasoning_text"}, {"text", it.text}};
  return {{"type", "output_text"}, {"text", it.text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
}

ojson ResponsesReply::item_json(const Item& it) const {
  const bool done = it.status != "in_progress";
  if (it.type == "function_call")
    return {{"type", "function_call"}, {"id", it.id},       {"call_id", it.call.id},
            {"name", it.call.name},   {"arguments", done ? it.call.arguments : ""}, {"status", it.status}};
  ojson content = done ? ojson::array({part_json(it)}) : ojson::array();
  if (it.type == "reasoning")
    return {{"type", "reasoning"}, {"id", it.id}, {"summary", ojson::array()}, {"content", content}, {"status", it.status}};
  return {{"type", "message"}, {"id", it.id}, {"role", "assistant"}, {"status", it.status}, {"content", content}};
}

ojson ResponsesReply::usage() const {
  const int p = chat_->job->prompt_tokens(), c = chat_->job->completion_tokens();
  return {{"input_tokens", p},
          {"input_tokens_details", {{"cached_tokens", chat_->job->cached_tokens()}}},
          {"output_tokens", c},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}},
          {"total_tokens", p + c}};
}

ojson ResponsesReply::object(const char* status) const {
  ojson o = ojson::object();
  o["id"] = id_;
  o["object"] = "response";
  o["created_at"] = created_;
  o["status"] = status;
  o["error"] = nullptr;
  o["incomplete_details"] = std::string(status) == "incomplete" ? ojson{{"reason", "max_output_tokens"}} : ojson();
  o["model"] = chat_->model;
  ojson output = ojson::array();
  if (std::string(status) != "in_progress")
    for (const Item& it : items_) output.push_back(item_json(it));
  o["output"] = std::move(output);
  for (auto it = echo_.fields.begin(); it != echo_.fields.end(); ++it) o[it.key()] = it.value();
  o["previous_response_id"] = echo_.previous_response_id.empty() ? ojson() : ojson(echo_.previous_response_id);
  o["background"] = false;
  o["usage"] = std::string(status) == "in_progress" ? ojson() : usage();
  return o;
}

std::string ResponsesReply::on_start() {
  if (!stream_) return "";
  const ojson o = object("in_progress");
  std::string sse = event("response.created", {{"response", o}});
  return sse + event("response.in_progress", {{"response", o}});
}

// Ends the open item: its text's done events, then output_item.done.
std::string ResponsesReply::close_open(const std::string& status) {
  if (!open_) return "";
  open_ = false;
  Item& it = items_.back();
  it.status = status;
  if (!stream_) return "";
  const int index = int(items_.size()) - 1;
  const ojson where = {{"item_id", it.id}, {"output_index", index}};
  std::string sse;
  if (it.type == "function_call") {
    ojson d = where;
    d["name"] = it.call.name;
    d["arguments"] = it.call.arguments;
    sse += event("response.function_call_arguments.done", d);
  } else {
    ojson d = where;
    d["content_index"] = 0;
    d["text"] = it.text;
    if (it.type == "message") d["logprobs"] = ojson::array();
    sse += event(it.type == "message" ? "response.output_text.done" : "response.reasoning_text.done", d);
    ojson p = where;
    p["content_index"] = 0;
    p["part"] = part_json(it);
    sse += event("response.content_part.done", p);
  }
  sse += event("response.output_item.done", {{"output_index", index}, {"item", item_json(it)}});
  return sse;
}

// Text of kind `type` (reasoning, message): into the open item of that kind, or a new one.
std::string ResponsesReply::append_text(const char* type, const std::string& text) {
  std::string sse;
  if (!open_ || items_.back().type != type) {
    sse += close_open("completed");
    Item it;
    it.type = type;
    it.id = new_id(item_prefix(type));
    items_.push_back(std::move(it));
    open_ = true;
    if (stream_) {
      const int index = int(items_.size()) - 1;
      sse += event("response.output_item.added", {{"output_index", index}, {"item", item_json(items_.back())}});
      Item empty = items_.back();
      sse += event("response.content_part.added",
                   {{"item_id", empty.id}, {"output_index", index}, {"content_index", 0}, {"part", part_json(empty)}});
    }
  }
  Item& it = items_.back();
  it.text += text;
  if (stream_ && !text.empty()) {
    ojson d = {{"item_id", it.id}, {"output_index", int(items_.size()) - 1}, {"content_index", 0}, {"delta", text}};
    if (it.type == "message") d["logprobs"] = ojson::array();
    sse += event(it.type == "message" ? "response.output_text.delta" : "response.reasoning_text.delta", d);
  }
  return sse;
}

std::string ResponsesReply::take_new() {
  std::string sse;
  // Within one step's text: its reasoning, its answer text, its calls (ChatOutput's order).
  if (chat_->reasoning.size() > seen_reasoning_) {
    sse += append_text("reasoning", chat_->reasoning.substr(seen_reasoning_));
    seen_reasoning_ = chat_->reasoning.size();
  }
  if (chat_->content.size() > seen_content_) {
    sse += append_text("message", chat_->content.substr(seen_content_));
    seen_content_ = chat_->content.size();
  }
  for (; seen_calls_ < chat_->calls.size(); ++seen_calls_) {
    sse += close_open("completed");
    Item it;
    it.type = "function_call";
    it.id = new_id("fc_");
    it.call = chat_->calls[seen_calls_];
    items_.push_back(std::move(it));
    open_ = true;
    if (stream_) {
      const int index = int(items_.size()) - 1;
      sse += event("response.output_item.added", {{"output_index", index}, {"item", item_json(items_.back())}});
      sse += event("response.function_call_arguments.delta",
                   {{"item_id", items_.back().id}, {"output_index", index}, {"delta", items_.back().call.arguments}});
    }
    sse += close_open("completed");  // a call comes whole
  }
  return sse;
}

std::string ResponsesReply::on_delta(const JobEvent& e) {
  // reasoning_tokens: the tokens from <think> (or the reply's start, inside the reasoning) to </think>.
  for (const TokenInfo& t : e.tokens) {
    if (t.id == think_open_ && think_open_ >= 0) in_reasoning_ = true;
    if (in_reasoning_) ++reasoning_tokens_;
    if (t.id == think_close_ && think_close_ >= 0) in_reasoning_ = false;
  }
  chat_->on_delta(e);
  return take_new();
}

std::string ResponsesReply::on_done(const std::string& reason, const std::function<std::optional<ApiError>()>& commit) {
  chat_->on_finish(reason);
  std::string sse = take_new();
  if (!chat_->violation.empty()) {
    if (commit) (void)commit();  // (a turn ends all the same; what it says does not replace the error)
    ApiError e;
    e.type = "server_error";
    e.param = "tool_choice";
    e.code = "tool_choice_not_followed";
    e.message = chat_->violation;
    return sse + on_error(e);
  }
  const bool cut = chat_->finish == "length";
  status_ = cut ? "incomplete" : "completed";
  if (items_.empty()) sse += append_text("message", "");  // an empty answer is still a message
  sse += close_open(cut ? "incomplete" : "completed");
  // The response is whole now (its items closed, its status set): what commit stores or records.
  const std::optional<ApiError> not_committed = commit ? commit() : std::nullopt;
  if (!stream_) return "";
  if (not_committed) return sse + on_error(*not_committed);
  return sse + event(cut ? "response.incomplete" : "response.completed", {{"response", object(status_.c_str())}});
}

std::string ResponsesReply::on_error(const ApiError& e) {
  if (!stream_) return "";
  return event("error", {{"code", e.code.empty() ? ojson() : ojson(e.code)},
                         {"message", e.message},
                         {"param", e.param.empty() ? ojson() : ojson(e.param)}});
}

ojson ResponsesReply::response() const { return object(status_.c_str()); }

}  // namespace anvil::server
