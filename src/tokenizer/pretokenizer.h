// The tokenizer.json "pre_tokenizer": splits normalized text into pre-tokens, each of which BPE
// encodes independently. Supported: Split (regex or literal pattern, any behavior, invert),
// ByteLevel (add_prefix_space, use_regex = the GPT-2 pattern) and Sequence of those.
// Pre-tokens are raw bytes: the byte-level unicode mapping is folded into the vocab at load time,
// so ByteLevel here only contributes its prefix space and optional regex split.
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

class PreTokenizer {
 public:
  static Result<PreTokenizer> from_json(const nlohmann::json& j, const std::string& path = "pre_tokenizer");
  // Appends the pre-tokens of `text` (valid UTF-8) to `out`.
  void split(std::string_view text, std::vector<std::string>& out) const;
  bool empty() const { return steps_.empty(); }

 private:
  struct Step {
    enum Kind { kSplit, kByteLevel } kind;
    std::shared_ptr<const Regex> regex;  // Split pattern, or the GPT-2 pattern for ByteLevel use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
  };
  static Status parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

// Compiles a PCRE2 pattern with UTF and UCP; exposed for tests of the regex layer.
Result<std::shared_ptr<const Regex>> compile_regex(const std::string& pattern, bool literal, const std::string& what);
// Splits `text` by the regex: (start, end, is_match) ranges covering the text in order.
struct SplitRange {
  size_t begin, end;
  bool is_match;
};
void regex_ranges(const Regex& re, std::string_view text, std::vector<SplitRange>& out);

}  // namespace anvil::tok
