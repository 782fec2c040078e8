// Running the anvil binary from tests: through a pipe (stdout + exit code) or a pseudo-terminal.
#pragma once
#include <string>
#include <vector>

namespace anvil::test {

struct ProcResult {
  int exit_code = -1;
  std::string out;  // stdout (stderr too when merged)
};

// Runs ANVIL_BINARY with args (shell-quoted here); stderr goes to out when merge_stderr.
ProcResult run_anvil(const std::vector<std::string>& args, bool merge_stderr = false);

std::string shell_quote(const std::string& s);

// Runs a shell command line (sh -c); stdout, plus stderr when the line redirects it (2>&1).
ProcResult run_shell(const std::string& command_line);

// ANVIL_BINARY and args, shell-quoted, as one command line (for run_shell).
std::string anvil_command(const std::vector<std::string>& args);

// The "[anvil] prompt N tokens" lines of anvil run's stderr (one per answered turn), their N in order.
std::vector<int> prompt_sizes(const std::string& err);

}  // namespace anvil::test
