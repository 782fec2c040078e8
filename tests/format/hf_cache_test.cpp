// resolve_model_path: a directory wins; a repo id is found in the hub cache named by HF_HUB_CACHE,
// else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub, at refs/main or the revision asked for; an interrupted download is named;
// the error lists every place it looked. Where python3 has huggingface_hub (PYTHONPATH=.pydeps), the
// cache directory, the repo ids and the revisions are compared with what it resolves offline.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <unistd.h>

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
  void unset(const char* var) { unsetenv(var); }

 private:
  static constexpr const char* kVars[] = {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME",
                                          "HOME", "HF_HUB_OFFLINE", "ANVIL_TEST_VAR"};
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

bool python_has_hub() {
  static const bool yes = std::system("python3 -c 'import huggingface_hub' >/dev/null 2>&1") == 0;
  return yes;
}
#define SKIP_WITHOUT_HUB_PYTHON()                                                                        \
  if (!python_has_hub())                                                                                 \
  GTEST_SKIP() << "python3 with huggingface_hub is not available (scripts/setup.sh puts it in .pydeps; " \
                  "run with PYTHONPATH=.pydeps)"

// Runs a Python script (in this process's environment) and returns what it printed.
std::string run_python(const std::string& script) {
  TempDir d;
  anvil_test::write_text(d.file("ref.py"), script);
  FILE* p = popen(("python3 " + d.file("ref.py")).c_str(), "r");
  if (!p) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// snapshot_download(repo, revision, local_files_only=True) in this environment for each revision ("":
// the default): the path, or "ERROR <exception class>".
std::vector<std::string> hub_snapshot_downloads(const std::string& repo, const std::vector<std::string>& revisions) {
  nlohmann::json args = {repo, revisions};
  const std::string out = run_python(
      "import json\nfrom huggingface_hub import snapshot_download\nrepo, revs = json.loads(" +
      nlohmann::json(args.dump()).dump() +
      ")\nres = []\nfor rev in revs:\n    try:\n"
      "        res.append(snapshot_download(repo, revision=rev or None, local_files_only=True))\n"
      "    except Exception as e:\n        res.append('ERROR ' + type(e).__name__)\nprint(json.dumps(res))\n");
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  std::vector<std::string> res;
  if (j.is_array())
    for (const auto& v : j) res.push_back(v.is_string() ? v.get<std::string>() : "");
  return res;
}
std::string hub_snapshot_download(const std::string& repo, const std::string& revision) {
  std::vector<std::string> r = hub_snapshot_downloads(repo, {revision});
  return r.empty() ? "" : r[0];
}

// A 40-hex commit hash made of one repeated digit, as huggingface_hub's snapshot folders are named.
std::string commit_of(char c) { return std::string(40, c); }

// blobs/<blob> holding `text`, linked as snapshots/<commit>/<name> by a relative link, the way
// huggingface_hub lays out a downloaded file. An empty text leaves the blob absent (a dangling link).
void link_blob(const std::string& repo, const std::string& commit, const std::string& name, const std::string& blob,
               const std::string& text) {
  fs::create_directories(fs::path(repo) / "snapshots" / commit);
  fs::create_directories(fs::path(repo) / "blobs");
  if (!text.empty()) anvil_test::write_text((fs::path(repo) / "blobs" / blob).string(), text);
  fs::create_symlink(fs::path("..") / ".." / "blobs" / blob, fs::path(repo) / "snapshots" / commit / name);
}

// Runs `f` with the current directory changed to `dir`, and restores it.
template <class F>
void in_directory(const std::string& dir, F f) {
  const fs::path before = fs::current_path();
  fs::current_path(dir);
  f();
  fs::current_path(before);
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

// The cache directory under every combination of the variables huggingface_hub reads, compared with
// its constants.HF_HUB_CACHE: HF_HUB_CACHE, the legacy HUGGINGFACE_HUB_CACHE, HF_HOME, XDG_CACHE_HOME,
// HOME; a variable set but empty; "~", "~user", "$VAR", "${VAR}" (expanded twice on the HF_HOME path,
// as constants.py does); HF_HUB_OFFLINE changes nothing.
TEST(HfCache, CacheDirectoryMatchesHuggingfaceHub) {
  SKIP_WITHOUT_HUB_PYTHON();
  CacheEnv env;
  TempDir d;
  const std::string home = d.file("home");
  using Vars = std::vector<std::pair<std::string, std::optional<std::string>>>;
  const std::vector<Vars> combos = {
      {},
      {{"HF_HUB_CACHE", "/x/hub"}},
      {{"HUGGINGFACE_HUB_CACHE", "/legacy"}, {"HF_HOME", "/b"}},
      {{"HF_HUB_CACHE", "/new"}, {"HUGGINGFACE_HUB_CACHE", "/legacy"}},
      {{"HF_HOME", "/b"}, {"XDG_CACHE_HOME", "/xdg"}},
      {{"XDG_CACHE_HOME", "/xdg"}},
      {{"HF_HOME", "~/h"}},
      {{"XDG_CACHE_HOME", "~/xdg"}},
      {{"HUGGINGFACE_HUB_CACHE", "~/legacy"}},
      {{"HF_HUB_CACHE", "~"}},
      {{"HF_HOME", "$HOME/${ANVIL_TEST_VAR}/$NOPE_UNSET_VAR/${}x/$"}, {"ANVIL_TEST_VAR", "v$HOME"}},
      {{"HF_HOME", "$ANVIL_TEST_VAR"}, {"ANVIL_TEST_VAR", "~/t"}},
      {{"HF_HUB_CACHE", "$ANVIL_TEST_VAR"}, {"ANVIL_TEST_VAR", "~/t"}},
      {{"HF_HUB_CACHE", "${ANVIL_TEST_VAR}/x"}, {"ANVIL_TEST_VAR", ""}},
      {{"HF_HUB_CACHE", "/a$/b${c"}},
      {{"HF_HUB_CACHE", ""}},
      {{"HF_HUB_CACHE", ""}, {"HF_HOME", "/b"}},
      {{"HF_HOME", ""}},
      {{"XDG_CACHE_HOME", ""}},
      {{"HUGGINGFACE_HUB_CACHE", ""}},
      {{"HOME", std::nullopt}},
      {{"HOME", ""}},
      {{"HOME", "/"}},
      {{"HOME", "/h/"}},
      {{"HF_HUB_CACHE", "~root/z"}},
      {{"HF_HUB_CACHE", "~no_such_user_anvil/z"}},
      {{"HF_HOME", "rel/dir"}},
      {{"HF_HUB_CACHE", "/x/"}},
      {{"HF_HUB_OFFLINE", "1"}, {"HF_HOME", "/b"}},
  };
  nlohmann::json j = nlohmann::json::array();
  std::vector<std::string> ours;
  for (const Vars& vars : combos) {
    CacheEnv one;
    one.set("HOME", home);
    nlohmann::json jv = nlohmann::json::object();
    jv["HOME"] = home;
    for (const auto& [k, v] : vars) {
      if (v) one.set(k.c_str(), *v);
      else one.unset(k.c_str());
      jv[k] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
    }
    j.push_back(jv);
    ours.push_back(hub_cache_dir().path);
  }
  anvil_test::write_text(d.file("combos.json"), j.dump());
  const std::string out = run_python(
      "import importlib, json, os\n"
      "from huggingface_hub import constants\n"
      "names = ['HF_HUB_CACHE', 'HUGGINGFACE_HUB_CACHE', 'HF_HOME', 'XDG_CACHE_HOME', 'HOME', 'HF_HUB_OFFLINE', "
      "'ANVIL_TEST_VAR']\n"
      "res = []\n"
      "for combo in json.load(open(" + nlohmann::json(d.file("combos.json")).dump() + ")):\n"
      "    for n in names: os.environ.pop(n, None)\n"
      "    for k, v in combo.items():\n"
      "        if v is not None: os.environ[k] = v\n"
      "        else: os.environ.pop(k, None)\n"
      "    importlib.reload(constants)\n"
      "    res.append(constants.HF_HUB_CACHE)\n"
      "print(json.dumps(res))\n");
  nlohmann::json theirs = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(theirs.is_array() && theirs.size() == combos.size()) << out;
  for (size_t i = 0; i < combos.size(); ++i)
    EXPECT_EQ(ours[i], theirs[i].get<std::string>()) << "variables " << j[i].dump();
}

// The cache each variable names is the one searched, in huggingface_hub's order (no Python needed).
TEST(HfCache, LegacyVariableAndPrecedence) {
  CacheEnv env;
  TempDir d;
  const std::string legacy = make_snapshot(d.file("legacy"), "models--org--m", "l1", true);
  const std::string fresh = make_snapshot(d.file("new"), "models--org--m", "n1", true);
  make_snapshot(d.file("hfhome/hub"), "models--org--m", "h1", true);
  env.set("HF_HOME", d.file("hfhome"));
  env.set("HUGGINGFACE_HUB_CACHE", d.file("legacy"));  // before HF_HOME
  auto r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, legacy);
  env.set("HF_HUB_CACHE", d.file("new"));  // before HUGGINGFACE_HUB_CACHE
  r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, fresh);
}

