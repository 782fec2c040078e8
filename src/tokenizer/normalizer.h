// The tokenizer.json "normalizer": null, or one of NFC, NFD, NFKC, NFKD, Lowercase, Strip,
// Replace (a string or a regex), Prepend, or a Sequence of those (applied in order), each with
// tokenizers' semantics. Anything else is refused at load, naming the type.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace anvil::tok {

class Regex;

class Normalizer {
 public:
  // `j` is the "normalizer" field (may be null). Errors name the field path.
  static Result<Normalizer> from_json(const nlohmann::json& j, const std::string& path = "normalizer");
  bool is_identity() const { return steps_.empty(); }
  // `text` is valid UTF-8 (the tokenizer repairs its input first); invalid UTF-8 is passed through
  // the Unicode normalization forms unchanged.
  //
  // *keeps_start (when given) says whether the result's first character still stands at offset 0
  // of `text`, as tokenizers' alignments would say: false once leading characters were deleted
  // (Strip, or a Replace with empty content matching at the start), which Metaspace's
  // prepend_scheme "first" depends on.
  std::string apply(std::string_view text, bool* keeps_start = nullptr) const;

 private:
  struct Step {
    enum Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kStrip, kReplace, kPrepend } kind = kNfc;
    bool left = false, right = false;    // kStrip
    std::shared_ptr<const Regex> regex;  // kReplace
    std::string content;                 // kReplace, kPrepend
  };
  static Status parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps);
  // Returns false when the step deleted the characters at the start of `in`.
  static bool apply_step(const Step& s, std::string_view in, std::string& out);
  std::vector<Step> steps_;
};

}  // namespace anvil::tok
