// Checkpoint directories as users have them after a broken download or a hand edit: the bundled
// tiny model's files linked into a temporary directory, one of them changed. Each case fails with
// an error naming what is wrong, or runs with a warning, never crashes nor runs silently wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

using anvil::test::run_anvil;
namespace fs = std::filesystem;

namespace {

const fs::path kModel = fs::path(ANVIL_SOURCE_DIR) / "models/anvil-tiny-code-q4";

// A copy of the tiny model made of links, except the files the test writes itself.
struct ModelCopy {
  fs::path dir;
  explicit ModelCopy(const std::vector<std::string>& own) {
    dir = fs::temp_directory_path() / ("anvil_ckpt_" + std::to_string(::getpid()) + "_" +
                                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (auto& e : fs::directory_iterator(kModel)) {
      const std::string name = e.path().filename().string();
      if (std::find(own.begin(), own.end(), name) == own.end()) fs::create_symlink(e.path(), dir / name);
    }
  }
  ~ModelCopy() { fs::remove_all(dir); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; }
  std::vector<std::string> gen() const {
    return {"generate", "--device", "cpu", "--no-kv-store", "-m", dir.string(), "--raw", "-p", "def f(", "-n", "4"};
  }
};

}  // namespace

// generation_config.json's do_sample must be a boolean: anything else is named, not a crash.
TEST(CliCheckpoint, NonBooleanDoSampleIsNamed) {
  for (const char* v : {"null", "\"false\"", "1"}) {
    ModelCopy m({"generation_config.json"});
    m.write("generation_config.json", std::string("{\"do_sample\": ") + v + ", \"temperature\": 0.7}");
    auto r = run_anvil(m.gen(), true);
    if (std::string(v) == "null") {  // null: as if absent
      EXPECT_EQ(r.exit_code, 0) << r.out;
      continue;
    }
    EXPECT_EQ(r.exit_code, 1) << v << ": " << r.out;
    EXPECT_NE(r.out.find("generation_config.json: do_sample must be true or false"), std::string::npos) << r.out;
  }
}

// A link to a missing blob (an interrupted Hugging Face cache download) is named with its target.
TEST(CliCheckpoint, DanglingWeightsLinkIsNamed) {
  ModelCopy m({"model.safetensors"});
  fs::create_symlink(m.dir / "blobs-gone" / "abc123", m.dir / "model.safetensors");
  auto r = run_anvil(m.gen(), true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("model.safetensors is a link to"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("incomplete download"), std::string::npos) << r.out;
}

// config.json with fewer layers than the weights: the run would be silently wrong, so it warns,
// naming a tensor it leaves out; the unchanged model gives no such warning.
TEST(CliCheckpoint, LayerTensorsTheConfigLeavesOutAreWarnedAbout) {
  ModelCopy same({});
  auto ok = run_anvil(same.gen(), true);
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  EXPECT_EQ(ok.out.find("not used by"), std::string::npos) << ok.out;
  auto cfg = nlohmann::json::parse(std::ifstream(kModel / "config.json"));
  const int layers = cfg["num_hidden_layers"].get<int>();
  ASSERT_GE(layers, 2);
  cfg["num_hidden_layers"] = layers - 1;
  ModelCopy m({"config.json"});
  m.write("config.json", cfg.dump());
  auto r = run_anvil(m.gen(), true);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("are not used by the " + std::to_string(layers - 1) + "-layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers." + std::to_string(layers - 1) + "."), std::string::npos) << r.out;
}
