#include "server/chat_output.h"

#include <nlohmann/json.hpp>
#include <random>

namespace anvil::server {

namespace {

const std::string kOpen = "<tool_call>", kClose = "</tool_call>";

// Length of the longest suffix of s that is a proper prefix of tag.
size_t partial_suffix(const std::string& s, const std::string& tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.compare(s.size() - n, n, tag, 0, n) == 0) return n;
  return 0;
}

std::string call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* kAlnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[rng() % 62];
  return id;
}

bool parse_call(const std::string& body, ToolCall* out) {
  auto j = nlohmann::ordered_json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  out->id = call_id();
  out->name = j["name"].get<std::string>();
  auto it = j.find("arguments");
  if (it == j.end() || it->is_null()) out->arguments = "{}";
  else if (it->is_string()) out->arguments = it->get<std::string>();
  else out->arguments = it->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return true;
}

bool all_space(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

}  // namespace

ToolCallParser::Out ToolCallParser::push(std::string_view text) {
  Out o;
  buf_ += text;
  for (;;) {
    if (!in_block_) {
      size_t at = buf_.find(kOpen);
      size_t emit = at != std::string::npos ? at : buf_.size() - partial_suffix(buf_, kOpen);
      std::string piece = buf_.substr(0, emit);
      buf_.erase(0, emit);
      if (after_call_ && all_space(piece)) {
        ws_held_ += piece;  // between or after calls: dropped unless real content follows
      } else if (!piece.empty()) {
        // Content: whitespace after it is content too, however the text was chunked.
        o.content += ws_held_ + piece;
        ws_held_.clear();
        after_call_ = false;
      }
      if (at == std::string::npos) break;
      in_block_ = true;
    }
    size_t end = buf_.find(kClose);
    if (end == std::string::npos) break;
    std::string block = buf_.substr(0, end + kClose.size());
    buf_.erase(0, end + kClose.size());
    in_block_ = false;
    ToolCall c;
    if (parse_call(block.substr(kOpen.size(), end - kOpen.size()), &c)) {
      if (max_calls_ <= 0 || n_calls_ < max_calls_) o.calls.push_back(std::move(c));
      ++n_calls_;
      ws_held_.clear();
      after_call_ = true;
    } else {
      o.content += ws_held_ + block;
      ws_held_.clear();
      after_call_ = false;
    }
  }
  return o;
}

ToolCallParser::Out ToolCallParser::flush() {
  Out o;
  if (!(after_call_ && all_space(buf_))) o.content = ws_held_ + buf_;
  buf_.clear();
  ws_held_.clear();
  in_block_ = false;
  after_call_ = false;
  return o;
}

ChatOutput::ChatOutput(bool split_reasoning, bool starts_in_reasoning, bool parse_tool_calls, int max_tool_calls) {
  if (split_reasoning) split_ = std::make_unique<ReasoningShaper>(starts_in_reasoning);
  if (parse_tool_calls) tools_ = std::make_unique<ToolCallParser>(max_tool_calls);
}

void ChatOutput::shape(std::string r, std::string c, bool final, Delta* d) {
  d->reasoning += r;
  if (tools_) {
    ToolCallParser::Out o = tools_->push(c);
    if (final) {
      ToolCallParser::Out f = tools_->flush();
      o.content += f.content;
    }
    d->content += o.content;
    for (auto& call : o.calls) d->tool_calls.push_back(std::move(call));
  } else {
    d->content += c;
  }
}

ChatOutput::Delta ChatOutput::push(std::string_view text) {
  Delta d;
  if (split_) {
    auto o = split_->push(text);
    shape(std::move(o.reasoning), std::move(o.content), false, &d);
  } else {
    shape("", std::string(text), false, &d);
  }
  return d;
}

ChatOutput::Delta ChatOutput::flush() {
  Delta d;
  if (split_) {
    auto o = split_->flush();
    shape(std::move(o.reasoning), std::move(o.content), true, &d);
  } else {
    shape("", "", true, &d);
  }
  return d;
}

}  // namespace anvil::server
