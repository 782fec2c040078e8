// The durable KV store as a user meets it through `anvil generate` and `anvil kv`: sessions resume
// token-for-token like an uninterrupted run, prompts are served from the store after a restart,
// corruption and lost files fall back to recomputing with the same output, generation killed with
// SIGKILL leaves a store that verifies and resumes exactly, and two processes share one store.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "cli_helpers.h"
#include "kvstore/kvstore.h"
#include "kvstore/sqlite_db.h"

using anvil::test::run_anvil;
namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
const std::string kPrompt = "def fibonacci(n):\n";

nlohmann::json last_json(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nlohmann::json();
  auto start = out.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return nlohmann::json::parse(out.substr(start, end - start + 1), nullptr, false);
}

struct StoreDir {
  std::string path;
  StoreDir() {
    path = (fs::temp_directory_path() / ("anvil_kvcli_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(path);
  }
  ~StoreDir() { fs::remove_all(path); }
};

std::vector<std::string> gen(const std::string& store, std::vector<std::string> extra) {
  // The store runs on the CPU backend only so far (CUDA refuses --kv-store with a clear error).
  std::vector<std::string> a = {"generate", "--device", "cpu", "-m", kModel, "--temp", "0", "--json", "--ignore-eos"};
  if (store.empty()) a.push_back("--no-kv-store");
  else {
    a.push_back("--kv-store");
    a.push_back(store);
  }
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

nlohmann::json run_json(const std::vector<std::string>& args) {
  auto r = run_anvil(args, false);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  auto j = last_json(r.out);
  EXPECT_TRUE(j.is_object()) << r.out;
  return j;
}

std::vector<int> ids_of(const nlohmann::json& j, const char* key = "ids") { return j[key].get<std::vector<int>>(); }

// The uninterrupted greedy run: prompt ids followed by n generated ids.
std::vector<int> reference(int n) {
  auto j = run_json(gen("", {"-p", kPrompt, "-n", std::to_string(n)}));
  auto all = ids_of(j, "ids");
  auto tok = run_anvil({"tokenize", "-m", kModel, "-p", kPrompt, "--json"});
  auto p = nlohmann::json::parse(tok.out)["ids"].get<std::vector<int>>();
  p.insert(p.end(), all.begin(), all.end());
  return p;
}

pid_t spawn(const std::vector<std::string>& args, const std::string& out_file) {
  pid_t pid = fork();
  if (pid == 0) {
    FILE* f = std::freopen(out_file.c_str(), "w", stdout);
    (void)f;
    std::freopen("/dev/null", "w", stderr);
    std::vector<char*> argv;
    std::string bin = ANVIL_BINARY;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& s : copy) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

TEST(KvStoreCli, ResumedSessionMatchesUninterruptedRun) {
  StoreDir d;
  const auto ref = reference(40);
  auto a = run_json(gen(d.path, {"-p", kPrompt, "-n", "13", "--session", "s"}));
  EXPECT_EQ(a["session"], "s");
  auto sa = ids_of(a, "session_ids");
  ASSERT_EQ(sa.size(), ref.size() - 27);
  EXPECT_TRUE(std::equal(sa.begin(), sa.end(), ref.begin()));
  // The last sampled id has no KV yet; everything before it is durable at exit.
  EXPECT_EQ(a["session_durable_tokens"].get<int>(), int(sa.size()) - 1);
  auto b = run_json(gen(d.path, {"--session", "s", "--resume", "-n", "27", "--profile"}));
  EXPECT_EQ(b["store_prompt_tokens"].get<int>(), int(sa.size()) - 1) << "full pages and the partial tail restored";
  EXPECT_EQ(ids_of(b, "session_ids"), ref) << "greedy resume continues token for token";
  EXPECT_EQ(b["kv_store"]["restore_corrupt"].get<int>(), 0);
  // A resumed session without the store's KV (recomputed) gives the same tokens too.
  auto c = run_json(gen(d.path, {"--session", "s", "--fork", "t", "-n", "5"}));
  auto sc = ids_of(c, "session_ids");
  ASSERT_EQ(sc.size(), ref.size() + 5);
  EXPECT_TRUE(std::equal(ref.begin(), ref.end(), sc.begin()));
  auto show = run_json({"kv", "show", "s", "--kv-store", d.path, "--json"});
  EXPECT_EQ(show["ids"].get<std::vector<int>>(), ref) << "--fork leaves the original session unchanged";
  // Existing session without --resume/--fork: refused with a clear message.
  auto dup = run_anvil(gen(d.path, {"-p", kPrompt, "--session", "s"}), true);
  EXPECT_NE(dup.exit_code, 0);
  EXPECT_NE(dup.out.find("already exists"), std::string::npos) << dup.out;
  auto missing = run_anvil(gen(d.path, {"--session", "nope", "--resume"}), true);
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.out.find("no session named 'nope'"), std::string::npos) << missing.out;
  auto ls = run_anvil({"kv", "ls", "--kv-store", d.path, "--json"});
  EXPECT_EQ(nlohmann::json::parse(ls.out)["sessions"].size(), 2u);
}

TEST(KvStoreCli, PromptServedFromStoreAfterRestartSameOutput) {
  StoreDir d;
  std::string ids;
  for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(100 + i * 17);
  auto off = run_json(gen("", {"--ids", ids, "-n", "12"}));
  auto first = run_json(gen(d.path, {"--ids", ids, "-n", "12"}));
  EXPECT_EQ(first["store_prompt_tokens"].get<int>(), 0);
  auto second = run_json(gen(d.path, {"--ids", ids, "-n", "12"}));
  EXPECT_EQ(second["store_prompt_tokens"].get<int>(), 32) << "two full pages; the last token is always computed";
  EXPECT_EQ(ids_of(second), ids_of(off));
  EXPECT_EQ(ids_of(first), ids_of(off));
  auto v = run_anvil({"kv", "verify", "--kv-store", d.path});
  EXPECT_EQ(v.exit_code, 0) << v.out;
}

// LongRoPE rotates every K with the short factors in a context up to the model's original one and
// with the long factors past it (cli/common.cpp): the same tokens' KV differ, so pages stored at one
// context are never served at the other, while the same context finds its own again.
TEST(KvStoreCli, LongRopeFactorsKeepTheirOwnPages) {
  StoreDir d;
  const std::string model = std::string(ANVIL_SOURCE_DIR) + "/tests/data/golden/phi3-longrope-long";  // original 256
  std::string ids;
  for (int i = 0; i < 40; ++i) ids += (i ? "," : "") + std::to_string(3 + i * 7);
  auto run = [&](const char* ctx) {
    return run_json({"generate", "--device", "cpu", "-m", model, "--temp", "0", "--json", "--ignore-eos", "--kv-store",
                     d.path, "--ids", ids, "-n", "4", "-c", ctx});
  };
  auto short1 = run("256");
  EXPECT_EQ(short1["store_prompt_tokens"].get<int>(), 0);
  auto long1 = run("1024");
  EXPECT_EQ(long1["store_prompt_tokens"].get<int>(), 0) << "the long factors were served the short ones' pages";
  auto short2 = run("256");
  EXPECT_EQ(short2["store_prompt_tokens"].get<int>(), 32);
  EXPECT_EQ(ids_of(short2), ids_of(short1));
  auto long2 = run("1024");
  EXPECT_EQ(long2["store_prompt_tokens"].get<int>(), 32);
  EXPECT_EQ(ids_of(long2), ids_of(long1));
}

TEST(KvStoreCli, CorruptOrLostFilesAreRecomputedWithSameOutput) {
  StoreDir d;
  std::string ids;
  for (int i = 0; i < 60; ++i) ids += (i ? "," : "") + std::to_string(7 + i * 31);
  auto off = run_json(gen("", {"--ids", ids, "-n", "10"}));
  run_json(gen(d.path, {"--ids", ids, "-n", "10"}));
  // Flip bytes in the middle of every segment.
  for (auto& e : fs::directory_iterator(d.path)) {
    if (e.path().extension() != ".kv") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = fs::file_size(e.path());
    for (auto at : {size / 3, size / 2, size * 3 / 4}) {
      f.seekp(std::streamoff(at));
      f.put('\x7f');
    }
  }
  auto bad = run_anvil({"kv", "verify", "--kv-store", d.path});
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  auto j = run_json(gen(d.path, {"--ids", ids, "-n", "10", "--profile"}));
  EXPECT_EQ(ids_of(j), ids_of(off));
  EXPECT_GE(j["kv_store"]["restore_corrupt"].get<int>(), 1);
  // Truncated segments, then deleted segments, then a deleted catalog: same output each time.
  for (int round = 0; round < 3; ++round) {
    for (auto& e : fs::directory_iterator(d.path)) {
      if (round == 0 && e.path().extension() == ".kv") fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
      if (round == 1 && e.path().extension() == ".kv") fs::remove(e.path());
      if (round == 2 && e.path().filename().string().rfind("catalog.db", 0) == 0) fs::remove(e.path());
    }
    auto r = run_json(gen(d.path, {"--ids", ids, "-n", "10"}));
    EXPECT_EQ(ids_of(r), ids_of(off)) << "round " << round;
  }
  auto again = run_json(gen(d.path, {"--ids", ids, "-n", "10"}));
  EXPECT_EQ(again["store_prompt_tokens"].get<int>(), 48) << "the store heals: recomputed pages are stored again";
  EXPECT_EQ(ids_of(again), ids_of(off));
}

// kill -9 at random points of a session's generation; each time the store verifies and resuming
// continues exactly like the uninterrupted run. (scripts/bench_kv_kill.sh runs many more.)
TEST(KvStoreCli, KillNineThenVerifyAndResume) {
  StoreDir d;
  const int n = 400;
  const auto ref = reference(n + 40);
  std::mt19937 rng(1234);
  const int iterations = 3;
  int resumed = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::string name = "k" + std::to_string(it);
    const std::string out = d.path + ".out";
    fs::create_directories(d.path);
    pid_t pid = spawn(gen(d.path, {"-p", kPrompt, "-n", std::to_string(n), "--session", name, "--kv-flush-ms", "10"}),
                      out);
    if (it > 0) {
      // Later iterations kill after the session's first commit, so the test still resumes something on
      // a loaded machine (where starting the process alone can take longer than the random delay);
      // iteration 0 kills at a random time from the start and may land before the first flush.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (std::chrono::steady_clock::now() < deadline &&
             run_anvil({"kv", "show", name, "--kv-store", d.path, "--json"}).exit_code != 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 600));
    }
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    auto v = run_anvil({"kv", "verify", "--kv-store", d.path});
    ASSERT_EQ(v.exit_code, 0) << "iteration " << it << ": " << v.out;
    auto show = run_anvil({"kv", "show", name, "--kv-store", d.path, "--json"});
    if (show.exit_code != 0) continue;  // killed before its first flush: nothing recorded
    auto recorded = nlohmann::json::parse(show.out)["ids"].get<std::vector<int>>();
    ASSERT_LE(recorded.size(), ref.size());
    EXPECT_TRUE(std::equal(recorded.begin(), recorded.end(), ref.begin())) << "iteration " << it;
    auto j = run_json(gen(d.path, {"--session", name, "--resume", "-n", "20"}));
    auto all = ids_of(j, "session_ids");
    ASSERT_LE(all.size(), ref.size());
    EXPECT_TRUE(std::equal(all.begin(), all.end(), ref.begin())) << "iteration " << it << ": resumed at "
                                                                  << recorded.size();
    ++resumed;
  }
  EXPECT_GT(resumed, 0) << "every kill landed before the first flush: the test checked nothing";
  auto v = run_anvil({"kv", "verify", "--kv-store", d.path});
  EXPECT_EQ(v.exit_code, 0) << v.out;
}

