// The documentation a user reads matches what the binary and the scripts do: every option of
// every command's --help is in docs/cli.md and every option docs/cli.md lists is one of the
// command's, with the default --help shows; the README's example commands use existing options and
// its demo commands are what scripts/demo.sh runs; the benchmark protocol cited is in the repository.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
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

// One option of a --help text: its names ("-n", "--max-tokens") and the default it shows ("128"
// of "INT=128"; "" when it shows none).
struct HelpOption {
  std::vector<std::string> names;
  std::string default_value;
  std::string long_name() const {
    for (const std::string& n : names)
      if (n.rfind("--", 0) == 0) return n;
    return "";
  }
  std::vector<std::string> long_names() const {  // --temp,--temperature: both
    std::vector<std::string> l;
    for (const std::string& n : names)
      if (n.rfind("--", 0) == 0) l.push_back(n);
    return l;
  }
};

std::vector<HelpOption> help_options(const std::string& help) {
  std::vector<HelpOption> options;
  std::istringstream in(help);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("  -", 0) != 0) continue;
    std::istringstream words(line.substr(2));
    std::string names, type;
    words >> names >> type;
    HelpOption o;
    std::istringstream parts(names);
    for (std::string n; std::getline(parts, n, ',');) o.names.push_back(n);
    if (auto eq = type.find('='); eq != std::string::npos && type.find(':') == std::string::npos)
      o.default_value = type.substr(eq + 1);
    if (o.long_name() != "--help") options.push_back(o);
  }
  return options;
}

// The long option names of one --help text ("  -n,--max-tokens INT=128  ..." -> "--max-tokens").
std::vector<std::string> long_flags(const std::string& help) {
  std::vector<std::string> flags;
  for (const HelpOption& o : help_options(help))
    if (!o.long_name().empty()) flags.push_back(o.long_name());
  return flags;
}

// The names listed under "Subcommands:" in a --help text.
std::vector<std::string> subcommands(const std::string& help) {
  std::vector<std::string> names;
  auto at = help.find("Subcommands:");
  std::istringstream in(at == std::string::npos ? "" : help.substr(at));
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream w(line);
    std::string name;
    if (w >> name) names.push_back(name);
  }
  return names;
}

// The options of `anvil CMD --help` and, for a command with subcommands (kv), of each
// `anvil CMD SUB --help` too: what the command's section of docs/cli.md documents.
std::vector<HelpOption> command_options(const std::string& cmd) {
  auto help = run_anvil({cmd, "--help"});
  std::vector<HelpOption> options = help_options(help.out);
  for (const std::string& sub : subcommands(help.out)) {
    auto more = help_options(run_anvil({cmd, sub, "--help"}).out);
    options.insert(options.end(), more.begin(), more.end());
  }
  return options;
}

bool is_flag_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; }

// Whether `text` names flag `f` as a whole, as docs/cli.md writes one: "`--kv-store DIR`",
// "`-m,--model DIR`" and "`gc [--max SIZE]`" name --kv-store, --model and --max; "`--kv-store-max`"
// does not name --kv-store.
bool names_flag(const std::string& text, const std::string& f) {
  for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, at + 1)) {
    const bool starts = at > 0 && (text[at - 1] == '`' || text[at - 1] == ',' || text[at - 1] == '[');
    const bool ends = at + f.size() == text.size() || !is_flag_char(text[at + f.size()]);
    if (starts && ends) return true;
  }
  return false;
}

// The long flags (--name) written in one piece of docs text.
std::set<std::string> flags_in(const std::string& text) {
  std::set<std::string> flags;
  for (size_t at = text.find("--"); at != std::string::npos; at = text.find("--", at + 2)) {
    if (at > 0 && is_flag_char(text[at - 1])) continue;  // "a--b"
    size_t end = at + 2;
    while (end < text.size() && is_flag_char(text[end])) ++end;
    if (end > at + 2 && std::isalpha(static_cast<unsigned char>(text[at + 2]))) flags.insert(text.substr(at, end - at));
    at = end - 2;
  }
  return flags;
}

// The first cells of a section's table rows ("| `-n,--max-tokens N` | ..." -> "`-n,--max-tokens N`").
std::vector<std::string> table_first_cells(const std::string& text) {
  std::vector<std::string> cells;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("| `", 0) == 0) cells.push_back(line.substr(2, line.find(" |", 2) - 2));
  return cells;
}

// What `text` says of option `o`: the rest of the table row whose first cell names it (`table`),
// or the first line outside a table that names it; "" when none does.
std::string documenting_text(const std::string& text, const HelpOption& o, bool table) {
  auto names = [&o](const std::string& t) {
    for (const std::string& n : o.names)
      if (names_flag(t, n)) return true;
    return false;
  };
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (table && line.rfind("| `", 0) == 0) {
      const size_t end = line.find(" |", 2);
      if (end != std::string::npos && names(line.substr(2, end - 2))) return line.substr(end);
    } else if (!table && line.rfind("|", 0) != 0 && names(line)) {
      return line;
    }
  }
  return "";
}

// Whether `word` appears in `line` as a word of its own (not inside a longer number or name).
bool has_word(const std::string& line, const std::string& word) {
  auto part = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_'; };
  for (size_t at = line.find(word); at != std::string::npos; at = line.find(word, at + 1)) {
    const bool starts = at == 0 || !part(line[at - 1]);
    const size_t end = at + word.size();
    // A word may end a sentence: "default 8." is 8.
    const bool ends = end == line.size() || !part(line[end]) ||
                      (line[end] == '.' && (end + 1 == line.size() || line[end + 1] == ' '));
    if (starts && ends) return true;
  }
  return false;
}

