#include "cli/unexpected_flag.h"

#include <algorithm>
#include <cctype>
#include <map>

#include "cli/did_you_mean.h"

namespace anvil::cli {
namespace {

struct Hint {
  std::vector<std::string> names;
  std::string text;
};

std::map<const CLI::App*, std::vector<Hint>>& hints() {
  static std::map<const CLI::App*, std::vector<Hint>> h;
  return h;
}

// "anvil", "anvil serve", "anvil kv ls"; `relative` leaves out "anvil " ("kv ls").
std::string command_path(const CLI::App* app, bool relative = false) {
  std::string path;
  for (const CLI::App* a = app; a && a->get_parent(); a = a->get_parent())
    path = a->get_name() + (path.empty() ? "" : " " + path);
  return relative ? path : path.empty() ? "anvil" : "anvil " + path;
}

// "-p/--prompt", as the help and the docs write a flag.
std::string spelling(const CLI::Option* o) {
  std::string s;
  for (const std::string& n : o->get_snames()) s += (s.empty() ? "-" : "/-") + n;
  for (const std::string& n : o->get_lnames()) s += (s.empty() ? "--" : "/--") + n;
  return s;
}

// A flag the help lists (not a hidden old spelling, not -h/--help, which every command has).
const CLI::Option* listed_option(const CLI::App* app, const std::string& name) {
  const CLI::Option* o = app->get_option_no_throw(name);
  if (!o || o->get_group().empty() || o->check_lname("help")) return nullptr;
  return o;
}

// `word` is written as a flag: "-x", "--xy", "--xy=v"; not "-", "--", "-1" or "-.5" (values).
bool looks_like_flag(const std::string& word) {
  const size_t dashes = word.rfind("--", 0) == 0 ? 2 : word.rfind('-', 0) == 0 ? 1 : 0;
  return dashes > 0 && word.size() > dashes && std::isalpha(static_cast<unsigned char>(word[dashes]));
}

// "a", "a and b", "a, b and c".
std::string join_and(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return s;
}

struct Owner {
  const CLI::App* app;
  const CLI::Option* option;
};

// Every command under `app` (depth first, in the order they were added) that lists flag `name`,
// except `given` and the commands it takes flags from (its parents): a parent that has the flag
// stands for its subcommands.
void collect_owners(const CLI::App* app, const CLI::App* given, const std::string& name, std::vector<Owner>* out) {
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; })) {
    bool is_given_or_parent = false;
    for (const CLI::App* a = given; a; a = a->get_parent()) is_given_or_parent |= a == sub;
    const CLI::Option* o = is_given_or_parent ? nullptr : listed_option(sub, name);
    if (o) out->push_back({sub, o});
    else collect_owners(sub, given, name, out);
  }
}

// The flag's own name in `word`: "--port=1" -> "--port"; a short flag with its value attached
// ("-l5+1") -> "-l" when the whole word names no flag of `root`'s commands.
std::vector<std::string> names_in(const std::string& word) {
  std::vector<std::string> names = {word.substr(0, word.find('='))};
  if (word[1] != '-' && names[0].size() > 2) names.push_back(word.substr(0, 2));
  return names;
}

UnexpectedFlag explain(const CLI::App& root, const CLI::App* given, const std::string& word) {
  const std::string where = command_path(given);
  for (const std::string& name : names_in(word)) {
    std::vector<Owner> owners;
    collect_owners(&root, given, name, &owners);
    if (owners.empty()) continue;
    // Grouped by how each command spells it ("-c/--ctx" here, "-c/--ctx" there): one spelling, the
    // usual case, names the flag once.
    std::vector<std::pair<std::string, std::vector<std::string>>> by_spelling;
    for (const Owner& o : owners) {
      const std::string sp = spelling(o.option);
      auto it = std::find_if(by_spelling.begin(), by_spelling.end(), [&](const auto& g) { return g.first == sp; });
      if (it == by_spelling.end()) by_spelling.push_back({sp, {}}), it = by_spelling.end() - 1;
      it->second.push_back(command_path(o.app, true));
    }
    std::string msg = (by_spelling.size() == 1 ? by_spelling[0].first : name) + " is not a flag of " + where;
    if (auto h = hints().find(given); h != hints().end())
      for (const Hint& hint : h->second)
        if (std::any_of(hint.names.begin(), hint.names.end(),
                        [&](const std::string& n) {
                          return std::any_of(owners.begin(), owners.end(),
                                             [&](const Owner& o) { return o.option->check_name(n); });
                        })) {
          msg += ": " + hint.text;
          break;
        }
    if (by_spelling.size() == 1) {
      msg += "; it is a flag of " + join_and(by_spelling[0].second);
    } else {
      std::vector<std::string> parts;
      for (const auto& [sp, cmds] : by_spelling) parts.push_back(sp + " of " + join_and(cmds));
      msg += "; it is " + join_and(parts);
    }
    return {msg, where};
  }
  // No command has it: the closest long flag of this one, when one is close (a short one, a letter,
  // is close to every other letter: no guess for those).
  std::string msg = where + " has no flag " + word.substr(0, word.find('='));
  if (word.rfind("--", 0) == 0) {
    std::vector<std::string> longs;
    for (const CLI::App* a = given; a; a = a->get_parent())
      for (const CLI::Option* o : a->get_options())
        if (!o->get_group().empty())
          for (const std::string& n : o->get_lnames()) longs.push_back(n);
    const std::string best = closest_name(word.substr(2, word.find('=') - 2), longs);
    if (!best.empty()) msg += "; did you mean --" + best + "?";
  }
  return {msg, where};
}

}  // namespace

void add_flag_hint(CLI::App& app, const std::vector<std::string>& names, const std::string& hint) {
  hints()[&app].push_back({names, hint});
}

std::optional<UnexpectedFlag> explain_unexpected_flag(const CLI::App& root) {
  // The commands that were parsed, outermost first; each keeps the arguments it did not take, or
  // passes them to its parent (fallthrough: kv and its subcommands, for --kv-store).
  std::vector<const CLI::App*> chain = {&root};
  for (auto parsed = root.get_subcommands(); !parsed.empty(); parsed = parsed.front()->get_subcommands())
    chain.push_back(parsed.front());
  for (size_t i = 0; i < chain.size(); ++i)
    for (const std::string& word : chain[i]->remaining(false)) {
      if (!looks_like_flag(word)) continue;
      size_t given = i;  // the command it was given to, or one that passed it up
      while (given + 1 < chain.size() && chain[given + 1]->get_fallthrough()) ++given;
      // A flag of a command named later on the line, written before that command's name.
      for (size_t j = given; j < chain.size(); ++j)
        for (const std::string& name : names_in(word))
          if (const CLI::Option* o = listed_option(chain[j], name))
            return UnexpectedFlag{spelling(o) + " is a flag of " + command_path(chain[j]) + ": give it after '" +
                                      chain[j]->get_name() + "'",
                                  command_path(chain[j])};
      return explain(root, chain[given], word);
    }
  return std::nullopt;
}

}  // namespace anvil::cli