TEST(KvStoreCli, TwoProcessesShareOneStore) {
  StoreDir d;
  fs::create_directories(d.path);
  std::string a, b;
  for (int i = 0; i < 50; ++i) {
    a += (i ? "," : "") + std::to_string(11 + i * 13);
    b += (i ? "," : "") + std::to_string(19 + i * 29);
  }
  pid_t pa = spawn(gen(d.path, {"--ids", a, "-n", "60", "--session", "A"}), d.path + ".a.out");
  pid_t pb = spawn(gen(d.path, {"--ids", b, "-n", "60", "--session", "B"}), d.path + ".b.out");
  int sa = 0, sb = 0;
  waitpid(pa, &sa, 0);
  waitpid(pb, &sb, 0);
  EXPECT_TRUE(WIFEXITED(sa) && WEXITSTATUS(sa) == 0);
  EXPECT_TRUE(WIFEXITED(sb) && WEXITSTATUS(sb) == 0);
  auto v = run_anvil({"kv", "verify", "--kv-store", d.path});
  EXPECT_EQ(v.exit_code, 0) << v.out;
  auto ja = run_json(gen(d.path, {"--ids", a, "-n", "4"}));
  auto jb = run_json(gen(d.path, {"--ids", b, "-n", "4"}));
  EXPECT_EQ(ja["store_prompt_tokens"].get<int>(), 48);
  EXPECT_EQ(jb["store_prompt_tokens"].get<int>(), 48);
  auto ls = nlohmann::json::parse(run_anvil({"kv", "ls", "--kv-store", d.path, "--json"}).out);
  EXPECT_EQ(ls["sessions"].size(), 2u);
  fs::remove(d.path + ".a.out");
  fs::remove(d.path + ".b.out");
}

