// The tokenizer.json "pre_tokenizer": splits normalized text into pre-tokens, each of which BPE
// encodes independently. Supported, with tokenizers' semantics: Split (regex or literal pattern,
// any behavior, invert), ByteLevel (add_prefix_space, use_regex = the GPT-2 pattern), Metaspace
// (replacement, prepend_scheme always/first/never, split), Whitespace, WhitespaceSplit,
// Punctuation, Digits, and a Sequence of those. Empty pieces are dropped after every step.
// With ByteLevel, pre-tokens are raw bytes: the byte-level unicode mapping is folded into the vocab
// at load time, so ByteLevel here only contributes its prefix space and optional regex split.
//
// Metaspace's prepend_scheme "first" prepends only to a piece that starts at offset 0 of the
// original input (tokenizers' offsets_original().0 == 0): the caller says whether the text starts
// there (Normalizer::apply reports deleted leading characters), and a piece split off later never
// does. (Approximation: a piece at offset 0 of the text passed here is taken to start where the text
// starts, which differs from tokenizers only when a normalizer deleted leading characters that it had
// itself inserted, e.g. Prepend(" ") followed by Strip.)
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace anvil::tok {

class Regex;  // PCRE2 (UTF + UCP, JIT) pattern; defined in pretokenizer.cpp

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A piece of a split text: [begin, end) in bytes, and whether a pattern matched it.
struct SplitRange {
  size_t begin, end;
  bool is_match;
};

class PreTokenizer {
 public:
  static Result<PreTokenizer> from_json(const nlohmann::json& j, const std::string& path = "pre_tokenizer");
  // Appends the pre-tokens of `text` (valid UTF-8) to `out`; `at_origin`: text starts at offset 0
  // of the input given to encode().
  void split(std::string_view text, std::vector<std::string>& out, bool at_origin = true) const;
  bool empty() const { return steps_.empty(); }
  bool has_byte_level() const;  // a ByteLevel step: the model works on bytes

 private:
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    enum Kind { kSplit, kByteLevel, kMetaspace, kWhitespaceSplit, kPunctuation, kDigits } kind = kSplit;
    // Split pattern, the GPT-2 pattern for ByteLevel use_regex, or Whitespace's word pattern.
    std::shared_ptr<const Regex> regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;   // ByteLevel
    std::string replacement;         // Metaspace: the UTF-8 of its replacement character
    Prepend prepend = Prepend::kAlways;
    bool metaspace_split = true;
  };
  // Splits one piece by step `s` into `out`; returns whether the first piece appended starts at
  // offset 0 of `piece` (false when nothing was appended).
  static bool apply_step(const Step& s, std::string_view piece, bool piece_at_origin, std::vector<SplitRange>& ranges,
                         std::vector<std::string>& out);
  static Status parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

// Compiles an Oniguruma pattern (rewritten for PCRE2 by onig_to_pcre2) or a literal with PCRE2,
// UTF and UCP; exposed for tests of the regex layer.
Result<std::shared_ptr<const Regex>> compile_regex(const std::string& pattern, bool literal, const std::string& what);
// Splits `text` by the regex: ranges covering the text in order (empty matches split nothing).
void regex_ranges(const Regex& re, std::string_view text, std::vector<SplitRange>& out);

}  // namespace anvil::tok
