// Incremental detokenization for streaming output. Invariant: the concatenation of every push()
// result and the final flush() equals Tokenizer::decode(all ids) byte for byte, and every returned
// chunk is valid UTF-8 (a scalar split across tokens is held back until it completes; bytes that
// can never complete become U+FFFD exactly where decode() puts them).
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace anvil {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false) : tok_(tok), skip_special_(skip_special) {}
  std::string push(int32_t id);  // the newly complete text (possibly empty)
  std::string flush();           // whatever is held back, lossily decoded; resets the decoder

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: a proper prefix of one UTF-8 scalar, at most 3 bytes
};

}  // namespace anvil
