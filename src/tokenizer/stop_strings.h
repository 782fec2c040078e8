// Stop strings over a stream of text chunks. push() returns the text that is safe to emit now: it
// holds back the longest suffix that could still grow into a stop string. When a stop string
// completes, stopped() becomes true, the text before it is returned, and the stop string and
// everything after it is dropped (later pushes return ""). When several stop strings occur, the
// one that completes first in the stream wins, whatever the chunking.
//
// Markup (the <think> and </think> tags of a model whose reasoning is split off; a tool call's
// <tool_call> and </tool_call> where tool calls are parsed) passes through whole and is never cut:
// a stop string matches only inside the text between the tags, never inside a tag or across one,
// so that no tag fragment ever leaks into the output. A stop string equal to a whole tag matches
// that tag (stop "</think>" ends the reply with its reasoning). A possible start of a tag is held
// back until it resolves.
//
// Only a tag that switches the text between parts is markup, as the reasoning split and the
// tool-call parser read it: a pair's closing tag while inside it, its opening tag while outside.
// The same characters anywhere else (a "</think>" in the content with no reasoning open, a
// "<think>" inside the reasoning, a "<tool_call>" inside a call's body) are text that reaches the
// output as it is, so a stop string matches in them as in any text. Pairs are given in the order
// the text goes through them (the reasoning split first, then tool calls in the content): a pair's
// tags switch only while every pair before it is outside.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

struct MarkupPair {
  std::string open, close;
  bool inside = false;  // the text starts inside (a prompt that opened <think>, a prefilled tool call)
};

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops, std::vector<MarkupPair> markup = {});
  std::string push(std::string_view text);
  std::string flush();  // the held-back text (no stop string completed); "" once stopped
  bool stopped() const { return stopped_; }

 private:
  // The stop string that completes first in held_[0, end): its start, or npos.
  size_t first_match(size_t end) const;
  // The tags that would switch now, with the index of their pair.
  std::vector<std::pair<std::string_view, size_t>> switching_tags() const;
  std::vector<std::string> stops_;  // empty strings removed
  std::vector<MarkupPair> markup_;  // pairs with an empty tag removed; `inside` is the current state
  std::string held_;
  bool stopped_ = false;
};

}  // namespace anvil
