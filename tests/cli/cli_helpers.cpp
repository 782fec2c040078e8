#include "cli_helpers.h"

#include <sys/wait.h>

#include <cstdio>
#include <regex>

namespace anvil::test {

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') q += "'\\''";
    else q += c;
  }
  return q + "'";
}

std::string anvil_command(const std::vector<std::string>& args) {
  std::string cmd = shell_quote(ANVIL_BINARY);
  for (auto& a : args) cmd += " " + shell_quote(a);
  return cmd;
}

ProcResult run_anvil(const std::vector<std::string>& args, bool merge_stderr) {
  return run_shell(anvil_command(args) + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
}

ProcResult run_shell(const std::string& cmd) {
  ProcResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::vector<int> prompt_sizes(const std::string& err) {
  std::vector<int> out;
  std::regex re("\\[anvil\\] prompt ([0-9]+) tokens");
  for (std::sregex_iterator it(err.begin(), err.end(), re), end; it != end; ++it) out.push_back(std::stoi((*it)[1]));
  return out;
}

}  // namespace anvil::test
