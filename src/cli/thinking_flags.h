// --thinking / --no-thinking: a tri-state, because transformers passes enable_thinking to a chat
// template only when the caller asks. Unset, the template sees it undefined and applies its own
// default (Qwen3 and QwQ think, DeepSeek-V3.1 does not, ...), exactly as apply_chat_template does.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>

namespace anvil::cli {

inline void add_thinking_flags(CLI::App& app, std::optional<bool>* thinking) {
  auto* on = app.add_flag_callback(
      "--thinking", [thinking] { *thinking = true; }, "Pass enable_thinking=true to the chat template");
  auto* off = app.add_flag_callback(
      "--no-thinking", [thinking] { *thinking = false; },
      "Pass enable_thinking=false to the chat template (neither flag: the template's own default)");
  on->excludes(off);
}

}  // namespace anvil::cli