TEST(KvStoreCli, ExportIsAStandaloneSafetensorsFile) {
  if (std::system("python3 -c 'import safetensors, numpy' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3 with safetensors and numpy is not installed";
  StoreDir d;
  auto j = run_json(gen(d.path, {"-p", kPrompt, "-n", "30", "--session", "e"}));
  const int durable = j["session_durable_tokens"].get<int>();
  const std::string out = d.path + "/e.safetensors";
  auto e = run_anvil({"kv", "export", "e", "-o", out, "--kv-store", d.path});
  ASSERT_EQ(e.exit_code, 0) << e.out;
  const std::string py = "python3 -c \"from safetensors import safe_open; f = safe_open('" + out +
                         "', 'np'); print(f.get_slice('layer.0.k').get_shape()[1], f.metadata()['kv_tokens'])\"";
  FILE* p = popen(py.c_str(), "r");
  char buf[256] = {0};
  size_t n = fread(buf, 1, sizeof buf - 1, p);
  pclose(p);
  EXPECT_EQ(std::string(buf, n), std::to_string(durable) + " " + std::to_string(durable) + "\n");
}

TEST(KvStoreCli, RunResumesItsConversation) {
  StoreDir d;
  auto a = run_anvil({"run", "--device", "cpu", "-m", kModel, "-p", "hello", "-n", "10", "--temp", "0", "--kv-store", d.path, "--session",
                      "r"},
                     true);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  auto b = run_anvil({"run", "--device", "cpu", "-m", kModel, "-p", "more", "-n", "10", "--temp", "0", "--kv-store", d.path, "--session",
                      "r", "--resume", "--profile"},
                     true);
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_NE(b.out.find("(resumed session r"), std::string::npos) << b.out;
  auto at = b.out.find("prompt tokens from the store");
  ASSERT_NE(at, std::string::npos) << b.out;
  EXPECT_GT(std::atoi(b.out.c_str() + b.out.find_first_of("0123456789", at)), 0)
      << "the earlier turn's KV came from the store: " << b.out;
}

TEST(KvStoreCli, ResumeWithAnExtraPromptAppendsIt) {
  StoreDir d;
  const std::string x = "5,17,29,41,53,65,77,89,101,113,125,137,149,161,173,185,197,209,221,233";
  auto a = run_json(gen(d.path, {"--ids", x, "-n", "6", "--session", "p"}));
  auto first = ids_of(a, "session_ids");
  auto b = run_json(gen(d.path, {"--ids", "300,301,302", "-n", "6", "--session", "p", "--resume"}));
  auto all = ids_of(b, "session_ids");
  std::vector<int> expect_prefix = first;
  for (int t : {300, 301, 302}) expect_prefix.push_back(t);
  ASSERT_EQ(all.size(), expect_prefix.size() + 6);
  EXPECT_TRUE(std::equal(expect_prefix.begin(), expect_prefix.end(), all.begin()));
  std::string csv;
  for (int t : expect_prefix) csv += (csv.empty() ? "" : ",") + std::to_string(t);
  auto plain = run_json(gen("", {"--ids", csv, "-n", "6"}));
  EXPECT_EQ(ids_of(b), ids_of(plain)) << "the same as sending the whole history as a prompt";
  EXPECT_GT(b["store_prompt_tokens"].get<int>(), 0);
}

// A prompt longer than the context is refused before the session records it: a first turn leaves no
// session (the name is free for the next try), a resumed one the session as it was (it once recorded
// the whole over-long prompt, which could then neither be resumed nor started again).
TEST(KvStoreCli, APromptPastTheContextRecordsNothing) {
  StoreDir d;
  std::string longer;
  for (int i = 0; i < 40; ++i) longer += (longer.empty() ? "" : ",") + std::to_string(5 + i);
  auto r = run_anvil(gen(d.path, {"--ids", longer, "-n", "4", "--session", "p", "--ctx", "32"}), true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("sequence of 40 tokens exceeds the context limit of 32 (raise --ctx)"), std::string::npos) << r.out;
  auto ls = run_anvil({"kv", "ls", "--kv-store", d.path, "--json"});
  EXPECT_EQ(ls.out.find("\"p\""), std::string::npos) << ls.out;
  auto a = run_json(gen(d.path, {"--ids", "5,6,7", "-n", "4", "--session", "p", "--ctx", "32"}));
  const auto before = ids_of(a, "session_ids");
  auto b = run_anvil(gen(d.path, {"--ids", longer, "-n", "4", "--session", "p", "--resume", "--ctx", "32"}), true);
  EXPECT_EQ(b.exit_code, 1) << b.out;
  EXPECT_NE(b.out.find("session 'p' is left as it was"), std::string::npos) << b.out;
  auto c = run_json(gen(d.path, {"--ids", "8", "-n", "2", "--session", "p", "--resume", "--ctx", "32"}));
  auto after = ids_of(c, "session_ids");
  ASSERT_GE(after.size(), before.size());
  EXPECT_TRUE(std::equal(before.begin(), before.end(), after.begin())) << "the session continues from where it was";
}

// A session continued without a prompt (--resume or --fork, no -p) prints its continuation as text,
// as the run that recorded it did, not as token ids (which only --ids, or a model without a
// tokenizer, gets): the same text --json reports for the same tokens.
TEST(KvStoreCli, ContinuingWithoutAPromptPrintsText) {
  StoreDir d;
  run_json(gen(d.path, {"-p", kPrompt, "-n", "6", "--session", "s"}));
  for (const std::string how : {"--resume", "--fork"}) {
    SCOPED_TRACE(how);
    // Two equal copies of the session: one continued as plain output, one with --json.
    for (const std::string copy : {"plain", "json"}) run_json(gen(d.path, {"--session", "s", "--fork", copy, "-n", "0"}));
    auto args = [&](const std::string& name) {
      std::vector<std::string> a = {"generate", "--device", "cpu", "-m", kModel, "--temp", "0", "--ignore-eos",
                                    "--kv-store", d.path, "--session", name, "-n", "12"};
      if (how == "--resume") a.push_back("--resume");
      else a.insert(a.end(), {"--fork", name + "_next"});
      return a;
    };
    auto plain = run_anvil(args("plain"));
    ASSERT_EQ(plain.exit_code, 0) << plain.out;
    auto json_args = args("json");
    json_args.push_back("--json");
    auto j = run_json(json_args);
    ASSERT_EQ(ids_of(j).size(), 12u);
    const std::string text = j["text"].get<std::string>();
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(plain.out, text + "\n") << "ids " << j["ids"].dump();
    for (const std::string copy : {"plain", "json"}) run_anvil({"kv", "rm", copy, "--kv-store", d.path});
  }
  // --ids still prints ids.
  auto ids = run_anvil({"generate", "--device", "cpu", "-m", kModel, "--temp", "0", "--ignore-eos", "--kv-store", d.path,
                        "--session", "s", "--resume", "--ids", "300,301", "-n", "3"});
  ASSERT_EQ(ids.exit_code, 0) << ids.out;
  std::istringstream in(ids.out);
  int n = 0;
  for (int id; in >> id;) ++n;
  EXPECT_EQ(n, 3) << ids.out;
}

// Two processes recording one session at once would interleave two turns into one row (one of them
// lost): while one records it, the other is refused by name. New names follow the server's rule.
TEST(KvStoreCli, ASessionInUseByAnotherProcessIsRefused) {
  StoreDir d;
  fs::create_directories(d.path);
  // anvil run holds its session for the whole conversation: one turn, then it waits on stdin.
  int in[2];
  ASSERT_EQ(pipe(in), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    close(in[1]);
    std::freopen("/dev/null", "w", stdout);
    std::freopen("/dev/null", "w", stderr);
    std::string bin = ANVIL_BINARY;
    std::vector<std::string> args = {bin, "run", "--device", "cpu", "-m", kModel, "--kv-store", d.path,
                                     "--session", "S", "-n", "8", "--temp", "0"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(in[0]);
  const std::string turn = kPrompt + "\n";
  ASSERT_EQ(write(in[1], turn.data(), turn.size()), ssize_t(turn.size()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool recorded = false;
  while (!recorded && std::chrono::steady_clock::now() < deadline) {
    recorded = run_anvil({"kv", "show", "S", "--kv-store", d.path, "--json"}).exit_code == 0;
    if (!recorded) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(recorded) << "the first process never committed its session";
  auto second = run_anvil(gen(d.path, {"--session", "S", "--resume", "-n", "4"}), true);
  EXPECT_NE(second.exit_code, 0) << second.out;
  EXPECT_NE(second.out.find("in use by another process"), std::string::npos) << second.out;
  auto fork2 = run_anvil(gen(d.path, {"--session", "S", "--fork", "T", "-n", "4"}), true);
  EXPECT_NE(fork2.exit_code, 0) << "its source is being recorded: " << fork2.out;
  close(in[1]);  // end of input: run leaves, and its claim goes with it
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  // Let go, it is continued again, by anvil run (what records its kind: generate refuses it).
  auto later = run_anvil({"run", "--device", "cpu", "-m", kModel, "--kv-store", d.path, "--session", "S", "--resume",
                          "-p", "x = 1", "-n", "4", "--temp", "0"},
                         true);
  EXPECT_EQ(later.exit_code, 0) << later.out;
  for (const std::string bad : {std::string(), std::string("a/b"), std::string("../x"), std::string("-x"),
                                std::string(129, 'a'), std::string("has space")}) {
    auto r = run_anvil(gen(d.path, {"-p", kPrompt, "-n", "2", "--session", bad}), true);
    EXPECT_NE(r.exit_code, 0) << "session name '" << bad << "' was taken: " << r.out;
  }
}

// anvil kv inspects: a damaged catalog is reported (verify: exit 1) and left where it is; a model
// run on the store then moves it aside and starts afresh (the store is a cache).
TEST(KvStoreCli, VerifyReportsADamagedCatalogAndLeavesIt) {
  StoreDir d;
  run_json(gen(d.path, {"-p", kPrompt, "-n", "48", "--session", "c"}));
  const std::string cat = d.path + "/catalog.db";
  for (const char* sfx : {"-wal", "-shm"}) fs::remove(cat + sfx);
  {
    std::fstream f(cat, std::ios::in | std::ios::out | std::ios::binary);
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), std::streamsize(zeros.size()));
  }
  const auto size = fs::file_size(cat);
  auto v = run_anvil({"kv", "verify", "--kv-store", d.path}, true);
  EXPECT_EQ(v.exit_code, 1) << v.out;
  EXPECT_NE(v.out.find("damaged"), std::string::npos) << v.out;
  auto ls = run_anvil({"kv", "ls", "--kv-store", d.path}, false);
  EXPECT_NE(ls.exit_code, 0) << ls.out;
  ASSERT_TRUE(fs::exists(cat));
  EXPECT_EQ(fs::file_size(cat), size) << "inspection must not change the catalog";
  for (auto& e : fs::directory_iterator(d.path))
    EXPECT_EQ(e.path().filename().string().find("corrupt"), std::string::npos) << e.path();
  auto j = run_json(gen(d.path, {"-p", kPrompt, "-n", "8"}));
  EXPECT_TRUE(j.contains("ids"));
  // The new catalog does not know the old segment files: verify says so, and gc removes them.
  auto v2 = run_anvil({"kv", "verify", "--kv-store", d.path}, true);
  EXPECT_EQ(v2.exit_code, 1) << v2.out;
  EXPECT_NE(v2.out.find("no catalog row knows"), std::string::npos) << v2.out;
  EXPECT_EQ(run_anvil({"kv", "gc", "--kv-store", d.path}).exit_code, 0);
  auto v3 = run_anvil({"kv", "verify", "--kv-store", d.path}, true);
  EXPECT_EQ(v3.exit_code, 0) << v3.out;
}

// anvil run killed (SIGKILL) in the middle of an answer: the session's token ids were committed at
// every flush, its conversation only when the turn began. Resuming keeps the answer as far as it
// was committed (said on the console), never drops it or glues the next line onto the question:
// in completion mode (the tiny code model) as text, in chat mode (a model with a chat template) as
// the assistant's message. `killed` / `resumed`: more flags for the run that is killed and for the
// one that resumes it (--thinking/--no-thinking is per run: the resume finds the cut turn's prompt
// whatever its own).
void run_killed_mid_answer(const std::vector<std::string>& model, bool completion,
                           const std::vector<std::string>& killed = {}, const std::vector<std::string>& resumed = {}) {
  StoreDir d;
  fs::create_directories(d.path);
  pid_t pid = fork();
  if (pid == 0) {
    std::freopen("/dev/null", "w", stdout);
    std::freopen("/dev/null", "w", stderr);
    std::string bin = ANVIL_BINARY;
    // One turn, sampled (no early EOS likely), as long as it takes to be killed.
    std::vector<std::string> args = {bin, "run", "--device", "cpu"};
    args.insert(args.end(), model.begin(), model.end());
    args.insert(args.end(), {"--kv-store", d.path, "--session", "K", "-p", kPrompt, "-n", "100000", "--temp", "0.9",
                             "--seed", "4", "-t", "1"});
    args.insert(args.end(), killed.begin(), killed.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int tokens = 0;
  while (tokens < 64 && std::chrono::steady_clock::now() < deadline) {
    auto s = run_anvil({"kv", "show", "K", "--kv-store", d.path, "--json"});
    if (s.exit_code == 0) tokens = nlohmann::json::parse(s.out)["tokens"].get<int>();
    else std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_GE(tokens, 64) << "the answer was never committed";
  auto before = run_anvil({"kv", "show", "K", "--kv-store", d.path, "--json"});
  ASSERT_EQ(before.exit_code, 0) << before.out;
  const int committed = nlohmann::json::parse(before.out)["tokens"].get<int>();
  std::vector<std::string> again = {"run", "--device", "cpu"};
  again.insert(again.end(), model.begin(), model.end());
  again.insert(again.end(), {"--kv-store", d.path, "--session", "K", "--resume", "-p", "x = 1", "-n", "2", "--temp", "0"});
  again.insert(again.end(), resumed.begin(), resumed.end());
  auto r = run_anvil(again, true);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("the last answer was cut short after"), std::string::npos) << r.out;
  if (!completion) {
    // Every committed token after the cut turn's prompt is its answer (none of that prompt's), and
    // the conversation goes on as question, answer, question, answer.
    std::vector<std::string> ask = {"run", "--device", "cpu", "--no-kv-store", "-p", kPrompt, "-n", "1"};
    ask.insert(ask.begin() + 1, model.begin(), model.end());
    ask.insert(ask.end(), killed.begin(), killed.end());
    auto p = run_anvil(ask, true);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(p.out, m, std::regex("prompt ([0-9]+) tokens"))) << p.out;
    const int asked = std::stoi(m[1]);
    EXPECT_NE(r.out.find("cut short after " + std::to_string(committed - asked) + " tokens"), std::string::npos)
        << r.out << "(" << committed << " tokens committed, a prompt of " << asked << ")";
    anvil::KVStoreOptions o;
    o.dir = d.path;
    auto st = anvil::KVStore::open(o);
    ASSERT_TRUE(st.is_ok()) << st.status().message();
    auto s = (*st)->get_session("K");
    ASSERT_TRUE(s.is_ok() && s->has_value());
    std::vector<std::string> roles;
    const auto meta = nlohmann::json::parse((*s)->meta);
    for (const auto& msg : meta["messages"]) roles.push_back(msg["role"]);
    EXPECT_EQ(roles, (std::vector<std::string>{"user", "assistant", "user", "assistant"})) << (*s)->meta;
  }
  // A chat turn is re-rendered through the template (the answer's text, re-encoded, and Qwen3's
  // template drops earlier reasoning): the ids need not repeat. A document goes on exactly.
  if (!completion) return;
  auto after = run_anvil({"kv", "show", "K", "--kv-store", d.path, "--json"});
  ASSERT_EQ(after.exit_code, 0) << after.out;
  const auto ids = nlohmann::json::parse(after.out)["ids"].get<std::vector<int>>();
  auto ids_before = nlohmann::json::parse(before.out)["ids"].get<std::vector<int>>();
  ASSERT_GT(int(ids.size()), committed) << "the resumed turn went on from fewer tokens than were committed";
  EXPECT_TRUE(std::equal(ids_before.begin(), ids_before.end(), ids.begin())) << "the committed answer was changed";
}

TEST(KvStoreCli, RunKilledMidAnswerResumesWithWhatWasAnswered) { run_killed_mid_answer({"-m", kModel}, true); }
TEST(KvStoreCli, ChatRunKilledMidAnswerResumesWithWhatWasAnswered) {
  run_killed_mid_answer({"--synthetic", "tiny:q4g64"}, false);
}
// The cut turn thought (Qwen3's default) and the resuming run says --no-thinking, or the other way
// round: the resume rendered the conversation with its own flag only, so it missed the cut turn's
// prompt, kept neither the answer nor the question's end (two user messages in a row followed), or
// counted the empty think block of a --no-thinking prompt as answered tokens.
TEST(KvStoreCli, ChatRunKilledMidAnswerResumesUnderAnotherThinkingFlag) {
  run_killed_mid_answer({"--synthetic", "tiny:q4g64"}, false, {}, {"--no-thinking"});
  run_killed_mid_answer({"--synthetic", "tiny:q4g64"}, false, {"--no-thinking"}, {"--thinking"});
}

// A session recorded under a cap far below its own KV (--kv-store-max 1, a commit per page, no tail
// note during the run): its pages were committed before its row referenced them, so the writer's
// eviction after each commit took every one of them and the session ended with none of its prompt
// durable. Now they are referenced from their first commit: kept, the store stays over its cap and
// says so (what is left is sessions' KV), the resume restores all of it, and kv gc reports the live
// bytes it could not take.
TEST(KvStoreCli, ASessionKeepsItsKVUnderATinyCap) {
  StoreDir d;
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "def add_" + std::to_string(i) + "(a, b):\n    return a + b\n\n";
  const std::string err = d.path + ".stderr";
  auto r = anvil::test::run_shell(
      anvil::test::anvil_command(gen(d.path, {"-p", prompt, "-n", "6", "--session", "s", "--kv-store-max", "1",
                                              "--kv-flush-pages", "1", "--kv-flush-ms", "60000"})) +
      " 2>" + err);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto a = last_json(r.out);
  const int n = int(a["session_ids"].size());
  ASSERT_GT(n, 64) << "the prompt spans several pages";
  EXPECT_EQ(a["session_durable_tokens"].get<int>(), n - 1) << "the session's KV was evicted while it was recorded";
  std::ifstream ef(err);
  const std::string e((std::istreambuf_iterator<char>(ef)), std::istreambuf_iterator<char>());
  fs::remove(err);
  EXPECT_NE(e.find("over --kv-store-max"), std::string::npos) << e;
  auto b = run_json(gen(d.path, {"--session", "s", "--resume", "-n", "2", "--kv-store-max", "1"}));
  EXPECT_EQ(b["store_prompt_tokens"].get<int>(), n - 1) << "the resume restores the whole session";
  auto gc = run_anvil({"kv", "gc", "--max", "1", "--kv-store", d.path, "--json"}, true);
  EXPECT_EQ(gc.exit_code, 0) << gc.out;
  EXPECT_NE(gc.out.find("never evicted"), std::string::npos) << gc.out;
  EXPECT_GT(last_json(gc.out)["live_bytes"].get<int64_t>(), 1) << gc.out;
  EXPECT_EQ(run_anvil({"kv", "verify", "--kv-store", d.path}).exit_code, 0);
}

// On a full disk, `kv rm` and `kv gc` still free space: the store keeps a reserve file that they give
// up when SQLite's log cannot grow. Needs a small file system of its own (a tmpfs: root only).
TEST(KvStoreCli, RmAndGcWorkOnAFullDisk) {
  const std::string mnt = fs::temp_directory_path() / ("anvil_full_" + std::to_string(getpid()));
  fs::create_directories(mnt);
  if (geteuid() != 0 || std::system(("mount -t tmpfs -o size=6m tmpfs " + mnt + " 2>/dev/null").c_str()) != 0) {
    fs::remove(mnt);
    GTEST_SKIP() << "mounting a 6 MB tmpfs needs root: the full-disk case is not checked here";
  }
  const std::string store = mnt + "/st";
  int failed = 0;
  for (int i = 1; i <= 6; ++i) {
    auto r = run_anvil({"generate", "--device", "cpu", "-m", kModel, "--kv-store", store, "--session",
                        "s" + std::to_string(i), "--ids", std::to_string(100 + i) + ",5,6", "-n", "400", "--ignore-eos",
                        "-t", "1"},
                       true);
    failed += r.exit_code != 0;
  }
  EXPECT_GT(failed, 0) << "the disk never filled: the test checked nothing";
  auto rm = run_anvil({"kv", "rm", "s1", "--kv-store", store}, true);
  EXPECT_EQ(rm.exit_code, 0) << rm.out;
  auto gc = run_anvil({"kv", "gc", "--max", "0", "--kv-store", store, "--json"}, true);
  EXPECT_EQ(gc.exit_code, 0) << gc.out;
  auto v = run_anvil({"kv", "verify", "--kv-store", store}, true);
  EXPECT_EQ(v.exit_code, 0) << v.out;
  EXPECT_EQ(std::system(("umount " + mnt).c_str()), 0);
  fs::remove(mnt);
}

// kv ls lists a session whose row fails its checksum, marked damaged (text and --json), instead of
// leaving it out; kv rm of a session another process holds (here: this test process's claim, as
// anvil run --session holds it) is refused naming it, and the session stays.
TEST(KvStoreCli, LsMarksADamagedSessionAndRmRefusesOneInUse) {
  StoreDir d;
  for (const char* name : {"a", "b"}) {
    auto r = run_anvil(gen(d.path, {"-p", kPrompt, "-n", "4", "--session", name}), true);
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  {
    anvil::SqliteDb db;
    ASSERT_TRUE(db.open(d.path + "/catalog.db", 10000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET tokens = zeroblob(length(tokens)) WHERE name = 'b'").is_ok());
  }
  auto ls = run_anvil({"kv", "ls", "--kv-store", d.path});
  EXPECT_EQ(ls.exit_code, 0) << ls.out;
  EXPECT_NE(ls.out.find("2 sessions (1 damaged: see anvil kv verify)"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("DAMAGED"), std::string::npos) << ls.out;
  auto lj = run_anvil({"kv", "ls", "--kv-store", d.path, "--json"});
  EXPECT_EQ(lj.exit_code, 0) << lj.out;
  auto j = nlohmann::json::parse(lj.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << lj.out;
  ASSERT_EQ(j["sessions"].size(), 2u) << lj.out;
  EXPECT_EQ(j["sessions"][0]["name"], "a");
  EXPECT_FALSE(j["sessions"][0].contains("damaged"));
  EXPECT_EQ(j["sessions"][1]["name"], "b");
  EXPECT_EQ(j["sessions"][1]["damaged"], true);
  EXPECT_NE(j["sessions"][1]["error"].get<std::string>().find("session 'b' is damaged"), std::string::npos) << lj.out;
  anvil::KVStoreOptions o;
  o.dir = d.path;
  auto other = anvil::KVStore::open(o);
  ASSERT_TRUE(other.is_ok()) << other.status().message();
  ASSERT_TRUE((*other)->claim_session("a").is_ok());
  auto rm = run_anvil({"kv", "rm", "a", "--kv-store", d.path}, true);
  EXPECT_NE(rm.exit_code, 0) << rm.out;
  EXPECT_NE(rm.out.find("cannot remove session 'a': it is in use by another process"), std::string::npos) << rm.out;
  EXPECT_EQ(run_anvil({"kv", "show", "a", "--kv-store", d.path}).exit_code, 0) << "a refused rm removed it";
  (*other)->release_session("a");
  rm = run_anvil({"kv", "rm", "a", "--kv-store", d.path}, true);
  EXPECT_EQ(rm.exit_code, 0) << rm.out;
  rm = run_anvil({"kv", "rm", "b", "--kv-store", d.path}, true);
  EXPECT_EQ(rm.exit_code, 0) << "a damaged session is removed like any: " << rm.out;
}

namespace {
// Every session row of a store, byte for byte (tokens, meta, checksum, positions, time).
std::string session_rows(const std::string& dir) {
  anvil::SqliteDb db;
  EXPECT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
  anvil::SqliteStmt q;
  EXPECT_TRUE(q.prepare(db, "SELECT name || '|' || hex(tokens) || '|' || hex(meta) || '|' || quote(sum) || '|' || "
                            "durable_pos || '|' || updated FROM sessions ORDER BY name").is_ok());
  std::string all;
  for (auto r = q.step(); r.is_ok() && *r; r = q.step()) all += q.col_text(0) + "\n";
  return all;
}
}  // namespace

// A session whose own record is damaged (a generate session's token ids, a run session's
// conversation): --resume, --session NAME and --fork from it are refused (exit code 1) naming the
// session and `anvil kv rm`, as the server refuses it (409 session_damaged), and nothing changes:
// the rows stay byte for byte and no fork is made. kv rm then frees the name for a new session.
TEST(KvStoreCli, ADamagedSessionIsRefusedAndLeftAsItIs) {
  StoreDir d;
  ASSERT_EQ(run_anvil(gen(d.path, {"-p", kPrompt, "-n", "4", "--session", "doc"}), true).exit_code, 0);
  auto made = run_anvil({"run", "--device", "cpu", "-m", kModel, "-n", "4", "--temp", "0", "--kv-store", d.path,
                         "--session", "conv", "-p", kPrompt}, true);
  ASSERT_EQ(made.exit_code, 0) << made.out;
  auto rows = [&] { return session_rows(d.path); };
  {
    anvil::SqliteDb db;
    ASSERT_TRUE(db.open(d.path + "/catalog.db", 10000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET tokens = zeroblob(length(tokens)) WHERE name = 'doc'").is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET meta = replace(meta, 'messages', 'massages') WHERE name = 'conv'").is_ok());
  }
  const std::string before = rows();
  ASSERT_NE(before.find("conv|"), std::string::npos) << before;
  ASSERT_NE(before.find("doc|"), std::string::npos) << before;
  const std::vector<std::pair<std::string, std::vector<std::string>>> tries = {
      {"doc", gen(d.path, {"-p", " x", "-n", "2", "--session", "doc", "--resume"})},
      {"doc", gen(d.path, {"-p", " x", "-n", "2", "--session", "doc"})},
      {"doc", gen(d.path, {"-p", " x", "-n", "2", "--session", "doc", "--fork", "doc2"})},
      {"conv", {"run", "--device", "cpu", "-m", kModel, "-n", "2", "--kv-store", d.path, "--session", "conv",
                "--resume", "-p", "more"}},
      {"conv", gen(d.path, {"-n", "2", "--session", "conv", "--resume"})},
  };
  for (const auto& [name, args] : tries) {
    auto r = run_anvil(args, true);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_NE(r.out.find("session '" + name + "' is damaged"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("anvil kv rm " + name), std::string::npos) << r.out;
  }
  EXPECT_EQ(rows(), before) << "a refused run changed a session (or made the fork)";
  ASSERT_EQ(run_anvil({"kv", "rm", "doc", "--kv-store", d.path}, true).exit_code, 0);
  auto fresh = run_json(gen(d.path, {"-p", kPrompt, "-n", "2", "--session", "doc"}));
  EXPECT_EQ(fresh["session"], "doc");
}


// A session is continued only by what records its kind (a conversation: anvil run; anvil run's
// completion-mode text: anvil run; a completion document: anvil generate). anvil generate --resume
// on a conversation recorded it back with meta "", wiping the conversation (anvil run --resume then
// refused it as "not recorded by anvil run"); anvil run --fork from a generate session made the fork
// before refusing it. Now each is refused (exit 1) naming what the session holds and the command
// that continues it, with the flags given, and nothing changes: the rows stay byte for byte, no fork
// is made, and the conversation goes on with anvil run.
TEST(KvStoreCli, ASessionIsNotContinuedByTheOtherCommand) {
  StoreDir d;
  const std::vector<std::string> chat_model = {"--synthetic", "tiny"};  // a chat template
  const std::vector<std::string> text_model = {"-m", kModel};          // none: run's completion mode
  auto cmd = [&](const char* verb, const std::vector<std::string>& model, std::vector<std::string> extra) {
    std::vector<std::string> a = {verb, "--device", "cpu", "--kv-store", d.path, "--temp", "0", "-n", "3"};
    a.insert(a.end(), model.begin(), model.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  ASSERT_EQ(run_anvil(cmd("run", chat_model, {"--session", "c", "-p", "Hello"}), true).exit_code, 0);
  ASSERT_EQ(run_anvil(cmd("run", text_model, {"--session", "t", "-p", kPrompt}), true).exit_code, 0);
  ASSERT_EQ(run_anvil(cmd("generate", text_model, {"--session", "g", "-p", kPrompt}), true).exit_code, 0);
  const std::string before = session_rows(d.path);
  ASSERT_NE(before.find("c|"), std::string::npos) << before;
  struct Try {
    std::vector<std::string> args;
    std::vector<std::string> says;
  };
  const std::vector<Try> tries = {
      {cmd("generate", chat_model, {"--session", "c", "--resume", "-p", " more"}),
       {"session 'c' holds a conversation", "anvil run --session c --resume"}},
      {cmd("generate", chat_model, {"--session", "c", "--resume"}),
       {"session 'c' holds a conversation", "anvil run --session c --resume"}},
      {cmd("generate", chat_model, {"--session", "c", "--fork", "c2", "-p", " more"}),
       {"session 'c' holds a conversation", "anvil run --session c --fork c2"}},
      {cmd("generate", chat_model, {"--session", "c", "-p", " more"}),
       {"session 'c' already exists and holds a conversation", "anvil run --session c --resume", "anvil kv rm c"}},
      {cmd("generate", text_model, {"--session", "t", "--resume", "-p", " more"}),
       {"session 't' holds anvil run's completion-mode text", "anvil run --session t --resume"}},
      {cmd("run", text_model, {"--session", "g", "--resume", "-p", "more"}),
       {"session 'g' holds a completion document", "anvil generate --session g --resume"}},
      {cmd("run", text_model, {"--session", "g", "--fork", "g2", "-p", "more"}),
       {"session 'g' holds a completion document", "anvil generate --session g --fork g2"}},
  };
  for (const Try& t : tries) {
    auto r = run_anvil(t.args, true);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    for (const std::string& part : t.says) EXPECT_NE(r.out.find(part), std::string::npos) << part << ": " << r.out;
  }
  EXPECT_EQ(session_rows(d.path), before) << "a refused command changed a session (or made a fork)";
  auto again = run_anvil(cmd("run", chat_model, {"--session", "c", "--resume", "-p", "And then?"}), true);
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("(resumed session c: 2 messages)"), std::string::npos) << again.out;
  auto text = run_anvil(cmd("run", text_model, {"--session", "t", "--resume", "-p", "x = 1"}), true);
  EXPECT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("(resumed session t:"), std::string::npos) << text.out;
}

// A session row of the older catalog format (no checksum) whose meta is no session anvil writes
// (cut short): damaged, as a row failing its checksum is. anvil generate --resume continued it (and
// wrote its meta over), anvil run --resume called it a generate session; now both refuse it naming
// the session, why and kv rm, and leave it. kv ls gives each damaged row its own reason (it printed
// "fail their checksum" for every one), kv verify reports it.
TEST(KvStoreCli, AnOlderSessionWithAnUnreadableConversationIsDamaged) {
  StoreDir d;
  ASSERT_EQ(run_anvil(gen(d.path, {"-p", kPrompt, "-n", "4", "--session", "doc"}), true).exit_code, 0);
  for (const char* name : {"conv", "sound"}) {
    auto made = run_anvil({"run", "--device", "cpu", "-m", kModel, "-n", "4", "--temp", "0", "--kv-store", d.path,
                           "--session", name, "-p", kPrompt}, true);
    ASSERT_EQ(made.exit_code, 0) << made.out;
  }
  {
    anvil::SqliteDb db;
    ASSERT_TRUE(db.open(d.path + "/catalog.db", 10000).is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET sum = NULL WHERE name IN ('conv', 'sound')").is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET meta = substr(meta, 1, length(meta) / 2) WHERE name = 'conv'").is_ok());
    ASSERT_TRUE(db.exec("UPDATE sessions SET tokens = zeroblob(length(tokens)) WHERE name = 'doc'").is_ok());
  }
  const std::string before = session_rows(d.path);
  const std::vector<std::vector<std::string>> tries = {
      gen(d.path, {"-n", "2", "--session", "conv", "--resume"}),
      gen(d.path, {"-p", " x", "-n", "2", "--session", "conv", "--fork", "conv2"}),
      {"run", "--device", "cpu", "-m", kModel, "-n", "2", "--kv-store", d.path, "--session", "conv", "--resume", "-p",
       "more"},
  };
  for (const auto& args : tries) {
    auto r = run_anvil(args, true);
    EXPECT_EQ(r.exit_code, 1) << r.out;
    for (const char* part : {"session 'conv' is damaged (its conversation is unreadable", "anvil kv rm conv"})
      EXPECT_NE(r.out.find(part), std::string::npos) << part << ": " << r.out;
  }
  EXPECT_EQ(session_rows(d.path), before) << "a refused command changed a session";
  auto ls = run_anvil({"kv", "ls", "--kv-store", d.path});
  EXPECT_EQ(ls.exit_code, 0) << ls.out;
  EXPECT_NE(ls.out.find("3 sessions (2 damaged: see anvil kv verify)"), std::string::npos) << ls.out;
  auto line = [&](const std::string& name) {
    auto at = ls.out.find("\n  " + name + " ");
    return at == std::string::npos ? std::string() : ls.out.substr(at + 1, ls.out.find('\n', at + 1) - at - 1);
  };
  EXPECT_NE(line("conv").find("DAMAGED: its conversation is unreadable"), std::string::npos) << ls.out;
  EXPECT_EQ(line("conv").find("fail their checksum"), std::string::npos) << ls.out;
  EXPECT_NE(line("doc").find("DAMAGED: its token ids or conversation fail their checksum"), std::string::npos) << ls.out;
  EXPECT_EQ(line("sound").find("DAMAGED"), std::string::npos) << "a sound row of the older format: " << ls.out;
  auto v = run_anvil({"kv", "verify", "--kv-store", d.path});
  EXPECT_EQ(v.exit_code, 1) << v.out;
  EXPECT_NE(v.out.find("session conv: its conversation is unreadable"), std::string::npos) << v.out;
  auto resumed = run_anvil({"run", "--device", "cpu", "-m", kModel, "-n", "2", "--temp", "0", "--kv-store", d.path,
                            "--session", "sound", "--resume", "-p", "x = 1"}, true);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out;
}

// Two servers never share a port: the second is refused (the HTTP library's default SO_REUSEPORT
// let it bind, and the kernel then split the connections between two servers).
TEST(ServeCli, ASecondServerOnABusyPortIsRefused) {
  StoreDir d;
  const std::string out = d.path + ".serve.out";
  pid_t first = spawn({"serve", "--device", "cpu", "-m", kModel, "--no-kv-store", "--port", "0"}, out);
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::ifstream f(out);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto at = text.find("listening on http://127.0.0.1:");
    if (at != std::string::npos) port = std::atoi(text.c_str() + at + 30);
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GT(port, 0) << "the first server never listened";
  // (Bounded: a second server that did bind would serve until killed.)
  auto second = anvil::test::run_shell(
      "timeout 30 " +
      anvil::test::anvil_command({"serve", "--device", "cpu", "-m", kModel, "--no-kv-store", "--port", std::to_string(port)}) +
      " 2>&1");
  EXPECT_EQ(second.exit_code, 1) << second.out;
  EXPECT_NE(second.out.find("cannot bind"), std::string::npos) << second.out;
  kill(first, SIGTERM);
  int st = 0;
  waitpid(first, &st, 0);
  fs::remove(out);
}
