// The CLI's contract with a new user (issue 8): random sampling unless seeded, every bad flag value
// refused by name and range, an exact --ctx that ends generation cleanly, synth refusing to
// overwrite, bench's peak memory, a relocatable binary, and errors that say what was wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "cli_helpers.h"

using anvil::test::anvil_command;
using anvil::test::run_anvil;
using anvil::test::run_shell;
using anvil::test::shell_quote;
namespace fs = std::filesystem;

namespace {
const std::string kModel = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";

nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nlohmann::json();
  auto start = out.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return nlohmann::json::parse(out.substr(start, end - start + 1), nullptr, false);
}

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("anvil_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}
}  // namespace

// Defect 1: without --seed every run draws a fresh seed; --json reports it; that seed reproduces the run.
TEST(CliSeed, RandomUnlessGivenAndReportedForReproduction) {
  std::vector<std::string> args = {"generate", "-m", kModel, "-p", "class ", "-n", "24", "--temp", "1.0", "--json"};
  std::set<std::string> outputs;
  nlohmann::json first;
  for (int i = 0; i < 3; ++i) {
    auto r = run_anvil(args);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto j = last_json_line(r.out);
    ASSERT_TRUE(j.contains("seed")) << r.out;
    outputs.insert(j["ids"].dump());
    if (i == 0) first = j;
  }
  // 24 tokens at temperature 1 from three independent seeds: equal outputs mean the seed is fixed.
  EXPECT_GT(outputs.size(), 1u) << "three unseeded runs sampled the same tokens";
  auto again = args;
  again.insert(again.end(), {"--seed", std::to_string(first["seed"].get<uint64_t>())});
  auto r = run_anvil(again);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(last_json_line(r.out)["ids"], first["ids"]);
  EXPECT_EQ(last_json_line(r.out)["seed"], first["seed"]);
  // --seed -1 means "random", as in llama.cpp (not 2^64-1).
  auto m = args;
  m.insert(m.end(), {"--seed", "-1"});
  auto a = run_anvil(m), b = run_anvil(m);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  EXPECT_NE(last_json_line(a.out)["seed"], last_json_line(b.out)["seed"]);
  EXPECT_NE(last_json_line(a.out)["seed"].get<uint64_t>(), UINT64_MAX);
  // --temperature is --temp (vLLM's and the API's name): the same seeded run samples the same tokens.
  auto spelled = again;
  for (auto& s : spelled)
    if (s == "--temp") s = "--temperature";
  r = run_anvil(spelled);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(last_json_line(r.out)["ids"], first["ids"]);
}

