// Character classes and case mapping as the Rust standard library defines them, which is what
// tokenizers' normalizers and pre-tokenizers call (char::is_whitespace, is_alphanumeric,
// is_numeric, to_lowercase; unicode_categories' is_punctuation). Backed by utf8proc's tables.
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
