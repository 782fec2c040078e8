// The CLI as a user runs it: generate / inspect / synth on the bundled model and synthetic ones,
// and the errors a user sees for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

using anvil::test::run_anvil;
namespace fs = std::filesystem;

namespace {
const std::string kModel = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";

nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  auto start = out.rfind('\n', end);
  std::string line = out.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  return nlohmann::json::parse(line, nullptr, false);
}
}  // namespace

TEST(CliGenerate, TextAndIdsPathsAgree) {
  auto tok = run_anvil({"tokenize", "-m", kModel, "--text", "def fibonacci(n):\n", "--json"});
  ASSERT_EQ(tok.exit_code, 0) << tok.out;
  auto ids = nlohmann::json::parse(tok.out)["ids"];
  ASSERT_GT(ids.size(), 2u);
  std::string csv;
  for (auto& i : ids) csv += (csv.empty() ? "" : ",") + std::to_string(i.get<int>());

  auto a = run_anvil({"generate", "-m", kModel, "-p", "def fibonacci(n):\n", "-n", "24", "--temp", "0", "--json"});
  ASSERT_EQ(a.exit_code, 0) << a.out;
  auto ja = last_json_line(a.out);
  ASSERT_TRUE(ja.is_object()) << a.out;
  EXPECT_EQ(ja["prompt_tokens"].get<size_t>(), ids.size());
  ASSERT_GT(ja["ids"].size(), 0u);
  EXPECT_FALSE(ja["text"].get<std::string>().empty());
  EXPECT_TRUE(ja.contains("timings"));

  auto b = run_anvil({"generate", "-m", kModel, "--ids", csv, "-n", "24", "--temp", "0", "--json"});
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(last_json_line(b.out)["ids"], ja["ids"]);
}

TEST(CliGenerate, StreamsPlainText) {
  auto r = run_anvil({"generate", "-m", kModel, "-p", "import os\n", "-n", "12", "--temp", "0"});
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_GT(r.out.size(), 1u);
}

TEST(CliGenerate, SeededSamplingIsReproducible) {
  std::vector<std::string> args = {"generate", "-m", kModel, "-p", "class ", "-n", "16", "--temp", "0.9",
                                   "--top-k", "40", "--seed", "7", "--json"};
  auto a = run_anvil(args), b = run_anvil(args);
  ASSERT_EQ(a.exit_code, 0);
  EXPECT_EQ(last_json_line(a.out)["ids"], last_json_line(b.out)["ids"]);
}

