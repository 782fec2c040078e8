// Character classes and case mapping as the Rust standard library defines them, which is what
// tokenizers' normalizers and pre-tokenizers call (char::is_whitespace, is_alphanumeric,
// is_numeric, to_lowercase; unicode_categories' is_punctuation). Backed by utf8proc's tables
// (Debian's 2.8.0: Unicode 15.0). is_alnum_cp and is_numeric_cp follow the Rust standard library of
// tokenizers 0.23.3 (Unicode 17.0) through a generated table of what changed category since 15.0.
// Not matched (docs/architecture.md): append_lowercase lacks the case pairs new in 16.0 and 17.0
// (utf8proc has no newer data, and the script has no case-mapping source to draw from), and
// is_punctuation_cp is Unicode 15.0 where tokenizers' unicode_categories crate is Unicode 8.0.
#pragma once
#include <cstdint>
#include <string>

namespace anvil::tok {

bool is_whitespace_cp(uint32_t c);   // Rust char::is_whitespace (the White_Space property)
bool is_alnum_cp(uint32_t c);        // Rust char::is_alphanumeric
bool is_numeric_cp(uint32_t c);      // Rust char::is_numeric: general category Nd, Nl or No
bool is_punctuation_cp(uint32_t c);  // tokenizers' is_punc: ASCII punctuation or category P*
// Appends Rust's char::to_lowercase(c): the full lowercase mapping (U+0130 becomes two scalars).
void append_lowercase(std::string& out, uint32_t c);

}  // namespace anvil::tok
