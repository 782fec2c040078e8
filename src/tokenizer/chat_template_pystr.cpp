// Python str semantics: Unicode case mapping and classes, format() / str.format() and "%".
// Case mapping is utf8proc's simple per-code-point mapping plus the SpecialCasing expansions and
// the final-sigma rule Python applies; both reproduce CPython's output for the scripts real
// conversations use (Latin, Greek, Cyrillic, ligatures, ß, İ).
#include "tokenizer/chat_template_pystr.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tokenizer/chat_template_builtins.h"

namespace anvil::chat_template_detail {

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  utf8proc_ssize_t n = static_cast<utf8proc_ssize_t>(s.size());
  while (n > 0) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t used = utf8proc_iterate(p, n, &cp);
    if (used <= 0) {  // an invalid byte (>= 0x80) becomes U+DC80..U+DCFF, like Python's
      cp = 0xDC00 + *p;  // surrogateescape, so to_utf8 gives the same bytes back
      used = 1;
    }
    out += static_cast<char32_t>(cp);
    p += used;
    n -= used;
  }
  return out;
}

std::string to_utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) {
    if (c >= 0xDC80 && c <= 0xDCFF) {  // raw byte from to_u32
      out += static_cast<char>(c - 0xDC00);
      continue;
    }
    utf8proc_uint8_t buf[4];
    utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  }
  return out;
}

bool py_isspace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0) return true;
  if (c < 0x1680) return false;
  return c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

