// Where each token of a generated text starts in it, in characters (Unicode scalars), as the legacy
// completions `text_offset` reports: the offset of token i is the length in characters of the
// decode of the tokens before it (Tokenizer::decode, the text StreamDecoder streams: special tokens
// skipped when it skips them). With a byte-level decoder that is the characters of the text whose
// first byte comes before the token (a character split across tokens counts where it starts; every
// invalid byte sequence is one U+FFFD, a lone continuation byte too, as from_utf8_lossy decodes).
// With other decoders (SentencePiece-style: Replace, ByteFallback, Fuse, Strip) it is the decode of
// the prefix as such, so a word's leading space counts where decode puts it, and inside a run of
// byte-fallback tokens that does not form a character yet each byte counts as the U+FFFD decode
// gives it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/decoder.h"
#include "tokenizer/tokenizer.h"

namespace anvil {

class TextOffsets {
 public:
  explicit TextOffsets(const Tokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special), stream_(tok.decoder()) {}
  // The offset of `id` (characters before it), then takes it in.
  size_t push(int32_t id);

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  size_t chars_ = 0;  // characters of the text final so far (byte-level: up to tail_)
  std::string tail_;  // byte-level: trailing bytes that may still complete a character
  tok::DecodeStream stream_;  // other decoders: the decoding so far
};

}  // namespace anvil
