// The anvil executable: subcommands are registered by src/cli/cmd_*.cpp.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>

#include "cli/command.h"
#include "cli/did_you_mean.h"
#include "cli/output.h"
#include "cli/unexpected_flag.h"

namespace {

// When `word` is none of `names`: "unknown <what> 'word'; did you mean '<closest>'? (<what>s: ...;
// see <help>)" on stderr, and true. A mistyped subcommand is named, never a generic parse error.
bool refuse_unknown(const std::string& word, const std::vector<std::string>& names, const std::string& what,
                    const std::string& help) {
  if (std::find(names.begin(), names.end(), word) != names.end()) return false;
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  const std::string best = anvil::cli::closest_name(word, names);
  std::string hint = best.empty() ? "" : "; did you mean '" + best + "'?";
  std::fprintf(stderr, "anvil: error: unknown %s '%s'%s (%ss: %s; see %s --help)\n", what.c_str(), word.c_str(),
               hint.c_str(), what.c_str(), list.c_str(), help.c_str());
  return true;
}

// The option of `app` (or of an app it falls through to, the kv subcommands' parent) that the
// word `w` names ("--ctx", "-c", "--ctx=5"), or null.
const CLI::Option* option_named(CLI::App* app, const std::string& w) {
  const std::string name = w.substr(0, w.find('='));
  for (CLI::App* a = app; a; a = a->get_parent())
    if (const CLI::Option* o = a->get_option_no_throw(name)) return o;
  return nullptr;
}

// A flag is never taken for the value of the option before it (`bench --prompt --runs 1` read
// "--runs" as the prompt length): an option that needs a value, followed by another option of the
// command, is refused naming both, "anvil: error: --prompt needs a value (INT), but the next
// argument is the option --runs ...". A value that does start with '-' is still given as
// --name=VALUE, and words that name no option ("-", "-1") stay values. args: argv[1..], in order.
bool refuse_option_as_value(CLI::App& app, const std::vector<std::string>& args) {
  CLI::App* cur = &app;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& w = args[i];
    if (w == "--") break;
    if (w.size() < 2 || w[0] != '-') {  // a (sub)command, or a positional value
      for (CLI::App* sub : cur->get_subcommands([](CLI::App*) { return true; }))
        if (sub->get_name() == w) {
          cur = sub;
          break;
        }
      continue;
    }
    const CLI::Option* o = w.find('=') == std::string::npos ? option_named(cur, w) : nullptr;
    if (!o || o->get_items_expected_min() == 0 || i + 1 >= args.size()) continue;
    const std::string& next = args[i + 1];
    if (next.size() >= 2 && next[0] == '-' && next != "--" && option_named(cur, next)) {
      const auto& longs = o->get_lnames();
      const std::string spelled = longs.empty() ? w : "--" + longs.front();
      std::string where = "anvil";
      for (CLI::App* a = cur; a && a != &app; a = a->get_parent()) where.insert(5, " " + a->get_name());
      std::fprintf(stderr,
                   "anvil: error: %s needs a value (%s), but the next argument is the option %s: give %s its value "
                   "(one that starts with '-' is written %s=VALUE) (see %s --help)\n",
                   w.c_str(), o->get_type_name().c_str(), next.c_str(), w.c_str(), spelled.c_str(), where.c_str());
      return true;
    }
    ++i;  // its value
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anvil: a native LLM inference engine for Qwen3-family (MLX and Hugging Face safetensors) models"};
  app.name("anvil");  // help's usage lines read "anvil run [OPTIONS]", not "run [OPTIONS]"
  app.set_version_flag("--version", "anvil 0.1.0");
  app.require_subcommand(1);
  anvil::cli::watch_output();  // a closed stdout is a write error to handle, not a SIGPIPE death
  auto& reg = anvil::cli::command_registry();
  std::sort(reg.begin(), reg.end(), [](auto& a, auto& b) { return a.order < b.order; });
  std::vector<std::pair<CLI::App*, std::function<int()>>> subs;
  for (auto& c : reg) {
    CLI::App* sub = app.add_subcommand(c.name, c.description);
    subs.emplace_back(sub, c.setup(*sub));
  }
  // The first word names the command: an unknown one is named, with the closest command.
  if (argc > 1 && argv[1][0] != '-') {
    std::vector<std::string> names;
    for (auto& c : reg) names.push_back(c.name);
    if (refuse_unknown(argv[1], names, "command", "anvil")) return 1;
    // So is a command's own subcommand (anvil kv lss): its first word that is neither an option
    // nor an option's value.
    CLI::App* cmd = app.get_subcommand(argv[1]);
    std::vector<std::string> subs_of;
    for (CLI::App* s : cmd->get_subcommands([](CLI::App*) { return true; })) subs_of.push_back(s->get_name());
    for (int i = 2; i < argc && !subs_of.empty(); ++i) {
      const std::string w = argv[i];
      if (w == "--") break;
      if (w[0] == '-') {
        const CLI::Option* o = cmd->get_option_no_throw(w.substr(0, w.find('=')));
        if (!o) break;  // not the command's flag: the parse names it (and the word after may be its value)
        if (w.find('=') == std::string::npos && o->get_items_expected_min() > 0) ++i;  // its value
        continue;
      }
      if (refuse_unknown(w, subs_of, std::string(argv[1]) + " subcommand", std::string("anvil ") + argv[1])) return 1;
      break;
    }
  }
  // llama-server spells --parallel "-np"; CLI11 short names are one letter, so map it here.
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    const std::string w = argv[i];
    args.push_back(w == "-np" ? "--parallel" : w.rfind("-np=", 0) == 0 ? "--parallel=" + w.substr(4) : w);
  }
  if (refuse_option_as_value(app, args)) return 1;
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and exit 0 as the library does; any other parse error follows the
    // CLI's one contract (docs/cli.md): "anvil: error: ..." on stderr, exit code 1.
    if (e.get_exit_code() == 0) return anvil::cli::finish_output(app.exit(e));
    if (argc == 1) {
      std::fputs(app.help().c_str(), stderr);
      return 1;
    }
    // A flag the command does not have: which commands have it, or the closest of its own.
    // (Also where CLI11 finds a required argument missing first: the stray flag is the likelier cause.)
    if (dynamic_cast<const CLI::ExtrasError*>(&e) || dynamic_cast<const CLI::RequiredError*>(&e))
      if (auto u = anvil::cli::explain_unexpected_flag(app)) {
        std::fprintf(stderr, "anvil: error: %s (see %s --help)\n", u->message.c_str(), u->command.c_str());
        return 1;
      }
    std::string where = "anvil";
    for (CLI::App* sub = &app; sub;) {
      auto parsed = sub->get_subcommands();
      sub = parsed.empty() ? nullptr : parsed.front();
      if (sub) where += " " + sub->get_name();
    }
    std::fprintf(stderr, "anvil: error: %s (see %s --help)\n", e.what(), where.c_str());
    return 1;
  }
  for (auto& [sub, run] : subs)
    if (sub->parsed()) return anvil::cli::finish_output(run());
  return 1;
}
