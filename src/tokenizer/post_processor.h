// tokenizer.json's "post_processor" for ONE sequence: the special tokens that tokenizers'
// encode(text, add_special_tokens=True) puts around the ids (BOS for Llama 2/3, Mistral, Mixtral;
// <s> ... </s> for RoBERTa-style files). Offsets, type ids and pair templates do not exist here:
// anvil encodes single prompts only.
//
// Supported, as tokenizers 0.23 applies them to a single sequence:
//   TemplateProcessing  its "single" template: SpecialToken pieces (each may stand for several ids,
//                       from "special_tokens") around the $A sequence, which must appear once
//   BertProcessing      cls $A sep
//   RobertaProcessing   cls $A sep (add_prefix_space/trim_offsets only change offsets)
//   ByteLevel           nothing (offsets only): Qwen2/Qwen3, GPT-2
//   Sequence            its processors in turn; at most one of them may add tokens (tokenizers
//                       passes a template's output on as separate pieces, which a second
//                       template would treat as a pair: refused)
// Any other type is refused at load, naming it.
//
// transformers (5.x, TokenizersBackend) replaces this processor with "[bos] $A [eos]" built from
// tokenizer_config.json's add_bos_token/add_eos_token when the config sets either flag or the
// tokenizer.json has none: from_flags() is that processor.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace anvil::tok {

class PostProcessor {
 public:
  // `j`: the "post_processor" value (null: none). Every special-token id must be < vocab_size.
  static Result<PostProcessor> from_json(const nlohmann::json& j, int vocab_size);
  // "[bos] $A [eos]": each token present only when given.
  static PostProcessor from_flags(std::optional<int32_t> bos, std::optional<int32_t> eos);

  // ids -> the post-processed ids (add_special_tokens=True).
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;
  // True when apply() can change the ids (some step adds a token).
  bool adds_tokens() const;

 private:
  // One step's output: pieces in order; a piece is either the sequence ($A) or literal ids.
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  using Step = std::vector<Piece>;
  std::vector<Step> steps_;  // empty: the identity
};

}  // namespace anvil::tok
