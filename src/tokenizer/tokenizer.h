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

  // The bytes one token decodes to, before any UTF-8 repair: a token that holds part of a
  // character gives those bytes (what OpenAI's logprobs "bytes" carry). With a decoder other than
  // ByteLevel alone, decode() of the one id. "" for an id not in the vocabulary.
  std::string token_raw_bytes(int32_t id) const;
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
  std::vector<std::string> token_bytes_;  // by id, only with a ByteLevel-only decoder: its bytes
  std::vector<uint8_t> special_;          // by id
  int vocab_size_ = 0;
};

}  // namespace anvil
