#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace anvil::tok {

// The GPT-2 pattern that ByteLevel(use_regex=true) splits with.
static const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

Result<std::shared_ptr<const Regex>> compile_regex(const std::string& pattern, bool literal, const std::string& what) {
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
    case SplitBehavior::kContiguous: {  // consecutive matches form one piece
      std::vector<std::pair<size_t, size_t>> acc;
      bool prev_match = false;
      for (const auto& x : r) {
        if (x.is_match && prev_match && !acc.empty()) acc.back().second = x.end;
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
    Step s{Step::kByteLevel, nullptr};
    s.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) {
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(kGpt2Pattern, false, path + " (GPT-2 pattern)"));
    }
    steps.push_back(std::move(s));
    return Status::ok();
  }
  if (type == "Split") {
    Step s{Step::kSplit, nullptr};
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
    const std::string b = j.contains("behavior") && j["behavior"].is_string() ? j["behavior"].get<std::string>() : "";
    if (b == "Isolated") s.behavior = SplitBehavior::kIsolated;
    else if (b == "Removed") s.behavior = SplitBehavior::kRemoved;
    else if (b == "MergedWithPrevious") s.behavior = SplitBehavior::kMergedWithPrevious;
    else if (b == "MergedWithNext") s.behavior = SplitBehavior::kMergedWithNext;
    else if (b == "Contiguous") s.behavior = SplitBehavior::kContiguous;
    else
      return invalid_argument(path + ".behavior: \"" + b +
                              "\" is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous");
    s.invert = get_bool(j, "invert", false);
    steps.push_back(std::move(s));
    return Status::ok();
  }
  return unsupported(path + ".type: pre-tokenizer \"" + type + "\" is not supported (expected Split, ByteLevel or Sequence)");
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j, const std::string& path) {
  PreTokenizer p;
  ANVIL_RETURN_IF_ERROR(parse_into(j, path, p.steps_));
  return p;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string>& out) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.emplace_back(text);
    return;
  }
  std::vector<std::string> cur, next;
  std::vector<SplitRange> ranges;
  bool first = true;
  for (const Step& s : steps_) {
    next.clear();
    auto apply = [&](std::string_view piece) {
      std::string prefixed;
      if (s.kind == Step::kByteLevel && s.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        prefixed = " ";
        prefixed.append(piece);
        piece = prefixed;
      }
      if (!s.regex) {
        next.emplace_back(piece);
        return;
      }
      ranges.clear();
      regex_ranges(*s.regex, piece, ranges);
      if (s.invert)
        for (auto& r : ranges) r.is_match = !r.is_match;
      emit_split(piece, ranges, s.kind == Step::kByteLevel ? SplitBehavior::kIsolated : s.behavior, next);
    };
    if (first) apply(text);
    else
      for (const auto& piece : cur) apply(piece);
    first = false;
    std::swap(cur, next);
  }
  for (auto& p : cur)
    if (!p.empty()) out.push_back(std::move(p));
}

}  // namespace anvil::tok