// A variable that is set counts even when empty: huggingface_hub then looks in the current directory
// (HF_HUB_CACHE="") or ./hub (HF_HOME=""), and the error says so. "~" is the user's home.
TEST(HfCache, EmptyVariableAndTilde) {
  CacheEnv env;
  TempDir d;
  const std::string home_snap = make_snapshot(d.file("home/hf/hub"), "models--org--m", "t1", true);
  env.set("HOME", d.file("home"));
  env.set("HF_HOME", "~/hf");
  auto r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, home_snap);

  env.set("HF_HOME", "");
  make_snapshot(d.file("hub"), "models--org--m", "e1", true);
  in_directory(d.path(), [&] {
    auto r2 = resolve_model_path("org/m");
    ASSERT_TRUE(r2.is_ok()) << r2.status().message();
    EXPECT_EQ(*r2, "hub/models--org--m/snapshots/e1");

    env.set("HF_HUB_CACHE", "");
    r2 = resolve_model_path("org/m");
    ASSERT_FALSE(r2.is_ok());
    const std::string& m = r2.status().message();
    EXPECT_TRUE(contains(m, "\n  models--org--m (from $HF_HUB_CACHE (set but empty), relative to the current directory"))
        << m;
  });
}

// Repo ids: accepted and refused exactly as huggingface_hub's validate_repo_id does.
TEST(HfCache, RepoIdsAsHuggingfaceHubValidatesThem) {
  SKIP_WITHOUT_HUB_PYTHON();
  const std::vector<std::string> ids = {
      "gpt2", "Qwen/Qwen3-0.6B", "a.b", "_a", "a_", "a", "1/2", "Foo-BAR_foo.bar123", "a--b", "org/a--b", "a..b",
      "-a", "a-", ".a", "a.", "org/-b", "org-/b", "org/b.git", "org/b.gi", "a/b/c", "/a", "a/", "", "caf\xc3\xa9",
      "a b", "a@b", "org/m@main", std::string(96, 'a'), std::string(97, 'a'), "o/" + std::string(96, 'b'),
      std::string(96, 'o') + "/" + std::string(96, 'b'), "o/" + std::string(97, 'b'), "a/.b", "a./b"};
  const std::string out = run_python(
      "import json\nfrom huggingface_hub.utils import validate_repo_id\nres = []\nfor r in json.loads(" +
      nlohmann::json(nlohmann::json(ids).dump()).dump() +
      "):\n    try:\n        validate_repo_id(r); res.append(True)\n    except Exception:\n        res.append(False)\n"
      "print(json.dumps(res))\n");
  nlohmann::json theirs = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(theirs.is_array() && theirs.size() == ids.size()) << out;
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(repo_id_problem(ids[i]).empty(), theirs[i].get<bool>()) << "'" << ids[i] << "': " << repo_id_problem(ids[i]);
}

