#include "tokenizer/pretokenizer.h"

#include <algorithm>
#include <cstdio>
#include <iterator>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/unicode_class.h"

namespace anvil::tok {

// The GPT-2 pattern that ByteLevel(use_regex=true) splits with.
static const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Whitespace pre-tokenizer's pattern, \w+|[^\w\s]+ in Rust's regex crate, where \w is
// Alphabetic, M, Nd, Pc and Join_Control and \s is White_Space (PCRE2's \w and \s differ). L and Nl
// are in Alphabetic, and are named so that oniguruma_classes adds what Unicode 16.0 (the regex
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

namespace {

#include "tokenizer/unicode_delta.inc"

// The 30 two-letter general categories, one bit each in a category mask.
constexpr const char* kGcNames[] = {"Cc", "Cf", "Cn", "Co", "Cs", "Ll", "Lm", "Lo", "Lt", "Lu", "Mc", "Me", "Mn", "Nd", "Nl",
                                    "No", "Pc", "Pd", "Pe", "Pf", "Pi", "Po", "Ps", "Sc", "Sk", "Sm", "So", "Zl", "Zp", "Zs"};

uint32_t gc_bit(const char* gc) {
  for (uint32_t i = 0; i < std::size(kGcNames); ++i)
    if (kGcNames[i][0] == gc[0] && kGcNames[i][1] == gc[1]) return 1u << i;
  return 0;
}

// The categories whose names start with `major` ("L" gives Ll Lm Lo Lt Lu), or the one named.
uint32_t gc_mask(const char* names) {
  uint32_t m = 0;
  for (uint32_t i = 0; i < std::size(kGcNames); ++i)
    if (names[1] ? (kGcNames[i][0] == names[0] && kGcNames[i][1] == names[1]) : kGcNames[i][0] == names[0]) m |= 1u << i;
  return m;
}

struct GcProperty {
  const char* pcre2;  // PCRE2's name for it
  uint32_t mask;
};

// A general-category property by the name Oniguruma takes (short or long name, or the aliases
// cntrl, digit, punct, Combining_Mark; case, spaces, '_' and '-' ignored; PCRE2 10.42 knows only
// the short names). nullptr for every other property (scripts, binary properties), which passes
// unchanged.
const GcProperty* gc_property(const std::string& raw) {
  std::string n;
  for (char c : raw)
    if (c != ' ' && c != '_' && c != '-') n += char(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  struct Entry {
    const char* names;  // normalized, '|'-separated
    GcProperty prop;
  };
  static const Entry kTable[] = {
      {"c|other", {"C", gc_mask("C")}},
      {"cc|control|cntrl", {"Cc", gc_mask("Cc")}},
      {"cf|format", {"Cf", gc_mask("Cf")}},
      {"cn|unassigned", {"Cn", gc_mask("Cn")}},
      {"co|privateuse", {"Co", gc_mask("Co")}},
      {"cs|surrogate", {"Cs", gc_mask("Cs")}},
      {"l|letter", {"L", gc_mask("L")}},
      {"lc|casedletter", {"L&", gc_mask("Lu") | gc_mask("Ll") | gc_mask("Lt")}},
      {"ll|lowercaseletter", {"Ll", gc_mask("Ll")}},
      {"lm|modifierletter", {"Lm", gc_mask("Lm")}},
      {"lo|otherletter", {"Lo", gc_mask("Lo")}},
      {"lt|titlecaseletter", {"Lt", gc_mask("Lt")}},
      {"lu|uppercaseletter", {"Lu", gc_mask("Lu")}},
      {"m|mark|combiningmark", {"M", gc_mask("M")}},
      {"mc|spacingmark", {"Mc", gc_mask("Mc")}},
      {"me|enclosingmark", {"Me", gc_mask("Me")}},
      {"mn|nonspacingmark", {"Mn", gc_mask("Mn")}},
      {"n|number", {"N", gc_mask("N")}},
      {"nd|decimalnumber|digit", {"Nd", gc_mask("Nd")}},
      {"nl|letternumber", {"Nl", gc_mask("Nl")}},
      {"no|othernumber", {"No", gc_mask("No")}},
      {"p|punctuation|punct", {"P", gc_mask("P")}},
      {"pc|connectorpunctuation", {"Pc", gc_mask("Pc")}},
      {"pd|dashpunctuation", {"Pd", gc_mask("Pd")}},
      {"pe|closepunctuation", {"Pe", gc_mask("Pe")}},
      {"pf|finalpunctuation", {"Pf", gc_mask("Pf")}},
      {"pi|initialpunctuation", {"Pi", gc_mask("Pi")}},
      {"po|otherpunctuation", {"Po", gc_mask("Po")}},
      {"ps|openpunctuation", {"Ps", gc_mask("Ps")}},
      {"s|symbol", {"S", gc_mask("S")}},
      {"sc|currencysymbol", {"Sc", gc_mask("Sc")}},
      {"sk|modifiersymbol", {"Sk", gc_mask("Sk")}},
      {"sm|mathsymbol", {"Sm", gc_mask("Sm")}},
      {"so|othersymbol", {"So", gc_mask("So")}},
      {"z|separator", {"Z", gc_mask("Z")}},
      {"zl|lineseparator", {"Zl", gc_mask("Zl")}},
      {"zp|paragraphseparator", {"Zp", gc_mask("Zp")}},
      {"zs|spaceseparator", {"Zs", gc_mask("Zs")}},
  };
  for (const Entry& e : kTable) {
    std::string_view names = e.names;
    while (!names.empty()) {
      const size_t bar = names.find('|');
      if (names.substr(0, bar) == n) return &e.prop;
      names = bar == std::string_view::npos ? std::string_view() : names.substr(bar + 1);
    }
  }
  return nullptr;
}

// The code points that Unicode 16.0 puts in the categories of `mask` and Unicode 14.0 did not
// (`added`), or the reverse, as class items: "\x{10D50}-\x{10D65}\x{1171E}...".
std::string delta_items(uint32_t mask, bool added) {
  std::vector<std::pair<uint32_t, uint32_t>> r;
  for (const UnicodeDeltaRange& d : kUnicodeDelta) {
    const bool in_old = mask & gc_bit(d.old_gc), in_new = mask & gc_bit(d.new_gc);
    if (added ? (in_new && !in_old) : (in_old && !in_new)) r.push_back({d.first, d.last});
  }
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& x : r) {
    if (!merged.empty() && merged.back().second + 1 >= x.first) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  std::string out;
  char buf[32];
  for (auto [a, b] : merged) {
    if (a == b) std::snprintf(buf, sizeof(buf), "\\x{%X}", a);
    else std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", a, b);
    out += buf;
  }
  return out;
}

// Appends a set of characters whose Unicode 16.0 membership is the categories of `mask`, given as
// PCRE2 (Unicode 14.0) class items: `pos` its members, `neg` its complement as one item ("" where
// none). Outside a class, what left the categories is kept out by a lookahead; inside a class that
// cannot be expressed (PCRE2 10.42 has no class subtraction), so a negated set inside a class
// still takes the characters that joined the categories, and a plain one still takes those that
// left them (Unicode 14 to 16: U+1171E, Mn to Mc, and the newly assigned, no longer Cn or C).
void append_set(std::string& out, const std::string& pos, const std::string& neg, uint32_t mask, bool negate,
                bool in_class) {
  const std::string add = delta_items(mask, true), rem = delta_items(mask, false);
  if (in_class) {
    out += negate ? neg + rem : pos + add;
    return;
  }
  if (!negate) {
    std::string cls = add.empty() && pos.rfind("\\p{", 0) == 0 && pos.find('}') + 1 == pos.size() ? pos
                                                                                                  : "[" + pos + add + "]";
    out += rem.empty() ? cls : "(?:(?![" + rem + "])" + cls + ")";
  } else {
    const std::string cls = add.empty() && !neg.empty() ? neg : "[^" + pos + add + "]";
    out += rem.empty() ? cls : "(?:[" + rem + "]|" + cls + ")";
  }
}

}  // namespace

// tokenizers compiles its patterns with Oniguruma (Unicode 16.0 tables), whose \s is the
// White_Space property and whose \w is Alphabetic, marks, decimal digits and connector punctuation
// (outside a class also the Latin-1 numbers U+00B2 U+00B3 U+00B9 U+00BC-U+00BE, but no other No);
// PCRE2's (with UCP) differ: its \s also takes U+180E, its \w takes no marks and no Pc but '_'. So
// those escapes are spelled out as Unicode properties before PCRE2 sees the pattern, in and out of
// character classes (\W inside a class is left as it is). PCRE2 10.42's tables are Unicode 14.0:
// \w, \d and the general-category properties \p{X} / \P{X} / \p{^X} (long names too, which PCRE2
// does not know) get the code points that changed category since (unicode_delta.inc), so e.g.
// \p{L} takes the Garay and CJK Extension H letters; see append_set for what a class cannot say.
// \pL without a brace is the letter 'p' then 'L' in Oniguruma's Ruby syntax, so it becomes "p".
// Other properties (scripts such as \p{Han}, binary ones such as \p{Alphabetic}) keep PCRE2's
// Unicode 14.0 data. Everything else, escapes included, passes unchanged.
static const char* kOnigWord = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
static const char* kOnigWordOutsideClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";
std::string oniguruma_classes(const std::string& p) {
  // Alphabetic holds L and Nl.
  static const uint32_t kWordMask = gc_mask("L") | gc_mask("Nl") | gc_mask("M") | gc_mask("Nd") | gc_mask("Pc");
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      if (n == 's') out += R"(\p{White_Space})";
      else if (n == 'S') out += R"(\P{White_Space})";
      else if (n == 'w') append_set(out, in_class ? kOnigWord : kOnigWordOutsideClass, "", kWordMask, false, in_class);
      else if (n == 'W') {
        if (in_class) out += R"(\W)";
        else append_set(out, kOnigWordOutsideClass, "", kWordMask, true, false);
      } else if (n == 'd' || n == 'D') append_set(out, R"(\p{Nd})", R"(\P{Nd})", gc_mask("Nd"), n == 'D', in_class);
      else if ((n == 'p' || n == 'P') && (i + 1 >= p.size() || p[i + 1] != '{')) out += n;
      else if (n == 'p' || n == 'P') {
        const size_t close = p.find('}', i + 2);
        std::string name = close == std::string::npos ? "" : p.substr(i + 2, close - i - 2);
        const bool caret = !name.empty() && name[0] == '^';
        const GcProperty* gc = close == std::string::npos ? nullptr : gc_property(caret ? name.substr(1) : name);
        if (!gc) {
          out += c, out += n;
          continue;
        }
        const std::string pcre2 = gc->pcre2;
        append_set(out, "\\p{" + pcre2 + "}", "\\P{" + pcre2 + "}", gc->mask, (n == 'P') != caret, in_class);
        i = close;
      } else out += c, out += n;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is a member
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
      const size_t e = p.find(":]", i + 2);
      if (e != std::string::npos) {
        out.append(p, i, e + 2 - i);
        i = e + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Result<std::shared_ptr<const Regex>> compile_regex(const std::string& raw_pattern, bool literal, const std::string& what) {
  const std::string pattern = literal ? raw_pattern : oniguruma_classes(raw_pattern);
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
