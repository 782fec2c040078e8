#include "tokenizer/stream_decoder.h"

namespace anvil {

std::string StreamDecoder::push(int32_t id) {
  std::string out;
  const std::string* t = tok_.token_text(id);
  if (!t || (skip_special_ && tok_.is_special(id))) return out;  // as decode() skips them
  stream_.push(*t, out);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  stream_.finish(out);
  return out;
}

}  // namespace anvil
