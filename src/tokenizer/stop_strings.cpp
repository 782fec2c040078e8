#include "tokenizer/stop_strings.h"

#include <algorithm>

namespace anvil {

namespace {

// Length of the longest suffix of s[0, end) that is a proper prefix of one of `strs`.
size_t longest_partial(const std::string& s, size_t end, const std::vector<std::string>& strs) {
  size_t keep = 0;
  for (const auto& t : strs) {
    const size_t max_k = std::min(t.size() - 1, end);
    for (size_t k = max_k; k > keep; --k)
      if (s.compare(end - k, k, t, 0, k) == 0) {
        keep = k;
        break;
      }
  }
  return keep;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops, std::vector<std::string> atomic) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
  for (auto& a : atomic)
    if (!a.empty()) atomic_.push_back(std::move(a));
}

size_t StopMatcher::first_match(size_t end) const {
  // The stop string that completes first (earliest end; on a tie the one that starts earliest),
  // so the result does not depend on how the text was chunked.
  const std::string_view seg(held_.data(), end);
  size_t first = std::string::npos, first_end = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = seg.find(s);
    if (at == std::string::npos) continue;
    const size_t e = at + s.size();
    if (e < first_end || (e == first_end && at < first)) {
      first = at;
      first_end = e;
    }
  }
  return first;
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  std::string out;
  for (;;) {
    // The first whole tag ends the text a stop string may match in; a possible start of one at
    // the end is not text yet.
    size_t tag_at = std::string::npos, tag_len = 0;
    for (const auto& a : atomic_) {
      const size_t at = held_.find(a);
      if (at != std::string::npos && (at < tag_at || (at == tag_at && a.size() > tag_len))) {
        tag_at = at;
        tag_len = a.size();
      }
    }
    const size_t seg_end = tag_at != std::string::npos ? tag_at : held_.size() - longest_partial(held_, held_.size(), atomic_);
    if (const size_t at = first_match(seg_end); at != std::string::npos) {
      stopped_ = true;
      out.append(held_, 0, at);
      held_.clear();
      return out;
    }
    if (tag_at == std::string::npos) {
      // Hold back the longest suffix of the text that is a proper prefix of some stop string
      // (and the possible tag start after it).
      const size_t emit = seg_end - longest_partial(held_, seg_end, stops_);
      out.append(held_, 0, emit);
      held_.erase(0, emit);
      return out;
    }
    // The text before the tag is final: no stop string can continue across the tag.
    const std::string_view tag(held_.data() + tag_at, tag_len);
    if (std::find(stops_.begin(), stops_.end(), tag) != stops_.end()) {
      stopped_ = true;
      out.append(held_, 0, tag_at);
      held_.clear();
      return out;
    }
    out.append(held_, 0, tag_at + tag_len);
    held_.erase(0, tag_at + tag_len);
  }
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  // What was held back is text now (a tag start that never completed included).
  std::string out;
  if (const size_t at = first_match(held_.size()); at != std::string::npos) {
    stopped_ = true;
    out = held_.substr(0, at);
    held_.clear();
    return out;
  }
  out.swap(held_);
  return out;
}

}  // namespace anvil