// "org--name" is no repo id; it must not reach models--org--name, which is the cache of org/name.
TEST(HfCache, DoubleDashIsNotTheOrgSeparator) {
  CacheEnv env;
  TempDir d;
  const std::string snap = make_snapshot(d.path(), "models--org--m", "s1", true);
  env.set("HF_HUB_CACHE", d.path());
  auto r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(*r, snap);
  r = resolve_model_path("org--m");
  ASSERT_FALSE(r.is_ok()) << *r;
  EXPECT_TRUE(contains(r.status().message(), "\"--\"")) << r.status().message();
  // "org/m@rev" is refused with the spelling that works.
  r = resolve_model_path("org/m@main");
  ASSERT_FALSE(r.is_ok()) << *r;
  EXPECT_TRUE(contains(r.status().message(), "-m org/m --revision main")) << r.status().message();
}

// A relative directory named like a repo id wins over the cache, as in transformers and mlx-lm; a
// revision for it is refused rather than ignored.
TEST(HfCache, RelativeDirectoryNamedLikeARepoId) {
  CacheEnv env;
  TempDir d;
  make_snapshot(d.file("cache"), "models--org--m", "s1", true);
  env.set("HF_HUB_CACHE", d.file("cache"));
  fs::create_directories(d.file("work/org/m"));
  in_directory(d.file("work"), [&] {
    auto r = resolve_model_path("org/m");
    ASSERT_TRUE(r.is_ok()) << r.status().message();
    EXPECT_EQ(*r, "org/m");
    r = resolve_model_path("org/m", "main");
    ASSERT_FALSE(r.is_ok()) << *r;
    EXPECT_TRUE(contains(r.status().message(), "'org/m' is a directory")) << r.status().message();
  });
}

