#include "tokenizer/pretokenizer.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/onig_pattern.h"
#include "tokenizer/unicode_class.h"

namespace anvil::tok {

// The GPT-2 pattern that ByteLevel(use_regex=true) splits with.
static const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Whitespace pre-tokenizer's pattern, \w+|[^\w\s]+ in Rust's regex crate, where \w is
// Alphabetic, M, Nd, Pc and Join_Control and \s is White_Space (PCRE2's \w and \s differ). L and Nl
// are in Alphabetic, and are named so that onig_to_pcre2 adds what Unicode 16.0 (the regex
// crate's tables in tokenizers 0.23.3) put in them since PCRE2's Unicode 14.0.
static const char* kWhitespacePattern =
    R"([\p{Alphabetic}\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|)"
    R"([^\p{Alphabetic}\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)";

class Regex {
 public:
  explicit Regex(pcre2_code* code) : code_(code) { jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0; }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Finds the first match at or after `start`; returns false when there is none.
  bool find(std::string_view text, size_t start, size_t* mb, size_t* me) const {
    // One match-data block per thread: matching is the hot path, and Tokenizer::encode is const
    // and may run concurrently.
    thread_local struct Md {
      pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
      ~Md() { pcre2_match_data_free(md); }
    } tl;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, tl.md, nullptr)
                        : pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, tl.md, nullptr);
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(tl.md);
    *mb = ov[0];
    *me = ov[1];
    return true;
  }

 private:
  pcre2_code* code_;
  bool jit_ = false;
};

Result<std::shared_ptr<const Regex>> compile_regex(const std::string& raw_pattern, bool literal, const std::string& what) {
  const std::string pattern = literal ? raw_pattern : onig_to_pcre2(raw_pattern);
  int err = 0;
  PCRE2_SIZE erroff = 0;
  // UCP only changes how \d, \w, \s and POSIX classes behave, which a literal has none of (and
  // PCRE2 refuses UCP together with LITERAL).
  const uint32_t opts = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), opts, &err, &erroff, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument(what + ": cannot compile regex at offset " + std::to_string(erroff) + ": " +
                            reinterpret_cast<const char*>(buf));
  }
  return std::shared_ptr<const Regex>(std::make_shared<Regex>(code));
}

void regex_ranges(const Regex& re, std::string_view text, std::vector<SplitRange>& out) {
  size_t prev = 0, pos = 0, mb, me;
  while (pos <= text.size() && re.find(text, pos, &mb, &me)) {
    if (me == mb) {  // empty matches split nothing; step over one UTF-8 scalar
      pos = mb + 1;
      while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (mb > prev) out.push_back({prev, mb, false});
    out.push_back({mb, me, true});
    prev = pos = me;
  }
  if (prev < text.size()) out.push_back({prev, text.size(), false});
}

namespace {

// Applies a split behavior to ranges (already inverted if asked) and appends the pieces.
void emit_split(std::string_view text, const std::vector<SplitRange>& r, SplitBehavior b, std::vector<std::string>& out) {
  switch (b) {
    case SplitBehavior::kIsolated:
      for (const auto& x : r) out.emplace_back(text.substr(x.begin, x.end - x.begin));
      return;
    case SplitBehavior::kRemoved:
      for (const auto& x : r)
        if (!x.is_match) out.emplace_back(text.substr(x.begin, x.end - x.begin));
      return;
    case SplitBehavior::kMergedWithPrevious: {  // a match joins the piece before it
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (const auto& x : r) {
        if (x.is_match && !prev_match && !acc.empty()) acc.back().second = x.end;
        else acc.push_back({x.begin, x.end});
        prev_match = x.is_match;
      }
      for (auto [a, e] : acc) out.emplace_back(text.substr(a, e - a));
      return;
    }
    case SplitBehavior::kMergedWithNext: {  // a match joins the piece after it
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (size_t i = r.size(); i-- > 0;) {
        const auto& x = r[i];
        if (x.is_match && !prev_match && !acc.empty()) acc.back().first = x.begin;
        else acc.push_back({x.begin, x.end});
        prev_match = x.is_match;
      }
      for (size_t i = acc.size(); i-- > 0;) out.emplace_back(text.substr(acc[i].first, acc[i].second - acc[i].first));
      return;
    }
    case SplitBehavior::kContiguous: {  // consecutive pieces of one kind form one piece (two
      // non-matches are adjacent only when inverted)
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (const auto& x : r) {
        if (x.is_match == prev_match && !acc.empty()) acc.back().second = x.end;
        else acc.push_back({x.begin, x.end});
        prev_match = x.is_match;
      }
      for (auto [a, e] : acc) out.emplace_back(text.substr(a, e - a));
      return;
    }
  }
}

bool get_bool(const nlohmann::json& j, const char* key, bool dflt) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : dflt;
}

// tokenizers' char-predicate pattern: every scalar for which pred holds is its own match.
template <class Pred>
void predicate_ranges(std::string_view text, Pred pred, std::vector<SplitRange>& out) {
  size_t prev = 0;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0xFFFD;
    size_t n = utf8_decode_one(text, i, &cp);
    if (n == 0) n = 1;
    if (pred(cp)) {
      if (prev < i) out.push_back({prev, i, false});
      out.push_back({i, i + n, true});
      prev = i + n;
    }
    i += n;
  }
  if (prev < text.size()) out.push_back({prev, text.size(), false});
}

