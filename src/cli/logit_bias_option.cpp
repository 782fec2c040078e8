#include "cli/logit_bias_option.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>

namespace anvil::cli {
namespace {

constexpr const char* kFlag = "-l/--logit-bias";
constexpr const char* kForm = "TOKEN_ID+BIAS, TOKEN_ID-BIAS or TOKEN_ID=BIAS (e.g. 15043+1.5)";

bool equals_lower(const std::string& s, const char* word) {
  std::string l = s;
  for (char& c : l) c = char(std::tolower(static_cast<unsigned char>(c)));
  return l == word;
}

}  // namespace

Result<LogitBias> parse_logit_bias_value(const std::string& text) {
  auto refuse = [&](const std::string& what) {
    return invalid_argument(std::string(kFlag) + " " + what + ", got '" + text + "'");
  };
  // The id: decimal digits, nothing else (no sign, no space).
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0 || i == text.size() || (text[i] != '+' && text[i] != '-' && text[i] != '='))
    return refuse(std::string("must be ") + kForm);
  const std::string id_text = text.substr(0, i);
  errno = 0;
  const unsigned long long id = id_text.size() > 12 ? ULLONG_MAX : std::strtoull(id_text.c_str(), nullptr, 10);
  if (errno == ERANGE || id > uint64_t(INT32_MAX))
    return refuse("takes a token id in [0, " + std::to_string(INT32_MAX) + "]");
  // The bias: after '+' or '-', an unsigned number (that sign is its sign); after '=', a number with
  // an optional sign. Decimal digits, '.', an exponent; or inf/infinity for -inf.
  char sign = text[i] == '=' ? '+' : text[i];
  std::string mag = text.substr(i + 1);  // the number without its sign
  if (text[i] == '=' && !mag.empty() && (mag[0] == '+' || mag[0] == '-')) {
    sign = mag[0];
    mag.erase(0, 1);
  }
  const std::string form = std::string("must be ") + kForm;
  const std::string range = "takes a bias in [-100, 100] (-inf = -100, the lowest)";
  if (equals_lower(mag, "inf") || equals_lower(mag, "infinity")) {
    if (sign == '+') return refuse(range);
    return LogitBias{int32_t(id), -kMaxLogitBias};
  }
  // A digit first (".5" too); then digits, '.', and an exponent's e and sign.
  const size_t first = !mag.empty() && mag[0] == '.' ? 1 : 0;
  if (mag.size() <= first || !std::isdigit(static_cast<unsigned char>(mag[first]))) return refuse(form);
  for (char c : mag)
    if (!std::isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' && c != '+' && c != '-')
      return refuse(form);
  const std::string num = sign + mag;
  char* end = nullptr;
  const double bias = std::strtod(num.c_str(), &end);
  if (*end != 0) return refuse(form);
  if (!std::isfinite(bias) || bias < -kMaxLogitBias || bias > kMaxLogitBias) return refuse(range);
  return LogitBias{int32_t(id), float(bias)};
}

CLI::Option* add_logit_bias_option(CLI::App& app, std::vector<LogitBias>& out) {
  auto set = [&out](const std::vector<std::string>& values) {
    // (A ValidationError of one argument is printed as it is: "anvil: error: <message> (see ...)".)
    if (values.size() > size_t(kMaxLogitBiasEntries))
      throw CLI::ValidationError(std::string(kFlag) + " is given at most " + std::to_string(kMaxLogitBiasEntries) +
                                 " times, got " + std::to_string(values.size()));
    std::vector<std::pair<LogitBias, std::string>> v;
    for (const std::string& s : values) {
      auto b = parse_logit_bias_value(s);
      if (!b.is_ok()) throw CLI::ValidationError(b.status().message());
      v.emplace_back(*b, s);
    }
    std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first.id < b.first.id; });
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i].first.id == v[i - 1].first.id)
        throw CLI::ValidationError(std::string(kFlag) + " names token " + std::to_string(v[i].first.id) + " twice ('" +
                                   v[i - 1].second + "', '" + v[i].second + "'): give each token once");
    out.clear();
    for (const auto& e : v) out.push_back(e.first);
  };
  return app.add_option_function<std::vector<std::string>>("-l,--logit-bias", set,
                                                           "Add BIAS to token TOKEN_ID's logit before sampling "
                                                           "(greedy too), repeatable: TOKEN_ID+BIAS, TOKEN_ID-BIAS or "
                                                           "TOKEN_ID=BIAS, the bias in [-100, 100] (-inf = -100); "
                                                           "e.g. -l 15043+1.5 -l 42-inf")
      ->type_name("TOKEN_ID(+/-)BIAS")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

Status check_logit_bias_vocab(const std::vector<LogitBias>& bias, int64_t vocab) {
  for (const LogitBias& b : bias)
    if (b.id >= vocab)
      return invalid_argument(std::string(kFlag) + ": token id " + std::to_string(b.id) +
                              " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
  return Status::ok();
}

}  // namespace anvil::cli
