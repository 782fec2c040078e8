#include "cli/did_you_mean.h"

#include <algorithm>
#include <cstdint>

namespace anvil::cli {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string closest_name(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& n : names) {
    size_t d = edit_distance(word, n);
    if (d < best_d) best_d = d, best = n;
  }
  return best_d <= std::max<size_t>(2, best.size() / 3) ? best : "";
}

}  // namespace anvil::cli