namespace {
// models--org--m with refs main -> c1, v1.0 -> c2, refs/pr/1 -> c3, each snapshot holding config.json.
struct RevisionCache {
  TempDir d;
  std::string repo = d.file("models--org--m");
  std::string c1 = commit_of('1'), c2 = commit_of('2'), c3 = "3333" + std::string(36, 'a'),
              c4 = "3333" + std::string(36, 'b');
  RevisionCache() {
    for (const std::string& c : {c1, c2, c3, c4}) make_snapshot(d.path(), "models--org--m", c, false);
    anvil_test::write_text(repo + "/refs/main", c1);
    anvil_test::write_text(repo + "/refs/v1.0", c2);
    anvil_test::write_text(repo + "/refs/refs/pr/1", c3);
  }
  std::string snap(const std::string& c) const { return repo + "/snapshots/" + c; }
};
}  // namespace

// --revision: a branch or tag in refs/ (also "refs/pr/1"), or a full commit, as snapshot_download
// resolves them offline; a revision it cannot resolve is refused by both.
TEST(HfCache, RevisionsAsHuggingfaceHubResolvesThem) {
  SKIP_WITHOUT_HUB_PYTHON();
  CacheEnv env;
  RevisionCache c;
  env.set("HF_HUB_CACHE", c.d.path());
  const std::vector<std::string> revs = {"", "main", "v1.0", "refs/pr/1", c.c2, c.c4, "v2.0", commit_of('9')};
  const std::vector<std::string> all = hub_snapshot_downloads("org/m", revs);
  ASSERT_EQ(all.size(), revs.size());
  for (size_t i = 0; i < revs.size(); ++i) {
    const std::string& rev = revs[i];
    const std::string& theirs = all[i];
    auto r = resolve_model_path("org/m", rev);
    if (theirs.rfind("ERROR", 0) == 0) {
      EXPECT_FALSE(r.is_ok()) << "revision '" << rev << "': huggingface_hub: " << theirs << ", anvil: " << *r;
    } else {
      ASSERT_TRUE(r.is_ok()) << "revision '" << rev << "': " << r.status().message();
      EXPECT_EQ(*r, theirs) << "revision '" << rev << "'";
    }
  }
}