TEST(CliGenerate, DumpLogitsWritesNpy) {
  fs::path f = fs::temp_directory_path() / ("anvil_logits_" + std::to_string(getpid()) + ".npy");
  auto r = run_anvil({"generate", "-m", kModel, "--ids", "5,6,7,8", "-n", "0", "--dump-logits", f.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream in(f, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), {});
  ASSERT_GT(data.size(), 10u);
  EXPECT_EQ(data.substr(0, 6), "\x93NUMPY");
  EXPECT_NE(data.find("'shape': (4, 8192)"), std::string::npos);
  EXPECT_NE(data.find("<f4"), std::string::npos);
  fs::remove(f);
}

TEST(CliGenerate, ClearErrors) {
  auto r = run_anvil({"generate", "-m", "/nonexistent/model", "-p", "x"}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("/nonexistent/model"), std::string::npos) << r.out;

  r = run_anvil({"generate", "-m", kModel, "-p", "x", "--top-p", "1.5"}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--top-p"), std::string::npos) << r.out;

  r = run_anvil({"generate", "-m", kModel, "--ids", "1,99999"}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("99999"), std::string::npos) << r.out;

  r = run_anvil({"generate", "-m", kModel, "--ids", "1,x"}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("'x'"), std::string::npos) << r.out;

  r = run_anvil({"generate", "-p", "x"}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("--synthetic"), std::string::npos) << r.out;
}

TEST(CliInspect, ReportsTheModel) {
  auto r = run_anvil({"inspect", "-m", kModel, "--json", "--ctx", "1024"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "qwen3");
  EXPECT_EQ(j["layers"], 6);
  // 12.6M parameters (fixtures/README.md): embeddings 8192x384 tied + 6 layers.
  EXPECT_NEAR(j["parameters"].get<double>(), 12.6e6, 0.1e6);
  // KV per token: 2 (K,V) x 6 layers x 2 kv heads x 64 x 2 bytes.
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * 6 * 2 * 64 * 2);
  EXPECT_EQ(j["memory_plan"]["kv_cache"], 2 * 6 * 2 * 64 * 2 * 1024);
  EXPECT_LT(j["bytes_per_token"].get<double>(), j["weight_bytes"].get<double>() * 1.01);
}

// The memory plan's KV figure is exact up to 2^64 bytes (it printed a wrapped-around figure past
// it), with units up to EiB, and past 2^64 an error naming --ctx and --seqs.
TEST(CliInspect, HugeMemoryPlansAreExactAndAbsurdOnesAnError) {
  // qwen3-0.6b: 2 (K,V) x 28 layers x 8 kv heads x 128 x 2 bytes (bf16) = 114688 bytes a token;
  // the largest plan inspect takes (--ctx 2^31-1 x --seqs 65536) is 14 EiB, just under 2^64.
  auto r = run_anvil({"inspect", "--synthetic", "qwen3-0.6b", "--json", "--ctx", "2147483647", "--seqs", "65536"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  const unsigned __int128 want = (unsigned __int128)114688 * 2147483647 * 65536;
  ASSERT_LT(want, (unsigned __int128)1 << 64);
  EXPECT_EQ(j["kv_bytes_per_token"], 114688);
  EXPECT_EQ(j["memory_plan"]["kv_cache"].get<uint64_t>(), uint64_t(want));
  EXPECT_GT(j["memory_plan"]["total"].get<uint64_t>(), uint64_t(want));
  auto t = run_anvil({"inspect", "--synthetic", "qwen3-0.6b", "--ctx", "2147483647", "--seqs", "65536"});
  EXPECT_NE(t.out.find("KV 14.00 EiB"), std::string::npos) << t.out;
  // f32 doubles it past 2^64.
  auto e = run_anvil({"inspect", "--synthetic", "qwen3-0.6b", "--ctx", "2147483647", "--seqs", "65536", "--kv-dtype",
                      "f32", "--json"}, true);
  EXPECT_EQ(e.exit_code, 1) << e.out;
  EXPECT_EQ(e.out.find("memory_plan"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("the KV cache for a context of 2147483647 tokens (--ctx) x 65536 sequence(s) (--seqs) at "
                       "229376 bytes per token would be 3.228e+19 bytes, more than 64-bit memory can address"),
            std::string::npos) << e.out;
}

// An MoE model's expert matrices have their own format line and JSON counts (before, only the
// attention matrices' format and the router's were shown): one entry per expert matrix.
TEST(CliInspect, ShowsTheExpertsFormats) {
  auto r = run_anvil({"inspect", "--synthetic", "tiny-moe:q4g64", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const int layers = j["layers"], experts = j["moe"]["experts"];
  ASSERT_EQ(j["moe"]["moe_layers"], layers);
  const auto& f = j["formats"];
  EXPECT_EQ(f["experts"], (nlohmann::json{{"q4g64 (BF16 scales)", layers * experts * 3}})) << f.dump();
  EXPECT_EQ(f["router"], (nlohmann::json{{"q8g64 (BF16 scales)", layers}})) << f.dump();  // routers stay 8-bit
  EXPECT_EQ(f["layers"], (nlohmann::json{{"q4g64 (BF16 scales)", layers * 4}})) << "q, k, v, o: " << f.dump();
  auto t = run_anvil({"inspect", "--synthetic", "tiny-moe:q4g64"});
  EXPECT_NE(t.out.find("experts q4g64 (BF16 scales); router q8g64"), std::string::npos) << t.out;
}

TEST(CliSynth, WritesALoadableCheckpoint) {
  fs::path dir = fs::temp_directory_path() / ("anvil_synth_" + std::to_string(getpid()));
  auto r = run_anvil({"synth", "--shape", "tiny", "--quant", "q8g64", "--out", dir.string()}, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir / "config.json"));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / "tokenizer.json"));
  auto g = run_anvil({"generate", "-m", dir.string(), "-p", "Hello", "-n", "4", "--ignore-eos", "--json"});
  ASSERT_EQ(g.exit_code, 0) << g.out;
  EXPECT_EQ(last_json_line(g.out)["ids"].size(), 4u);
  // In memory, the same model generates the same ids.
  auto m = run_anvil({"generate", "--synthetic", "tiny:q8g64", "-p", "Hello", "-n", "4", "--ignore-eos", "--json"});
  ASSERT_EQ(m.exit_code, 0) << m.out;
  EXPECT_EQ(last_json_line(m.out)["ids"], last_json_line(g.out)["ids"]);
  fs::remove_all(dir);

  r = run_anvil({"synth", "--shape", "nope", "--out", dir.string()}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("qwen3-0.6b"), std::string::npos) << r.out;
}

// --config-only: the shape's config and the tokenizer, no weights (what scripts/bench_llamacpp_moe.sh
// hands to llama.cpp's converter), for a shape far too large to build in memory as bf16 here.
TEST(CliSynth, ConfigOnlyWritesNoWeights) {
  fs::path dir = fs::temp_directory_path() / ("anvil_synth_cfg_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto r = run_anvil({"synth", "--shape", "qwen3-30b-a3b-16L", "--quant", "bf16", "--config-only", "--out",
                      dir.string()}, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::ifstream f(dir / "config.json");
  auto cfg = nlohmann::json::parse(f);
  EXPECT_EQ(cfg["model_type"], "qwen3_moe");
  EXPECT_EQ(cfg["num_hidden_layers"], 16);
  EXPECT_EQ(cfg["num_experts"], 128);
  EXPECT_EQ(cfg["num_experts_per_tok"], 8);
  EXPECT_EQ(cfg["moe_intermediate_size"], 768);
  EXPECT_FALSE(cfg.contains("quantization")) << "bf16 has no quantization block";
  EXPECT_TRUE(fs::exists(dir / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(dir / "generation_config.json"));
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_NE(e.path().extension(), ".safetensors") << e.path();
  // Without weights it is not a loadable model, and loading says so instead of crashing.
  auto g = run_anvil({"inspect", "-m", dir.string()}, true);
  EXPECT_NE(g.exit_code, 0) << g.out;
  fs::remove_all(dir);
}

TEST(CliGenerate, StopStringEndsGenerationAndIsNotPrinted) {
  auto full = run_anvil({"generate", "-m", kModel, "-p", "def add(a, b):\n", "-n", "40", "--temp", "0", "--json"});
  ASSERT_EQ(full.exit_code, 0);
  std::string text = last_json_line(full.out)["text"];
  auto at = text.find("return");
  ASSERT_NE(at, std::string::npos) << "the reference continuation has no 'return': " << text;
  auto cut = run_anvil({"generate", "-m", kModel, "-p", "def add(a, b):\n", "-n", "40", "--temp", "0", "--json",
                        "--stop", "return", "--stop", "never-produced"});
  ASSERT_EQ(cut.exit_code, 0);
  auto j = last_json_line(cut.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["text"].get<std::string>(), text.substr(0, at));
}

// A user asking about the <think> tag does not put the answer into hidden reasoning: only a
// template that ends the prompt with it opens a reasoning block (as the server decides). Qwen3's
// template (thinking on by default) leaves none open, so the reply is content unless the model
// itself writes the tag.
TEST(CliGenerate, ThinkTagInTheUserTextOpensNoReasoning) {
  auto t = run_anvil({"generate", "--synthetic", "tiny", "--device", "cpu", "--no-kv-store", "--temp", "0", "-n", "12",
                      "-p", "What does the <think> tag do?", "--json"});
  ASSERT_EQ(t.exit_code, 0) << t.out;
  auto k = nlohmann::json::parse(t.out, nullptr, false);
  ASSERT_TRUE(k.is_object()) << t.out;
  const std::string text = k["text"], reasoning = k["reasoning"];
  EXPECT_FALSE(text.empty() && !reasoning.empty()) << "the answer went to hidden reasoning: " << t.out;
}
