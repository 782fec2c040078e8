// anvil template: renders a model's chat template for a conversation, exactly as the model
// will see it (no trailing newline added). Needs only tokenizer_config.json, no weights.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/thinking_flags.h"
#include "format/hf_cache.h"
#include "base/mmap_file.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::cli {
namespace {

// FILE's JSON, or stdin's for "-".
Result<nlohmann::ordered_json> read_json_file(const std::string& path, const char* what) {
  ANVIL_ASSIGN_OR_RETURN(std::string text, read_input_file(what, path));
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return invalid_argument(std::string(what) + " " + (path == "-" ? "- (stdin)" : path) + ": not valid JSON");
  return j;
}

Command template_command("template", "Render the chat template for a conversation (messages JSON)", 60,
                         [](CLI::App& sub) -> std::function<int()> {
  struct Opts {
    std::string model, revision, messages, tools, context;
    bool no_generation_prompt = false;
    std::optional<bool> thinking;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("-m,--model", o->model, "Model directory (with tokenizer_config.json) or a Hugging Face repo id in the local cache")->required();
  add_revision_option(sub, o->revision);
  sub.add_option("--messages", o->messages, "JSON file: an array of {role, content, ...} messages ('-': stdin)")
      ->required();
  sub.add_option("--tools", o->tools, "JSON file: an array of tool schemas ('-': stdin)");
  sub.add_option("--context", o->context, "JSON file: an object of extra template variables ('-': stdin)");
  sub.add_flag("--no-generation-prompt", o->no_generation_prompt, "Do not append the assistant prompt");
  add_thinking_flags(sub, &o->thinking);
  return [o]() -> int {
    if (int(o->messages == "-") + int(o->tools == "-") + int(o->context == "-") > 1)
      return fail("stdin ('-') can be read once: give it to one of --messages, --tools and --context, and files to "
                  "the others");
    auto dir = resolve_model_path(o->model, o->revision, ModelFiles::kTokenizer);
    if (!dir.is_ok()) return fail(dir.status().message());
    auto cfg = load_tokenizer_config(*dir);
    if (!cfg.is_ok()) return fail(cfg.status().message());
    auto messages = read_json_file(o->messages, "--messages");
    if (!messages.is_ok()) return fail(messages.status().message());
    if (!messages->is_array()) return fail("--messages " + o->messages + ": expected a JSON array of messages");
    nlohmann::ordered_json tools = nullptr, extra = nlohmann::ordered_json::object();
    if (!o->tools.empty()) {
      auto t = read_json_file(o->tools, "--tools");
      if (!t.is_ok()) return fail(t.status().message());
      tools = std::move(*t);
    }
    if (!o->context.empty()) {
      auto c = read_json_file(o->context, "--context");
      if (!c.is_ok()) return fail(c.status().message());
      extra = std::move(*c);
    }
    auto out = apply_chat_template(*cfg, *messages, tools, !o->no_generation_prompt, o->thinking, extra);
    if (!out.is_ok()) return fail(out.status().message());
    std::fwrite(out->data(), 1, out->size(), stdout);
    return 0;
  };
});

}  // namespace
}  // namespace anvil::cli