// The same without Python, plus what anvil adds: an abbreviated commit (4+ digits, one match), and
// errors that name the cached refs and snapshots.
TEST(HfCache, RevisionSelection) {
  CacheEnv env;
  RevisionCache c;
  env.set("HF_HUB_CACHE", c.d.path());
  EXPECT_EQ(*resolve_model_path("org/m"), c.snap(c.c1));
  EXPECT_EQ(*resolve_model_path("org/m", "v1.0"), c.snap(c.c2));
  EXPECT_EQ(*resolve_model_path("org/m", "refs/pr/1"), c.snap(c.c3));
  EXPECT_EQ(*resolve_model_path("org/m", c.c2), c.snap(c.c2));
  EXPECT_EQ(*resolve_model_path("org/m", "2222"), c.snap(c.c2));
  EXPECT_EQ(*resolve_model_path("org/m", "3333a"), c.snap(c.c3));

  auto r = resolve_model_path("org/m", "3333");  // c3 and c4
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), "several cached commits")) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), c.c3) && contains(r.status().message(), c.c4)) << r.status().message();

  r = resolve_model_path("org/m", "222");  // shorter than git's 4
  ASSERT_FALSE(r.is_ok()) << *r;
  r = resolve_model_path("org/m", "v2.0");
  ASSERT_FALSE(r.is_ok());
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, "revision 'v2.0' is not cached")) << m;
  EXPECT_TRUE(contains(m, "v1.0 -> " + c.c2)) << m;
  EXPECT_TRUE(contains(m, "refs/pr/1 -> " + c.c3)) << m;
  EXPECT_TRUE(contains(m, c.repo + "/refs/v2.0 (does not exist)")) << m;
  EXPECT_TRUE(contains(m, "hf download org/m --revision v2.0")) << m;

  r = resolve_model_path("org/m", commit_of('9'));  // a commit that was never downloaded
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), c.snap(commit_of('9')) + " (does not exist)")) << r.status().message();

  for (const std::string bad : {"../v1.0", "/etc/passwd", "refs/../v1.0"}) {
    r = resolve_model_path("org/m", bad);
    EXPECT_FALSE(r.is_ok()) << bad << ": " << *r;
  }
  // A directory takes no revision.
  TempDir dir;
  r = resolve_model_path(dir.path(), "v1.0");
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

// No refs/main: huggingface_hub does not pick a snapshot, and neither does anvil; the error names what is
// cached so that --revision can choose.
TEST(HfCache, NoRefsMainIsAnErrorNamingTheCachedRevisions) {
  CacheEnv env;
  TempDir d;
  make_snapshot(d.path(), "models--org--m", commit_of('a'), false);
  make_snapshot(d.path(), "models--org--m", commit_of('b'), false);
  anvil_test::write_text(d.file("models--org--m/refs/v1"), commit_of('b'));
  env.set("HF_HUB_CACHE", d.path());
  auto r = resolve_model_path("org/m");
  ASSERT_FALSE(r.is_ok()) << *r;
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, "no refs/main")) << m;
  EXPECT_TRUE(contains(m, "--revision")) << m;
  EXPECT_TRUE(contains(m, "v1 -> " + commit_of('b'))) << m;
  EXPECT_TRUE(contains(m, commit_of('a'))) << m;
  EXPECT_EQ(*resolve_model_path("org/m", "v1"), d.file("models--org--m/snapshots/" + commit_of('b')));
  if (python_has_hub()) EXPECT_EQ(hub_snapshot_download("org/m", "").rfind("ERROR", 0), 0u);
}

// An interrupted download: a shard that links to a blob still being written (blobs/X.incomplete) is
// named, with the partial blob; a tokenizer-only read does not need the weights; a broken link to a
// file anvil never reads (README.md) is no reason to refuse.
TEST(HfCache, DanglingShardLinkIsAnIncompleteDownload) {
  CacheEnv env;
  TempDir d;
  const std::string repo = d.file("models--org--m"), c = commit_of('c');
  env.set("HF_HUB_CACHE", d.path());
  anvil_test::write_text(repo + "/refs/main", c);
  link_blob(repo, c, "config.json", "cfgblob", "{}");
  link_blob(repo, c, "tokenizer.json", "tokblob", "{}");
  link_blob(repo, c, "README.md", "readmeblob", "");
  link_blob(repo, c, "model.safetensors.index.json", "idxblob",
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  link_blob(repo, c, "model-00001-of-00002.safetensors", "shard1", "x");
  link_blob(repo, c, "model-00002-of-00002.safetensors", "shard2", "");
  anvil_test::write_text(repo + "/blobs/shard2.incomplete", std::string(100, 'x'));

  auto r = resolve_model_path("org/m");
  ASSERT_FALSE(r.is_ok()) << *r;
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, "incompletely downloaded")) << m;
  EXPECT_TRUE(contains(m, "model-00002-of-00002.safetensors: a link to ../../blobs/shard2, which does not exist")) << m;
  EXPECT_TRUE(contains(m, repo + "/blobs/shard2.incomplete holds 100 bytes of an interrupted download")) << m;
  EXPECT_TRUE(contains(m, "hf download org/m")) << m;
  EXPECT_FALSE(contains(m, "README.md")) << m;
  EXPECT_FALSE(contains(m, "model-00001")) << m;

  auto t = resolve_model_path("org/m", "", ModelFiles::kTokenizer);
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  EXPECT_EQ(*t, repo + "/snapshots/" + c);

  // The download finished: nothing is missing (the README link stays broken).
  fs::rename(repo + "/blobs/shard2.incomplete", repo + "/blobs/shard2");
  r = resolve_model_path("org/m");
  ASSERT_TRUE(r.is_ok()) << r.status().message();
}

