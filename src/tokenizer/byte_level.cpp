#include "tokenizer/byte_level.h"

#include <vector>

namespace anvil::tok {

namespace {

// GPT-2's table: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves; the other
// 68 bytes, in increasing order, map to 256, 257, ... so that no byte maps to whitespace/control.
std::array<uint32_t, 256> make_byte_table() {
  std::array<uint32_t, 256> t{};
  auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) t[b] = printable(b) ? uint32_t(b) : next++;
  return t;
}

std::vector<int16_t> make_inverse() {
  std::vector<int16_t> inv(512, -1);  // every code point in the table is < 256 + 68
  const auto& t = byte_to_codepoint();
  for (int b = 0; b < 256; ++b) inv[t[b]] = int16_t(b);
  return inv;
}

}  // namespace

const std::array<uint32_t, 256>& byte_to_codepoint() {
  static const std::array<uint32_t, 256> table = make_byte_table();
  return table;
}

int codepoint_to_byte(uint32_t cp) {
  static const std::vector<int16_t> inv = make_inverse();
  return cp < inv.size() ? inv[cp] : -1;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Number of bytes of s[i..] that form a valid prefix of a UTF-8 scalar (Unicode Table 3-7), and
// the full length that the lead byte announces. valid == need means a complete scalar; valid == 0
// means s[i] cannot start a scalar.
struct Utf8Probe {
  size_t valid, need;
};

Utf8Probe probe(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return uint8_t(s[i + k]); };
  const size_t avail = s.size() - i;
  const uint8_t c = b(0);
  if (c < 0x80) return {1, 1};
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {0, 1};
  }
  size_t k = 1;
  if (k < avail) {
    if (b(1) < lo || b(1) > hi) return {1, need};
    ++k;
    while (k < need && k < avail) {
      if (b(k) < 0x80 || b(k) > 0xBF) return {k, need};
      ++k;
    }
  }
  return {k, need};
}

}  // namespace

size_t utf8_decode_one(std::string_view s, size_t i, uint32_t* cp) {
  const Utf8Probe p = probe(s, i);
  if (p.valid == 0 || p.valid != p.need) return 0;
  const uint8_t c = uint8_t(s[i]);
  uint32_t v = p.need == 1 ? c : p.need == 2 ? (c & 0x1F) : p.need == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < p.need; ++k) v = (v << 6) | (uint8_t(s[i + k]) & 0x3F);
  *cp = v;
  return p.need;
}

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    const size_t n = utf8_decode_one(token, i, &cp);
    if (n == 0) return std::nullopt;
    const int b = codepoint_to_byte(cp);
    if (b < 0) return std::nullopt;
    out.push_back(char(b));
    i += n;
  }
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Probe p = probe(bytes, i);
    if (p.valid != 0 && p.valid == p.need) {
      out.append(bytes.substr(i, p.need));
      i += p.need;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD for the maximal invalid subpart
      i += p.valid == 0 ? 1 : p.valid;
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view bytes) {
  // Only the last <= 3 bytes can be an unfinished scalar.
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    const uint8_t c = uint8_t(bytes[i]);
    if (c < 0x80) return n;
    if (c >= 0xC0) {  // a lead byte: is bytes[i..] a proper prefix of a valid scalar?
      const Utf8Probe p = probe(bytes, i);
      return (p.valid == back && p.valid < p.need) ? i : n;
    }
  }
  return n;
}

bool is_valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Probe p = probe(s, i);
    if (p.valid == 0 || p.valid != p.need) return false;
    i += p.need;
  }
  return true;
}

}  // namespace anvil::tok
