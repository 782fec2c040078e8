#include "server/json_mode.h"

#include <algorithm>

namespace anvil::server {

Result<std::shared_ptr<const JsonVocab>> json_vocab(const Tokenizer& tok, int vocab, const std::vector<int32_t>& eos_ids) {
  const std::string refused = "'response_format' json_object needs a tokenizer whose tokens each add known bytes to the text: ";
  if (Status s = tok.decoder().check_exact_token_bytes(); !s.is_ok()) return invalid_argument(refused + s.message());
  // The text is the tokens' bytes joined, less what the decoder cuts at its edges (a whole-text
  // Strip, Metaspace's first token, a null decoder's first separator): JSON stays JSON only when
  // that is whitespace.
  for (const std::string& c : tok.decoder().edge_strip_contents())
    if (c != " " && c != "\t" && c != "\n" && c != "\r")
      return invalid_argument(refused + "the decoder's Strip cuts '" + c + "' from the text's ends, which JSON may need");
  std::vector<std::string> bytes(size_t(std::max(vocab, 0)));
  for (int32_t id = 0; id < vocab && id < tok.vocab_size(); ++id) bytes[size_t(id)] = tok.token_raw_bytes(id);
  for (const tok::AddedToken& a : tok.added_tokens())
    if (a.id >= 0 && a.id < vocab) bytes[size_t(a.id)].clear();
  // The mask is never empty only when every byte is some token's whole bytes (byte-level BPE's
  // alphabet, SentencePiece's byte fallback <0x00>..<0xFF>).
  std::vector<bool> single(256, false);
  for (const std::string& b : bytes)
    if (b.size() == 1) single[static_cast<unsigned char>(b[0])] = true;
  if (auto it = std::find(single.begin(), single.end(), false); it != single.end()) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02X", unsigned(it - single.begin()));
    return invalid_argument(refused + "no token is the single byte " + hex +
                            " (JSON mode needs every byte: a byte-level BPE, or SentencePiece with byte fallback)");
  }
  return JsonVocab::create(bytes, vocab, eos_ids);
}

}  // namespace anvil::server