namespace {

utf8proc_category_t cat(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }

// The value of a Unicode decimal digit (category Nd, encoded in contiguous runs 0..9), or -1.
int decimal_value(char32_t c) {
  if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
  if (c < 0x80 || cat(c) != UTF8PROC_CATEGORY_ND) return -1;
  char32_t first = c;
  while (c - first < 9 && first > 0 && cat(first - 1) == UTF8PROC_CATEGORY_ND) --first;
  return static_cast<int>((c - first) % 10);
}

// What int()/float() parse: Unicode spaces become ' ' and Unicode digits ASCII ones (any other
// non-ASCII character makes it invalid: '?'), then surrounding whitespace is stripped
// (CPython's _PyUnicode_TransformDecimalAndSpaceToASCII).
std::string number_text(const std::string& s) {
  std::string out;
  for (char32_t c : to_u32(s)) {
    if (c < 0x80) out += static_cast<char>(c);
    else if (py_isspace(c)) out += ' ';
    else if (int d = decimal_value(c); d >= 0) out += static_cast<char>('0' + d);
    else out += '?';
  }
  size_t b = out.find_first_not_of(" \t\n\r\f\v"), e = out.find_last_not_of(" \t\n\r\f\v");
  return b == std::string::npos ? "" : out.substr(b, e - b + 1);
}

// Removes the '_' separators of a digit run; false if one is not between two digits (PEP 515).
bool drop_underscores(std::string& digits, bool (*is_digit)(char)) {
  std::string out;
  for (size_t k = 0; k < digits.size(); ++k) {
    if (digits[k] != '_') {
      out += digits[k];
      continue;
    }
    if (k == 0 || k + 1 == digits.size() || !is_digit(digits[k - 1]) || !is_digit(digits[k + 1])) return false;
  }
  digits = std::move(out);
  return true;
}
bool is_upper_cat(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_LU; }
bool is_lower_cat(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_LL; }
bool is_title_cat(char32_t c) { return cat(c) == UTF8PROC_CATEGORY_LT; }
bool is_cased(char32_t c) { return is_upper_cat(c) || is_lower_cat(c) || is_title_cat(c); }

// Full (SpecialCasing) upper/title mappings that expand; everything else maps 1:1.
const char32_t* special_upper(char32_t c, bool title) {
  switch (c) {
    case 0xDF: return title ? U"Ss" : U"SS";
    case 0x149: return U"\u02BCN";
    case 0x1F0: return U"J\u030C";
    case 0xFB00: return title ? U"Ff" : U"FF";
    case 0xFB01: return title ? U"Fi" : U"FI";
    case 0xFB02: return title ? U"Fl" : U"FL";
    case 0xFB03: return title ? U"Ffi" : U"FFI";
    case 0xFB04: return title ? U"Ffl" : U"FFL";
    case 0xFB05: case 0xFB06: return title ? U"St" : U"ST";
    default: return nullptr;
  }
}

void append_upper(std::u32string& out, char32_t c, bool title) {
  if (const char32_t* s = special_upper(c, title)) {
    out += s;
    return;
  }
  out += static_cast<char32_t>(title ? utf8proc_totitle(static_cast<utf8proc_int32_t>(c))
                                     : utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

// Lowercase of s[k] with Python's context rules (final sigma, İ).
void append_lower(std::u32string& out, const std::u32string& s, size_t k) {
  char32_t c = s[k];
  if (c == 0x130) {
    out += U"i\u0307";
    return;
  }
  if (c == 0x3A3) {  // final sigma: after a cased letter and not before one (case-ignorables skipped)
    auto ignorable = [](char32_t x) {
      auto k2 = cat(x);
      return k2 == UTF8PROC_CATEGORY_MN || k2 == UTF8PROC_CATEGORY_ME || k2 == UTF8PROC_CATEGORY_CF ||
             k2 == UTF8PROC_CATEGORY_LM || k2 == UTF8PROC_CATEGORY_SK || x == '\'' || x == 0x2019 || x == '.' ||
             x == ':' || x == 0xB7;
    };
    size_t j = k;
    while (j > 0 && ignorable(s[j - 1])) --j;
    bool before = j > 0 && is_cased(s[j - 1]);
    size_t m = k + 1;
    while (m < s.size() && ignorable(s[m])) ++m;
    bool after = m < s.size() && is_cased(s[m]);
    out += (before && !after) ? char32_t(0x3C2) : char32_t(0x3C3);
    return;
  }
  out += static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}

}  // namespace

std::string py_upper(const std::string& s) {
  std::u32string in = to_u32(s), out;
  for (char32_t c : in) append_upper(out, c, false);
  return to_utf8(out);
}

std::string py_lower(const std::string& s) {
  std::u32string in = to_u32(s), out;
  for (size_t k = 0; k < in.size(); ++k) append_lower(out, in, k);
  return to_utf8(out);
}

std::string py_swapcase(const std::string& s) {
  std::u32string in = to_u32(s), out;
  for (size_t k = 0; k < in.size(); ++k) {
    if (is_upper_cat(in[k])) append_lower(out, in, k);
    else if (is_lower_cat(in[k])) append_upper(out, in[k], false);
    else out += in[k];
  }
  return to_utf8(out);
}

std::string py_title(const std::string& s) {
  std::u32string in = to_u32(s), out;
  bool prev_cased = false;
  for (size_t k = 0; k < in.size(); ++k) {
    if (prev_cased) append_lower(out, in, k);
    else append_upper(out, in[k], true);
    prev_cased = is_cased(in[k]);
  }
  return to_utf8(out);
}

std::string py_capitalize(const std::string& s) {
  std::u32string in = to_u32(s), out;
  for (size_t k = 0; k < in.size(); ++k) {
    if (k == 0) append_upper(out, in[k], true);
    else append_lower(out, in, k);
  }
  return to_utf8(out);
}

std::string py_casefold(const std::string& s) {
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst, UTF8PROC_CASEFOLD);
  if (n < 0) return py_lower(s);
  std::string out(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (cat(c)) {
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_ZS: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP:
      return false;
    default: return true;
  }
}

bool py_parse_int(const std::string& s, int64_t base, int64_t* out, bool* overflow) {
  *overflow = false;
  if (base != 0 && (base < 2 || base > 36)) return false;
  std::string t = number_text(s);
  size_t k = 0;
  bool neg = false;
  if (k < t.size() && (t[k] == '+' || t[k] == '-')) neg = t[k++] == '-';
  bool prefixed = false;
  if (t.size() - k >= 2 && t[k] == '0') {
    const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(t[k + 1])));
    const int64_t pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (pb && (base == 0 || base == pb)) {
      base = pb;
      k += 2;
      prefixed = true;
      if (k < t.size() && t[k] == '_') ++k;  // "0x_1f" is valid
    }
  }
  std::string digits = t.substr(k);
  if (digits.empty() || !drop_underscores(digits, [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }))
    return false;
  if (base == 0) {  // no prefix: decimal, and "010" is refused (only zeros may lead)
    base = 10;
    if (!prefixed && digits.size() > 1 && digits[0] == '0' && digits.find_first_not_of('0') != std::string::npos)
      return false;
  }
  // Accumulate negatively: -9223372036854775808 fits, its absolute value does not.
  int64_t v = 0;
  for (char ch : digits) {
    const int d = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
                  : std::isalpha(static_cast<unsigned char>(ch))
                      ? std::tolower(static_cast<unsigned char>(ch)) - 'a' + 10
                      : 99;
    if (d >= base) return false;
    if (!*overflow && (__builtin_mul_overflow(v, base, &v) || __builtin_sub_overflow(v, d, &v))) *overflow = true;
  }
  if (*overflow) return true;
  if (!neg && v == INT64_MIN) {
    *overflow = true;
    return true;
  }
  *out = neg ? v : -v;
  return true;
}

