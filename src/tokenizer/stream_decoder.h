// Incremental detokenization for streaming output. Invariant: the concatenation of every push()
// result and the final flush() equals Tokenizer::decode(all ids) byte for byte, and every returned
// chunk is valid UTF-8. Text is held back only while a later token can still change it (a UTF-8
// scalar split across byte-level tokens, a run of byte-fallback tokens, trailing characters a
// Strip decoder may remove: see decoder.h); bytes that can never complete become U+FFFD exactly
// where decode() puts them.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"

namespace anvil {

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special), stream_(tok.decoder()) {}
  std::string push(int32_t id);  // the newly final text (possibly empty)
  std::string flush();           // whatever is held back; resets the decoder (the next id starts a new text)

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  tok::DecodeStream stream_;
};

}  // namespace anvil
