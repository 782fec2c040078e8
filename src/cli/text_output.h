// Text in and out for the CLI: tokenizer, chat template, streaming detokenizer, stop strings and
// the <think> reasoning split, composed in the order tokens flow:
//   id -> StreamDecoder (whole UTF-8 only) -> StopMatcher (holds back a possible stop prefix;
//         the <think>/</think> tags are atomic to it) -> ReasoningShaper (chat only: the split
//         and the Qwen3 newline trimming, as the server does) -> {reasoning, content}
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/reasoning.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::cli {

// Whether DIR's tokenizer_config.json (or chat_template.jinja/.json) carries a chat template: false
// when there is no tokenizer_config.json; an error naming the file when one of them is there but
// unreadable (a link to a missing blob, no permission, not JSON), never a silent "no template".
Result<bool> has_chat_template(const std::string& dir);

class TextOutput {
 public:
  struct Chunk {
    std::string reasoning, content;
  };
  // tokenizer.json and tokenizer_config.json (required for chat; its add_bos_token/add_eos_token
  // apply when present) from `dir`.
  static Result<std::unique_ptr<TextOutput>> open(const std::string& dir, bool chat, bool show_reasoning,
                                                  std::vector<std::string> stops);
  // A raw prompt. add_special_tokens: the tokenizer's post-processor tokens (BOS for Llama 2/3,
  // Mistral), as transformers' tokenizer(text) and llama.cpp add them; not for text that continues
  // a sequence.
  Result<std::vector<int32_t>> encode(const std::string& text, bool add_special_tokens) const;
  // One user turn (plus an optional system message) through the chat template. `thinking` is
  // passed as enable_thinking only when set (--thinking/--no-thinking); unset, the template's own
  // default applies. Also resets the answer stream (begin_answer).
  Result<std::vector<int32_t>> encode_chat(const std::string& system, const std::string& user,
                                           std::optional<bool> thinking);
  // A whole conversation through the chat template; remembers whether the rendered prompt ends
  // inside an opened <think> (DeepSeek-R1, QwQ: the answer then starts with reasoning).
  Result<std::vector<int32_t>> encode_messages(const nlohmann::ordered_json& messages, std::optional<bool> thinking);
  // Resets the per-answer stream state (decoder, stop matcher, reasoning split).
  void begin_answer();
  Chunk push(int32_t id);
  Chunk flush();
  bool stopped() const { return stop_ && stop_->stopped(); }
  // Inside <think> ... </think> (chat only): the text so far is reasoning.
  bool in_reasoning() const { return split_ && split_->in_reasoning(); }
  const Tokenizer& tokenizer() const { return *tok_; }
  const TokenizerConfig& config() const { return cfg_; }

 private:
  Chunk route(const std::string& text);
  std::unique_ptr<Tokenizer> tok_;
  TokenizerConfig cfg_;
  bool chat_ = false;
  bool prompt_opens_reasoning_ = false;
  bool splits_reasoning_ = false;  // the vocabulary has <think> and </think> (the server's rule)
  std::vector<std::string> stops_;
  std::unique_ptr<StreamDecoder> dec_;
  std::unique_ptr<StopMatcher> stop_;
  std::unique_ptr<ReasoningShaper> split_;
};

}  // namespace anvil::cli
