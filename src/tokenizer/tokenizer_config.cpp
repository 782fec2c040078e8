// Loading tokenizer_config.json and applying its chat template like transformers 5.x does
// (PreTrainedTokenizerBase.apply_chat_template -> render_jinja_template).
#include "tokenizer/tokenizer_config.h"

#include <filesystem>
#include <utility>

#include "base/optional_file.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace anvil {

namespace {

using ojson = nlohmann::ordered_json;

// A file of the model directory that may be absent (nullopt); present but unreadable or not JSON
// is an error naming it (base/optional_file.h).
Result<std::optional<ojson>> read_optional_json(const std::string& path) {
  ANVIL_ASSIGN_OR_RETURN(std::optional<std::string> text, read_optional_file(path));
  if (!text) return std::optional<ojson>();
  ojson j = ojson::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(path + ": not valid JSON");
  return std::optional<ojson>(std::move(j));
}

// A special token is a string or an AddedToken dict {"content": ...}; null/absent means none.
Status read_token(const ojson& cfg, const char* key, std::string* out, bool* has, const std::string& path) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return Status::ok();
  if (it->is_string()) {
    *out = it->get<std::string>();
  } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    *out = (*it)["content"].get<std::string>();
  } else {
    return corrupt(path + ": field '" + key + "' must be a string or {\"content\": string}");
  }
  *has = true;
  return Status::ok();
}

// chat_template as a string or a list of {"name", "template"}.
Status read_template_field(const ojson& value, TokenizerConfig* cfg, const std::string& path) {
  if (value.is_string()) {
    cfg->chat_template = value.get<std::string>();
    return Status::ok();
  }
  if (value.is_array()) {
    for (auto& e : value) {
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
          !e["template"].is_string())
        return corrupt(path + ": chat_template list entries must be {\"name\": string, \"template\": string}");
      cfg->named_chat_templates[e["name"].get<std::string>()] = e["template"].get<std::string>();
    }
    auto d = cfg->named_chat_templates.find("default");
    if (d != cfg->named_chat_templates.end()) cfg->chat_template = d->second;
    return Status::ok();
  }
  if (value.is_null()) return Status::ok();
  return corrupt(path + ": chat_template must be a string or a list of {name, template}");
}

}  // namespace

Result<TokenizerConfig> load_tokenizer_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "tokenizer_config.json").string();
  ANVIL_ASSIGN_OR_RETURN(std::optional<ojson> config, read_optional_json(path));
  if (!config) return not_found(path + ": not found (a model directory needs tokenizer_config.json)");
  const ojson& j = *config;
  if (!j.is_object()) return corrupt(path + ": expected a JSON object");
  TokenizerConfig cfg;
  cfg.config_path = path;
  ANVIL_RETURN_IF_ERROR(read_token(j, "bos_token", &cfg.bos_token, &cfg.has_bos_token, path));
  ANVIL_RETURN_IF_ERROR(read_token(j, "eos_token", &cfg.eos_token, &cfg.has_eos_token, path));
  ANVIL_RETURN_IF_ERROR(read_token(j, "pad_token", &cfg.pad_token, &cfg.has_pad_token, path));
  ANVIL_RETURN_IF_ERROR(read_token(j, "unk_token", &cfg.unk_token, &cfg.has_unk_token, path));
  for (auto [key, value] : {std::pair{"add_bos_token", &cfg.add_bos_token}, std::pair{"add_eos_token", &cfg.add_eos_token}}) {
    auto it = j.find(key);
    if (it == j.end()) continue;
    if (!it->is_boolean() && !it->is_null())
      return corrupt(path + ": field '" + key + "' must be true, false or null, got " + it->dump());
    *value = it->is_boolean() && it->get<bool>();
  }

  const std::string jinja_path = (fs::path(dir) / "chat_template.jinja").string();
  const std::string json_path = (fs::path(dir) / "chat_template.json").string();
  // chat_template.jinja wins; chat_template.json is read only without it (as transformers does).
  ANVIL_ASSIGN_OR_RETURN(std::optional<std::string> jinja, read_optional_file(jinja_path));
  std::optional<ojson> template_json;
  if (!jinja) {
    ANVIL_ASSIGN_OR_RETURN(template_json, read_optional_json(json_path));
  }
  if (jinja) {
    cfg.chat_template = std::move(*jinja);
    cfg.source = jinja_path;
  } else if (template_json) {
    ojson& t = *template_json;
    if (!t.is_object() || !t.contains("chat_template"))
      return corrupt(json_path + ": expected an object with a 'chat_template' field");
    ANVIL_RETURN_IF_ERROR(read_template_field(t["chat_template"], &cfg, json_path));
    cfg.source = json_path;
  } else if (j.contains("chat_template")) {
    ANVIL_RETURN_IF_ERROR(read_template_field(j["chat_template"], &cfg, path));
    cfg.source = path;
  }
  return cfg;
}