Result<SplitBehavior> parse_behavior(const nlohmann::json& j, const std::string& path, bool required) {
  if (!j.contains("behavior") && !required) return SplitBehavior::kIsolated;
  const std::string b = j.contains("behavior") && j["behavior"].is_string() ? j["behavior"].get<std::string>() : "";
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return invalid_argument(path + ".behavior: \"" + b +
                          "\" is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
}

}  // namespace

Status PreTokenizer::parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps) {
  if (j.is_null()) return Status::ok();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument(path + ": expected an object with a string \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      return invalid_argument(path + ".pretokenizers: expected an array");
    for (size_t i = 0; i < j["pretokenizers"].size(); ++i)
      ANVIL_RETURN_IF_ERROR(parse_into(j["pretokenizers"][i], path + ".pretokenizers[" + std::to_string(i) + "]", steps));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    Step s;
    s.kind = Step::kByteLevel;
    s.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) {
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(kGpt2Pattern, false, path + " (GPT-2 pattern)"));
    }
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Split") {
    Step s;
    s.kind = Step::kSplit;
    if (!j.contains("pattern") || !j["pattern"].is_object())
      return invalid_argument(path + ".pattern: expected {\"Regex\": ...} or {\"String\": ...}");
    const auto& p = j["pattern"];
    if (p.contains("Regex") && p["Regex"].is_string()) {
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(p["Regex"].get<std::string>(), false, path + ".pattern.Regex"));
    } else if (p.contains("String") && p["String"].is_string()) {
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(p["String"].get<std::string>(), true, path + ".pattern.String"));
    } else {
      return invalid_argument(path + ".pattern: expected {\"Regex\": string} or {\"String\": string}");
    }
    ANVIL_ASSIGN_OR_RETURN(s.behavior, parse_behavior(j, path, true));
    s.invert = get_bool(j, "invert", false);
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Metaspace") {
    Step s;
    s.kind = Step::kMetaspace;
    if (!j.contains("replacement") || !j["replacement"].is_string())
      return invalid_argument(path + ".replacement: expected a one-character string");
    s.replacement = j["replacement"].get<std::string>();
    uint32_t cp;
    if (s.replacement.empty() || utf8_decode_one(s.replacement, 0, &cp) != s.replacement.size())
      return invalid_argument(path + ".replacement: expected exactly one character, got \"" + s.replacement + "\"");
    // tokenizers: prepend_scheme defaults to "always"; a legacy add_prefix_space=false means "never".
    const std::string scheme = j.contains("prepend_scheme") && j["prepend_scheme"].is_string()
                                   ? j["prepend_scheme"].get<std::string>() : "always";
    if (scheme == "always") s.prepend = Prepend::kAlways;
    else if (scheme == "first") s.prepend = Prepend::kFirst;
    else if (scheme == "never") s.prepend = Prepend::kNever;
    else return invalid_argument(path + ".prepend_scheme: \"" + scheme + "\" is not one of always, first, never");
    if (!get_bool(j, "add_prefix_space", true)) {
      if (s.prepend != Prepend::kNever && j.contains("prepend_scheme"))
        return invalid_argument(path + ".add_prefix_space: false does not match prepend_scheme \"" + scheme + "\"");
      s.prepend = Prepend::kNever;
    }
    s.metaspace_split = get_bool(j, "split", true);
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Whitespace") {  // the word pattern's non-matches are removed
    Step s;
    s.kind = Step::kSplit;
    ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(kWhitespacePattern, false, path + " (Whitespace pattern)"));
    s.behavior = SplitBehavior::kRemoved;
    s.invert = true;
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "WhitespaceSplit") {
    Step s;
    s.kind = Step::kWhitespaceSplit;
    s.behavior = SplitBehavior::kRemoved;
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Punctuation") {
    Step s;
    s.kind = Step::kPunctuation;
    ANVIL_ASSIGN_OR_RETURN(s.behavior, parse_behavior(j, path, false));
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Digits") {
    Step s;
    s.kind = Step::kDigits;
    s.behavior = get_bool(j, "individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
    steps.push_back(std::move(s));
    return Status::ok();
  }
  return unsupported(path + ".type: pre-tokenizer \"" + type +
                     "\" is not supported (expected Split, ByteLevel, Metaspace, Whitespace, WhitespaceSplit, "
                     "Punctuation, Digits or Sequence)");
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j, const std::string& path) {
  PreTokenizer p;
  ANVIL_RETURN_IF_ERROR(parse_into(j, path, p.steps_));
  return p;
}