std::vector<std::string> commands() { return subcommands(run_anvil({"--help"}).out); }
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
    EXPECT_FALSE(long_flags(help.out).empty()) << c;
    // A command's subcommands' options too (anvil kv gc --max, kv export -o/--out).
    for (const HelpOption& o : command_options(c)) {
      const std::string f = o.long_name();
      if (f.empty()) continue;
      EXPECT_TRUE(names_flag(own, f) || names_flag(shared, f)) << "anvil " << c << " " << f << " is not in docs/cli.md";
    }
  }
}

// The other way round: every option a command's table in docs/cli.md lists is one of the command's
// (or of its subcommands), and every option of the shared tables ("One vocabulary") is one of some
// command's. Without it a flag renamed or removed in the code stays documented.
TEST(CliDocs, EveryOptionInTheReferenceExists) {
  const std::string doc = read(kRoot / "docs" / "cli.md");
  ASSERT_FALSE(doc.empty()) << "docs/cli.md is missing";
  std::set<std::string> any_command;
  int checked = 0;
  for (const std::string& c : commands()) {
    std::set<std::string> own_flags;
    for (const HelpOption& o : command_options(c))
      for (const std::string& f : o.long_names()) own_flags.insert(f);
    any_command.insert(own_flags.begin(), own_flags.end());
    for (const std::string& cell : table_first_cells(section(doc, "## anvil " + c)))
      for (const std::string& f : flags_in(cell)) {
        EXPECT_TRUE(own_flags.count(f)) << "docs/cli.md lists " << f << " under '## anvil " << c
                                        << "', but anvil " << c << " --help has no such option (cell: " << cell << ")";
        ++checked;
      }
  }
  const std::string shared = section(doc, "## One vocabulary");
  ASSERT_FALSE(shared.empty());
  for (const std::string& cell : table_first_cells(shared))
    for (const std::string& f : flags_in(cell)) {
      EXPECT_TRUE(any_command.count(f)) << "docs/cli.md's shared options list " << f << ", which no command has";
      ++checked;
    }
  EXPECT_GE(checked, 60) << "the tables of docs/cli.md were not found";
}

// A default that --help shows (`--page-size INT=16`) is the one docs/cli.md states: what documents
// the option (its table row in the command's section, else in the shared ones, else a line of prose)
// has the value.
TEST(CliDocs, EveryDefaultInHelpIsTheReferences) {
  const std::string doc = read(kRoot / "docs" / "cli.md");
  const std::string shared = section(doc, "## One vocabulary");
  ASSERT_FALSE(shared.empty());
  int checked = 0;
  for (const std::string& c : commands()) {
    const std::string own = section(doc, "## anvil " + c);
    for (const HelpOption& o : command_options(c)) {
      if (o.default_value.empty()) continue;
      // The command's own row, else the shared one, else the command's or the shared prose.
      std::string line = documenting_text(own, o, true);
      if (line.empty()) line = documenting_text(shared, o, true);
      if (line.empty()) line = documenting_text(own, o, false);
      if (line.empty()) line = documenting_text(shared, o, false);
      EXPECT_TRUE(has_word(line, o.default_value))
          << "anvil " << c << " " << o.long_name() << " defaults to " << o.default_value
          << " (--help), but docs/cli.md's line for it says otherwise or nothing: " << line;
      ++checked;
    }
  }
  EXPECT_GE(checked, 30);
}

// docs/api.md's table of `anvil serve`'s options (before "## Endpoints") has every option of
// `anvil serve --help`, and every option it lists is one of serve's.
TEST(CliDocs, ApiReferenceListsEveryServeOption) {
  const std::string api = read(kRoot / "docs" / "api.md");
  const std::string table = api.substr(0, api.find("\n## Endpoints"));
  ASSERT_NE(table.size(), api.size()) << "docs/api.md has no '## Endpoints'";
  std::set<std::string> serve;
  for (const HelpOption& o : command_options("serve"))
    for (const std::string& f : o.long_names()) {
      serve.insert(f);
      if (f == o.long_name()) EXPECT_TRUE(names_flag(table, f)) << "anvil serve " << f << " is not in docs/api.md";
    }
  ASSERT_GE(serve.size(), 20u);
  for (const std::string& cell : table_first_cells(table))
    for (const std::string& f : flags_in(cell))
      EXPECT_TRUE(serve.count(f)) << "docs/api.md lists " << f << ", which anvil serve does not have";
}

// Every command line the README shows (its fenced blocks' lines that start with "anvil CMD") uses
// only options that anvil CMD has.
TEST(CliDocs, ReadmeExamplesUseExistingOptions) {
  const std::string readme = read(kRoot / "README.md");
  std::map<std::string, std::set<std::string>> flags_of;
  for (const std::string& c : commands())
    for (const HelpOption& o : command_options(c))
      for (const std::string& f : o.long_names()) flags_of[c].insert(f);
  int lines = 0;
  bool fenced = false;
  std::istringstream in(readme);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (!fenced || line.rfind("anvil ", 0) != 0) continue;
    std::istringstream w(line.substr(6));
    std::string cmd;
    w >> cmd;
    ASSERT_TRUE(flags_of.count(cmd)) << "the README runs an unknown command: " << line;
    ++lines;
    const std::string command = line.substr(0, line.find(" # "));  // the comment is prose
    for (const std::string& f : flags_in(command))
      EXPECT_TRUE(flags_of[cmd].count(f)) << "the README's `" << command << "` uses " << f
                                          << ", which anvil " << cmd << " does not have";
  }
  EXPECT_GE(lines, 15);
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
