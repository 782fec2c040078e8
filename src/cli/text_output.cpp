#include "cli/text_output.h"

#include <filesystem>

#include "base/optional_file.h"

namespace anvil::cli {

Result<bool> has_chat_template(const std::string& dir) {
  if (dir.empty()) return false;
  auto cfg = load_tokenizer_config(dir);
  if (!cfg.is_ok()) {
    if (cfg.status().code() == StatusCode::kNotFound) return false;  // no tokenizer_config.json
    return cfg.status();
  }
  return !cfg->chat_template.empty();
}

Result<std::unique_ptr<TextOutput>> TextOutput::open(const std::string& dir, bool chat, bool show_reasoning,
                                                     std::vector<std::string> stops) {
  std::string path = dir + "/tokenizer.json";
  if (dir.empty() || !path_present(path))  // a link to nothing is there: Tokenizer::load names it
    return not_found("no tokenizer.json in " + (dir.empty() ? std::string("the model") : dir) +
                     ": text cannot be encoded or decoded (anvil generate takes a prompt as token ids with --ids)");
  auto t = std::unique_ptr<TextOutput>(new TextOutput());
  ANVIL_ASSIGN_OR_RETURN(t->tok_, Tokenizer::load(path));
  // Reasoning is split only where the model can write it: both tags in its vocabulary.
  t->splits_reasoning_ = vocabulary_has_reasoning(*t->tok_);
  // The config decides the raw prompt's BOS/EOS (add_bos_token/add_eos_token) even without chat.
  const bool has_config = path_present(dir + "/tokenizer_config.json");  // unreadable: an error below
  if (has_config || chat) {
    ANVIL_ASSIGN_OR_RETURN(t->cfg_, load_tokenizer_config(dir));
  }
  if (has_config) ANVIL_RETURN_IF_ERROR(apply_special_token_flags(t->cfg_, t->tok_.get()));
  if (chat) {
    if (t->cfg_.chat_template.empty())
      return not_found(dir + "/tokenizer_config.json has no chat_template: drop --chat to use the prompt as is");
  }
  t->chat_ = chat;
  t->stops_ = std::move(stops);
  t->begin_answer();
  return t;
}

Result<std::vector<int32_t>> TextOutput::encode(const std::string& text, bool add_special_tokens) const {
  return tok_->encode(text, add_special_tokens);
}

Result<std::vector<int32_t>> TextOutput::encode_messages(const nlohmann::ordered_json& messages,
                                                         std::optional<bool> thinking) {
  ANVIL_ASSIGN_OR_RETURN(std::string prompt,
                         apply_chat_template(cfg_, messages, nlohmann::ordered_json(), true, thinking));
  prompt_opens_reasoning_ = prompt_opens_reasoning(prompt);
  begin_answer();
  return tok_->encode(prompt, /*add_special_tokens=*/false);  // the template wrote BOS itself
}

Result<std::vector<int32_t>> TextOutput::encode_chat(const std::string& system, const std::string& user,
                                                     std::optional<bool> thinking) {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", user}});
  return encode_messages(messages, thinking);
}

void TextOutput::begin_answer() {
  dec_ = std::make_unique<StreamDecoder>(*tok_, /*skip_special=*/true);
  const bool split = chat_ && splits_reasoning_;
  // A stop string never cuts a reasoning tag (stop_strings.h): the server's rule too.
  stop_ = std::make_unique<StopMatcher>(stops_, split ? std::vector<MarkupPair>{reasoning_markup(prompt_opens_reasoning_)}
                                                     : std::vector<MarkupPair>{});
  split_ = split ? std::make_unique<ReasoningShaper>(prompt_opens_reasoning_) : nullptr;
}

TextOutput::Chunk TextOutput::route(const std::string& text) {
  Chunk c;
  if (split_) {
    auto o = split_->push(text);
    c.reasoning = std::move(o.reasoning);
    c.content = std::move(o.content);
  } else {
    c.content = text;
  }
  return c;
}

TextOutput::Chunk TextOutput::push(int32_t id) {
  if (stop_->stopped()) return {};
  return route(stop_->push(dec_->push(id)));
}

TextOutput::Chunk TextOutput::flush() {
  std::string rest;
  if (!stop_->stopped()) rest = stop_->push(dec_->flush());
  rest += stop_->flush();
  Chunk c = route(rest);
  if (split_) {
    auto o = split_->flush();
    c.reasoning += o.reasoning;
    c.content += o.content;
  }
  return c;
}

}  // namespace anvil::cli