bool PreTokenizer::has_byte_level() const {
  for (const Step& s : steps_)
    if (s.kind == Step::kByteLevel) return true;
  return false;
}

bool PreTokenizer::apply_step(const Step& s, std::string_view piece, bool piece_at_origin, std::vector<SplitRange>& ranges,
                              std::vector<std::string>& out) {
  std::string rewritten;
  if (s.kind == Step::kByteLevel && s.add_prefix_space && piece[0] != ' ') {
    rewritten = " ";
    rewritten.append(piece);
    piece = rewritten;
  } else if (s.kind == Step::kMetaspace) {
    // Every ' ' becomes the replacement; then the replacement is prepended per the scheme.
    const bool starts_with_rep = piece.substr(0, s.replacement.size()) == s.replacement || piece[0] == ' ';
    if (!starts_with_rep && (s.prepend == Prepend::kAlways || (s.prepend == Prepend::kFirst && piece_at_origin)))
      rewritten = s.replacement;
    for (char c : piece) {
      if (c == ' ') rewritten += s.replacement;
      else rewritten.push_back(c);
    }
    piece = rewritten;
    if (!s.metaspace_split) {
      out.emplace_back(piece);
      return true;
    }
  }
  ranges.clear();
  switch (s.kind) {
    case Step::kSplit:
    case Step::kByteLevel:
      if (!s.regex) {
        out.emplace_back(piece);
        return true;
      }
      regex_ranges(*s.regex, piece, ranges);
      break;
    case Step::kMetaspace: {
      uint32_t rep;
      utf8_decode_one(s.replacement, 0, &rep);
      predicate_ranges(piece, [rep](uint32_t c) { return c == rep; }, ranges);
      break;
    }
    case Step::kWhitespaceSplit: predicate_ranges(piece, is_whitespace_cp, ranges); break;
    case Step::kPunctuation: predicate_ranges(piece, is_punctuation_cp, ranges); break;
    case Step::kDigits: predicate_ranges(piece, is_numeric_cp, ranges); break;
  }
  if (s.invert)
    for (auto& r : ranges) r.is_match = !r.is_match;
  const SplitBehavior b = s.kind == Step::kByteLevel ? SplitBehavior::kIsolated
                          : s.kind == Step::kMetaspace ? SplitBehavior::kMergedWithNext
                                                       : s.behavior;
  const size_t before = out.size();
  emit_split(piece, ranges, b, out);
  if (out.size() == before) return false;
  // Every behavior but Removed covers the piece from offset 0.
  return b != SplitBehavior::kRemoved || !ranges[0].is_match;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& out, bool at_origin) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.emplace_back(text);
    return;
  }
  std::vector<std::string> cur, next;
  std::vector<SplitRange> ranges;
  bool first_at_origin = at_origin;  // cur[0] starts at offset 0 of the original input
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& s = steps_[k];
    next.clear();
    bool next_first_at_origin = false;
    if (k == 0) {
      next_first_at_origin = apply_step(s, text, first_at_origin, ranges, next) && first_at_origin;
    } else {
      for (size_t i = 0; i < cur.size(); ++i) {
        const size_t before = next.size();
        const bool starts0 = apply_step(s, cur[i], i == 0 && first_at_origin, ranges, next);
        if (before == 0 && next.size() > 0) next_first_at_origin = i == 0 && first_at_origin && starts0;
      }
    }
    // tokenizers drops empty pieces after every step.
    next.erase(std::remove_if(next.begin(), next.end(), [](const std::string& p) { return p.empty(); }), next.end());
    first_at_origin = next_first_at_origin;
    std::swap(cur, next);
  }
  for (auto& p : cur) out.push_back(std::move(p));
}

}  // namespace anvil::tok
