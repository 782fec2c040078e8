// Chat templates: a Jinja2 subset that renders Hugging Face chat templates byte for byte like
// transformers' apply_chat_template does (jinja2 ImmutableSandboxedEnvironment with
// trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False, the loopcontrols extension,
// transformers' tojson override (json.dumps, ensure_ascii=False), raise_exception, strftime_now,
// namespace, dict).
//
// Anything outside the supported subset is an error naming the construct and its line
// ("chat template: unsupported filter 'wordwrap' at line 3"), never silently different output.
//
// The context is an nlohmann::ordered_json object: key order is observable through tojson and
// dict iteration, so it must be preserved (nlohmann::json sorts keys; it is accepted too, but then
// dicts iterate in sorted order, unlike Python).
#pragma once
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace anvil {

namespace chat_template_detail {
struct Program;
}

class ChatTemplate {
 public:
  // Lexes and parses `source`; syntax errors and unknown tags are reported here.
  static Result<ChatTemplate> compile(const std::string& source);

  // Renders with `context` (a JSON object) as the template's variables. Unknown filters/tests,
  // undefined-value misuse and raise_exception(...) are reported here.
  Result<std::string> render(const nlohmann::ordered_json& context) const;
  Result<std::string> render(const nlohmann::json& context) const;

  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

 private:
  explicit ChatTemplate(std::shared_ptr<const chat_template_detail::Program> program);
  std::shared_ptr<const chat_template_detail::Program> program_;
};

}  // namespace anvil
