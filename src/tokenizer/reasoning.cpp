#include "tokenizer/reasoning.h"

#include <algorithm>

namespace anvil {

bool prompt_opens_reasoning(std::string_view prompt, std::string_view open_tag) {
  const size_t end = prompt.find_last_not_of(" \t\r\n");
  if (end == std::string_view::npos) return false;
  const size_t n = end + 1;
  return n >= open_tag.size() && prompt.substr(n - open_tag.size(), open_tag.size()) == open_tag;
}

bool vocabulary_has_reasoning(const Tokenizer& tok) {
  return tok.token_to_id("<think>").has_value() && tok.token_to_id("</think>").has_value();
}

MarkupPair reasoning_markup(bool starts_in_reasoning) { return {"<think>", "</think>", starts_in_reasoning}; }

ReasoningSplitter::ReasoningSplitter(bool starts_in_reasoning, std::string open_tag, std::string close_tag)
    : open_(std::move(open_tag)),
      close_(std::move(close_tag)),
      in_reasoning_(starts_in_reasoning),
      opened_(starts_in_reasoning) {}

std::vector<ReasoningSplitter::Segment> ReasoningSplitter::push_segments(std::string_view text) {
  std::vector<Segment> segs;
  held_.append(text);
  for (;;) {
    const std::string& tag = in_reasoning_ ? close_ : open_;
    const size_t at = held_.find(tag);
    if (at != std::string::npos) {
      segs.push_back({in_reasoning_, held_.substr(0, at), opened_});
      held_.erase(0, at + tag.size());
      in_reasoning_ = !in_reasoning_;
      opened_ = opened_ || in_reasoning_;
      continue;
    }
    // Hold back the longest suffix that is a proper prefix of the tag we are waiting for.
    size_t keep = 0;
    for (size_t k = std::min(tag.size() - 1, held_.size()); k > 0; --k)
      if (held_.compare(held_.size() - k, k, tag, 0, k) == 0) {
        keep = k;
        break;
      }
    segs.push_back({in_reasoning_, held_.substr(0, held_.size() - keep), opened_});
    held_.erase(0, held_.size() - keep);
    return segs;
  }
}

ReasoningSplitter::Segment ReasoningSplitter::flush_segment() {
  Segment seg{in_reasoning_, std::move(held_), opened_};
  held_.clear();
  return seg;
}

ReasoningSplitter::Out ReasoningSplitter::push(std::string_view text) {
  Out out;
  for (Segment& s : push_segments(text)) (s.reasoning ? out.reasoning : out.content) += s.text;
  return out;
}

ReasoningSplitter::Out ReasoningSplitter::flush() {
  Out out;
  Segment s = flush_segment();
  (s.reasoning ? out.reasoning : out.content) = std::move(s.text);
  return out;
}

ReasoningShaper::ReasoningShaper(bool starts_in_reasoning) : split_(starts_in_reasoning) {}

void ReasoningShaper::shape(ReasoningSplitter::Segment seg, ReasoningSplitter::Out* out) {
  std::string r, c;
  (seg.reasoning ? r : c) = std::move(seg.text);
  if (!r.empty()) {
    if (!reasoning_started_) {
      const size_t first = r.find_first_not_of('\n');
      r.erase(0, first == std::string::npos ? r.size() : first);
      reasoning_started_ = !r.empty();
    }
    if (!r.empty()) {
      std::string all = held_newlines_ + r;
      held_newlines_.clear();
      const size_t last = all.find_last_not_of('\n');
      if (last == std::string::npos) {
        held_newlines_ = all;
      } else {
        held_newlines_ = all.substr(last + 1);
        out->reasoning += all.substr(0, last + 1);
      }
    }
  }
  if (!c.empty()) {
    held_newlines_.clear();  // the reasoning is over
    if (seg.opened && !content_started_) {  // content after a reasoning block, not before one
      const size_t first = c.find_first_not_of('\n');
      c.erase(0, first == std::string::npos ? c.size() : first);
    }
    if (!c.empty()) content_started_ = true;
    out->content += c;
  }
}

ReasoningSplitter::Out ReasoningShaper::push(std::string_view text) {
  ReasoningSplitter::Out out;
  for (ReasoningSplitter::Segment& s : split_.push_segments(text)) shape(std::move(s), &out);
  return out;
}

ReasoningSplitter::Out ReasoningShaper::flush() {
  ReasoningSplitter::Out out;
  shape(split_.flush_segment(), &out);
  return out;
}

}  // namespace anvil
