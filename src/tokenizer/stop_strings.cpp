#include "tokenizer/stop_strings.h"

#include <algorithm>

namespace anvil {

namespace {

// Length of the longest suffix of s[0, end) that is a proper prefix of one of `strs`.
template <class Strings>
size_t longest_partial(const std::string& s, size_t end, const Strings& strs) {
  size_t keep = 0;
  for (std::string_view t : strs) {
    const size_t max_k = std::min(t.size() - 1, end);
    for (size_t k = max_k; k > keep; --k)
      if (std::string_view(s).substr(end - k, k) == t.substr(0, k)) {
        keep = k;
        break;
      }
  }
  return keep;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops, std::vector<MarkupPair> markup) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
  for (auto& m : markup)
    if (!m.open.empty() && !m.close.empty()) markup_.push_back(std::move(m));
}

std::vector<std::pair<std::string_view, size_t>> StopMatcher::switching_tags() const {
  std::vector<std::pair<std::string_view, size_t>> tags;
  for (size_t k = 0; k < markup_.size(); ++k) {
    tags.emplace_back(markup_[k].inside ? markup_[k].close : markup_[k].open, k);
    if (markup_[k].inside) break;  // the pairs after it see none of this text
  }
  return tags;
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
    // The first tag that switches ends the text a stop string may match in; a possible start of
    // one at the end is not text yet.
    const auto tags = switching_tags();
    size_t tag_at = std::string::npos, tag_len = 0, pair = 0;
    for (const auto& [t, k] : tags) {
      const size_t at = held_.find(t);
      if (at != std::string::npos && (at < tag_at || (at == tag_at && t.size() > tag_len))) {
        tag_at = at;
        tag_len = t.size();
        pair = k;
      }
    }
    std::vector<std::string_view> tag_strings;
    for (const auto& tk : tags) tag_strings.push_back(tk.first);
    const size_t seg_end = tag_at != std::string::npos ? tag_at : held_.size() - longest_partial(held_, held_.size(), tag_strings);
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
    markup_[pair].inside = !markup_[pair].inside;
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
