#include "server/json_mode.h"

namespace anvil::server {

Result<std::shared_ptr<const JsonVocab>> json_vocab(const Tokenizer& tok, int vocab, const std::vector<int32_t>& eos_ids) {
  if (!tok.decoder().is_byte_level_only())
    return invalid_argument("'response_format' json_object needs a byte-level BPE tokenizer (a tokenizer.json decoder "
                            "that is ByteLevel alone, as Qwen's and Llama 3's); this model's decoder is not");
  std::vector<std::string> bytes(size_t(std::max(vocab, 0)));
  for (int32_t id = 0; id < vocab && id < tok.vocab_size(); ++id) bytes[size_t(id)] = tok.token_raw_bytes(id);
  for (const tok::AddedToken& a : tok.added_tokens())
    if (a.id >= 0 && a.id < vocab) bytes[size_t(a.id)].clear();
  return JsonVocab::create(bytes, vocab, eos_ids);
}

}  // namespace anvil::server
