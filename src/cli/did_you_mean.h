// "Did you mean": the known name closest to a mistyped one, for the subcommands (main.cpp) and
// anvil run's slash commands (run_line.cpp).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace anvil::cli {

// Levenshtein distance between a and b (bytes).
size_t edit_distance(const std::string& a, const std::string& b);

// The name of `names` closest to `word`, when it is close enough to be what was meant (at most
// 2 edits, or a third of its length); "" when none is. `word` itself when it is one of them.
std::string closest_name(const std::string& word, const std::vector<std::string>& names);

}  // namespace anvil::cli
