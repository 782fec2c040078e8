// resolve_model_path: a directory wins; a repo id is found in the hub cache named by HF_HUB_CACHE,
// else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; the error
// lists every place it looked.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "format/hf_cache.h"
#include "format_test_util.h"

using namespace anvil;
using anvil_test::contains;
using anvil_test::TempDir;
namespace fs = std::filesystem;

namespace {

// Sets (or unsets) the cache variables for one test and restores them afterwards.
class CacheEnv {
 public:
  CacheEnv() {
    for (const char* v : kVars) {
      const char* cur = std::getenv(v);
      saved_.push_back(cur ? std::optional<std::string>(cur) : std::nullopt);
      unsetenv(v);
    }
  }
  ~CacheEnv() {
    for (size_t i = 0; i < std::size(kVars); ++i) {
      if (saved_[i]) setenv(kVars[i], saved_[i]->c_str(), 1);
      else unsetenv(kVars[i]);
    }
  }
  void set(const char* var, const std::string& value) { setenv(var, value.c_str(), 1); }

 private:
  static constexpr const char* kVars[] = {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"};
  std::vector<std::optional<std::string>> saved_;
};

// hub/models--org--name/{refs/main, snapshots/<hash>/config.json}
std::string make_snapshot(const std::string& hub, const std::string& repo_dir, const std::string& hash,
                          bool write_ref) {
  fs::path repo = fs::path(hub) / repo_dir;
  fs::path snap = repo / "snapshots" / hash;
  fs::create_directories(snap);
  anvil_test::write_text((snap / "config.json").string(), "{}");
  if (write_ref) anvil_test::write_text((repo / "refs" / "main").string(), hash + "\n");
  return snap.string();
}

}  // namespace

TEST(HfCache, ExistingDirectoryWins) {
  CacheEnv env;
  TempDir d;
  auto r = resolve_model_path(d.path());
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(*r, d.path());
}

TEST(HfCache, RepoIdThroughHfHubCacheAndRefsMain) {
  CacheEnv env;
  TempDir d;
  std::string snap = make_snapshot(d.path(), "models--Qwen--Qwen3-0.6B", "abc123", true);
  make_snapshot(d.path(), "models--Qwen--Qwen3-0.6B", "zzz999", false);  // newer, but refs/main decides
  env.set("HF_HUB_CACHE", d.path());
  env.set("HF_HOME", "/nonexistent-hf-home");  // HF_HUB_CACHE takes precedence
  auto r = resolve_model_path("Qwen/Qwen3-0.6B");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, snap);
}

TEST(HfCache, HfHomeThenXdgThenHome) {
  CacheEnv env;
  TempDir d;
  std::string snap = make_snapshot(d.file("hfhome/hub"), "models--org--m", "h1", true);
  env.set("HF_HOME", d.file("hfhome"));
  auto r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, snap);

  CacheEnv env2;
  snap = make_snapshot(d.file("xdg/huggingface/hub"), "models--org--m", "h2", true);
  env2.set("XDG_CACHE_HOME", d.file("xdg"));
  r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, snap);

  CacheEnv env3;
  snap = make_snapshot(d.file("home/.cache/huggingface/hub"), "models--gpt2", "h3", true);
  env3.set("HOME", d.file("home"));
  r = resolve_model_path("gpt2");  // a repo id without an org
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, snap);
}

TEST(HfCache, NewestSnapshotWithoutRefsMain) {
  CacheEnv env;
  TempDir d;
  std::string old_snap = make_snapshot(d.path(), "models--org--m", "old", false);
  std::string new_snap = make_snapshot(d.path(), "models--org--m", "new", false);
  auto now = fs::file_time_type::clock::now();
  fs::last_write_time(old_snap, now - std::chrono::hours(2));
  fs::last_write_time(new_snap, now - std::chrono::hours(1));
  env.set("HF_HUB_CACHE", d.path());
  auto r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, new_snap);
}

TEST(HfCache, ErrorListsEveryPlaceItLooked) {
  CacheEnv env;
  TempDir d;
  env.set("HF_HUB_CACHE", d.path());
  auto r = resolve_model_path("org/missing-model");
  ASSERT_FALSE(r.is_ok());
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, "org/missing-model")) << m;
  EXPECT_TRUE(contains(m, (fs::path(d.path()) / "models--org--missing-model").string())) << m;
  EXPECT_TRUE(contains(m, "$HF_HUB_CACHE")) << m;

  // refs/main naming a snapshot that is not there.
  fs::create_directories(d.file("models--org--broken/refs"));
  anvil_test::write_text(d.file("models--org--broken/refs/main"), "deadbeef");
  r = resolve_model_path("org/broken");
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), d.file("models--org--broken/refs/main"))) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), d.file("models--org--broken/snapshots/deadbeef")))
      << r.status().message();

  // A path that is not a directory and not a repo id.
  r = resolve_model_path("./no/such/dir/here");
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), "./no/such/dir/here")) << r.status().message();

  // A file is not a model directory.
  anvil_test::write_text(d.file("afile"), "x");
  r = resolve_model_path(d.file("afile"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), "not a directory")) << r.status().message();
}
