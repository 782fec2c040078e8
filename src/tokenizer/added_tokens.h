// Added tokens (tokenizer.json "added_tokens"): matched in the text before pre-tokenization, like
// tokenizers' AddedVocabulary. Tokens with normalized=false are matched in the raw text; those with
// normalized=true are matched in the normalized remainder. Matching is leftmost-longest and
// non-overlapping; lstrip/rstrip absorb adjacent whitespace; single_word requires non-word
// characters (or the text edge) on both sides.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A piece of the text: either an added token (id >= 0) or text still to tokenize (id == -1).
struct TextSplit {
  int32_t id;
  size_t begin, end;
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text to look for (the normalized content for normalized tokens);
  // `tokens[i]` supplies id and flags.
  AddedTokenMatcher(std::vector<std::string> patterns, std::vector<AddedToken> tokens);
  AddedTokenMatcher() = default;
  bool empty() const { return patterns_.empty(); }
  // Splits `text` into added-token and plain pieces, in order.
  void split(std::string_view text, std::vector<TextSplit>& out) const;

 private:
  std::vector<std::string> patterns_;
  std::vector<AddedToken> tokens_;
  std::vector<std::vector<int>> by_first_byte_;  // [256] -> pattern indices, longest first
};

}  // namespace anvil::tok