Result<std::string> apply_chat_template(const TokenizerConfig& cfg, const ojson& messages, const ojson& tools,
                                        bool add_generation_prompt, std::optional<bool> enable_thinking,
                                        const ojson& extra_context) {
  std::string source = cfg.chat_template;
  if (!cfg.named_chat_templates.empty()) {
    auto pick = cfg.named_chat_templates.end();
    if (!tools.is_null()) pick = cfg.named_chat_templates.find("tool_use");
    if (pick == cfg.named_chat_templates.end()) pick = cfg.named_chat_templates.find("default");
    if (pick == cfg.named_chat_templates.end())
      return invalid_argument(cfg.source + ": several chat templates and none named 'default'");
    source = pick->second;
  }
  if (source.empty())
    return not_found("this model has no chat template (tokenizer_config.json has no 'chat_template', and there is "
                     "no chat_template.jinja or chat_template.json)");
  if (!messages.is_array() || messages.empty())
    return invalid_argument("messages: expected a non-empty JSON array of message objects");
  if (!tools.is_null() && !tools.is_array()) return invalid_argument("tools: expected a JSON array (or null)");
  if (!extra_context.is_null() && !extra_context.is_object())
    return invalid_argument("extra_context: expected a JSON object");

  // Messages as transformers hands them to the template: null-valued keys dropped, and the
  // reasoning text (first non-null of reasoning_content/thinking/reasoning) copied to
  // {"thinking": r, **message, "reasoning_content": r}.
  ojson msgs = ojson::array();
  for (size_t k = 0; k < messages.size(); ++k) {
    const ojson& m = messages[k];
    if (!m.is_object()) return invalid_argument("messages[" + std::to_string(k) + "]: expected a JSON object");
    ojson clean = ojson::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) clean[it.key()] = it.value();
    const ojson* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (clean.contains(key)) {
        reasoning = &clean[key];
        break;
      }
    if (reasoning) {
      ojson r = *reasoning;
      ojson aliased = ojson::object();
      aliased["thinking"] = r;
      for (auto it = clean.begin(); it != clean.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      clean = std::move(aliased);
    }
    msgs.push_back(std::move(clean));
  }

  ojson ctx = ojson::object();
  ctx["messages"] = std::move(msgs);
  ctx["tools"] = tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = add_generation_prompt;
  if (cfg.has_bos_token) ctx["bos_token"] = cfg.bos_token;
  if (cfg.has_eos_token) ctx["eos_token"] = cfg.eos_token;
  if (cfg.has_unk_token) ctx["unk_token"] = cfg.unk_token;
  if (cfg.has_pad_token) ctx["pad_token"] = cfg.pad_token;
  if (extra_context.is_object())
    for (auto it = extra_context.begin(); it != extra_context.end(); ++it) ctx[it.key()] = it.value();
  // An explicit --thinking / --no-thinking wins over an enable_thinking among the extra variables.
  if (enable_thinking.has_value()) ctx["enable_thinking"] = *enable_thinking;

  ANVIL_ASSIGN_OR_RETURN(ChatTemplate tmpl, ChatTemplate::compile(source));
  return tmpl.render(ctx);
}

}  // namespace anvil

namespace anvil {

Status apply_special_token_flags(const TokenizerConfig& cfg, Tokenizer* tok) {
  if (tok->has_json_post_processor()) return Status::ok();
  // transformers' update_post_processor: a flag whose token is null is dropped silently; a token
  // that is not in the vocabulary would be added as a new one there (an id the model has no
  // embedding for), so it is an error here.
  auto id_of = [&](bool add, bool has, const std::string& token, const char* flag,
                   const char* field) -> Result<std::optional<int32_t>> {
    if (!add || !has) return std::optional<int32_t>();
    auto id = tok->token_to_id(token);
    if (!id)
      return invalid_argument(cfg.config_path + ": " + flag + " is true but " + field + " \"" + token +
                              "\" is not in tokenizer.json's vocabulary");
    return std::optional<int32_t>(*id);
  };
  ANVIL_ASSIGN_OR_RETURN(auto bos, id_of(cfg.add_bos_token, cfg.has_bos_token, cfg.bos_token, "add_bos_token", "bos_token"));
  ANVIL_ASSIGN_OR_RETURN(auto eos, id_of(cfg.add_eos_token, cfg.has_eos_token, cfg.eos_token, "add_eos_token", "eos_token"));
  tok->set_post_processor(tok::PostProcessor::from_flags(bos, eos));
  return Status::ok();
}

}  // namespace anvil
