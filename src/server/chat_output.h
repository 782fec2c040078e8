// Shapes a chat reply's text stream into OpenAI message fields, incrementally:
//   text -> ReasoningShaper (<think>..</think> -> reasoning_content; the newlines around the
//           reasoning are template formatting and are trimmed, as the CLI does: reasoning.h)
//        -> ToolCallParser (Qwen/Hermes "<tool_call>\n{json}\n</tool_call>" blocks -> tool_calls)
// The same code serves streaming (each push() is one SSE delta) and non-streaming replies (the
// concatenation of every delta), so both give the same message.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/reasoning.h"

namespace anvil::server {

struct ToolCall {
  std::string id, name, arguments;  // arguments: a JSON text, as OpenAI sends it
};

// Finds "<tool_call>{...}</tool_call>" blocks in a text stream. A block whose body is not a JSON
// object with a string "name" stays in the content as text, as generated. With max_calls > 0, the
// valid calls after the first max_calls are dropped (parallel_tool_calls: false keeps the first, as
// vLLM does); their blocks are not content either.
class ToolCallParser {
 public:
  explicit ToolCallParser(int max_calls = 0) : max_calls_(max_calls) {}
  struct Out {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Out push(std::string_view text);
  Out flush();  // an unfinished block is content
  int calls_so_far() const { return n_calls_; }

 private:
  std::string buf_;  // text held back: a possible start of "<tool_call>", or an open block
  bool in_block_ = false;
  int n_calls_ = 0;  // valid calls parsed, dropped ones included
  int max_calls_ = 0;  // 0: no limit
  std::string ws_held_;  // whitespace after a call, emitted only if content follows
  bool after_call_ = false;  // since the last call, only whitespace (held in ws_held_) came
};

class ChatOutput {
 public:
  struct Delta {
    std::string reasoning, content;
    std::vector<ToolCall> tool_calls;
    bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  };
  // max_tool_calls: see ToolCallParser (0: every call).
  ChatOutput(bool split_reasoning, bool starts_in_reasoning, bool parse_tool_calls, int max_tool_calls = 0);
  Delta push(std::string_view text);
  Delta flush();

 private:
  void shape(std::string reasoning, std::string content, bool final, Delta* d);
  std::unique_ptr<ReasoningShaper> split_;
  std::unique_ptr<ToolCallParser> tools_;
};

}  // namespace anvil::server
