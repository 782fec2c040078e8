// Subcommand registry: each src/cli/cmd_<name>.cpp defines one subcommand and registers it with
// a static Command object, so adding a command touches one file.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace anvil::cli {

struct Command {
  // setup() declares the subcommand's options on `sub` and returns the function run when it is
  // chosen; that function returns the process exit code.
  using Setup = std::function<std::function<int()>(CLI::App& sub)>;
  Command(const char* name, const char* description, int order, Setup setup);
};

struct RegisteredCommand {
  std::string name, description;
  int order;
  Command::Setup setup;
};
std::vector<RegisteredCommand>& command_registry();

// Prints "anvil: error: <message>" to stderr and returns exit code 1.
int fail(const std::string& message);

}  // namespace anvil::cli
