#include "tokenizer/stop_strings.h"

#include <algorithm>

namespace anvil {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // The stop string that completes first in the stream wins (earliest end; on a tie the one that
  // starts earliest), so the result does not depend on how the text was chunked.
  size_t first = std::string::npos, first_end = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = held_.find(s);
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (end < first_end || (end == first_end && at < first)) {
      first = at;
      first_end = end;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix of held_ that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace anvil
