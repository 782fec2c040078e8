// The anvil executable: subcommands are registered by src/cli/cmd_*.cpp.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>

#include "cli/command.h"

int main(int argc, char** argv) {
  CLI::App app{"anvil: a native LLM inference engine for Qwen3-family (MLX and Hugging Face safetensors) models"};
  app.set_version_flag("--version", "anvil 0.1.0");
  app.require_subcommand(1);
  auto& reg = anvil::cli::command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.order < b.order; });
  std::function<int()> chosen;
  std::vector<std::pair<CLI::App*, std::function<int()>>> subs;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    subs.emplace_back(sub, c.setup(*sub));
  }
  // llama-server spells --parallel "-np"; CLI11 short names are one letter, so map it here.
  std::vector<std::string> args;
  for (int i = argc - 1; i >= 1; --i) args.push_back(std::string(argv[i]) == "-np" ? "--parallel" : argv[i]);
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : subs)
    if (sub->parsed()) return run();
  return 1;
}
