// Stop strings over a stream of text chunks. push() returns the text that is safe to emit now: it
// holds back the longest suffix that could still grow into a stop string. When a stop string
// completes, stopped() becomes true, the text before it is returned, and the stop string and
// everything after it is dropped (later pushes return ""). When several stop strings occur, the
// one that completes first in the stream wins, whatever the chunking.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  std::string push(std::string_view text);
  std::string flush();  // the held-back text (no stop string completed); "" once stopped
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;  // empty strings removed
  std::string held_;
  bool stopped_ = false;
};

}  // namespace anvil
