// The documentation a user reads matches what the binary and the scripts do: every option of
// every command's --help is in docs/cli.md, the README's demo commands are what scripts/demo.sh
// runs, and the benchmark protocol cited is in the repository.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_helpers.h"

using anvil::test::run_anvil;
namespace fs = std::filesystem;

namespace {
std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}
const fs::path kRoot = ANVIL_SOURCE_DIR;

// The text from `heading` to the next "\n## " (or the end); "" when the heading is absent.
std::string section(const std::string& doc, const std::string& heading) {
  auto a = doc.find("\n" + heading + "\n");
  if (a == std::string::npos) return "";
  auto b = doc.find("\n## ", a + 1);
  return doc.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

// The long option names of one --help text ("  -n,--max-tokens INT=128  ..." -> "--max-tokens").
std::vector<std::string> long_flags(const std::string& help) {
  std::vector<std::string> flags;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  -", 0) != 0) continue;
    std::string names = line.substr(2, line.find(' ', 2) - 2);
    std::istringstream parts(names);
    for (std::string n; std::getline(parts, n, ',');)
      if (n.rfind("--", 0) == 0 && n != "--help") flags.push_back(n);
  }
  return flags;
}

std::vector<std::string> commands() {
  auto r = run_anvil({"--help"});
  std::vector<std::string> cmds;
  auto at = r.out.find("Subcommands:");
  std::istringstream in(at == std::string::npos ? "" : r.out.substr(at));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string name;
    if (w >> name) cmds.push_back(name);
  }
  return cmds;
}
}  // namespace

TEST(CliDocs, EveryHelpOptionIsInTheReference) {
  const std::string doc = read(kRoot / "docs" / "cli.md");
  ASSERT_FALSE(doc.empty()) << "docs/cli.md is missing";
  const std::string shared = section(doc, "## One vocabulary");
  ASSERT_FALSE(shared.empty());
  auto cmds = commands();
  ASSERT_GE(cmds.size(), 7u);
  for (const std::string& c : cmds) {
    const std::string own = section(doc, "## anvil " + c);
    EXPECT_FALSE(own.empty()) << "docs/cli.md has no '## anvil " << c << "' section";
    auto help = run_anvil({c, "--help"});
    ASSERT_EQ(help.exit_code, 0) << c;
    // The usage line is one a user can paste: it names the program and the command.
    EXPECT_NE(help.out.find("Usage: anvil " + c + " "), std::string::npos) << help.out.substr(0, 200);
    auto flags = long_flags(help.out);
    EXPECT_FALSE(flags.empty()) << c;
    for (const std::string& f : flags)
      EXPECT_TRUE(own.find("`" + f) != std::string::npos || own.find("," + f) != std::string::npos ||
                  shared.find("," + f) != std::string::npos || shared.find("`" + f) != std::string::npos)
          << "anvil " << c << " " << f << " is not in docs/cli.md";
  }
}

// Every command that anvil run's /help lists (its "  /name  ..." lines) is in docs/cli.md's anvil
// run section. There was no /help: it went to the model as a message.
TEST(CliDocs, EveryRunCommandIsInTheReference) {
  const std::string own = section(read(kRoot / "docs" / "cli.md"), "## anvil run");
  ASSERT_FALSE(own.empty());
  auto r = anvil::test::run_shell("printf '/help\\n' | " +
                                  anvil::test::anvil_command({"run", "--synthetic", "tiny", "--no-kv-store"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> names;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  /", 0) == 0) names.push_back(line.substr(2, line.find(' ', 2) - 2));
  EXPECT_GE(names.size(), 4u) << r.out;
  for (const std::string& want : {"/help", "/reset", "/quit"})
    EXPECT_TRUE(std::find(names.begin(), names.end(), want) != names.end()) << want << " is not in /help:\n" << r.out;
  for (const std::string& n : names)
    EXPECT_NE(own.find("`" + n + "`"), std::string::npos) << "anvil run's " << n << " is not in docs/cli.md";
}

TEST(CliDocs, ReadmeDemoIsWhatTheScriptRuns) {
  const std::string readme = read(kRoot / "README.md"), demo = read(kRoot / "scripts" / "demo.sh");
  ASSERT_NE(readme.find("bash scripts/demo.sh"), std::string::npos);
  ASSERT_NE(readme.find("bash scripts/test.sh"), std::string::npos);
  // The fenced block after "`scripts/demo.sh` runs" lists the demo's commands, one a line.
  auto at = readme.find("`scripts/demo.sh` runs");
  ASSERT_NE(at, std::string::npos);
  auto open = readme.find("```\n", at), close = readme.find("\n```", open + 4);
  ASSERT_NE(close, std::string::npos);
  std::istringstream block(readme.substr(open + 4, close - open - 4));
  int n = 0;
  for (std::string line; std::getline(block, line); ++n)
    EXPECT_NE(demo.find("\nrun " + line + "\n"), std::string::npos) << "scripts/demo.sh does not run: " << line;
  EXPECT_GE(n, 1);
  // The demo builds only the executable; the test script builds everything.
  EXPECT_NE(demo.find("TARGETS=anvil"), std::string::npos);
  EXPECT_EQ(read(kRoot / "scripts" / "test.sh").find("TARGETS="), std::string::npos);
}

TEST(CliDocs, BenchmarkProtocolIsInTheRepository) {
  EXPECT_TRUE(fs::exists(kRoot / "docs" / "bench-protocol.md"));
  auto help = run_anvil({"--help"});
  EXPECT_NE(help.out.find("docs/bench-protocol.md"), std::string::npos) << help.out;
  for (const fs::path& p : {kRoot / "README.md", kRoot / "docs" / "cli.md", kRoot / "docs" / "benchmarks.md",
                            kRoot / "docs" / "architecture.md"})
    EXPECT_EQ(read(p).find("shared/BENCH.md"), std::string::npos) << p << " cites a file outside the repository";
}