// Defect 2: each bad sampling value is refused, naming the flag as typed and its range.
TEST(CliSampling, BadValuesAreRefusedByName) {
  struct Case {
    std::string flag, value, range;
  };
  const Case cases[] = {
      {"--temp", "-1", ">= 0"},          {"--temp", "nan", ">= 0"},         {"--temp", "inf", ">= 0"},
      {"--temp", "warm", "must be a number >= 0"}, {"--top-p", "-0.5", "(0, 1]"},    {"--top-p", "1.5", "(0, 1]"},
      {"--top-k", "-3", "[0, 2147483647]"}, {"--top-k", "2.5", "must be an integer in [0, 2147483647]"},
      {"--min-p", "-0.1", "[0, 1)"},
      {"--repeat-penalty", "-2", "> 0"}, {"--repeat-penalty", "0", "> 0"},  {"--seed", "-2", "-1"},
      {"--seed", "18446744073709551616", "18446744073709551615"},
  };
  for (const Case& c : cases) {
    auto r = run_anvil({"generate", "-m", kModel, "-p", "x", "-n", "2", c.flag, c.value}, true);
    EXPECT_EQ(r.exit_code, 1) << c.flag << " " << c.value << ": " << r.out;
    EXPECT_NE(r.out.find(c.flag), std::string::npos) << c.flag << " " << c.value << ": " << r.out;
    EXPECT_NE(r.out.find(c.range), std::string::npos) << c.flag << " " << c.value << ": " << r.out;
  }
  // The same checks hold in `run`.
  auto r = run_anvil({"run", "-m", kModel, "-p", "x", "-n", "2", "--top-k", "-3"}, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--top-k"), std::string::npos) << r.out;
  // Edge values inside the ranges are accepted.
  r = run_anvil({"generate", "-m", kModel, "-p", "x", "-n", "2", "--temp", "0", "--top-p", "1", "--min-p", "0",
                 "--top-k", "0", "--repeat-penalty", "1", "--seed", "18446744073709551615"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// A bad --kv-warm size is refused by name before the model loads.
// Flags whose bad values once did harm: an empty --api-key (authentication silently off), a
// negative --max-body (wrapped to no limit), --threads past any machine (an abort), bench-kv on a
// directory of someone else's files (deleted), bench-kv's own ranges (aborts) and flags its
// --open-lookup / --restore-pages modes would ignore; and tokenize takes
// an empty file or stdin as no ids, as it does an empty -p.
TEST(CliFlags, HarmfulValuesAreRefused) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const fs::path victim = temp_dir("victim");
  fs::create_directories(victim);
  { std::ofstream(victim / "notes.txt") << "precious"; }
  const std::vector<Case> cases = {
      {{"serve", "-m", kModel, "--no-kv-store", "--api-key", ""}, "--api-key is empty"},
      {{"serve", "-m", kModel, "--no-kv-store", "--max-body", "-1"}, "--max-body must be an integer in [1, 1048576]"},
      {{"generate", "-m", kModel, "-p", "x", "-n", "1", "--no-kv-store", "-t", "100000"}, "-t/--threads must be an integer in [0, 4096]"},
      {{"bench-kv", "--kv-store", victim.string(), "--open-lookup", "10"}, "new or empty directory"},
      {{"bench-kv", "--synthetic", "tiny", "--prompt-tokens", "-5"}, "--prompt-tokens must be an integer in [1, 16777216]"},
      {{"bench-kv", "--synthetic", "tiny", "--open-lookup", "3"}, "--open-lookup must be"},
      {{"bench-kv", "--open-lookup", "64", "--kv-durability", "bogus"}, "--kv-durability has no effect with --open-lookup"},
      {{"bench-kv", "--restore-pages", "8", "--synthetic", "tiny"}, "--synthetic has no effect with --restore-pages"},
      {{"bench-kv", "--synthetic", "tiny", "--no-kv-store"}, "--no-kv-store is not a flag of anvil bench-kv"},
      // A system message for a model without a chat template is refused, not dropped (run did).
      {{"run", "-m", kModel, "-p", "def f", "-n", "2", "--system", "Be brief.", "--no-kv-store"}, "--system needs a chat template"},
      {{"generate", "-m", kModel, "-p", "def f", "-n", "2", "--system", "Be brief.", "--no-kv-store"}, "--system needs a chat template"},
      {{"bench", "--synthetic", "tiny", "-c", "0", "-n", "4", "--prompt-tokens", "8"}, "-c/--ctx must be an integer in [1, 2147483647], got '0'"},
      {{"serve", "-m", kModel, "--no-kv-store", "--host", ""}, "--host is empty"},
      // llama-server's -np, also written -np=N, is --parallel and checked as it is.
      {{"serve", "-m", kModel, "--no-kv-store", "-np", "0"}, "--parallel must be an integer in [1, 2147483647], got '0'"},
      {{"serve", "-m", kModel, "--no-kv-store", "-np=0"}, "--parallel must be an integer in [1, 2147483647], got '0'"},
      {{"synth", "--shape", "tiny", "--out", ""}, "--out: an empty directory name"},
      {{"synth", "--shape", "tiny-moe", "--quant", "q4g128", "--out", (victim / "moe").string()}, "does not divide"},
  };
  for (const Case& c : cases) {
    auto r = run_anvil(c.args, true);
    EXPECT_EQ(r.exit_code, 1) << c.args[0] << ": " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << r.out;
  }
  EXPECT_TRUE(fs::exists(victim / "notes.txt")) << "bench-kv deleted a directory it did not make";
  fs::remove_all(victim);
  const fs::path empty = temp_dir("empty_text");
  { std::ofstream(empty.string()); }
  const std::string tok_dir = std::string(ANVIL_SOURCE_DIR) + "/tests/data/tokenizer/qwen3";
  auto t = run_anvil({"tokenize", "-m", tok_dir, "-f", empty.string(), "--json"});
  EXPECT_EQ(t.exit_code, 0) << t.out;
  EXPECT_EQ(last_json_line(t.out)["ids"], nlohmann::json::array()) << t.out;
  fs::remove(empty);
}

TEST(CliServe, BadKvWarmIsRefusedByName) {
  auto r = run_anvil({"serve", "--synthetic", "tiny", "--port", "0", "--kv-warm", "3Q"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--kv-warm"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("device"), std::string::npos) << "refused before the model loaded: " << r.out;
}

// Values a flag's type would take but that mean nothing are refused at parse time, by name.
TEST(CliFlags, NegativeOrNonFiniteValuesAreRefusedByName) {
  for (const char* v : {"-1", "nan", "inf"}) {
    // (under timeout: a value let through would start a server that never exits)
    auto r = anvil::test::run_shell("timeout 60 " +
                                    anvil::test::anvil_command({"serve", "--synthetic", "tiny", "--port", "0",
                                                                "--shutdown-timeout", v}) + " 2>&1");
    EXPECT_NE(r.exit_code, 0) << v << ": " << r.out;
    EXPECT_NE(r.out.find("--shutdown-timeout"), std::string::npos) << r.out;
  }
  auto s = run_anvil({"synth", "--shape", "tiny", "--out", "/tmp/anvil-never-written", "--seed", "-5"}, true);
  EXPECT_NE(s.exit_code, 0) << s.out;
  EXPECT_NE(s.out.find("--seed"), std::string::npos) << s.out;
}

// Defects 3 and 4: --ctx is exact, and reaching it ends generation with finish "length", keeping the text.
TEST(CliContext, ExactLimitEndsWithLengthKeepingTheOutput) {
  for (int ctx : {1, 5, 20, 33}) {
    auto r = run_anvil({"generate", "-m", kModel, "--ids", "1", "-n", "100", "--ignore-eos", "--temp", "0", "--ctx",
                        std::to_string(ctx), "--json"});
    ASSERT_EQ(r.exit_code, 0) << "--ctx " << ctx << ": " << r.out;
    auto j = last_json_line(r.out);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["finish_reason"], "length");
    // The prompt and every decoded token take one position each; the last sampled token needs none.
    EXPECT_EQ(j["prompt_tokens"].get<int>() + int(j["ids"].size()), ctx + 1) << "--ctx " << ctx;
    EXPECT_TRUE(j.contains("text"));
  }
  // Streaming: the text stays, no error is appended, exit 0.
  auto r = run_anvil({"generate", "-m", kModel, "-p", "def f(x):\n", "-n", "100", "--ignore-eos", "--temp", "0",
                      "--ctx", "24"},
                     true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("error"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("finish: length"), std::string::npos) << r.out;
  // A prompt longer than the context is an error that says so.
  r = run_anvil({"generate", "-m", kModel, "--ids", "1,2,3,4,5", "-n", "4", "--ctx", "3"}, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("--ctx"), std::string::npos) << r.out;
}

TEST(CliContext, WarnsAboveMaxPositionEmbeddings) {
  // The synthetic tiny shape declares max_position_embeddings 40960.
  auto r = run_anvil({"generate", "--synthetic", "tiny:q4g64", "--ids", "1", "-n", "1", "--ctx", "50000"}, true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: --ctx 50000 is above the model's max_position_embeddings (40960)"),
            std::string::npos)
      << r.out;
  r = run_anvil({"generate", "--synthetic", "tiny:q4g64", "--ids", "1", "-n", "1", "--ctx", "40960"}, true);
  EXPECT_EQ(r.out.find("warning"), std::string::npos) << r.out;
}

// A model with a sliding_window W (Mistral v0.1's 4096, Mixtral's when set, Phi-3-mini-4k's 2047) attends over its last W
// positions. Until session 44 anvil attended over the whole context, so it capped the context at W
// and refused a larger --ctx; now every backend's attention takes the window (KVCacheView::window),
// so the context is the usual one (4096, or max_position_embeddings when smaller) and runs past W.
// The golden Mistral fixture has W = 64 and max_position_embeddings 512; what the window computes is
// checked against mlx-lm by the golden `mistral-swa` fixture (golden_test.cpp). Here: a run past W is
// served in full by generate (and bench, bench-kv below), and a greedy continuation equals the
// same checkpoint's without a window while every position is within W of the first (so a model whose
// window the engine ignored, or applied one position off, would have to match both).
TEST(CliContext, SlidingWindowRunsPastTheWindow) {
  const fs::path mistral = fs::path(ANVIL_TEST_DATA) / "golden" / "mistral-bf16";
  const fs::path phi3 = fs::path(ANVIL_TEST_DATA) / "golden" / "phi3-q4";
  // The model's own directory, its files linked, with config.json's sliding_window set to `window`.
  auto with_window = [](const fs::path& src, const std::string& tag, nlohmann::json window) {
    const fs::path d = temp_dir(tag);
    fs::create_directories(d);
    for (auto& e : fs::directory_iterator(src))
      if (e.path().filename() != "config.json") fs::create_symlink(e.path(), d / e.path().filename());
    auto cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
    cfg["sliding_window"] = window;
    std::ofstream(d / "config.json") << cfg.dump(2);
    return d;
  };
  // A greedy run of -n 200 from 3 prompt ids: its ids, and the positions it used.
  auto greedy = [](const fs::path& dir, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"generate", "--device", "cpu", "--no-kv-store", "-m", dir.string(), "--ids",
                                     "1,2,3", "-n", "200", "--ignore-eos", "--temp", "0", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_anvil(args, true);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    auto j = last_json_line(r.out);
    std::vector<int> ids;
    if (j.is_object()) ids = j["ids"].get<std::vector<int>>();
    return std::pair{ids, j.is_object() ? j["prompt_tokens"].get<int>() + int(ids.size()) - 1 : -1};
  };
  const auto [ids, positions] = greedy(mistral, {});
  EXPECT_EQ(positions, 202);  // 3 + 200 - 1 positions: past the window of 64, within min(4096, 512)
  EXPECT_EQ(greedy(mistral, {"--ctx", "100"}).second, 100);
  EXPECT_EQ(greedy(phi3, {"--ctx", "100"}).second, 100);  // Phi-3's window (64 here) too
  const fs::path small = with_window(mistral, "mistral_window8", 8);
  const fs::path unwindowed = with_window(mistral, "mistral_null_window", nullptr);
  const auto [ids8, pos8] = greedy(small, {});
  const auto [ids_full, pos_full] = greedy(unwindowed, {});
  EXPECT_EQ(pos8, 202);
  EXPECT_EQ(pos_full, 202);
  // Token i (i >= 1) of the continuation is sampled after position 2 + i - 1 attended: within the
  // window of 8 of position 0 while 2 + i - 1 <= 7, i.e. for the first 6 tokens (and the first from
  // the prompt's last position, 2). So the first 6 ids are the unwindowed model's; the whole
  // continuation is not (random weights: the window changes the later logits by far more than a tie).
  ASSERT_EQ(ids8.size(), 200u);
  ASSERT_EQ(ids_full.size(), 200u);
  EXPECT_EQ(std::vector<int>(ids8.begin(), ids8.begin() + 6), std::vector<int>(ids_full.begin(), ids_full.begin() + 6));
  EXPECT_NE(ids8, ids_full);
  EXPECT_NE(ids8, ids) << "a window of 8 and one of 64 continued alike for 200 tokens";
  fs::remove_all(small);
  fs::remove_all(unwindowed);
}

// bench and bench-kv size their own context, prompt + generated tokens: on a model with a sliding
// window they were refused past it (naming what they computed); now they run past it in full.
TEST(CliContext, BenchRunsPastTheSlidingWindow) {
  const std::string mistral = std::string(ANVIL_TEST_DATA) + "/golden/mistral-bf16";  // sliding_window 64
  auto r = run_anvil({"bench", "--device", "cpu", "-m", mistral, "--runs", "1", "--json", "--prompt-tokens", "60", "-n",
                      "40"},
                     true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["prompt_tokens"], 60);
  EXPECT_EQ(j["generated_tokens"], 40);
  // Bytes per token count the KV positions attention reads: at most the window's 64. Decode steps at
  // 60.5 .. 99.5 positions on average read 60.5, 61.5, 62.5, 63.5, then 64 for the other 36: 63.8 on
  // average (without the window, 80), of 2 layers x 2 kv heads x 32 dims x K and V x 2 bytes = 512 each.
  const double kv_positions = (j["bytes_per_token"].get<double>() - j["weight_bytes_per_token"].get<double>()) / 512.0;
  EXPECT_NEAR(kv_positions, 63.8, 1e-6) << r.out;
}

// bench-kv sizes its context as bench does, --prompt-tokens + -n (or a larger -c/--ctx), and build_stack
// keeps it. It raised the context without saying it was given, so build_stack put the default in its
// place: --prompt-tokens 5000 -n 8 failed at the first prefill ("sequence of 5000 tokens exceeds the
// context limit of 4096 (raise --ctx)"), and on the Mistral fixture (sliding_window 64) --prompt-tokens
// 60 -n 10 ran in 64 positions, each run stopping after 5 of its 10 tokens while the report said 10.
// Now both run in full.
TEST(CliContext, BenchKvKeepsItsComputedContext) {
  auto bench_kv = [](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"bench-kv", "--device", "cpu", "--pairs", "1", "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_anvil(args, true);
  };
  // Every timed run decodes n tokens: n - 1 per-token intervals each, one off run and one on run.
  auto expect_full_runs = [](const anvil::test::ProcResult& r, int n) {
    ASSERT_EQ(r.exit_code, 0) << r.out;
    auto j = last_json_line(r.out);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j["store_off"]["tokens"], n - 1) << r.out;
    EXPECT_EQ(j["store_on"]["tokens"], n - 1) << r.out;
  };
  expect_full_runs(bench_kv({"--synthetic", "tiny", "--prompt-tokens", "5000", "-n", "8"}), 8);  // above 4096
  // Past the Mistral fixture's sliding window (64): the runs are whole (they stopped at 64 before the
  // context could go past the window, session 44).
  const std::string mistral = std::string(ANVIL_TEST_DATA) + "/golden/mistral-bf16";  // sliding_window 64
  expect_full_runs(bench_kv({"-m", mistral, "--prompt-tokens", "60", "-n", "10"}), 10);
  expect_full_runs(bench_kv({"-m", mistral, "--prompt-tokens", "60", "-n", "10", "--seqs", "2"}), 10);
  expect_full_runs(bench_kv({"-m", mistral, "-c", "40", "--prompt-tokens", "60", "-n", "10"}), 10);  // -c raised to the sum
}

// A KV cache bench-kv cannot have names the flags that size it there, --prompt-tokens + -n and --seqs:
// it named -c/--ctx and -np/--parallel, which the user did not type (-np is not even a bench-kv flag).
// Both errors: a size past 64 bits, refused before anything is allocated, and a pool past the 128 TiB a
// process can map (f32, 2^25 tokens in 64Ki-token pages x 65536 sequences: 2 PiB), whatever the
// machine's memory overcommit. (--batch 256: the default batch is at least --seqs.)
TEST(CliContext, BenchKvKvCacheErrorsNameItsOwnFlags) {
  const std::vector<std::string> base = {"bench-kv", "--device", "cpu", "--synthetic", "tiny", "--prompt-tokens",
                                         "16777216", "-n", "16777216", "--batch", "256", "--pairs", "1"};
  auto with = [&](const std::vector<std::string>& extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return run_shell("timeout 120 " + anvil_command(args) + " 2>&1");
  };
  auto r = with({"--seqs", "2147483647"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the KV cache for a context of 33554432 tokens (--prompt-tokens + -n) x 2147483647 "
                       "sequence(s) (--seqs)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("more than 64-bit memory can address: lower --prompt-tokens + -n or --seqs"),
            std::string::npos)
      << r.out;
  r = with({"--seqs", "65536", "--kv-dtype", "f32", "--page-size", "65536"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("anvil: error: the KV cache for the context, --prompt-tokens 16777216 + -n 16777216 = "
                       "33554432 tokens, x 65536 sequence(s), in pages of --page-size 65536 tokens: "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(lower --prompt-tokens + -n, --seqs or --page-size)"), std::string::npos) << r.out;
  for (const char* other : {"-c/--ctx", "--ctx,", "-np/--parallel"})
    EXPECT_EQ(r.out.find(other), std::string::npos) << other << ": " << r.out;
}

// A forward pass never holds more tokens than the context (of every sequence): a larger --batch is
// lowered to it, as llama.cpp lowers n_batch to n_ctx, and gives the same tokens; it allocated
// activations for every row it named (--batch 100000000: "cpu alloc: could not allocate
// 153600000000 bytes", with no flag named).
TEST(CliContext, BatchAboveTheContextIsLoweredToIt) {
  const std::vector<std::string> base = {"generate", "--device", "cpu", "-m", kModel, "-p", "def f(x):\n", "-n", "8",
                                         "--temp", "0", "--no-kv-store", "--json"};
  auto plain = run_anvil(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  for (const std::string batch : {"100000000", "2147483647"}) {
    auto args = base;
    args.insert(args.end(), {"--batch", batch});
    auto r = run_anvil(args, true);
    ASSERT_EQ(r.exit_code, 0) << "--batch " << batch << ": " << r.out;
    EXPECT_EQ(last_json_line(r.out)["ids"], last_json_line(plain.out)["ids"]) << r.out;
  }
}

// The KV pool is max_seqs x the context: a product past 64 bits is refused by name before anything
// is allocated (serve once failed on its activations' allocation, and a larger per-token size could
// wrap the pool's byte count around to a small allocation), and a context near INT_MAX no longer
// wraps the page count around to "the memory budget leaves no page".
TEST(CliContext, AbsurdContextTimesParallelIsAClearErrorNotAnOverflow) {
  auto r = anvil::test::run_shell("timeout 60 " +
                                  anvil::test::anvil_command({"serve", "--synthetic", "tiny", "--port", "0", "--no-kv-store",
                                                              "-np", "2147483647", "-c", "2147483647"}) + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the KV cache for a context of 2147483647 tokens (-c/--ctx) x 2147483647 sequence(s) "
                       "(-np/--parallel)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("more than 64-bit memory can address"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("alloc"), std::string::npos) << "refused before allocating: " << r.out;
  // 512 bytes a token x 2^31 tokens (rounded up to pages) is 1 TiB: either this machine allocates it
  // (overcommit) and generates, or the pool says so; never a wrapped page count.
  auto g = run_anvil({"generate", "--synthetic", "tiny", "--ids", "1", "-n", "1", "--no-kv-store", "-c", "2147483647"}, true);
  EXPECT_EQ(g.out.find("leaves no page"), std::string::npos) << g.out;
  if (g.exit_code != 0)
    EXPECT_NE(g.out.find("KV cache: allocating 134217728 pages (1048576 MiB)"), std::string::npos) << g.out;
}

// Defect 5: synth refuses a non-empty --out unless --force.
TEST(CliSynth, RefusesANonEmptyDirectoryWithoutForce) {
  fs::path dir = temp_dir("synth_force");
  fs::create_directories(dir);
  { std::ofstream(dir / "config.json") << "{\"mine\": true}"; }
  auto r = run_anvil({"synth", "--shape", "tiny", "--out", dir.string()}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
  std::ifstream in(dir / "config.json");
  std::string kept((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(kept, "{\"mine\": true}");
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  r = run_anvil({"synth", "--shape", "tiny", "--out", dir.string(), "--force"}, true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  fs::remove_all(dir);
}

// Defect 6: bench's peak memory is the model's, not its 1 GiB bandwidth probe's; the header names the device once.
TEST(CliBench, PeakMemoryExcludesTheBandwidthProbe) {
  auto r = run_anvil({"bench", "--synthetic", "tiny:q4g64", "--prompt-tokens", "16", "-n", "4", "--runs", "1",
                      "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  // The tiny model needs tens of MiB (its weights are ~7 MB); the probe alone touches 1024 MiB.
  EXPECT_LT(j["peak_rss_mib"].get<double>(), 512.0);
  EXPECT_GT(j["peak_rss_mib"].get<double>(), 1.0);
  auto t = run_anvil({"bench", "--synthetic", "tiny:q4g64", "--prompt-tokens", "16", "-n", "4", "--runs", "1"});
  ASSERT_EQ(t.exit_code, 0) << t.out;
  std::istringstream lines(t.out);
  for (std::string line; std::getline(lines, line);) {
    auto first = line.find("threads");
    EXPECT_TRUE(first == std::string::npos || line.find("threads", first + 1) == std::string::npos) << line;
  }
}

// Defect 7: the binary carries its default tokenizer: no path into the source tree, and a copy
// elsewhere still tokenizes a prompt for a synthetic model exactly as the shipped tokenizer does.
TEST(CliRelocatable, CopiedBinaryRunsSyntheticPrompts) {
  std::ifstream bin(ANVIL_BINARY, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(bin)), {});
  EXPECT_EQ(bytes.find(std::string(ANVIL_SOURCE_DIR) + "/tests/data/tokenizer"), std::string::npos)
      << "the binary looks for its tokenizer in the source tree";
  fs::path dir = temp_dir("reloc");
  fs::create_directories(dir / "bin");
  fs::copy_file(ANVIL_BINARY, dir / "bin" / "anvil");
  fs::permissions(dir / "bin" / "anvil", fs::perms::owner_all);
  const std::string env = "XDG_CACHE_HOME=" + shell_quote((dir / "cache").string()) + " ";
  auto r = run_shell("cd / && " + env + shell_quote((dir / "bin" / "anvil").string()) +
                     " generate --synthetic tiny:q4g64 -p 'Hello world' --raw -n 3 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = last_json_line(r.out);
  auto ref = run_anvil({"tokenize", "-m", std::string(ANVIL_TEST_DATA) + "/tokenizer/qwen3", "-p", "Hello world",
                        "--json"});
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  EXPECT_EQ(j["prompt_tokens"].get<size_t>(), nlohmann::json::parse(ref.out)["ids"].size());
  EXPECT_TRUE(fs::exists(dir / "cache" / "anvil"));
  fs::remove_all(dir);
}

// Defect 8: a mistyped command is named with the closest one; an empty prompt is called empty.
TEST(CliErrors, TypoAndEmptyPrompt) {
  auto r = run_anvil({"genrate", "-m", kModel, "-p", "x"}, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("unknown command 'genrate'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did you mean 'generate'"), std::string::npos) << r.out;
  // So is a mistyped subcommand of kv (it read "A subcommand is required"), after its options too;
  // an option's value that looks like a subcommand is a value.
  const std::string store = ::testing::TempDir() + "/anvil_typo_store_" + std::to_string(getpid());
  for (const auto& [args, said] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"kv", "lss"}, "unknown kv subcommand 'lss'; did you mean 'ls'?"},
           {{"kv", "--kv-store", store, "verfy"}, "unknown kv subcommand 'verfy'; did you mean 'verify'?"},
           {{"kv", "--kv-store=" + store, "remove", "x"}, "unknown kv subcommand 'remove'"}}) {
    r = run_anvil(args, true);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("anvil: error: " + said), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("see anvil kv --help"), std::string::npos) << r.out;
  }
  r = run_anvil({"kv", "--kv-store", "ls", "ls"}, true);
  EXPECT_EQ(r.exit_code, 0) << "a store directory named ls: " << r.out;
  r = run_anvil({"generate", "-m", kModel, "-p", ""}, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("the prompt is empty"), std::string::npos) << r.out;
  r = run_anvil({"generate", "-m", kModel}, true);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("no prompt"), std::string::npos) << r.out;
  // Errors the argument parser finds keep the same contract: "anvil: error: ...", exit code 1.
  const std::vector<std::vector<std::string>> parse_errors = {
      {"generate", "-m", kModel, "-p", "x", "-n", "abc"}, {"generate", "-m", kModel, "-p", "x", "--bogus"},
      {"generate", "-m", kModel, "-p", "x", "-n", "1", "-n", "2"}, {"kv", "show"},
      {"generate", "-m", kModel, "-p", "x", "--thinking", "--no-thinking"}, {"kv"}};
  for (const auto& args : parse_errors) {
    r = run_anvil(args, true);
    EXPECT_EQ(r.exit_code, 1) << args[1] << ": " << r.out;
    EXPECT_EQ(r.out.rfind("anvil: error: ", 0), 0u) << r.out;
  }
  // Typos in --ids, an empty --stop, --system for a model without a chat template: named errors.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--ids", "1,,2"}, {"--ids", "1,2,"}, {"-p", "x", "--stop", ""},
        {"-p", "x", "--system", "be brief"}}) {
    std::vector<std::string> full = {"generate", "-m", kModel, "-n", "1", "--no-kv-store"};
    full.insert(full.end(), args.begin(), args.end());
    r = run_anvil(full, true);
    EXPECT_EQ(r.exit_code, 1) << args[0] << " " << args[1] << ": " << r.out;
    EXPECT_NE(r.out.find("anvil: error: "), std::string::npos) << r.out;
  }
  r = run_anvil({"generate", "-m", kModel, "-n", "1", "--no-kv-store", "--ids", "1, 2 3", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(last_json_line(r.out)["prompt_tokens"], 3) << r.out;
  // A directory as the prompt file, an empty store name, an unbounded writer queue: named errors.
  r = run_anvil({"generate", "-m", kModel, "--raw", "-f", "/tmp", "-n", "1"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("Is a directory"), std::string::npos) << r.out;
  r = run_anvil({"generate", "-m", kModel, "--raw", "-p", "x", "-n", "1", "--kv-store", ""}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--kv-store"), std::string::npos) << r.out;
  r = run_anvil({"generate", "-m", kModel, "--raw", "-p", "x", "-n", "1", "--no-prefix-cache", "--kv-store",
                 temp_dir("kvq").string(), "--kv-queue", "999999999"},
                true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--kv-queue must be an integer in [2, 65536], got '999999999'"), std::string::npos) << r.out;
}

namespace {

// The commands whose --help lists `flag` ("--port", "-m"), in `anvil --help`'s order, kv's subcommands
// as "kv ls" (those of kv only where kv itself lacks it): the reference for the error's list.
std::vector<std::string> commands_listing(const std::string& flag) {
  struct Help {
    std::set<std::string> flags;
    std::vector<std::string> subs;  // "Subcommands:"
  };
  auto read_help = [](const std::vector<std::string>& cmd) {
    std::vector<std::string> args = cmd;
    args.push_back("--help");
    Help h;
    bool in_subs = false;
    std::istringstream in(run_anvil(args).out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Subcommands:", 0) == 0) in_subs = true;
      else if (!line.empty() && line[0] != ' ') in_subs = false;
      else if (in_subs && line.size() > 2) h.subs.push_back(line.substr(2, line.find(' ', 2) - 2));
      else if (line.rfind("  -", 0) == 0) {
        std::istringstream names(line.substr(2, line.find(' ', 2) - 2));
        for (std::string n; std::getline(names, n, ',');) h.flags.insert(n);
      }
    }
    return h;
  };
  // Every command's help, read once: (command, its help).
  static const std::vector<std::pair<std::string, Help>> helps = [&] {
    std::vector<std::pair<std::string, Help>> all;
    for (const std::string& c : read_help({}).subs) {
      all.emplace_back(c, read_help({c}));
      for (const std::string& s : std::vector<std::string>(all.back().second.subs))
        all.emplace_back(c + " " + s, read_help({c, s}));
    }
    return all;
  }();
  std::vector<std::string> out;
  for (const auto& [cmd, h] : helps) {
    const auto space = cmd.find(' ');
    const bool parent_has = space != std::string::npos && std::find(out.begin(), out.end(), cmd.substr(0, space)) != out.end();
    if (h.flags.count(flag) && !parent_has) out.push_back(cmd);
  }
  return out;
}

std::string join_and(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return s;
}

}  // namespace

// A flag of one command given to another was CLI11's "The following arguments were not expected:
// 8080 --port". Now the error names the flag, the command it was given to and the commands that have
// it (as their --help lists them); serve says which field of a request's body carries what run and
// generate take as flags; a flag written before the subcommand it belongs to is told to go after it;
// a flag no command has gets the closest of the command's own (did you mean). Exit code 1, before
// anything runs (serve under timeout: a server that started anyway would never exit).
TEST(CliFlags, AnotherCommandsFlagNamesTheCommandsThatHaveIt) {
  struct Case {
    std::vector<std::string> args;
    std::string said;
  };
  const std::string store = temp_dir("other_flag_store").string();
  const std::vector<Case> cases = {
      {{"serve", "-m", kModel, "--no-kv-store", "--port", "0", "-p", "hi"},
       "-p/--prompt is not a flag of anvil serve: each request carries its own prompt, the \"messages\" of POST "
       "/v1/chat/completions or the \"prompt\" of POST /v1/completions (docs/api.md); it is a flag of " +
           join_and(commands_listing("--prompt")) + " (see anvil serve --help)"},
      {{"serve", "-m", kModel, "--no-kv-store", "--port", "0", "--session", "x"},
       "--session is not a flag of anvil serve: a request names its session in the \"session\" field of its body"},
      {{"serve", "-m", kModel, "--no-kv-store", "--port", "0", "--system", "Be brief."},
       "--system is not a flag of anvil serve: a request's system prompt is a message of its \"messages\""},
      {{"serve", "-m", kModel, "--no-kv-store", "--port", "0", "-n", "5"},
       "-n/--max-tokens is not a flag of anvil serve: each request sets its own \"max_tokens\""},
      {{"generate", "-m", kModel, "-p", "x", "--port", "8080"},
       "--port is not a flag of anvil generate; it is a flag of serve (see anvil generate --help)"},
      {{"generate", "-m", kModel, "-p", "x", "--port=8080"},
       "--port is not a flag of anvil generate; it is a flag of serve (see anvil generate --help)"},
      {{"run", "-m", kModel, "-p", "x", "--api-key", "k"}, "--api-key is not a flag of anvil run; it is a flag of serve"},
      {{"bench", "--synthetic", "tiny", "--session", "s"},
       "--session is not a flag of anvil bench; it is a flag of " + join_and(commands_listing("--session")) +
           " (see anvil bench --help)"},
      {{"kv", "--kv-store", store, "ls", "-m", kModel},
       "-m/--model is not a flag of anvil kv ls; it is a flag of " + join_and(commands_listing("-m")) +
           " (see anvil kv ls --help)"},
      {{"bench-kv", "--synthetic", "tiny", "--no-kv-store"},
       "--no-kv-store is not a flag of anvil bench-kv; it is a flag of " + join_and(commands_listing("--no-kv-store"))},
      {{"kv", "--json", "ls"}, "--json is a flag of anvil kv ls: give it after 'ls' (see anvil kv ls --help)"},
      {{"generate", "-m", kModel, "--promt", "x"},
       "anvil generate has no flag --promt; did you mean --prompt? (see anvil generate --help)"},
      {{"kv", "ls", "--kv-stor", store}, "anvil kv ls has no flag --kv-stor; did you mean --kv-store?"},
      {{"generate", "-m", kModel, "-p", "x", "-x"}, "anvil generate has no flag -x (see anvil generate --help)"},
  };
  for (const Case& c : cases) {
    auto r = run_shell("timeout 60 " + anvil_command(c.args) + " 2>&1");
    EXPECT_EQ(r.exit_code, 1) << c.args[0] << ": " << r.out;
    EXPECT_NE(r.out.find("anvil: error: " + c.said), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("not expected"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("listening"), std::string::npos) << r.out;
  }
  EXPECT_FALSE(fs::exists(store)) << "kv ls made a store despite the bad flag";
  // The reference itself: --port is serve's alone, -m several commands'.
  EXPECT_EQ(commands_listing("--port"), std::vector<std::string>{"serve"});
  EXPECT_GT(commands_listing("-m").size(), 3u);
  // A word that is no flag keeps CLI11's message.
  auto r = run_anvil({"generate", "-m", kModel, "-p", "x", "stray"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("not expected: stray"), std::string::npos) << r.out;
}

// A flag is never read as the value of the option before it: bench --prompt --runs 1 failed with
// "Could not convert:  = --runs". The option that lacks its value is named with what it takes; a
// value that starts with '-' but names no option (-1, -) is still a value, and --name=VALUE passes
// any text.
TEST(CliFlags, AnOptionIsNeverTheValueOfTheOneBefore) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"bench", "--synthetic", "tiny", "--prompt", "--runs", "1"},
       "--prompt needs a value (INT), but the next argument is the option --runs"},
      {{"generate", "-m", kModel, "-p", "--json"}, "-p needs a value (TEXT), but the next argument is the option --json"},
      {{"generate", "-m", kModel, "-p", "x", "-c", "-n", "4"},
       "-c needs a value (INT), but the next argument is the option -n"},
      {{"kv", "ls", "--kv-store", "--json"}, "--kv-store needs a value (TEXT), but the next argument is the option --json"},
      {{"serve", "-m", kModel, "--port", "--api-key=k"}, "--port needs a value (INT), but the next argument is the option --api-key=k"},
  };
  for (const Case& c : cases) {
    auto r = run_anvil(c.args, true);
    EXPECT_EQ(r.exit_code, 1) << c.needle << ": " << r.out;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("Could not convert"), std::string::npos) << r.out;
  }
  // The spelling that passes a value starting with '-': the prompt "--json", as is.
  auto r = run_anvil({"generate", "-m", kModel, "--raw", "--prompt=--json", "-n", "1", "--no-kv-store", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto t = run_anvil({"tokenize", "-m", kModel, "-p", "--json"}, true);  // (the same rule in tokenize)
  EXPECT_EQ(t.exit_code, 1) << t.out;
  auto ids = run_anvil({"tokenize", "-m", kModel, "--add-special-tokens", "--prompt=--json", "--json"});
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  EXPECT_EQ(last_json_line(r.out)["prompt_tokens"], last_json_line(ids.out)["ids"].size()) << r.out;
}

// Every integer flag refuses a value that is no integer of its range as the command line is
// parsed, naming the flag as declared, the value and the range (CLI11 said "Could not convert:
// --ctx = abc"); the sampling flags say the same of theirs.
TEST(CliFlags, NumericValuesAreRefusedWithTheFlagTheValueAndTheRange) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<std::string> gen = {"generate", "-m", kModel, "-p", "x", "--no-kv-store"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  const std::vector<Case> cases = {
      {with(gen, {"-c", "abc"}), "-c/--ctx must be an integer in [1, 2147483647], got 'abc'"},
      {with(gen, {"--ctx", "2147483648"}), "-c/--ctx must be an integer in [1, 2147483647], got '2147483648'"},
      {with(gen, {"-n", "1e3"}), "-n/--max-tokens must be an integer in [0, 2147483647], got '1e3'"},
      {with(gen, {"-t", "x"}), "-t/--threads must be an integer in [0, 4096] (0 = all cores), got 'x'"},
      {with(gen, {"--batch", "1.5"}), "--batch must be an integer in [0, 2147483647] (0 = the device's default), got '1.5'"},
      {with(gen, {"--page-size", "100000000"}), "--page-size must be an integer in [1, 65536], got '100000000'"},
      {with(gen, {"--page-size", "0"}), "--page-size must be an integer in [1, 65536], got '0'"},
      {with(gen, {"--kv-flush-ms", "0x10"}), "--kv-flush-ms must be an integer in [1, 2147483647], got '0x10'"},
      {with(gen, {"--temp", "x"}), "--temp/--temperature must be a number >= 0 (0 = greedy), got 'x'"},
      {with(gen, {"--top-k", "9999999999"}), "--top-k must be an integer in [0, 2147483647] (0 = off), got '9999999999'"},
      {{"run", "-m", kModel, "-p", "x", "-n", "0"}, "-n/--max-tokens must be an integer in [1, 2147483647], got '0'"},
      {{"bench", "--synthetic", "tiny", "--runs", "0"}, "--runs must be an integer in [1, 2147483647], got '0'"},
      {{"bench", "--synthetic", "tiny", "--prompt", "x"}, "--prompt must be an integer in [1, 16777216], got 'x'"},
      {{"bench-kv", "--pairs", "1001"}, "--pairs must be an integer in [1, 1000], got '1001'"},
      {{"inspect", "-m", kModel, "--seqs", " 2"}, "--seqs must be an integer in [1, 65536], got ' 2'"},
      {{"serve", "-m", kModel, "--port", "70000"}, "--port must be an integer in [0, 65535] (0 = any free port), got '70000'"},
      {{"serve", "-m", kModel, "--max-body", "8M"}, "--max-body must be an integer in [1, 1048576] (MiB), got '8M'"},
      {{"serve", "-m", kModel, "--ctx-size", "-5"}, "--ctx-size must be an integer in [1, 2147483647], got '-5'"},
      {{"synth", "--shape", "tiny", "--out", "/nonexistent/x", "--seed", "-1"},
       "--seed must be an integer in [0, 18446744073709551615], got '-1'"},
  };
  for (const Case& c : cases) {
    auto r = run_anvil(c.args, true);
    EXPECT_EQ(r.exit_code, 1) << c.message << ": " << r.out;
    EXPECT_NE(r.out.find("anvil: error: " + c.message), std::string::npos) << r.out;
  }
  // The ends of a range are accepted.
  for (const char* page : {"1", "65536"}) {
    auto r = run_anvil(with(gen, {"--raw", "-n", "2", "--page-size", page}), true);
    EXPECT_EQ(r.exit_code, 0) << page << ": " << r.out;
  }
}

// The sampling flags' values are checked as the command line is parsed, as docs/cli.md says of every
// numeric flag: a bad one stops the command before anything is loaded. They were checked only after
// the model was found (generate, run) or loaded, warmed up and given its store (serve), so
// `anvil serve --temp x` loaded the whole model to refuse it, and with a mistyped -m the error named
// the model instead of the flag.
TEST(CliSampling, BadValuesAreRefusedBeforeTheModelIsLoaded) {
  const std::string missing = "/nonexistent/anvil-model-dir";
  const std::vector<std::pair<std::vector<std::string>, std::string>> flags = {
      // --temp's two spellings are both named, as -c/--ctx's are (--temperature's error said --temp).
      {{"--temp", "x"}, "--temp/--temperature must be a number >= 0 (0 = greedy), got 'x'"},
      {{"--temperature", "-1"}, "--temp/--temperature must be a number >= 0 (0 = greedy), got '-1'"},
      {{"--top-k", "-1"}, "--top-k must be an integer in [0, 2147483647] (0 = off), got '-1'"},
      {{"--top-p", "0"}, "--top-p must be a number in (0, 1] (1 = off), got '0'"},
      {{"--min-p", "1"}, "--min-p must be a number in [0, 1) (0 = off), got '1'"},
      {{"--repeat-penalty", "0"}, "--repeat-penalty must be a number > 0 (1 = off), got '0'"},
      {{"--seed", "1.5"}, "--seed must be an integer in [0, 18446744073709551615], or -1 for a random seed, got '1.5'"},
  };
  for (const std::string cmd : {"generate", "run", "serve"})
    for (const auto& [flag, message] : flags) {
      std::vector<std::string> args = {cmd, "-m", missing, "-p", "x"};
      if (cmd == "serve") args = {cmd, "-m", missing, "--port", "0"};
      args.insert(args.end(), flag.begin(), flag.end());
      auto r = run_anvil(args, true);
      EXPECT_EQ(r.exit_code, 1) << cmd << " " << flag[0] << ": " << r.out;
      EXPECT_NE(r.out.find("anvil: error: " + message + " (see anvil " + cmd + " --help)"), std::string::npos)
          << cmd << " " << flag[0] << ": " << r.out;
      EXPECT_EQ(r.out.find("not found"), std::string::npos) << "the model was looked for first: " << r.out;
    }
  // Good values still pass (a seed of -1 is a random one).
  auto r = run_anvil({"generate", "-m", kModel, "-p", "x", "-n", "2", "--no-kv-store", "--temp", "0.5", "--top-k",
                      "5", "--top-p", "0.9", "--min-p", "0.05", "--repeat-penalty", "1.1", "--seed", "-1"},
                     true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

// A KV cache that cannot be allocated names the flags that size it (it said only "KV cache:
// allocating N pages (M MiB): cpu alloc: ...").
TEST(CliFlags, AKvCacheTooLargeToAllocateNamesItsFlags) {
  auto r = run_anvil({"generate", "-m", kModel, "-p", "x", "-n", "1", "--no-kv-store", "--kv-dtype", "f32", "-c",
                      "2147483647", "--page-size", "65536"},
                     true);
  if (r.exit_code == 0) GTEST_SKIP() << "this machine allocated a 13 TB KV cache (memory overcommit): nothing to refuse";
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("the KV cache for -c/--ctx 2147483647 tokens x 1 sequence(s), in pages of --page-size 65536"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("(lower --ctx or --page-size)"), std::string::npos) << r.out;
}

// anvil kv never creates a store, and every subcommand's --json is JSON.
TEST(CliKv, NoStoreIsSaidAndJsonEverywhere) {
  const fs::path missing = temp_dir("kv_missing") / "typo";
  auto r = run_anvil({"kv", "ls", "--kv-store", missing.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(last_json_line(r.out)["sessions"], nlohmann::json::array()) << r.out;
  r = run_anvil({"kv", "verify", "--kv-store", missing.string()}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("no KV store at"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(missing)) << "kv created the mistyped store";
  // A file is no store either: every subcommand says so (not "create directory ...: Not a
  // directory", as if kv were making one), and leaves the file as it was.
  const fs::path file = temp_dir("kv_file");
  { std::ofstream(file) << "precious"; }
  for (const std::vector<std::string>& sub : {std::vector<std::string>{"ls"}, {"ls", "--json"}, {"verify"}, {"gc"},
                                              {"show", "s"}, {"rm", "s"}}) {
    std::vector<std::string> args = {"kv"};
    args.insert(args.end(), sub.begin(), sub.end());
    args.insert(args.end(), {"--kv-store", file.string()});
    r = run_anvil(args, true);
    EXPECT_EQ(r.exit_code, 1) << sub[0] << ": " << r.out;
    EXPECT_NE(r.out.find("no KV store at " + file.string() + " (it is not a directory)"), std::string::npos)
        << sub[0] << ": " << r.out;
    EXPECT_EQ(r.out.find("create directory"), std::string::npos) << sub[0] << ": " << r.out;
  }
  {
    std::ifstream in(file);
    std::string kept((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(kept, "precious");
  }
  fs::remove(file);
  const fs::path dir = temp_dir("kv_json");
  r = run_anvil({"generate", "-m", kModel, "--raw", "-p", "def f(x):", "-n", "20", "--temp", "0", "--kv-store",
                 dir.string(), "--session", "s"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  r = run_anvil({"kv", "verify", "--kv-store", dir.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  auto v = last_json_line(r.out);
  EXPECT_GT(v["records"].get<int>(), 0) << r.out;
  EXPECT_EQ(v["problems"], nlohmann::json::array()) << r.out;
  r = run_anvil({"kv", "export", "s", "-o", (dir / "s.safetensors").string(), "--kv-store", dir.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(last_json_line(r.out)["wrote"], (dir / "s.safetensors").string()) << r.out;
  r = run_anvil({"kv", "rm", "s", "--kv-store", dir.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(last_json_line(r.out)["removed"], "s") << r.out;
  r = run_anvil({"kv", "gc", "--max", "0", "--kv-store", dir.string(), "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_GT(last_json_line(r.out)["evicted_pages"].get<int>(), 0) << r.out;
  fs::remove_all(dir);
  fs::remove_all(missing.parent_path());
}

// A prompt from stdin (-p -) or a file (-f) is the same prompt as -p TEXT.
TEST(CliPrompt, StdinAndFileMatchTheFlag) {
  const std::string text = "def add(a, b):\n";
  auto ref = run_anvil({"generate", "-m", kModel, "-p", text, "-n", "8", "--temp", "0", "--json"});
  ASSERT_EQ(ref.exit_code, 0) << ref.out;
  auto want = last_json_line(ref.out)["ids"];
  auto s = run_shell("printf 'def add(a, b):\\n' | " +
                     anvil_command({"generate", "-m", kModel, "-p", "-", "-n", "8", "--temp", "0", "--json"}));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_EQ(last_json_line(s.out)["ids"], want);
  fs::path f = temp_dir("prompt_file");
  { std::ofstream(f) << text; }
  auto g = run_anvil({"generate", "-m", kModel, "-f", f.string(), "-n", "8", "--temp", "0", "--json"});
  ASSERT_EQ(g.exit_code, 0) << g.out;
  EXPECT_EQ(last_json_line(g.out)["ids"], want);
  fs::remove(f);
  // -f - reads stdin as -p - does, in generate, run and tokenize alike; an empty stdin is an empty prompt.
  s = run_shell("printf 'def add(a, b):\\n' | " +
                anvil_command({"generate", "-m", kModel, "-f", "-", "-n", "8", "--temp", "0", "--json"}));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_EQ(last_json_line(s.out)["ids"], want);
  const std::string answer = run_anvil({"generate", "-m", kModel, "-p", text, "-n", "8", "--temp", "0",
                                        "--no-kv-store"}).out;
  s = run_shell("printf 'def add(a, b):\\n' | " +
                anvil_command({"run", "-m", kModel, "-f", "-", "-n", "8", "--temp", "0", "--no-kv-store"}) +
                " 2>/dev/null");
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_EQ(s.out, answer) << "run -f - answered another prompt than generate -p";
  s = run_shell("printf 'def add(a, b):\\n' | " + anvil_command({"tokenize", "-m", kModel, "-f", "-", "--json"}));
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_EQ(s.out, run_anvil({"tokenize", "-m", kModel, "-p", text, "--json"}).out);
  s = run_shell(anvil_command({"generate", "-m", kModel, "-f", "-", "-n", "8"}) + " < /dev/null 2>&1");
  EXPECT_EQ(s.exit_code, 1) << s.out;
  EXPECT_NE(s.out.find("-f -: stdin was empty"), std::string::npos) << s.out;
  auto both = run_anvil({"generate", "-m", kModel, "-f", "/nonexistent/prompt.txt", "-n", "8"}, true);
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.out.find("/nonexistent/prompt.txt"), std::string::npos) << both.out;
}

// generate sends a text prompt through the model's chat template when it has one; --raw sends it as is.
TEST(CliPrompt, ChatTemplateByDefaultRawOnRequest) {
  auto ref = run_anvil({"tokenize", "-m", std::string(ANVIL_TEST_DATA) + "/tokenizer/qwen3", "-p", "Hello", "--json"});
  ASSERT_EQ(ref.exit_code, 0);
  const size_t raw_len = nlohmann::json::parse(ref.out)["ids"].size();
  auto chat = run_anvil({"generate", "--synthetic", "tiny:q4g64", "-p", "Hello", "-n", "1", "--json"});
  ASSERT_EQ(chat.exit_code, 0) << chat.out;
  auto jc = last_json_line(chat.out);
  EXPECT_TRUE(jc["chat_template"].get<bool>());
  EXPECT_GT(jc["prompt_tokens"].get<size_t>(), raw_len + 4);  // <|im_start|>user\n ... <|im_start|>assistant\n
  auto raw = run_anvil({"generate", "--synthetic", "tiny:q4g64", "-p", "Hello", "-n", "1", "--raw", "--json"});
  ASSERT_EQ(raw.exit_code, 0) << raw.out;
  EXPECT_FALSE(last_json_line(raw.out)["chat_template"].get<bool>());
  EXPECT_EQ(last_json_line(raw.out)["prompt_tokens"].get<size_t>(), raw_len);
  // The code model has no template: the prompt goes as is.
  auto code = run_anvil({"generate", "-m", kModel, "-p", "x", "-n", "1", "--json"});
  EXPECT_FALSE(last_json_line(code.out)["chat_template"].get<bool>());
}

// Ctrl-C during generate, or during run answering one message (-p), stops it cleanly: the text so
// far, then the summary (speed, peak memory), and exit code 130, so a script can tell a cut answer
// from a whole one (run -p exited 0).
// Runs `cmd` in the background with its output in `out`, and sends it SIGINT 0.5 s after its first
// output (a background job of a non-interactive shell ignores SIGINT until anvil installs its
// handler, so a signal sent during a slow start-up, a GPU's initialisation, would be lost). A
// binary that ignores SIGINT is killed 20 s later, so the test fails instead of hanging. The output
// then "rc=<exit code>".
anvil::test::ProcResult interrupt_once_started(const std::string& cmd, const std::string& out) {
  return run_shell("(" + cmd + " > " + out +
                   " 2>&1 & pid=$!; for i in $(seq 300); do [ -s " + out +
                   " ] && break; sleep 0.1; done; sleep 0.5; kill -INT $pid; "
                   "(sleep 20; kill -KILL $pid) >/dev/null 2>&1 & killer=$!; "
                   "wait $pid; rc=$?; kill $killer 2>/dev/null; cat " + out + "; echo \"rc=$rc\") 2>&1");
}

TEST(CliInterrupt, GenerateSummarizesWhenInterrupted) {
  for (const std::string command : {"generate", "run"}) {
    SCOPED_TRACE(command);
    // run has no --ignore-eos: greedy, this prompt's answer runs far past the time the test waits.
    std::vector<std::string> args = {command, "-m", kModel, "-p", "def f(x):\n", "-n", "40000", "--ctx", "40010",
                                     "--temp", "0", "--no-kv-store"};
    if (command == "generate") args.push_back("--ignore-eos");
    const std::string cmd = anvil_command(args);
    const std::string out = ::testing::TempDir() + "/interrupt_out.txt";
    auto r = interrupt_once_started(cmd, out);
    EXPECT_NE(r.out.find("finish: interrupted"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("peak memory"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rc=130"), std::string::npos) << r.out;
  }
}

// Ctrl-C during a long prompt stops its prefill at the end of the current chunk (--batch 1: a token),
// not after the whole prompt and a first token: the summary says how far it got, nothing is
// generated, exit 130. (~4,000 tokens one at a time take seconds here; the signal comes 0.5 s after
// start-up's first line.)
TEST(CliInterrupt, CtrlCDuringThePromptStopsItsPrefill) {
  const std::string prompt_file = ::testing::TempDir() + "/long_prompt.txt";
  {
    std::ofstream f(prompt_file);
    for (int i = 0; i < 500; ++i) f << "def f(x):\n    return x\n";
  }
  for (const std::string command : {"generate", "run"}) {
    SCOPED_TRACE(command);
    const std::string cmd = anvil_command({command, "-m", kModel, "-f", prompt_file, "-n", "8", "--ctx", "4096",
                                           "--batch", "1", "--temp", "0", "--no-kv-store"});
    const std::string out = ::testing::TempDir() + "/prefill_interrupt_out.txt";
    auto r = interrupt_once_started(cmd, out);
    EXPECT_NE(r.out.find("finish: interrupted"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("generated 0 tokens"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(" prompt tokens ("), std::string::npos) << "no 'N of M prompt tokens': " << r.out;
    EXPECT_NE(r.out.find("rc=130"), std::string::npos) << r.out;
  }
}

// -m REPO_ID --revision REV: the snapshot of that branch, tag or commit in the Hugging Face cache is the
// one read (here two revisions holding different tokenizers); a revision that is not cached is refused
// naming what is, and --revision with a directory or --synthetic is refused rather than ignored.
TEST(CliModel, RevisionSelectsTheCachedSnapshot) {
  const fs::path cache = temp_dir("hub_revision");
  const fs::path repo = cache / "models--org--tok";
  const std::string main_commit(40, 'a'), v2_commit(40, 'b');
  const std::string data = std::string(ANVIL_SOURCE_DIR) + "/tests/data/tokenizer/";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "snapshots" / main_commit);
  fs::create_directories(repo / "snapshots" / v2_commit);
  fs::copy_file(data + "gpt2-style/tokenizer.json", repo / "snapshots" / main_commit / "tokenizer.json");
  fs::copy_file(data + "qwen3/tokenizer.json", repo / "snapshots" / v2_commit / "tokenizer.json");
  std::ofstream(repo / "refs" / "main") << main_commit;
  std::ofstream(repo / "refs" / "v2") << v2_commit;
  const std::string env = "HF_HUB_CACHE=" + shell_quote(cache.string()) + " ";
  auto ids = [&](const std::vector<std::string>& args) {
    auto r = run_shell(env + anvil_command(args) + " 2>&1");
    EXPECT_EQ(r.exit_code, 0) << r.out;
    return r.out;
  };
  const std::string text = "Hello, world! 12345 ümlaut";
  const std::string gpt2 = ids({"tokenize", "-m", data + "gpt2-style", "-p", text});
  const std::string qwen3 = ids({"tokenize", "-m", data + "qwen3", "-p", text});
  ASSERT_NE(gpt2, qwen3);
  EXPECT_EQ(ids({"tokenize", "-m", "org/tok", "-p", text}), gpt2);
  EXPECT_EQ(ids({"tokenize", "-m", "org/tok", "--revision", "v2", "-p", text}), qwen3);
  EXPECT_EQ(ids({"tokenize", "-m", "org/tok", "--revision", v2_commit, "-p", text}), qwen3);
  EXPECT_EQ(ids({"tokenize", "-m", "org/tok", "--revision", "bbbbbbb", "-p", text}), qwen3);

  auto r = run_shell(env + anvil_command({"tokenize", "-m", "org/tok", "--revision", "v3", "-p", text}) + " 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("revision 'v3' is not cached"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("v2 -> " + v2_commit), std::string::npos) << r.out;

  r = run_anvil({"tokenize", "-m", data + "qwen3", "--revision", "v2", "-p", text}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("is a directory"), std::string::npos) << r.out;
  r = run_anvil({"generate", "--synthetic", "tiny", "--revision", "v2", "-p", "x", "-n", "1", "--device", "cpu"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--synthetic has none"), std::string::npos) << r.out;
  r = run_anvil({"inspect", "--synthetic", "tiny", "--revision", "v2"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("--synthetic has none"), std::string::npos) << r.out;
  fs::remove_all(cache);
}
