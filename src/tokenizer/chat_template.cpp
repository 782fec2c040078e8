// ChatTemplate: compile (lex + parse) once, render many times; engine errors become Status here.
#include "tokenizer/chat_template.h"

#include "tokenizer/chat_template_internal.h"

namespace anvil {

using chat_template_detail::Program;
using chat_template_detail::TemplateError;

ChatTemplate::ChatTemplate(std::shared_ptr<const Program> program) : program_(std::move(program)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

Result<ChatTemplate> ChatTemplate::compile(const std::string& source) {
  try {
    auto tokens = chat_template_detail::lex(source);
    std::shared_ptr<const Program> prog = chat_template_detail::parse(tokens);
    return ChatTemplate(std::move(prog));
  } catch (const TemplateError& e) {
    return invalid_argument(e.message);
  }
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return invalid_argument("chat template: the render context must be a JSON object");
  try {
    return chat_template_detail::render_program(*program_, context);
  } catch (const TemplateError& e) {
    return invalid_argument(e.message);
  }
}

Result<std::string> ChatTemplate::render(const nlohmann::json& context) const {
  return render(nlohmann::ordered_json(context));
}

}  // namespace anvil