bool py_parse_float(const std::string& s, double* out) {
  std::string t = number_text(s);
  size_t k = 0;
  std::string sign;
  if (k < t.size() && (t[k] == '+' || t[k] == '-')) sign = t[k++];
  std::string rest = t.substr(k), lower;
  for (char c : rest) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "inf" || lower == "infinity" || lower == "nan") {
    double v = lower == "nan" ? std::nan("") : HUGE_VAL;
    *out = sign == "-" ? -v : v;
    return true;
  }
  // digits [. digits] | . digits, then an optional exponent; '_' only between digits.
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  size_t e = rest.find_first_of("eE");
  std::string mant = rest.substr(0, e), expo = e == std::string::npos ? "" : rest.substr(e + 1);
  size_t dot = mant.find('.');
  std::string ip = mant.substr(0, dot), fp = dot == std::string::npos ? "" : mant.substr(dot + 1);
  if (ip.empty() && fp.empty()) return false;
  for (std::string* part : {&ip, &fp})
    if (!part->empty() && (!drop_underscores(*part, [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }) ||
                           !std::all_of(part->begin(), part->end(), is_digit)))
      return false;
  std::string clean = sign + ip + (dot == std::string::npos ? "" : "." + fp);
  if (e != std::string::npos) {
    std::string esign;
    if (!expo.empty() && (expo[0] == '+' || expo[0] == '-')) {
      esign = expo[0];
      expo.erase(0, 1);
    }
    if (expo.empty() || !drop_underscores(expo, [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }) ||
        !std::all_of(expo.begin(), expo.end(), is_digit))
      return false;
    clean += "e" + esign + expo;
  }
  *out = std::strtod(clean.c_str(), nullptr);  // correctly rounded; out of range gives inf / 0
  return true;
}

