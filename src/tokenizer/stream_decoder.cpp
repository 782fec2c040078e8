#include "tokenizer/stream_decoder.h"

#include "tokenizer/byte_level.h"

namespace anvil {

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  pending_ += tok_.token_bytes(id);
  // Lossy decoding is decided left to right, and only a trailing unfinished scalar depends on
  // bytes not seen yet; everything before it can be emitted now.
  const size_t done = tok::utf8_complete_prefix(pending_);
  std::string out = tok::utf8_lossy(std::string_view(pending_).substr(0, done));
  pending_.erase(0, done);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = tok::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace anvil
