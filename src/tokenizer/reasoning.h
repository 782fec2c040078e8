// Splits a generated text stream into reasoning (between <think> and </think>) and content.
// Tags may arrive split across pushes: a suffix that could be the start of the next tag is held
// back until it resolves. Tags themselves are not emitted. `starts_in_reasoning` is for chat
// templates that already opened <think> in the prompt (the output then starts with reasoning).
// One newline right after </think> is kept in content, as generated; callers that want the
// Qwen3-style trimmed content strip it themselves.
#pragma once
#include <string>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace anvil {

// True when a rendered chat prompt opens a <think> block for the model: it ends with the tag
// (then only whitespace). DeepSeek-R1-distill and QwQ end the generation prompt with "<think>\n",
// so the answer starts inside the reasoning. A closed block (Qwen3's enable_thinking=false
// renders "<think>\n\n</think>\n\n") does not count, nor does the tag earlier in the prompt (a
// user asking about "<think>").
bool prompt_opens_reasoning(std::string_view prompt, std::string_view open_tag = "<think>");

// Whether a model can write reasoning at all: its vocabulary has both tags. Reasoning is told apart
// from the answer only then (the CLI and the server alike).
bool vocabulary_has_reasoning(const Tokenizer& tok);

class ReasoningSplitter {
 public:
  struct Out {
    std::string reasoning, content;
  };
  explicit ReasoningSplitter(bool starts_in_reasoning = false, std::string open_tag = "<think>",
                             std::string close_tag = "</think>");
  Out push(std::string_view text);
  Out flush();  // emits any held-back partial tag as text of the current side
  bool in_reasoning() const { return in_reasoning_; }

 private:
  std::string open_, close_;
  bool in_reasoning_;
  std::string held_;
};

}  // namespace anvil