double py_round_float(double x, int64_t ndigits) {
  // CPython's double_round: past these bounds the result is x itself / a zero of x's sign.
  if (!std::isfinite(x) || x == 0.0 || ndigits > 323) return x;
  if (ndigits < -308) return 0.0 * x;
  if (ndigits >= 0) {  // printf rounds the exact binary value, ties to even
    int n = std::snprintf(nullptr, 0, "%.*f", static_cast<int>(ndigits), x);
    std::string buf(static_cast<size_t>(n) + 1, '\0');
    std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf.c_str(), nullptr);
  }
  // A multiple of 10^k (k = -ndigits): keep the significant digits down to that position. 40
  // digits give the exact decimal exponent (no double is that close below a power of ten).
  char probe[64];
  std::snprintf(probe, sizeof probe, "%.40e", std::fabs(x));
  const int64_t exp10 = std::strtol(std::strchr(probe, 'e') + 1, nullptr, 10);
  const int64_t keep = exp10 + 1 + ndigits;  // significant digits kept
  if (keep >= 1) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*e", static_cast<int>(keep - 1), x);
    return std::strtod(buf, nullptr);
  }
  if (keep < 0) return 0.0 * x;
  // |x| < 10^k: 10^k when above half of it; the exact half rounds to the even 0.
  const bool above_half = probe[0] > '5' || (probe[0] == '5' && std::string(probe + 2, 40).find_first_not_of('0') != std::string::npos);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s1e%lld", x < 0 ? "-" : "", static_cast<long long>(-ndigits));
  return above_half ? std::strtod(buf, nullptr) : 0.0 * x;
}

std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  std::u32string in = to_u32(s), set = chars ? to_u32(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  size_t b = 0, e = in.size();
  if (left)
    while (b < e && strip_it(in[b])) ++b;
  if (right)
    while (e > b && strip_it(in[e - 1])) --e;
  return to_utf8(in.substr(b, e - b));
}

// ---- format() ----

namespace {

struct Spec {
  char32_t fill = ' ';
  char align = 0;  // '<' '>' '^' '=' or 0
  char sign = '-';
  bool alt = false, zero = false;
  int64_t width = -1, precision = -1;
  char grouping = 0;  // ',' or '_'
  char type = 0;
};

Spec parse_spec(const std::string& spec_utf8, int line) {
  std::u32string s = to_u32(spec_utf8);
  Spec sp;
  size_t k = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    sp.fill = s[0];
    sp.align = static_cast<char>(s[1]);
    k = 2;
  } else if (!s.empty() && is_align(s[0])) {
    sp.align = static_cast<char>(s[0]);
    k = 1;
  }
  if (k < s.size() && (s[k] == '+' || s[k] == '-' || s[k] == ' ')) sp.sign = static_cast<char>(s[k++]);
  if (k < s.size() && s[k] == 'z') ++k;
  if (k < s.size() && s[k] == '#') { sp.alt = true; ++k; }
  if (k < s.size() && s[k] == '0') { sp.zero = true; ++k; }
  auto number = [&]() -> int64_t {
    int64_t v = -1;
    while (k < s.size() && s[k] >= '0' && s[k] <= '9') {
      v = (v < 0 ? 0 : v) * 10 + (s[k++] - '0');
      if (v > kMaxTemplateBuild) fail("a format width or precision above " + std::to_string(kMaxTemplateBuild), line);
    }
    return v;
  };
  sp.width = number();
  if (k < s.size() && (s[k] == ',' || s[k] == '_')) sp.grouping = static_cast<char>(s[k++]);
  if (k < s.size() && s[k] == '.') {
    ++k;
    sp.precision = number();
    if (sp.precision < 0) fail("Format specifier missing precision", line);
  }
  if (k < s.size()) sp.type = static_cast<char>(s[k++]);
  if (k < s.size()) fail("Invalid format specifier '" + spec_utf8 + "'", line);
  return sp;
}

std::string group_digits(const std::string& digits, char sep) {
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int k = 0; k < n; ++k) {
    if (k && (n - k) % 3 == 0) out += sep;
    out += digits[k];
  }
  return out;
}

