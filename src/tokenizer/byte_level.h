// Byte-level helpers shared by the BPE tokenizer and the stream decoder: the GPT-2 byte <-> unicode
// table (every byte gets a printable code point so vocab entries are valid strings) and UTF-8 utilities,
// including the lossy decoding that Hugging Face tokenizers applies when decoding (Rust's
// String::from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace anvil::tok {

// byte_to_codepoint()[b] is the code point that byte b is written as in a byte-level vocab.
const std::array<uint32_t, 256>& byte_to_codepoint();
// The inverse: -1 for code points that are not in the table.
int codepoint_to_byte(uint32_t cp);

// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, uint32_t cp);

// Decodes one UTF-8 scalar at s[i]; returns its length in bytes, or 0 if s[i..] does not start with a
// complete valid sequence. On success *cp holds the code point.
size_t utf8_decode_one(std::string_view s, size_t i, uint32_t* cp);

// Converts a byte-level vocab string ("Ġhello") back to raw bytes (" hello"); nullopt when a
// character is outside the byte table (e.g. an added token's literal text).
std::optional<std::string> byte_level_to_bytes(std::string_view token);

// Lossy UTF-8 decoding identical to Rust's String::from_utf8_lossy.
std::string utf8_lossy(std::string_view bytes);

// Length of the longest prefix of `bytes` that lossy decoding can finish without seeing more
// bytes: everything except a trailing sequence that is a proper prefix of a valid UTF-8 scalar.
size_t utf8_complete_prefix(std::string_view bytes);

bool is_valid_utf8(std::string_view s);

}  // namespace anvil::tok
