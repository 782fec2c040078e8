// JSON mode's vocabulary for a served model: each token's bytes as the reply's text holds them
// (runtime/json_mask.h builds the trie the token mask walks).
#pragma once
#include <memory>
#include <vector>

#include "base/status.h"
#include "runtime/json_mask.h"
#include "tokenizer/tokenizer.h"

namespace anvil::server {

// The tokens of `tok` below `vocab` (the model's vocabulary) with their bytes; added tokens (special
// or not: <think>, <tool_call>, the chat markup) are never allowed inside the JSON. Needs a decoder
// that is ByteLevel alone (Qwen, Llama 3, GPT-2 style), where a reply's text is exactly its tokens'
// bytes joined; other decoders (SentencePiece's Metaspace, byte fallback) change a token's text by
// its neighbours and are refused with an error saying so. eos_ids: the ids that may end the reply.
Result<std::shared_ptr<const JsonVocab>> json_vocab(const Tokenizer& tok, int vocab, const std::vector<int32_t>& eos_ids);

}  // namespace anvil::server
