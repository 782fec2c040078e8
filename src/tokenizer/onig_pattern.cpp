#include "tokenizer/onig_pattern.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>
#include <utility>
#include <vector>

// tokenizers compiles its patterns with Oniguruma (Ruby syntax, Unicode 16.0 tables); anvil with
// PCRE2 10.42 (UTF + UCP, Unicode 14.0 tables). What differs, and is rewritten here:
//  - \s is the White_Space property (PCRE2's also takes U+180E); \w is Alphabetic, marks, decimal
//    digits and connector punctuation (outside a class also the Latin-1 numbers U+00B2 U+00B3
//    U+00B9 U+00BC-U+00BE), \W its complement (PCRE2's \w takes no marks and no Pc but '_');
//    \h is a hex digit (PCRE2's is horizontal space).
//  - General categories (\p{L}, \P{Lu}, \p{^N}, long names and aliases that PCRE2 does not know,
//    \d, \w) get the code points that changed category since Unicode 14.0
//    (unicode_delta.inc), so e.g. \p{L} takes the Garay and CJK Extension H letters.
//  - Scripts (\p{Han}, \p{Hani}, \P{Greek}, ...) are Oniguruma's Unicode 16.0 Script property,
//    spelled out as ranges (unicode_scripts.inc): PCRE2's tables lack the scripts and letters
//    added since 14.0, and its \p{Han} is Script_Extensions (it takes U+3001 and other shared CJK
//    punctuation).
//  - Character classes: Oniguruma nests them ([a-c[x-z]]) and intersects them ([\p{L}&&[^a-z]]);
//    PCRE2 reads '[' inside a class as a literal. And PCRE2 10.42 cannot take characters out of a
//    class, which a negated category inside one needs ([\P{L}] must not take the letters new since
//    Unicode 14.0; [^\p{L}\P{N}]). A class that only holds what a PCRE2 class can say exactly stays
//    a class; any other becomes an expression that matches one character: a union of alternatives,
//    an intersection of lookaheads, a negation as (?!...) followed by any character.
//  - \pL without a brace is the letter 'p' then 'L' in Ruby syntax, so it becomes "p".
// Other properties (binary ones such as \p{Alphabetic}) keep PCRE2's Unicode 14.0 data.
// Everything else, escapes included, passes unchanged.
namespace anvil::tok {
namespace {

#include "tokenizer/unicode_delta.inc"
#include "tokenizer/unicode_scripts.inc"

// Oniguruma's loose matching of property names: case, spaces, '_' and '-' ignored.
std::string loose_name(const std::string& raw) {
  std::string n;
  for (char c : raw)
    if (c != ' ' && c != '_' && c != '-') n += char(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return n;
}

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
// cntrl, digit, punct, Combining_Mark), given as loose_name spells it (PCRE2 10.42 knows only the
// short names). nullptr for every other property.
const GcProperty* gc_property(const std::string& n) {
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

// The index in kScriptNames of the script Oniguruma knows by `n` (a loose_name), or -1.
int script_index(const std::string& n) {
  const auto* end = std::end(kScriptAliases);
  const auto* it = std::lower_bound(std::begin(kScriptAliases), end, n,
                                    [](const UnicodeScriptName& a, const std::string& b) { return std::strcmp(a.name, b.c_str()) < 0; });
  return it != end && n == it->name ? it->script : -1;
}

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// Sorted, merged ranges as class items: "\x{10D50}-\x{10D65}\x{1171E}...". The surrogates, which
// no UTF-8 text holds and PCRE2 refuses in a UTF pattern, are left out.
std::string range_items(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges merged;
  for (const auto& x : r) {
    if (!merged.empty() && merged.back().second + 1 >= x.first) merged.back().second = std::max(merged.back().second, x.second);
    else merged.push_back(x);
  }
  std::string out;
  char buf[32];
  auto item = [&](uint32_t a, uint32_t b) {
    if (a == b) std::snprintf(buf, sizeof(buf), "\\x{%X}", a);
    else std::snprintf(buf, sizeof(buf), "\\x{%X}-\\x{%X}", a, b);
    out += buf;
  };
  for (auto [a, b] : merged) {
    if (a < 0xD800 && b >= 0xD800) item(a, 0xD7FF);
    if (b > 0xDFFF && a <= 0xDFFF) item(0xE000, b);
    if (b < 0xD800 || a > 0xDFFF) item(a, b);
  }
  return out;
}

// The code points that Unicode 16.0 puts in the categories of `mask` and Unicode 14.0 did not
// (`added`), or the reverse, as class items.
std::string delta_items(uint32_t mask, bool added) {
  Ranges r;
  for (const UnicodeDeltaRange& d : kUnicodeDelta) {
    const bool in_old = mask & gc_bit(d.old_gc), in_new = mask & gc_bit(d.new_gc);
    if (added ? (in_new && !in_old) : (in_old && !in_new)) r.push_back({d.first, d.last});
  }
  return range_items(std::move(r));
}

// A set of characters as Oniguruma means it, in PCRE2: `matcher` matches exactly one of its
// characters outside a class; `items` are class items for it, exactly its members where `exact`.
struct CharSet {
  std::string items;
  bool exact = true;
  std::string matcher;
};

CharSet exact_set(const std::string& items, const std::string& matcher) { return {items, true, matcher}; }

// The set whose Unicode 16.0 membership is the categories of `mask` (or its complement, `negate`),
// given as PCRE2 (Unicode 14.0) class items: `pos` its members, `neg` its complement as one item
// ("" where none). Outside a class, what left the categories is kept out by a lookahead; a class
// cannot subtract, so the items are exact only where nothing has to come out.
CharSet gc_set(const std::string& pos, const std::string& neg, uint32_t mask, bool negate) {
  const std::string add = delta_items(mask, true), rem = delta_items(mask, false);
  CharSet s;
  if (!negate) {
    s.items = pos + add;
    s.exact = rem.empty();
    const bool one_property = pos.rfind("\\p{", 0) == 0 && pos.find('}') + 1 == pos.size();
    const std::string cls = add.empty() && one_property ? pos : "[" + pos + add + "]";
    s.matcher = rem.empty() ? cls : "(?:(?![" + rem + "])" + cls + ")";
  } else {
    s.items = neg + rem;
    s.exact = !neg.empty() && add.empty();
    const std::string cls = add.empty() && !neg.empty() ? neg : "[^" + pos + add + "]";
    s.matcher = rem.empty() ? cls : "(?:[" + rem + "]|" + cls + ")";
  }
  return s;
}

// A script (or every character outside it) as the ranges of Unicode 16.0's Script property. Outside
// a class the ranges are matched case-sensitively, as Oniguruma matches a property (inside one it
// case-folds class members, and so does PCRE2).
CharSet script_set(int script, bool negate) {
  Ranges r;
  for (const UnicodeScriptRange& x : kUnicodeScripts)
    if ((x.script == script) != negate) r.push_back({x.first, x.last});
  const std::string items = range_items(std::move(r));
  return exact_set(items, "(?-i:[" + items + "])");
}

const char* kOnigWord = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc})";
const char* kOnigWordOutsideClass = R"(\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{B2}\x{B3}\x{B9}\x{BC}-\x{BE})";

// The set that the escape at p[i] == '\\' names (\s \S \w \W \d \D \h \H, \p{..} \P{..} of a
// general category or a script, or \p / \P without a brace: the letter); i is left on its last
// character. false for every other escape, which passes unchanged.
bool set_escape(const std::string& p, size_t& i, bool in_class, CharSet* s) {
  // Alphabetic holds L and Nl.
  static const uint32_t kWordMask = gc_mask("L") | gc_mask("Nl") | gc_mask("M") | gc_mask("Nd") | gc_mask("Pc");
  if (i + 1 >= p.size()) return false;
  const char n = p[i + 1];
  switch (n) {
    case 's': *s = exact_set(R"(\p{White_Space})", R"(\p{White_Space})"); break;
    case 'S': *s = exact_set(R"(\P{White_Space})", R"(\P{White_Space})"); break;
    case 'h': *s = exact_set("0-9A-Fa-f", "[0-9A-Fa-f]"); break;
    case 'H': *s = {"", false, "[^0-9A-Fa-f]"}; break;
    case 'w':
    case 'W': *s = gc_set(in_class ? kOnigWord : kOnigWordOutsideClass, "", kWordMask, n == 'W'); break;
    case 'd':
    case 'D': *s = gc_set(R"(\p{Nd})", R"(\P{Nd})", gc_mask("Nd"), n == 'D'); break;
    case 'p':
    case 'P': {
      if (i + 2 >= p.size() || p[i + 2] != '{') {
        *s = exact_set(std::string(1, n), std::string(1, n));
        break;
      }
      const size_t close = p.find('}', i + 3);
      if (close == std::string::npos) return false;
      std::string name = p.substr(i + 3, close - i - 3);
      const bool caret = !name.empty() && name[0] == '^';
      if (caret) name.erase(0, 1);
      const bool negate = (n == 'P') != caret;
      const std::string loose = loose_name(name);
      if (const GcProperty* gc = gc_property(loose)) {
        const std::string pcre2 = gc->pcre2;
        *s = gc_set("\\p{" + pcre2 + "}", "\\P{" + pcre2 + "}", gc->mask, negate);
      } else if (const int script = script_index(loose); script >= 0) {
        *s = script_set(script, negate);
      } else {
        return false;
      }
      i = close;
      return true;
    }
    default: return false;
  }
  i += 1;
  return true;
}

// Members of one operand of a class: PCRE2 class items, and one-character expressions for what a
// PCRE2 class cannot hold.
struct ClassUnion {
  std::string items;
  std::vector<std::string> matchers;