// A shard the index names that is not in the snapshot at all (its download never finished, so it was
// never linked).
TEST(HfCache, ShardNamedByTheIndexButAbsent) {
  CacheEnv env;
  TempDir d;
  const std::string repo = d.file("models--org--m"), c = commit_of('c');
  env.set("HF_HUB_CACHE", d.path());
  anvil_test::write_text(repo + "/refs/main", c);
  link_blob(repo, c, "config.json", "cfgblob", "{}");
  link_blob(repo, c, "model.safetensors.index.json", "idxblob",
            R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  link_blob(repo, c, "model-00001-of-00002.safetensors", "shard1", "x");
  auto r = resolve_model_path("org/m");
  ASSERT_FALSE(r.is_ok()) << *r;
  EXPECT_TRUE(contains(r.status().message(),
                       "model-00002-of-00002.safetensors: a shard model.safetensors.index.json names, not in the snapshot"))
      << r.status().message();
}

// huggingface_hub's tree listing (trees/<commit>.json) names every file of the commit: a file anvil
// reads that the snapshot lacks is an interrupted download (snapshot_download says the same), with the
// partial blob's size when there is one. Files anvil does not read may be left out on purpose.
TEST(HfCache, TreeListingNamesAFileTheSnapshotLacks) {
  CacheEnv env;
  TempDir d;
  const std::string repo = d.file("models--org--m"), c = commit_of('c');
  const std::string sha = std::string(64, 'e');
  env.set("HF_HUB_CACHE", d.path());
  anvil_test::write_text(repo + "/refs/main", c);
  link_blob(repo, c, "config.json", std::string(40, 'f'), "{}");
  nlohmann::json tree = {{"format_version", 1},
                         {"files",
                          {{"config.json", {{"size", 2}, {"blob_id", std::string(40, 'f')}}},
                           {"model.safetensors",
                            {{"size", 1000}, {"blob_id", std::string(40, 'd')}, {"lfs_sha256", sha}, {"lfs_size", 1000}}}}}};
  anvil_test::write_text(repo + "/trees/" + c + ".json", tree.dump());
  anvil_test::write_text(repo + "/blobs/" + sha + ".incomplete", std::string(10, 'x'));
  auto r = resolve_model_path("org/m");
  ASSERT_FALSE(r.is_ok()) << *r;
  const std::string& m = r.status().message();
  EXPECT_TRUE(contains(m, "model.safetensors: in the repo at this commit")) << m;
  EXPECT_TRUE(contains(m, repo + "/blobs/" + sha + ".incomplete holds 10 of its 1000 bytes")) << m;
  if (python_has_hub()) EXPECT_EQ(hub_snapshot_download("org/m", "").rfind("ERROR IncompleteSnapshotError", 0), 0u);

  // A tokenizer-only read needs no weights; a file anvil never reads may be absent.
  EXPECT_TRUE(resolve_model_path("org/m", "", ModelFiles::kTokenizer).is_ok());
  tree["files"].erase("model.safetensors");
  tree["files"]["README.md"] = {{"size", 5}, {"blob_id", std::string(40, '0')}};
  anvil_test::write_text(repo + "/trees/" + c + ".json", tree.dump());
  link_blob(repo, c, "model.safetensors", "w", "x");
  r = resolve_model_path("org/m");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
}
