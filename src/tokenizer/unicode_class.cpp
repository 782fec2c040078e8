#include "tokenizer/unicode_class.h"

#include <utf8proc.h>

#include <algorithm>
#include <iterator>

#include "tokenizer/byte_level.h"

namespace anvil::tok {
namespace {

#include "tokenizer/unicode_rust.inc"

// The general category as the Rust standard library in tokenizers has it (Unicode 17.0): the
// Debian utf8proc's (Unicode 15.0), except where it changed since (unicode_rust.inc).
utf8proc_category_t rust_category(uint32_t c) {
  // utf8proc's category enum, in order.
  static constexpr const char* kNames[] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd",
                                           "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm",
                                           "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co"};
  const auto* end = std::end(kUnicodeRustDelta);
  const auto* it = std::upper_bound(std::begin(kUnicodeRustDelta), end, c,
                                    [](uint32_t x, const UnicodeRustRange& r) { return x < r.first; });
  if (it != std::begin(kUnicodeRustDelta) && c <= (it - 1)->last) {
    const char* gc = (it - 1)->gc;
    for (int i = 0; i < int(std::size(kNames)); ++i)
      if (kNames[i][0] == gc[0] && kNames[i][1] == gc[1]) return utf8proc_category_t(i);
  }
  return utf8proc_category(utf8proc_int32_t(c));
}

}  // namespace

bool is_whitespace_cp(uint32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0D) || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_alnum_cp(uint32_t c) {
  switch (rust_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_numeric_cp(uint32_t c) {
  switch (rust_category(c)) {
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_punctuation_cp(uint32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
  switch (utf8proc_category(utf8proc_int32_t(c))) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

void append_lowercase(std::string& out, uint32_t c) {
  if (c == 0x130) {  // the one unconditional multi-scalar lowercase mapping (SpecialCasing.txt)
    out += "i\xCC\x87";
    return;
  }
  append_utf8(out, uint32_t(utf8proc_tolower(utf8proc_int32_t(c))));
}

}  // namespace anvil::tok
