// Where each token of a generated text starts in it, in characters (Unicode scalars), as the legacy
// completions `text_offset` reports: the characters of the decoded text before the token, a
// character counted at the token holding its first byte. The text is what StreamDecoder (and
// Tokenizer::decode) makes of the same ids, so the offsets follow its rules: special tokens are
// skipped when it skips them, and every invalid byte sequence is one U+FFFD, one character (a lone
// continuation byte too), as from_utf8_lossy decodes. So the offset of token i is the length of
// decode(ids[0, i)) in characters: a character split across tokens counts where it starts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace anvil {

class TextOffsets {
 public:
  explicit TextOffsets(const Tokenizer& tok, bool skip_special = false) : tok_(tok), skip_special_(skip_special) {}
  // The offset of `id` (characters before it), then takes its bytes in.
  size_t push(int32_t id);

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  size_t chars_ = 0;  // characters of the text up to tail_
  std::string tail_;  // trailing bytes that may still complete a character (a proper prefix of one)
};

}  // namespace anvil
