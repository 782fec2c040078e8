// What a line typed at anvil run's prompt is: nothing (empty, or only whitespace), one of the
// slash commands, a mistyped command (refused: nothing is sent or recorded), or text to send.
// A command is a line whose first character is '/' followed by a command word: an ASCII letter,
// then letters, digits, '-' or '_', up to whitespace or the end of the line. Any other line that
// starts with '/' is text as typed (a path such as "/usr/bin/python is broken", "/* a comment */",
// "// a comment", "/"), as is a line that starts with whitespace. A command-shaped line after a
// second '/' ("//reset ...") is text without that '/' ("/reset ..."): the way to send one.
#pragma once
#include <string>
#include <vector>

namespace anvil::cli {

struct RunCommand {
  std::string name;  // "/reset"
  std::string help;  // one line for /help
};

// The commands, in /help's order.
const std::vector<RunCommand>& run_commands();

// /help's text (several lines, each ending in '\n'); `completion`: a model without a chat template
// (the conversation is one text).
std::string run_help(bool completion);

struct TypedLine {
  enum Kind { kNothing, kText, kCommand, kRefused } kind = kNothing;
  std::string text;  // kText: what to send; kCommand: the command's name ("/reset"); kRefused: why
};

TypedLine classify_typed_line(const std::string& line);

}  // namespace anvil::cli