// Pads body (sign/prefix already split off into `prefix`) to the spec's width.
std::string pad(const std::string& prefix, const std::string& body, const Spec& sp, char default_align) {
  char align = sp.align ? sp.align : (sp.zero ? '=' : default_align);
  char32_t fill = sp.align ? sp.fill : (sp.zero ? U'0' : U' ');
  int64_t len = static_cast<int64_t>(utf8_length(prefix) + utf8_length(body));
  if (sp.width <= len) return prefix + body;
  int64_t n = sp.width - len;
  std::string f = to_utf8(std::u32string(1, fill)), left, right;
  auto rep = [&](int64_t m) {
    std::string r;
    for (int64_t i = 0; i < m; ++i) r += f;
    return r;
  };
  if (align == '<') return prefix + body + rep(n);
  if (align == '>') return rep(n) + prefix + body;
  if (align == '^') return rep(n / 2) + prefix + body + rep(n - n / 2);
  return prefix + rep(n) + body;  // '='
}

std::string c_format(const char* fmt, int prec, double x) {
  char buf[512];
  std::snprintf(buf, sizeof buf, fmt, prec, x);
  return buf;
}

std::string format_float(double x, const Spec& sp, int line) {
  char type = sp.type;
  std::string sign = std::signbit(x) && !std::isnan(x) ? "-" : (sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "");
  double a = std::fabs(x);
  std::string body;
  if (std::isnan(x) || std::isinf(x)) {
    body = std::isnan(x) ? "nan" : "inf";
    if (type == 'E' || type == 'F' || type == 'G') body = std::isnan(x) ? "NAN" : "INF";
    if (type == '%') body += "%";
    return pad(sign, body, sp, '>');
  }
  int prec = static_cast<int>(sp.precision);
  switch (type) {
    case 'f': case 'F': body = c_format(sp.alt ? "%#.*f" : "%.*f", prec < 0 ? 6 : prec, a); break;
    case 'e': case 'E':
      body = c_format(sp.alt ? "%#.*e" : "%.*e", prec < 0 ? 6 : prec, a);
      if (type == 'E') std::transform(body.begin(), body.end(), body.begin(), ::toupper);
      break;
    case 'g': case 'G': case 'n':
      body = c_format(sp.alt ? "%#.*g" : "%.*g", prec < 0 ? 6 : (prec == 0 ? 1 : prec), a);
      if (type == 'G') std::transform(body.begin(), body.end(), body.begin(), ::toupper);
      break;
    case '%': body = c_format(sp.alt ? "%#.*f" : "%.*f", prec < 0 ? 6 : prec, a * 100) + "%"; break;
    case 0:
      if (prec < 0) {
        body = py_float_repr(a);
      } else {  // like 'g', but a fixed-point result keeps one decimal
        body = c_format(sp.alt ? "%#.*g" : "%.*g", prec == 0 ? 1 : prec, a);
        if (body.find_first_of(".e") == std::string::npos) body += ".0";
      }
      break;
    default: fail(std::string("Unknown format code '") + type + "' for object of type 'float'", line);
  }
  if (sp.grouping) {
    size_t end = body.find_first_not_of("0123456789");
    body = group_digits(body.substr(0, end), sp.grouping) + (end == std::string::npos ? "" : body.substr(end));
  }
  return pad(sign, body, sp, '>');
}

std::string format_int(int64_t v, const Spec& sp, int line) {
  char type = sp.type;
  if (type == 'e' || type == 'E' || type == 'f' || type == 'F' || type == 'g' || type == 'G' || type == '%')
    return format_float(static_cast<double>(v), sp, line);
  if (sp.precision >= 0) fail("Precision not allowed in integer format specifier", line);
  if (type == 'c') return pad("", to_utf8(std::u32string(1, static_cast<char32_t>(v))), sp, '<');
  uint64_t a = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string sign = v < 0 ? "-" : (sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "");
  std::string digits, prefix;
  int base = 10;
  if (type == 'x' || type == 'X') base = 16, prefix = type == 'x' ? "0x" : "0X";
  else if (type == 'o') base = 8, prefix = "0o";
  else if (type == 'b') base = 2, prefix = "0b";
  else if (type != 0 && type != 'd' && type != 'n')
    fail(std::string("Unknown format code '") + type + "' for object of type 'int'", line);
  do {
    int d = static_cast<int>(a % base);
    digits += static_cast<char>(d < 10 ? '0' + d : (type == 'X' ? 'A' : 'a') + d - 10);
    a /= base;
  } while (a);
  std::reverse(digits.begin(), digits.end());
  if (sp.grouping) digits = group_digits(digits, sp.grouping);
  return pad(sign + (sp.alt ? prefix : ""), digits, sp, '>');
}

}  // namespace

