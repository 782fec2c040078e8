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

// A tokenizer or generation file that is there but unreadable (a link to a blob an interrupted
// download never wrote, a directory in its place) is an error naming the file and why, for run,
// generate and serve alike: before, a dangling tokenizer_config.json was taken for an absent one
// and the model ran without its chat template (and BOS/EOS flags), a dangling generation_config.json
// without its stop ids and sampling defaults, without a word.
TEST(CliCheckpoint, UnreadableTokenizerFilesAreNamedNotTakenForAbsent) {
  for (const char* name : {"tokenizer_config.json", "tokenizer.json", "generation_config.json"}) {
    SCOPED_TRACE(name);
    ModelCopy m({name});
    fs::create_symlink(m.dir / "blobs-gone" / "abc123", m.dir / name);
    const std::string link_msg = std::string(name) + ": a symbolic link to '" + (m.dir / "blobs-gone/abc123").string() +
                                 "', which does not exist";
    auto g = run_anvil(m.gen(), true);
    EXPECT_EQ(g.exit_code, 1) << g.out;
    EXPECT_NE(g.out.find(link_msg), std::string::npos) << g.out;
    auto r = run_anvil({"run", "--device", "cpu", "--no-kv-store", "-m", m.dir.string(), "-p", "def f(", "-n", "4"}, true);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find(link_msg), std::string::npos) << r.out;
    // (under timeout: a server that started anyway would never exit)
    auto s = anvil::test::run_shell("timeout 60 " +
                                    anvil::test::anvil_command({"serve", "--device", "cpu", "--no-kv-store", "-m",
                                                                m.dir.string(), "--port", "0"}) +
                                    " 2>&1");
    EXPECT_EQ(s.exit_code, 1) << s.out;
    EXPECT_NE(s.out.find(link_msg), std::string::npos) << s.out;
  }
  // A directory where the file should be, and a file that is not JSON.
  ModelCopy d({"tokenizer_config.json"});
  fs::create_directory(d.dir / "tokenizer_config.json");
  auto r = run_anvil(d.gen(), true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("tokenizer_config.json: a directory, not a file"), std::string::npos) << r.out;
  ModelCopy j({"generation_config.json"});
  j.write("generation_config.json", "{\"eos_token_id\": 0,");
  r = run_anvil(j.gen(), true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("generation_config.json: not valid JSON"), std::string::npos) << r.out;
}

// The chat template files are read when they are used: a dangling chat_template.jinja (which
// transformers prefers to tokenizer_config.json's chat_template) is an error, not "no template".
TEST(CliCheckpoint, DanglingChatTemplateIsNamed) {
  ModelCopy m({"chat_template.jinja"});
  fs::create_symlink(m.dir / "blobs-gone" / "t1", m.dir / "chat_template.jinja");
  auto r = run_anvil({"run", "--device", "cpu", "--no-kv-store", "-m", m.dir.string(), "-p", "hi", "-n", "2"}, true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("chat_template.jinja: a symbolic link to"), std::string::npos) << r.out;
  m.write("messages.json", "[{\"role\": \"user\", \"content\": \"hi\"}]");
  auto t = run_anvil({"template", "-m", m.dir.string(), "--messages", (m.dir / "messages.json").string()}, true);
  EXPECT_EQ(t.exit_code, 1) << t.out;
  EXPECT_NE(t.out.find("chat_template.jinja: a symbolic link to"), std::string::npos) << t.out;
}

// Without read permission (as another user's download left it): named with the system's reason.
TEST(CliCheckpoint, UnreadableTokenizerConfigSaysPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root, which reads any file: no permission to deny";
  ModelCopy m({"tokenizer_config.json"});
  m.write("tokenizer_config.json", "{}");
  fs::permissions(m.dir / "tokenizer_config.json", fs::perms::none);
  auto r = run_anvil(m.gen(), true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("tokenizer_config.json: cannot open: Permission denied"), std::string::npos) << r.out;
}

// Absent stays what it was: no tokenizer_config.json and no generation_config.json run as before
// (completion mode, greedy), with the same output as the full directory's for this model.
TEST(CliCheckpoint, AbsentTokenizerConfigAndGenerationConfigStillRun) {
  ModelCopy full({});
  auto want = run_anvil(full.gen());
  ASSERT_EQ(want.exit_code, 0);
  ModelCopy m({"tokenizer_config.json", "generation_config.json"});
  auto r = run_anvil(m.gen());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, want.out);
  auto run = run_anvil({"run", "--device", "cpu", "--no-kv-store", "-m", m.dir.string(), "-p", "def f(", "-n", "4"}, true);
  EXPECT_EQ(run.exit_code, 0) << run.out;
}
