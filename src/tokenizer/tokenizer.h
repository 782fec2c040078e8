// A BPE tokenizer loaded from a Hugging Face tokenizer.json: byte-level BPE (Qwen2/Qwen3, Llama 3,
// GPT-2, DeepSeek) and SentencePiece-style BPE (Llama 2, Mistral, Mixtral: Metaspace or
// Prepend+Replace, byte fallback). encode() matches tokenizers' Tokenizer.encode(text,
// add_special_tokens).ids exactly; decode() matches tokenizers' decode.
//
// Pipeline: added tokens (raw text) -> normalizer (per piece) -> added tokens (normalized) ->
// pre-tokenizer -> BPE per pre-token (cached); decoding: ids -> token strings -> decoder
// (decoder.h); with add_special_tokens, the post-processor adds BOS/EOS (post_processor.h). The BPE alphabet is bytes when the pre-tokenizer has a ByteLevel step, else
// Unicode scalars (bpe.h). Anything in tokenizer.json that this pipeline cannot reproduce exactly
// is rejected at load with an error naming the field.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pretokenizer.h"

namespace anvil {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path);
  // `label` names the source in error messages (e.g. the file path).
  static Result<std::unique_ptr<Tokenizer>> from_json_text(const std::string& text, const std::string& label);

  // Added/special tokens written in the text are recognized. Invalid UTF-8 in `text` is first
  // replaced by U+FFFD (tokenizers only accepts valid strings). Thread-safe.
  // add_special_tokens: the post-processor's tokens too (BOS for Llama/Mistral), as for a raw
  // prompt; a chat-template-rendered prompt already holds them and is encoded without
  // (transformers' apply_chat_template does the same).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Ids that are not in the vocabulary are skipped, as tokenizers does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int vocab_size() const { return vocab_size_; }  // max id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  bool is_special(int32_t id) const;

  // The bytes token `id` adds to a decoded text where it is not the text's first token, before
  // any UTF-8 repair (OpenAI's logprobs "bytes"; JSON mode's view of a token): the decoder's
  // per-token steps applied to it alone (tok::Decoder::token_bytes). So a byte-level token gives
  // its bytes, a byte-fallback token "<0xE4>" the byte 0xE4 (decode() of it alone: U+FFFD), a
  // SentencePiece "▁Hello" " Hello" (decode() of it alone: "Hello", the text's first space being
  // stripped), an added or special token its content. "" for an id not in the vocabulary.
  //
  // Invariant (tests/tokenizer/token_bytes_test.cpp, against Hugging Face tokenizers' decode on
  // every decoder layout): for any ids (and with skip_special, on both sides),
  //   decode(ids) == utf8_lossy(join_raw_bytes(ids)),
  // where join_raw_bytes(ids) is concat(token_raw_bytes(ids[i])) with only the decoder's text-edge
  // rules applied, which only ever delete: the first token's spaces from "▁" (Metaspace with
  // prepend_scheme first/always) or its separator space (a null decoder), then up to `start`
  // leading and `stop` trailing `content` characters (a Strip after Fuse/ByteLevel: Llama 2 and
  // Mistral cut one leading space). So the text is the tokens' bytes joined, less a space at its
  // start. It holds for every decoder that passes Decoder::check_exact_token_bytes(), except for
  // lossy repair (ByteFallback turns each byte of a byte-token run that is not valid UTF-8 into
  // U+FFFD, utf8_lossy each maximal invalid sequence) and a byte-token run that spells a character
  // a later step rewrites (the bytes of "▁" before Metaspace; no encoding produces it).
  std::string token_raw_bytes(int32_t id) const;
  // The tokens' bytes joined as decode() joins them, before UTF-8 repair (see token_raw_bytes).
  std::string join_raw_bytes(std::span<const int32_t> ids, bool skip_special = false) const;
  // The token string of an id as tokenizers' decode sees it (added token content, else the vocab
  // entry); nullptr for an id that is not in the vocabulary.
  const std::string* token_text(int32_t id) const;
  const tok::Decoder& decoder() const { return decoder_; }
  const std::vector<tok::AddedToken>& added_tokens() const { return added_; }
  // tokenizer.json's post_processor, or the one set below.
  const tok::PostProcessor& post_processor() const { return post_; }
  // transformers' override from tokenizer_config.json's add_bos_token/add_eos_token (see
  // tokenizer_config.h: apply_special_token_flags). Not thread-safe: call before sharing.
  void set_post_processor(tok::PostProcessor p) { post_ = std::move(p); }
  bool has_json_post_processor() const { return has_json_post_; }

 private:
  Tokenizer() = default;
  std::vector<int32_t> encode_text(std::string_view text) const;  // add_special_tokens=False
  // `text` has no raw-text added tokens; `at_origin`: it starts at offset 0 of encode()'s input.
  void encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& out) const;

  tok::Normalizer normalizer_;
  tok::PreTokenizer pretokenizer_;
  tok::Decoder decoder_;
  tok::PostProcessor post_;
  bool has_json_post_ = false;  // tokenizer.json's "post_processor" is not null
  std::unique_ptr<tok::BpeModel> model_;
  std::vector<tok::AddedToken> added_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  tok::AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> token_text_;   // by id: what decode() sees
  std::vector<uint8_t> known_;            // by id: 1 when the id is in the vocabulary
  std::vector<std::string> token_bytes_;  // by id: token_raw_bytes
  bool byte_level_only_ = false;          // decode() is the lossy UTF-8 of the tokens' bytes joined
  std::vector<uint8_t> special_;          // by id
  int vocab_size_ = 0;
};

}  // namespace anvil