std::string format_value(const Value& v, const std::string& spec, int line) {
  if (spec.empty()) return to_str(v, line);
  Spec sp = parse_spec(spec, line);
  switch (v.kind) {
    case Kind::kString: {
      if (sp.type && sp.type != 's') fail(std::string("Unknown format code '") + sp.type + "' for object of type 'str'", line);
      if (sp.sign != '-') fail("Sign not allowed in string format specifier", line);
      if (sp.align == '=') fail("'=' alignment not allowed in string format specifier", line);
      std::string body = v.s;
      if (sp.precision >= 0) body = to_utf8(to_u32(body).substr(0, static_cast<size_t>(sp.precision)));
      return pad("", body, sp, '<');
    }
    case Kind::kBool:
      if (!sp.type) return pad("", to_str(v, line), sp, '<');
      return format_int(v.b, sp, line);
    case Kind::kInt: return format_int(v.i, sp, line);
    case Kind::kFloat: return format_float(v.f, sp, line);
    case Kind::kUndefined: return pad("", "", sp, '<');
    default: fail("unsupported format string passed to " + type_name(v) + ".__format__", line);
  }
}

std::string str_format(const std::string& fmt, const Args& args, int line) {
  std::string out;
  int auto_index = 0;
  bool used_auto = false, used_manual = false;
  // One replacement field body (between the braces), nested fields in its spec already expanded.
  auto field = [&](const std::string& body) -> std::string {
    size_t name_end = body.find_first_of("!:");
    std::string name = body.substr(0, name_end), conv, spec;
    if (name_end != std::string::npos && body[name_end] == '!') {
      size_t colon = body.find(':', name_end);
      conv = body.substr(name_end + 1, colon == std::string::npos ? std::string::npos : colon - name_end - 1);
      if (colon != std::string::npos) spec = body.substr(colon + 1);
      if (conv.size() != 1 || (conv != "r" && conv != "s" && conv != "a"))
        fail("Unknown conversion specifier " + conv, line);
    } else if (name_end != std::string::npos) {
      spec = body.substr(name_end + 1);
    }
    size_t first_end = name.find_first_of(".[");
    std::string first = name.substr(0, first_end);
    Value obj;
    if (first.empty()) {
      if (used_manual) fail("cannot switch from manual field specification to automatic field numbering", line);
      used_auto = true;
      size_t idx = static_cast<size_t>(auto_index++);
      if (idx >= args.pos.size()) fail("Replacement index " + std::to_string(idx) + " out of range for positional args tuple", line);
      obj = args.pos[idx];
    } else if (std::all_of(first.begin(), first.end(), ::isdigit)) {
      if (used_auto) fail("cannot switch from automatic field numbering to manual field specification", line);
      used_manual = true;
      size_t idx = std::stoul(first);
      if (idx >= args.pos.size()) fail("Replacement index " + first + " out of range for positional args tuple", line);
      obj = args.pos[idx];
    } else {
      const Value* kv = nullptr;
      for (auto& [k, x] : args.kw)
        if (k == first) kv = &x;
      if (!kv) fail("KeyError: '" + first + "'", line);
      obj = *kv;
    }
    for (size_t k = first_end; k != std::string::npos && k < name.size();) {
      if (name[k] == '.') {
        size_t e = name.find_first_of(".[", k + 1);
        std::string attr = name.substr(k + 1, e == std::string::npos ? std::string::npos : e - k - 1);
        if (attr.empty()) fail("Empty attribute in format string", line);
        obj = get_attr(obj, attr, line);
        k = e;
      } else {
        size_t e = name.find(']', k);
        if (e == std::string::npos) fail("Missing ']' in format string", line);
        std::string key = name.substr(k + 1, e - k - 1);
        bool digits = !key.empty() && std::all_of(key.begin(), key.end(), ::isdigit);
        obj = get_item(obj, digits ? Value::integer(std::stoll(key)) : Value::string(key), line);
        k = e + 1;
        if (k < name.size() && name[k] != '.' && name[k] != '[')
          fail("Only '.' or '[' may follow ']' in format field specifier", line);
      }
    }
    if (conv == "r" || conv == "a") obj = Value::string(repr(obj, line));
    else if (conv == "s") obj = Value::string(to_str(obj, line));
    return format_value(obj, spec, line);
  };
  for (size_t k = 0; k < fmt.size();) {
    char c = fmt[k];
    if (c == '}') {
      if (k + 1 < fmt.size() && fmt[k + 1] == '}') { out += '}'; k += 2; continue; }
      fail("Single '}' encountered in format string", line);
    }
    if (c != '{') { out += c; ++k; continue; }
    if (k + 1 < fmt.size() && fmt[k + 1] == '{') { out += '{'; k += 2; continue; }
    // Find the matching '}', expanding nested "{...}" inside the spec.
    std::string body;
    int depth = 1;
    size_t j = k + 1;
    for (; j < fmt.size(); ++j) {
      if (fmt[j] == '{') {
        size_t close = fmt.find('}', j);
        if (close == std::string::npos) break;
        body += field(fmt.substr(j + 1, close - j - 1));
        j = close;
        continue;
      }
      if (fmt[j] == '}') { --depth; break; }
      body += fmt[j];
    }
    if (depth != 0) fail("Single '{' encountered in format string", line);
    out += field(body);
    k = j + 1;
  }
  return out;
}

