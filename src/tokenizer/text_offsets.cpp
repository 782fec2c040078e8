#include "tokenizer/text_offsets.h"

#include "tokenizer/byte_level.h"

namespace anvil {

namespace {
size_t count_chars(std::string_view utf8) {
  size_t n = 0;
  for (unsigned char c : utf8) n += (c & 0xC0) != 0x80;
  return n;
}
}  // namespace

size_t TextOffsets::push(int32_t id) {
  const bool skipped = !tok_.token_text(id) || (skip_special_ && tok_.is_special(id));  // not in the text
  if (tok_.decoder().is_byte_level_only()) {
    // An unfinished character already counts: whatever follows, it becomes one (itself or U+FFFD).
    const size_t at = chars_ + (tail_.empty() ? 0 : 1);
    if (skipped) return at;
    tail_ += tok_.token_raw_bytes(id);
    // Lossy decoding of the bytes up to a trailing proper prefix of a scalar is final: no later
    // byte changes it (tokenizer/byte_level.h).
    const size_t done = tok::utf8_complete_prefix(tail_);
    chars_ += count_chars(tok::utf8_lossy(std::string_view(tail_).substr(0, done)));
    tail_.erase(0, done);
    return at;
  }
  // The decode of the tokens so far: what the stream emitted, and what finishing it would add.
  tok::DecodeStream rest(stream_);
  std::string tail;
  rest.finish(tail);
  const size_t at = chars_ + count_chars(tail);
  if (skipped) return at;
  std::string out;
  stream_.push(*tok_.token_text(id), out);
  chars_ += count_chars(out);
  return at;
}

}  // namespace anvil
