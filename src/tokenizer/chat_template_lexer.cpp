// Lexer for the chat-template Jinja subset. It follows jinja2's lexer rules for the settings
// transformers uses (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//  - line endings \r\n and \r become \n, and one trailing newline of the source is dropped;
//  - "{%-"/"{{-"/"{#-" strip all whitespace before the tag, "-%}"/"-}}"/"-#}" all after it;
//  - trim_blocks: a single "\n" right after "%}" or "#}" is dropped;
//  - lstrip_blocks: spaces/tabs between a line start and "{%"/"{#" are dropped ("{%+" keeps them);
//  - inside a tag, "}}"/"%}" only end it when (), [] and {} are balanced.
#include <cctype>
#include <string>
#include <vector>

#include "tokenizer/chat_template_internal.h"

namespace anvil::chat_template_detail {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string normalize_newlines(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Python's "unicode-escape" decoding of a string literal body.
std::string decode_string_literal(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    auto hex = [&](int n) -> uint32_t {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        if (i + 1 >= body.size() || !std::isxdigit(static_cast<unsigned char>(body[i + 1])))
          fail("bad escape in string literal", line);
        char h = body[++i];
        v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '\n': break;  // line continuation
      case 'x': append_utf8(out, hex(2)); break;
      case 'u': append_utf8(out, hex(4)); break;
      case 'U': append_utf8(out, hex(8)); break;
      case 'N': {
        // \N{NAME}: Python looks the character up in the Unicode name database, which we do
        // not carry. Refused by name, never left in the text as if it were literal.
        size_t close = body.find('}', i);
        if (i + 1 >= body.size() || body[i + 1] != '{' || close == std::string::npos)
          fail("malformed \\N character escape in string literal", line);
        fail("unsupported construct: the string escape \\" + body.substr(i, close + 1 - i) +
                 " (Unicode character names are not supported; write the character itself or \\uXXXX)",
             line);
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + (body[++i] - '0');
          append_utf8(out, v);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_newlines(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_root();
    out_.push_back({Tok::kEof, "", line_});
    return std::move(out_);
  }

 private:
  void emit(Tok t, std::string text, int line) { out_.push_back({t, std::move(text), line}); }

  void lex_root() {
    // Next tag opener.
    size_t open = std::string::npos;
    for (size_t p = src_.find('{', pos_); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        open = p;
        break;
      }
    }
    if (open == std::string::npos) {
      std::string text = src_.substr(pos_);
      emit(Tok::kText, text, line_);
      count_lines(text);
      pos_ = src_.size();
      return;
    }
    char kind = src_[open + 1];
    char sign = open + 2 < src_.size() ? src_[open + 2] : '\0';
    std::string text = src_.substr(pos_, open - pos_);
    int text_line = line_;
    count_lines(text);
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      text.resize(end);
    } else if (sign != '+' && kind != '{') {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if (l_pos > 0 || line_starting_) {
        bool all_ws = l_pos < text.size();
        for (size_t k = l_pos; k < text.size(); ++k)
          if (text[k] != ' ' && text[k] != '\t' && text[k] != '\f' && text[k] != '\v') all_ws = false;
        if (all_ws) text.resize(l_pos);
      }
    }
    if (!text.empty()) emit(Tok::kText, text, text_line);
    pos_ = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    line_starting_ = false;
    if (kind == '#') {
      lex_comment();
    } else if (kind == '%' && lex_raw()) {
      return;
    } else {
      lex_tag(kind == '{');
    }
  }

  void count_lines(const std::string& s) {
    for (char c : s) line_ += c == '\n';
  }

  void lex_comment() {
    int start_line = line_;
    size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) fail("unclosed comment (missing '#}')", start_line);
    char sign = close > pos_ ? src_[close - 1] : '\0';
    count_lines(src_.substr(pos_, close - pos_));
    size_t end = close + 2;
    after_tag_end(end, sign == '-', sign == '+', /*trim_newline=*/true);
  }

  // "{% raw %}...{% endraw %}" (pos_ just after "{%" and its sign): the body is text, verbatim.
  // As in jinja2's lexer: "raw -%}" strips the body's leading whitespace but a plain "raw %}" does
  // not trim the newline after it; "{%- endraw" strips the body's trailing whitespace, otherwise
  // lstrip_blocks applies to the endraw line; the newline after "endraw %}" is trimmed.
  bool lex_raw() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p + 3])) || src_[p + 3] == '_')))
      return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    bool strip_after_open = false;
    if (src_.compare(p, 3, "-%}") == 0) {
      strip_after_open = true;
      p += 3;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      fail("expected '%}' after 'raw'", line_);
    }
    count_lines(src_.substr(pos_, p - pos_));
    if (strip_after_open)
      while (p < src_.size() && is_space(src_[p])) line_ += src_[p++] == '\n';
    // Find "{%[-+]?\s*endraw\s*[-+]?%}".
    for (size_t q = src_.find("{%", p); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      char sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) sign = src_[r++];
      while (r < src_.size() && is_space(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && is_space(src_[r])) ++r;
      char end_sign = '\0';
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) end_sign = src_[r++];
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string body = src_.substr(p, q - p);
      int body_line = line_;
      count_lines(body);
      if (sign == '-') {
        while (!body.empty() && is_space(body.back())) body.pop_back();
      } else if (sign != '+') {
        size_t l_pos = body.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        bool all_ws = body.find_first_not_of(" \t\f\v", l_pos) == std::string::npos;
        if (l_pos > 0 && all_ws) body.resize(l_pos);
      }
      if (!body.empty()) emit(Tok::kText, body, body_line);
      count_lines(src_.substr(q, r + 2 - q));
      after_tag_end(r + 2, end_sign == '-', end_sign == '+', /*trim_newline=*/true);
      return true;
    }
    fail("unclosed '{% raw %}' (missing '{% endraw %}')", line_);
  }

  // Consumes what follows a tag's closing delimiter at `end` and updates line_starting_.
  void after_tag_end(size_t end, bool strip_ws, bool keep, bool trim_newline) {
    if (strip_ws) {
      while (end < src_.size() && is_space(src_[end])) {
        line_ += src_[end] == '\n';
        ++end;
      }
    } else if (!keep && trim_newline && end < src_.size() && src_[end] == '\n') {
      ++line_;
      ++end;
    }
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    pos_ = end;
  }

  void lex_tag(bool variable) {
    int start_line = line_;
    emit(variable ? Tok::kVarBegin : Tok::kBlockBegin, "", line_);
    std::vector<char> balance;
    const char closer = variable ? '}' : '%';
    while (true) {
      if (pos_ >= src_.size())
        fail(std::string("unclosed ") + (variable ? "'{{' (missing '}}')" : "'{%' (missing '%}')"), start_line);
      char c = src_[pos_];
      if (balance.empty()) {
        // End rule: "-%}" / "+%}" / "%}" (or the "}}" forms).
        size_t p = pos_;
        char sign = '\0';
        if ((c == '-' || c == '+') && p + 2 < src_.size() && src_[p + 1] == closer && src_[p + 2] == '}') {
          sign = c;
          ++p;
        }
        if (p + 1 < src_.size() && src_[p] == closer && src_[p + 1] == '}' && (sign != '+' || !variable)) {
          emit(variable ? Tok::kVarEnd : Tok::kBlockEnd, "", line_);
          after_tag_end(p + 2, sign == '-', sign == '+', /*trim_newline=*/!variable);
          return;
        }
      }
      if (is_space(c)) {
        line_ += c == '\n';
        ++pos_;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t b = pos_;
        while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
        emit(Tok::kName, src_.substr(b, pos_ - b), line_);
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t b = pos_ + 1, p = b;
        while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
        if (p >= src_.size()) fail("unterminated string literal", line_);
        std::string body = src_.substr(b, p - b);
        emit(Tok::kString, decode_string_literal(body, line_), line_);
        count_lines(body);
        pos_ = p + 1;
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                   "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
      bool matched = false;
      for (const char* op : kOps) {
        size_t n = std::char_traits<char>::length(op);
        if (src_.compare(pos_, n, op) == 0) {
          std::string o(op);
          if (o == "{" || o == "(" || o == "[") {
            balance.push_back(o == "{" ? '}' : o == "(" ? ')' : ']');
          } else if (o == "}" || o == ")" || o == "]") {
            if (balance.empty()) fail("unexpected '" + o + "'", line_);
            if (balance.back() != o[0])
              fail("unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'", line_);
            balance.pop_back();
          }
          emit(Tok::kOp, o, line_);
          pos_ += n;
          matched = true;
          break;
        }
      }
      if (!matched) fail(std::string("unexpected character '") + c + "' inside a tag", line_);
    }
  }

  void lex_number() {
    size_t b = pos_;
    // 0x1f, 0o17, 0b101: jinja2's prefixed integer literals ('_' may separate digits).
    if (src_[pos_] == '0' && pos_ + 2 < src_.size()) {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos_ + 1])));
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      auto digit = [&](size_t k) {
        if (k >= src_.size()) return 99;
        const unsigned char c = static_cast<unsigned char>(src_[k]);
        const int d = std::isdigit(c) ? c - '0' : std::isalpha(c) ? std::tolower(c) - 'a' + 10 : 99;
        return d < base ? d : 99;
      };
      const size_t first = pos_ + 2 + (src_[pos_ + 2] == '_');
      if (base && digit(first) != 99) {
        int64_t v = 0;
        bool overflow = false;
        for (pos_ = first; digit(pos_) != 99 || (src_[pos_] == '_' && digit(pos_ + 1) != 99); ++pos_)
          if (src_[pos_] != '_') overflow |= __builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, digit(pos_), &v);
        if (overflow) fail("number literal out of range: " + src_.substr(b, pos_ - b), line_);
        emit(Tok::kInt, std::to_string(v), line_);
        return;
      }
    }
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    bool after_dot = b > 0 && src_[b - 1] == '.';  // "x.0.1" is attribute access, not a float
    if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      ++pos_;
      digits();
      is_float = true;
    }
    if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        pos_ = p;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = b; k < pos_; ++k)
      if (src_[k] != '_') text += src_[k];
    emit(is_float ? Tok::kFloat : Tok::kInt, text, line_);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

void fail(const std::string& what, int line) {
  throw TemplateError{"chat template: " + what + (line > 0 ? " at line " + std::to_string(line) : "")};
}

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace anvil::chat_template_detail