// ---- printf-style "%" ----

std::string percent_format(const std::string& fmt, const Value& arg, int line) {
  std::vector<Value> pos;
  const Value* mapping = nullptr;
  if (arg.kind == Kind::kList && arg.is_tuple) pos = *arg.list;
  else if (arg.kind == Kind::kDict) mapping = &arg, pos = {arg};
  else pos = {arg};
  size_t next = 0;
  bool used_mapping = false;
  auto take = [&]() -> Value {
    if (next >= pos.size()) fail("not enough arguments for format string", line);
    return pos[next++];
  };
  std::string out;
  for (size_t k = 0; k < fmt.size();) {
    if (fmt[k] != '%') { out += fmt[k++]; continue; }
    ++k;
    if (k >= fmt.size()) fail("incomplete format", line);
    Value v;
    bool have_value = false;
    if (fmt[k] == '(') {
      size_t e = fmt.find(')', k);
      if (e == std::string::npos) fail("incomplete format key", line);
      if (!mapping) fail("format requires a mapping", line);
      std::string key = fmt.substr(k + 1, e - k - 1);
      const Value* x = mapping->dict->find(key);
      if (!x) fail("KeyError: '" + key + "'", line);
      v = *x;
      have_value = used_mapping = true;
      k = e + 1;
    }
    Spec sp;
    bool left = false;
    for (; k < fmt.size(); ++k) {
      char f = fmt[k];
      if (f == '-') left = true;
      else if (f == '+') sp.sign = '+';
      else if (f == ' ') { if (sp.sign != '+') sp.sign = ' '; }
      else if (f == '#') sp.alt = true;
      else if (f == '0') sp.zero = true;
      else break;
    }
    auto num = [&]() -> int64_t {
      if (k < fmt.size() && fmt[k] == '*') {
        ++k;
        Value w = take();
        if (w.kind != Kind::kInt) fail("* wants int", line);
        if (w.i > kMaxTemplateBuild || w.i < -kMaxTemplateBuild)
          fail("a format width or precision above " + std::to_string(kMaxTemplateBuild), line);
        return w.i;
      }
      int64_t n = -1;
      while (k < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[k]))) {
        n = (n < 0 ? 0 : n) * 10 + (fmt[k++] - '0');
        if (n > kMaxTemplateBuild) fail("a format width or precision above " + std::to_string(kMaxTemplateBuild), line);
      }
      return n;
    };
    sp.width = num();
    if (sp.width < -1) { left = true; sp.width = -sp.width; }
    if (k < fmt.size() && fmt[k] == '.') {
      ++k;
      sp.precision = num();
      if (sp.precision < 0) sp.precision = 0;
    }
    while (k < fmt.size() && (fmt[k] == 'h' || fmt[k] == 'l' || fmt[k] == 'L')) ++k;
    if (k >= fmt.size()) fail("incomplete format", line);
    char type = fmt[k++];
    if (type == '%') { out += '%'; continue; }
    if (!have_value) v = take();
    if (left) { sp.align = '<'; sp.zero = false; }
    std::string piece;
    switch (type) {
      case 's': case 'r': case 'a': {
        std::string s = type == 's' ? to_str(v, line) : repr(v, line);
        if (sp.precision >= 0) s = to_utf8(to_u32(s).substr(0, static_cast<size_t>(sp.precision)));
        Spec ss;
        ss.width = sp.width;
        ss.align = left ? '<' : '>';
        piece = pad("", s, ss, '>');
        break;
      }
      case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
        int64_t n;
        if (v.kind == Kind::kInt) n = v.i;
        else if (v.kind == Kind::kBool) n = v.b;
        else if (v.kind == Kind::kFloat && (type == 'd' || type == 'i' || type == 'u')) n = static_cast<int64_t>(v.f);
        else fail(std::string("%") + type + " format: a real number is required, not " + type_name(v), line);
        Spec is = sp;
        is.type = (type == 'x' || type == 'X' || type == 'o') ? type : 'd';
        is.precision = -1;
        std::string digits = format_int(n < 0 ? -n : n, Spec{.type = is.type}, line);
        if (sp.precision > static_cast<int64_t>(digits.size())) digits.insert(0, sp.precision - digits.size(), '0');
        std::string sign = n < 0 ? "-" : (sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "");
        if (sp.alt && type != 'd' && type != 'i' && type != 'u') sign += type == 'o' ? "0o" : (type == 'x' ? "0x" : "0X");
        piece = pad(sign, digits, is, '>');
        break;
      }
      case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
        double x;
        if (v.kind == Kind::kFloat) x = v.f;
        else if (v.kind == Kind::kInt) x = static_cast<double>(v.i);
        else if (v.kind == Kind::kBool) x = v.b;
        else fail(std::string("must be real number, not ") + type_name(v), line);
        Spec fs = sp;
        fs.type = type;
        if (fs.precision < 0) fs.precision = 6;
        piece = format_float(x, fs, line);
        break;
      }
      case 'c': {
        if (v.kind == Kind::kInt) piece = to_utf8(std::u32string(1, static_cast<char32_t>(v.i)));
        else if (v.kind == Kind::kString && utf8_length(v.s) == 1) piece = v.s;
        else fail("%c requires int or char", line);
        Spec cs;
        cs.width = sp.width;
        cs.align = left ? '<' : '>';
        piece = pad("", piece, cs, '>');
        break;
      }
      default: fail(std::string("unsupported format character '") + type + "'", line);
    }
    out += piece;
  }
  if (!used_mapping && next < pos.size() && !mapping) fail("not all arguments converted during string formatting", line);
  return out;
}

}  // namespace anvil::chat_template_detail
