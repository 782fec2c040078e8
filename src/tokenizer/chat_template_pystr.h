// Python str semantics for the chat-template engine: Unicode case mapping and character classes
// (utf8proc, plus the SpecialCasing expansions Python applies: "ß".upper() == "SS"), str.format()
// with the format-spec mini-language, and printf-style "%" formatting. Strings are UTF-8;
// lengths, widths and indices count code points, as Python does.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/chat_template_internal.h"

namespace anvil::chat_template_detail {

std::u32string to_u32(const std::string& s);
std::string to_utf8(const std::u32string& s);
bool py_isspace(char32_t c);  // str.isspace()/str.split(): Unicode whitespace
bool py_isprintable(char32_t c);  // str.isprintable(): what repr() shows as is rather than escaped

// int(s, base) and float(s) for a str, as Python parses them: surrounding Unicode whitespace,
// Unicode decimal digits, '_' between digits, 0x/0o/0b prefixes (int with base 0, 16, 8, 2),
// inf/nan (float). False when Python raises ValueError. An int past 64 bits sets *overflow (Python
// would give a big integer, which the engine cannot hold).
bool py_parse_int(const std::string& s, int64_t base, int64_t* out, bool* overflow);
bool py_parse_float(const std::string& s, double* out);
// round(x, ndigits) for a float: correctly rounded to ndigits decimals, ties to even, like CPython.
double py_round_float(double x, int64_t ndigits);

std::string py_upper(const std::string& s);
std::string py_lower(const std::string& s);
std::string py_swapcase(const std::string& s);
std::string py_title(const std::string& s);       // str.title()
std::string py_capitalize(const std::string& s);  // str.capitalize()
std::string py_casefold(const std::string& s);
// str.strip/lstrip/rstrip: `chars` null means whitespace.
std::string py_strip(const std::string& s, const std::string* chars, bool left, bool right);

// format(value, spec) as Python's built-in format() does for str/int/float/bool; other types
// accept only an empty spec (their str()).
std::string format_value(const Value& v, const std::string& spec, int line);
// "...".format(*args, **kwargs) as jinja2's SandboxedFormatter runs it.
std::string str_format(const std::string& fmt, const Args& args, int line);
// fmt % arg (arg: a tuple of positional values, a dict for %(name)s, or one value).
std::string percent_format(const std::string& fmt, const Value& arg, int line);

}  // namespace anvil::chat_template_detail
