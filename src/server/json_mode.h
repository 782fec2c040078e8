// JSON mode's vocabulary for a served model: each token's bytes as the reply's text holds them
// (runtime/json_mask.h builds the trie the token mask walks).
#pragma once
#include <memory>
#include <vector>

#include "base/status.h"
#include "runtime/json_mask.h"
#include "tokenizer/tokenizer.h"

namespace anvil::server {

// The tokens of `tok` below `vocab` (the model's vocabulary) with their bytes (token_raw_bytes: what
// each adds to the text); added tokens (special or not: <think>, <tool_call>, the chat markup) are
// never allowed inside the JSON. The reply's text is then its tokens' bytes joined, less what the
// decoder cuts at the text's edges (a SentencePiece reply's first space): still JSON when that is
// whitespace. Refused, with an error naming why: a decoder whose tokens' bytes depend on their
// neighbours (Decoder::check_exact_token_bytes), a whole-text Strip of anything but whitespace, a
// byte that is no token's (a mask could be empty). eos_ids: the ids that may end the reply.
Result<std::shared_ptr<const JsonVocab>> json_vocab(const Tokenizer& tok, int vocab, const std::vector<int32_t>& eos_ids);

}  // namespace anvil::server
