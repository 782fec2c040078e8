// tokenizer_config.json (plus chat_template.jinja / chat_template.json) and applying the chat
// template the way transformers' apply_chat_template(tokenize=False) does.
#pragma once
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace anvil {

class Tokenizer;

struct TokenizerConfig {
  std::string chat_template;  // empty: the model has none
  std::map<std::string, std::string> named_chat_templates;  // list-form templates by name ("default", "tool_use")
  // Special tokens; has_* is false when the config has none (null/absent), so the template sees
  // them as undefined exactly like transformers' special_tokens_map omits them.
  std::string bos_token, eos_token, pad_token, unk_token;
  bool has_bos_token = false, has_eos_token = false, has_pad_token = false, has_unk_token = false;
  bool add_bos_token = false, add_eos_token = false;  // null or absent: false
  std::string config_path;  // tokenizer_config.json (for error messages)
  std::string source;  // the file the chat template came from (for error messages)
};

// Reads DIR/tokenizer_config.json. The chat template is taken, in priority order, from
// DIR/chat_template.jinja, DIR/chat_template.json ({"chat_template": ...}), then the config's
// "chat_template" (a string, or a list of {name, template}).
Result<TokenizerConfig> load_tokenizer_config(const std::string& dir);

// The special tokens a raw prompt gets (Tokenizer::encode with add_special_tokens): tokenizer.json's
// post_processor when it has one (the config's flags are then ignored, as transformers 5.x does);
// else "[bos_token] $A [eos_token]" from add_bos_token/add_eos_token (absent: false), as 4.x's
// LlamaTokenizerFast and llama.cpp's converter do (5.x adds nothing there). A flag whose token is
// null adds nothing; one whose token is not in the vocabulary is an error.
Status apply_special_token_flags(const TokenizerConfig& cfg, Tokenizer* tok);

// Renders the chat template with the variables transformers passes: messages (keys whose value is
// null dropped; reasoning_content/thinking/reasoning aliased), tools (null when absent), documents
// (null), add_generation_prompt, the special tokens, enable_thinking only when set (unset, the
// template sees it undefined and applies its own default, as apply_chat_template without the
// kwarg does), then `extra_context`: arbitrary template variables, the chat_template_kwargs of an
// API request (they override the others). A config with several named templates uses "tool_use"
// when tools are given, else "default". Key order matters (tojson): pass ordered_json.
// A template that calls raise_exception(msg) fails with "chat template: raise_exception: msg".
Result<std::string> apply_chat_template(const TokenizerConfig& cfg, const nlohmann::ordered_json& messages,
                                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                        std::optional<bool> enable_thinking,
                                        const nlohmann::ordered_json& extra_context = nlohmann::ordered_json::object());

}  // namespace anvil
