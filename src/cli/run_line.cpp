#include "cli/run_line.h"

#include <algorithm>
#include <cctype>

#include "cli/did_you_mean.h"

namespace anvil::cli {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }
bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
}

// The length of the command word of `s` ("/reset  " -> 6), or 0 when `s` is not command-shaped.
size_t command_word_length(const std::string& s) {
  if (s.size() < 2 || s[0] != '/' || !std::isalpha(static_cast<unsigned char>(s[1]))) return 0;
  size_t end = 2;
  while (end < s.size() && static_cast<unsigned char>(s[end]) < 0x80 && is_word_char(s[end])) ++end;
  return end == s.size() || is_space(s[end]) ? end : 0;
}

std::string command_list() {
  std::string list;
  for (const RunCommand& c : run_commands()) list += (list.empty() ? "" : ", ") + c.name;
  return list;
}

}  // namespace

const std::vector<RunCommand>& run_commands() {
  static const std::vector<RunCommand> commands = {
      {"/help", "list these commands"},
      {"/reset", "clear the conversation (the system message stays); with --session, the session is cleared too"},
      {"/quit", "leave (Ctrl-D too)"},
      {"/exit", "leave, as /quit"},
  };
  return commands;
}

std::string run_help(bool completion) {
  std::string h = "Commands:\n";
  for (const RunCommand& c : run_commands()) {
    std::string help = c.help;
    if (completion && c.name == "/reset") help = "clear the text; with --session, the session is cleared too";
    h += "  " + c.name + std::string(8 - std::min<size_t>(7, c.name.size()), ' ') + help + "\n";
  }
  h += "Any other line is sent to the model; an empty one sends nothing. A line that starts with '/' and a word\n"
       "(/name) is taken for a command: to send one, begin it with '//' (\"//reset\" sends \"/reset\"). Other lines\n"
       "that start with '/' are sent as typed (\"/usr/bin/python is broken\", \"// comment\").\n"
       "Ctrl-C stops an answer.\n";
  return h;
}

TypedLine classify_typed_line(const std::string& line) {
  if (std::all_of(line.begin(), line.end(), is_space)) return {TypedLine::kNothing, ""};
  if (line.size() > 2 && line[0] == '/' && command_word_length(line.substr(1)) > 0)
    return {TypedLine::kText, line.substr(1)};
  const size_t n = command_word_length(line);
  if (n == 0) return {TypedLine::kText, line};
  const std::string word = line.substr(0, n);
  std::vector<std::string> names;
  for (const RunCommand& c : run_commands()) names.push_back(c.name);
  if (std::find(names.begin(), names.end(), word) == names.end()) {
    std::string lower = word;
    for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    const std::string best = closest_name(lower, names);
    return {TypedLine::kRefused, "unknown command '" + word + "'" +
                                     (best.empty() ? "" : "; did you mean '" + best + "'?") + " (commands: " +
                                     command_list() + "; /help says more); nothing was sent: to send a line " +
                                     "that starts with '" + word + "', begin it with '/" + word + "'"};
  }
  if (!std::all_of(line.begin() + n, line.end(), is_space))
    return {TypedLine::kRefused,
            word + " takes no arguments; nothing was done (to send the line as text, begin it with '/" + word + "')"};
  return {TypedLine::kCommand, word};
}

}  // namespace anvil::cli
