// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen2/Qwen3, Llama 3 and
// GPT-2 styles). encode() matches tokenizers' Tokenizer.encode(text, add_special_tokens=False).ids
// exactly; decode() matches tokenizers' decode (ByteLevel decoder, lossy UTF-8).
//
// Pipeline: added tokens (raw text) -> normalizer -> added tokens (normalized) -> pre-tokenizer
// -> BPE per pre-token (cached). Anything in tokenizer.json that this pipeline cannot reproduce
// exactly is rejected at load with an error naming the field.
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
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"

namespace anvil {

class Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path);
  // `label` names the source in error messages (e.g. the file path).
  static Result<std::unique_ptr<Tokenizer>> from_json_text(const std::string& text, const std::string& label);

  // Added/special tokens written in the text are recognized. Invalid UTF-8 in `text` is first
  // replaced by U+FFFD (tokenizers only accepts valid strings). Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids that are not in the vocabulary are skipped, as tokenizers does.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int vocab_size() const { return vocab_size_; }  // max id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // "" for an unknown id
  bool is_special(int32_t id) const;

  // The bytes an id contributes to decoded text (empty for unknown ids); used by StreamDecoder.
  const std::string& token_bytes(int32_t id) const;
  const std::vector<tok::AddedToken>& added_tokens() const { return added_; }

 private:
  Tokenizer() = default;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;  // no raw-text added tokens

  tok::Normalizer normalizer_;
  tok::PreTokenizer pretokenizer_;
  std::unique_ptr<tok::BpeModel> model_;
  std::vector<tok::AddedToken> added_;
  std::unordered_map<std::string, int32_t> added_by_content_;
  tok::AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<std::string> token_bytes_;  // by id
  std::vector<uint8_t> special_;          // by id
  int vocab_size_ = 0;
};

}  // namespace anvil
