// Splits a generated text stream into reasoning (between <think> and </think>) and content.
// Tags may arrive split across pushes: a suffix that could be the start of the next tag is held
// back until it resolves. Tags themselves are not emitted. `starts_in_reasoning` is for chat
// templates that already opened <think> in the prompt (the output then starts with reasoning).
// The newlines right after </think> are kept in content, as generated; ReasoningShaper below
// trims them (and the reasoning's own opening and closing newlines) as Qwen3's template does.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/stop_strings.h"
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

// The reasoning tags, <think> and </think>: markup to the stop-string matcher wherever reasoning is
// split off (stop_strings.h), starting inside when the prompt opened the reasoning.
MarkupPair reasoning_markup(bool starts_in_reasoning);

class ReasoningSplitter {
 public:
  struct Out {
    std::string reasoning, content;
  };
  // A piece of the text on one side, in order: push() gives one per side the text passes through
  // (a tag that switches sides ends a segment; a segment may be empty).
  struct Segment {
    bool reasoning = false;
    std::string text;
    bool opened = false;  // a reasoning block had been opened when this text came (opened())
  };
  explicit ReasoningSplitter(bool starts_in_reasoning = false, std::string open_tag = "<think>",
                             std::string close_tag = "</think>");
  Out push(std::string_view text);  // the segments' text joined by side
  Out flush();  // emits any held-back partial tag as text of the current side
  std::vector<Segment> push_segments(std::string_view text);
  Segment flush_segment();
  bool in_reasoning() const { return in_reasoning_; }
  // A reasoning block was opened: the stream started in one, or a <think> came.
  bool opened() const { return opened_; }

 private:
  std::string open_, close_;
  bool in_reasoning_, opened_;
  std::string held_;
};

// ReasoningSplitter plus the newline trimming that makes a reply what the chat template writes back
// for an earlier turn (Qwen3 renders reasoning_content.strip('\n') and content.lstrip('\n') after
// </think>): newlines that open or close the reasoning, and those that start the content after a
// reasoning block, are template formatting and are dropped. The CLI (anvil run/generate) and the
// server (reasoning_content/content) shape a reply with this one class, so the same tokens give
// the same text, also in a session's stored messages.
class ReasoningShaper {
 public:
  explicit ReasoningShaper(bool starts_in_reasoning = false);
  ReasoningSplitter::Out push(std::string_view text);
  ReasoningSplitter::Out flush();
  bool in_reasoning() const { return split_.in_reasoning(); }

 private:
  // One segment at a time: whether content follows a reasoning block is a property of the
  // segment, not of the push it came in (else the result would depend on how the text is chunked).
  void shape(ReasoningSplitter::Segment seg, ReasoningSplitter::Out* out);
  ReasoningSplitter split_;
  bool reasoning_started_ = false, content_started_ = false;
  std::string held_newlines_;  // trailing newlines of the reasoning so far
};

}  // namespace anvil
