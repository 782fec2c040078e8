#include "cli/command.h"

#include <cstdio>

namespace anvil::cli {

std::vector<RegisteredCommand>& command_registry() {
  static std::vector<RegisteredCommand> r;
  return r;
}

Command::Command(const char* name, const char* description, int order, Setup setup) {
  command_registry().push_back({name, description, order, std::move(setup)});
}

int fail(const std::string& message) {
  std::fprintf(stderr, "anvil: error: %s\n", message.c_str());
  return 1;
}

}  // namespace anvil::cli
