// A flag that the command it was given to does not have: the error names the commands that do have
// it, instead of CLI11's "The following arguments were not expected: ...":
//   anvil generate --port 1  ->  "--port is not a flag of anvil generate; it is a flag of serve"
// A command may add why the flag is not one of its own and what to do instead (add_flag_hint:
// anvil serve says that a request carries its own prompt, session, system message, logit_bias...).
// A flag that no command has gets the closest of the command's own flags, when one is close
// ("anvil generate has no flag --promt; did you mean --prompt?").
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace anvil::cli {

// On `app`, a flag of `names` (as other commands spell them: "-p", "--prompt"), given there, is
// refused with `hint` said first: "-p/--prompt is not a flag of anvil serve: <hint>; it is a flag of
// run, generate and tokenize".
void add_flag_hint(CLI::App& app, const std::vector<std::string>& names, const std::string& hint);

struct UnexpectedFlag {
  std::string message;  // without "anvil: error: " and without the help pointer
  std::string command;  // the command it was given to, "anvil serve", "anvil kv ls"
};

// After CLI11's ExtrasError from parsing `root`: the first argument written as a flag ("-x", "--xy",
// "--xy=v") that a parsed command left over, explained. nullopt when every left-over argument is a
// value (anvil generate hi): CLI11's own message says that well enough.
std::optional<UnexpectedFlag> explain_unexpected_flag(const CLI::App& root);

}  // namespace anvil::cli
