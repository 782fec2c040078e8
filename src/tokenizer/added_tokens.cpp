#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_class.h"

namespace anvil::tok {

namespace {

// The code point that ends just before byte offset `end`.
bool last_cp(std::string_view s, size_t end, uint32_t* cp, size_t* start) {
  if (end == 0) return false;
  size_t i = end - 1;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80) --i;
  if (utf8_decode_one(s, i, cp) == 0) return false;
  *start = i;
  return true;
}

// The Rust regex crate's \w (Alphabetic, M, Nd, Pc, Join_Control): what tokenizers' added tokens
// with single_word take for a word character next to a match. Through the pre-tokenizers' regex
// layer (PCRE2, its tables brought to the Unicode version tokenizers has).
bool is_regex_word_cp(uint32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  static const auto word = tok::compile_regex(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])", false, "\\w");
  if (!word.is_ok()) return is_alnum_cp(c);
  std::string s;
  append_utf8(s, c);
  thread_local std::vector<tok::SplitRange> ranges;
  ranges.clear();
  tok::regex_ranges(**word, s, ranges);
  return !ranges.empty() && ranges[0].is_match;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<std::string> patterns, std::vector<AddedToken> tokens)
    : patterns_(std::move(patterns)), tokens_(std::move(tokens)), by_first_byte_(256) {
  for (size_t i = 0; i < patterns_.size(); ++i)
    if (!patterns_[i].empty()) by_first_byte_[uint8_t(patterns_[i][0])].push_back(int(i));
  for (auto& v : by_first_byte_)
    std::stable_sort(v.begin(), v.end(), [&](int a, int b) { return patterns_[a].size() > patterns_[b].size(); });
}

void AddedTokenMatcher::split(std::string_view text, std::vector<TextSplit>& out) const {
  size_t start_offset = 0;  // end of the last emitted piece
  size_t pos = 0;           // where the next match search starts (the end of the previous match)
  while (pos < text.size()) {
    // Leftmost-longest match at or after pos.
    size_t mb = text.size();
    int which = -1;
    for (size_t i = pos; i < text.size() && which < 0; ++i) {
      for (int k : by_first_byte_[uint8_t(text[i])]) {
        const std::string& p = patterns_[k];
        if (text.size() - i >= p.size() && text.compare(i, p.size(), p) == 0) {
          mb = i;
          which = k;
          break;
        }
      }
    }
    if (which < 0) break;
    const AddedToken& t = tokens_[which];
    size_t start = mb, stop = mb + patterns_[which].size();
    pos = stop;
    if (t.single_word) {
      // tokenizers: the match must not follow or precede a word character (the regex crate's \w),
      // whatever the token's own edges are.
      uint32_t cp;
      size_t s0;
      const bool word_before = last_cp(text, start, &cp, &s0) && is_regex_word_cp(cp);
      bool word_after = false;
      if (stop < text.size() && utf8_decode_one(text, stop, &cp) > 0) word_after = is_regex_word_cp(cp);
      if (word_before || word_after) continue;
    }
    if (t.lstrip) {
      size_t s = start, s0;
      uint32_t cp;
      while (last_cp(text, s, &cp, &s0) && is_whitespace_cp(cp)) s = s0;
      start = std::max(s, start_offset);  // never reach back past the previous piece
    }
    if (t.rstrip) {
      uint32_t cp;
      size_t n;
      while (stop < text.size() && (n = utf8_decode_one(text, stop, &cp)) > 0 && is_whitespace_cp(cp)) stop += n;
      pos = stop;  // the absorbed whitespace cannot start another match
    }
    if (start > start_offset) out.push_back({-1, start_offset, start});
    out.push_back({t.id, start, stop});
    start_offset = stop;
  }
  if (start_offset < text.size()) out.push_back({-1, start_offset, text.size()});
}

}  // namespace anvil::tok
