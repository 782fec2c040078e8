#include "tokenizer/text_offsets.h"

#include "tokenizer/byte_level.h"

namespace anvil {

size_t TextOffsets::push(int32_t id) {
  // An unfinished character already counts: whatever follows, it becomes one (itself or U+FFFD).
  const size_t at = chars_ + (tail_.empty() ? 0 : 1);
  if (skip_special_ && tok_.is_special(id)) return at;  // not in the text
  tail_ += tok_.token_raw_bytes(id);
  // Lossy decoding of the bytes up to a trailing proper prefix of a scalar is final: no later
  // byte changes it (tokenizer/byte_level.h).
  const size_t done = tok::utf8_complete_prefix(tail_);
  for (unsigned char c : tok::utf8_lossy(std::string_view(tail_).substr(0, done)))
    if ((c & 0xC0) != 0x80) ++chars_;
  tail_.erase(0, done);
  return at;
}

}  // namespace anvil
