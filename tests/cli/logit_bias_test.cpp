// -l/--logit-bias of anvil generate and anvil run (cli/logit_bias_option.h) on the bundled model:
// the bias reaches the sampler (greedy and sampled), -inf is -100, and bad values are refused
// naming the flag and the value, an id past the vocabulary once the model has loaded; anvil serve
// refuses it saying that a request carries its own logit_bias.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "format/npy.h"

using anvil::test::run_anvil;
namespace fs = std::filesystem;

namespace {
const std::string kModel = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
const std::string kPrompt = "def fibonacci(n):\n";

nlohmann::json last_json_line(const std::string& out) {
  const size_t end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nullptr;
  const size_t nl = out.rfind('\n', end);
  const size_t start = nl == std::string::npos ? 0 : nl + 1;
  return nlohmann::json::parse(out.substr(start, end + 1 - start), nullptr, false);
}

// The ids of `generate --json` with `extra` flags (greedy unless they say --temp, n tokens); fails the test on error.
std::vector<int> generated(const std::vector<std::string>& extra, int n = 8) {
  std::vector<std::string> args = {"generate", "-m", kModel, "-p", kPrompt, "-n", std::to_string(n), "--ignore-eos",
                                   "--json"};
  if (std::find(extra.begin(), extra.end(), "--temp") == extra.end()) args.insert(args.end(), {"--temp", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_anvil(args);
  EXPECT_EQ(r.exit_code, 0) << run_anvil(args, true).out;
  auto j = last_json_line(r.out);
  if (!j.is_object() || !j.contains("ids")) {
    ADD_FAILURE() << "no JSON in: " << r.out;
    return {};
  }
  return j["ids"].get<std::vector<int>>();
}

// The text `generate --json` reports with `extra` flags.
std::string generated_text(const std::vector<std::string>& extra, int n) {
  std::vector<std::string> args = {"generate", "-m", kModel, "-p", kPrompt, "-n", std::to_string(n), "--ignore-eos",
                                   "--json"};
  if (std::find(extra.begin(), extra.end(), "--temp") == extra.end()) args.insert(args.end(), {"--temp", "0"});
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_anvil(args);
  EXPECT_EQ(r.exit_code, 0) << run_anvil(args, true).out;
  auto j = last_json_line(r.out);
  return j.is_object() ? j.value("text", std::string()) : std::string();
}
}  // namespace

// +100 on a token the model would not pick makes it the answer at every step, greedy and sampled,
// whatever the spelling (llama.cpp's ID+BIAS, ID=BIAS, --logit-bias=...), and in whatever order the
// flags come (the ids reach the sampler ascending).
TEST(CliLogitBias, PlusHundredPicksTheTokenEveryStep) {
  const std::vector<int> plain = generated({});
  ASSERT_EQ(plain.size(), 8u);
  int forced = 1000;
  while (std::find(plain.begin(), plain.end(), forced) != plain.end()) ++forced;
  const std::vector<int> all(8, forced);
  const std::string id = std::to_string(forced);
  EXPECT_EQ(generated({"-l", id + "+100"}), all);
  EXPECT_EQ(generated({"--logit-bias=" + id + "=100"}), all);
  // Two flags, the larger id first; the other entry is a small negative bias elsewhere.
  EXPECT_EQ(generated({"-l", "8000-1", "-l", id + "+100"}), all);
  // Sampling (temperature 0.9, top-k 40) goes through the same bias.
  EXPECT_EQ(generated({"--temp", "0.9", "--top-k", "40", "--seed", "3", "-l", id + "+100"}), all);
}

// -100 on the unbiased greedy first token makes the first token the runner-up of the prompt's last
// logits (read from --dump-logits: the model's own forward, no bias); -inf is the same -100.
TEST(CliLogitBias, MinusHundredOnTheGreedyTokenGivesTheRunnerUp) {
  const std::vector<int> plain = generated({}, 1);
  ASSERT_EQ(plain.size(), 1u);
  const int top = plain[0];

  const fs::path npy = fs::temp_directory_path() / ("anvil_bias_logits_" + std::to_string(getpid()) + ".npy");
  auto tok = run_anvil({"tokenize", "-m", kModel, "--text", kPrompt, "--json"});
  ASSERT_EQ(tok.exit_code, 0) << tok.out;
  std::string csv;
  const auto ids = nlohmann::json::parse(tok.out)["ids"];
  for (auto& i : ids) csv += (csv.empty() ? "" : ",") + std::to_string(i.get<int>());
  auto d = run_anvil({"generate", "-m", kModel, "--ids", csv, "-n", "0", "--dump-logits", npy.string()}, true);
  ASSERT_EQ(d.exit_code, 0) << d.out;
  auto arr = anvil::read_npy(npy.string());
  fs::remove(npy);
  ASSERT_TRUE(arr.is_ok()) << arr.status().message();
  ASSERT_EQ(arr->shape.size(), 2u);
  const int64_t vocab = arr->shape[1];
  const float* last = arr->f32() + (arr->shape[0] - 1) * vocab;
  ASSERT_EQ(std::max_element(last, last + vocab) - last, top) << "the dumped logits disagree with greedy decoding";
  int64_t second = top == 0 ? 1 : 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (i != top && last[i] > last[second]) second = i;

  const std::vector<int> biased = generated({"-l", std::to_string(top) + "-100"}, 1);
  ASSERT_EQ(biased.size(), 1u);
  EXPECT_NE(biased[0], top);
  EXPECT_EQ(biased[0], second);
  EXPECT_EQ(generated({"-l", std::to_string(top) + "-inf"}, 1), biased);
  EXPECT_EQ(generated({"-l", std::to_string(top) + "=-100"}, 1), biased);
}

// Each bad value is refused (exit 1) naming the flag and the value as typed, before the model runs;
// an id past the vocabulary once the model has loaded, before anything is generated.
TEST(CliLogitBias, BadValuesAreRefusedByName) {
  struct Case {
    std::string value, says;
  };
  const Case cases[] = {
      {"abc", "TOKEN_ID+BIAS"},     {"15", "TOKEN_ID+BIAS"},     {"15+", "TOKEN_ID+BIAS"},
      {"-15+1", "TOKEN_ID+BIAS"},   {"15++1", "TOKEN_ID+BIAS"},  {"15 +1", "TOKEN_ID+BIAS"},
      {"15+nan", "TOKEN_ID+BIAS"},  {"15=0x10", "TOKEN_ID+BIAS"}, {"15+1e", "TOKEN_ID+BIAS"},
      {"15+100.5", "[-100, 100]"},  {"15-101", "[-100, 100]"},   {"15+inf", "[-100, 100]"},
      {"15=1e400", "[-100, 100]"},  {"2147483648+1", "[0, 2147483647]"},
  };
  for (const Case& c : cases)
    for (const char* cmd : {"generate", "run"}) {
      auto r = run_anvil({cmd, "-m", kModel, "-p", "x", "-n", "2", "-l", c.value}, true);
      EXPECT_EQ(r.exit_code, 1) << cmd << " " << c.value << ": " << r.out;
      EXPECT_NE(r.out.find("-l/--logit-bias"), std::string::npos) << cmd << " " << c.value << ": " << r.out;
      EXPECT_NE(r.out.find("'" + c.value + "'"), std::string::npos) << cmd << " " << c.value << ": " << r.out;
      EXPECT_NE(r.out.find(c.says), std::string::npos) << cmd << " " << c.value << ": " << r.out;
    }
  // The same token twice: an error naming both values, whichever order.
  auto r = run_anvil({"generate", "-m", kModel, "-p", "x", "-n", "2", "-l", "15+1", "-l", "7-1", "-l", "15=-2"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("-l/--logit-bias names token 15 twice ('15+1', '15=-2')"), std::string::npos) << r.out;
  // The bundled model's vocabulary is 8192 ids: 8191 is its last, 8192 is refused once it has loaded.
  for (const char* cmd : {"generate", "run"}) {
    r = run_anvil({cmd, "-m", kModel, "-p", "x", "-n", "2", "-l", "8192+1"}, true);
    EXPECT_EQ(r.exit_code, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("-l/--logit-bias: token id 8192 is outside the model's vocabulary [0, 8192)"),
              std::string::npos)
        << cmd << ": " << r.out;
    EXPECT_EQ(r.out.find("prompt"), std::string::npos) << cmd << ": nothing is generated: " << r.out;
    r = run_anvil({cmd, "-m", kModel, "-p", "x", "-n", "2", "-l", "8191-1"}, true);
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.out;
  }
}

// serve has no such flag: a request carries its own logit_bias, which the refusal says, whatever the
// spelling and with or without a value (not CLI11's "The following arguments were not expected"), and
// which commands do have it (cli/unexpected_flag.h), while the command line is parsed (before the model
// loads, and under timeout: a server that started anyway would never exit). --help does not list it.
TEST(CliLogitBias, ServeSaysTheBiasIsPerRequest) {
  for (const std::vector<std::string>& flag : std::vector<std::vector<std::string>>{
           {"-l", "15+1"}, {"--logit-bias", "15+1"}, {"--logit-bias=15-inf"}, {"-l15+1"}, {"-l"}, {"-l", "abc"}}) {
    std::vector<std::string> args = {"serve", "-m", kModel, "--port", "0", "--no-kv-store"};
    args.insert(args.end(), flag.begin(), flag.end());
    auto r = anvil::test::run_shell("timeout 60 " + anvil::test::anvil_command(args) + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << flag[0] << ": " << r.out;
    EXPECT_NE(r.out.find("-l/--logit-bias is not a flag of anvil serve: each request carries its own bias, the "
                         "logit_bias field of its body"),
              std::string::npos)
        << flag[0] << ": " << r.out;
    EXPECT_NE(r.out.find("; it is a flag of run and generate (see anvil serve --help)"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("not expected"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
  }
  auto help = run_anvil({"serve", "--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out.find("logit-bias"), std::string::npos) << help.out;
}

// anvil run takes the flag too: its answer is the forced token, as generate's is.
TEST(CliLogitBias, RunAnswersWithTheBiasedToken) {
  const std::string forced = "1000";
  const std::string want = generated_text({"-l", forced + "+100"}, 4);
  ASSERT_FALSE(want.empty());
  auto r = run_anvil({"run", "-m", kModel, "-p", "say something", "-n", "4", "-l", forced + "+100"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find(want), std::string::npos) << "run printed: " << r.out << "\ngenerate's text: " << want;
  // And without it, run answers something else.
  r = run_anvil({"run", "-m", kModel, "-p", "say something", "-n", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find(want), std::string::npos) << r.out;
}
