// Stop strings over a stream of text chunks. push() returns the text that is safe to emit now: it
// holds back the longest suffix that could still grow into a stop string. When a stop string
// completes, stopped() becomes true, the text before it is returned, and the stop string and
// everything after it is dropped (later pushes return ""). When several stop strings occur, the
// one that completes first in the stream wins, whatever the chunking.
//
// Atomic markup (the <think> and </think> tags of a model whose reasoning is split off) passes
// through whole and is never cut: a stop string matches only inside the text between the tags,
// never inside a tag or across one, so that no tag fragment ever leaks into the output. A stop
// string equal to a whole tag matches that tag (stop "</think>" ends the reply with its
// reasoning). A possible start of a tag is held back until it resolves.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops, std::vector<std::string> atomic = {});
  std::string push(std::string_view text);
  std::string flush();  // the held-back text (no stop string completed); "" once stopped
  bool stopped() const { return stopped_; }

 private:
  // The stop string that completes first in held_[0, end): its start, or npos.
  size_t first_match(size_t end) const;
  std::vector<std::string> stops_;   // empty strings removed
  std::vector<std::string> atomic_;  // empty strings removed
  std::string held_;
  bool stopped_ = false;
};

}  // namespace anvil