  std::string expr() const {
    std::vector<std::string> alts;
    if (!items.empty()) alts.push_back("[" + items + "]");
    alts.insert(alts.end(), matchers.begin(), matchers.end());
    if (alts.empty()) return "(?!)";
    if (alts.size() == 1) return alts[0];
    std::string e = "(?:";
    for (size_t k = 0; k < alts.size(); ++k) e += (k ? "|" : "") + alts[k];
    return e + ")";
  }
  // Appends class items; a '-' before them is a literal (a range cannot end in a set).
  void add_items(const std::string& more) {
    if (!items.empty() && items.back() == '-' && !(items.size() >= 2 && items[items.size() - 2] == '\\')) {
      items.back() = '\\';
      items += '-';
    }
    items += more;
  }
};

// A class: its operands (more than one where && intersects them), and whether it is negated.
struct ParsedClass {
  bool negated = false;
  std::vector<ClassUnion> operands;

  bool exact() const { return operands.size() == 1 && operands[0].matchers.empty() && !operands[0].items.empty(); }
  // One PCRE2 expression that matches one character of the class.
  std::string expr() const {
    if (exact()) return std::string("[") + (negated ? "^" : "") + operands[0].items + "]";
    std::string e;
    for (size_t k = 0; k + 1 < operands.size(); ++k) e += "(?=" + operands[k].expr() + ")";
    e += operands.back().expr();
    if (negated) return "(?:(?!" + e + ")(?s:.))";
    return operands.size() > 1 ? "(?:" + e + ")" : e;
  }
};

// Parses the class that opens at p[i] == '['; i is left on its closing ']'. false when the class
// is not closed.
bool parse_class(const std::string& p, size_t& i, ParsedClass& c) {
  ++i;
  c.negated = i < p.size() && p[i] == '^';
  if (c.negated) ++i;
  c.operands.emplace_back();
  if (i < p.size() && p[i] == ']') {  // a leading ] is a member
    c.operands.back().items += "\\]";
    ++i;
  }
  while (i < p.size()) {
    ClassUnion& u = c.operands.back();
    const char ch = p[i];
    if (ch == ']') return true;
    if (ch == '&' && i + 1 < p.size() && p[i + 1] == '&') {
      c.operands.emplace_back();
      i += 2;
      continue;
    }
    if (ch == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:], [:^digit:]
      const size_t e = p.find(":]", i + 2);
      if (e != std::string::npos) {
        u.add_items(p.substr(i, e + 2 - i));
        i = e + 2;
        continue;
      }
    }
    if (ch == '[') {  // a nested class: a union member
      ParsedClass sub;
      if (!parse_class(p, i, sub)) return false;
      if (sub.exact() && !sub.negated) u.add_items(sub.operands[0].items);
      else u.matchers.push_back(sub.expr());
      ++i;
      continue;
    }
    if (ch == '\\' && i + 1 < p.size()) {
      CharSet s;
      size_t j = i;
      if (set_escape(p, j, true, &s)) {
        if (s.exact) u.add_items(s.items);
        else u.matchers.push_back(s.matcher);
        i = j + 1;
        continue;
      }
      u.items.append(p, i, 2);
      i += 2;
      continue;
    }
    u.items += ch;
    ++i;
  }
  return false;
}

}  // namespace

std::string onig_to_pcre2(const std::string& p) {
  std::string out;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      CharSet s;
      size_t j = i;
      if (set_escape(p, j, false, &s)) {
        out += s.matcher;
        i = j;
      } else {
        out += c;
        out += p[++i];
      }
      continue;
    }
    if (c == '[') {
      ParsedClass cls;
      size_t j = i;
      if (!parse_class(p, j, cls)) {  // not closed: PCRE2 reports it
        out.append(p, i, std::string::npos);
        break;
      }
      out += cls.expr();
      i = j;
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace anvil::tok
