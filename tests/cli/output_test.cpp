// Standard output that cannot be written (cli/output.h): a reader that went away (`anvil generate
// | head -c 10`) stops generation at the next token, the session keeps what was generated, and
// anvil exits 141 by itself instead of being killed by SIGPIPE mid-answer; a full disk
// (`> /dev/full`) is an error with exit code 1, never a silent success with the output lost.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"

using anvil::test::anvil_command;
using anvil::test::run_anvil;
using anvil::test::run_shell;
namespace fs = std::filesystem;

namespace {
const std::string kModel = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

struct Reaped {
  bool exited = false, signaled = false;
  int code = -1, signal = 0;
  double seconds = 0;  // from closing the pipe to the exit
};

// Runs anvil with stdout into a pipe (stderr into `err_file`), reads `keep` bytes, closes the pipe's
// read end as `head -c` does, and reaps it (killed after 60 s so that the test cannot hang).
Reaped run_into_closed_pipe(std::vector<std::string> args, size_t keep, const std::string& err_file,
                            std::string* got) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    int e = open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(e, STDERR_FILENO);
    signal(SIGPIPE, SIG_DFL);  // as a shell starts it
    std::string bin = ANVIL_BINARY;
    std::vector<char*> argv = {bin.data()};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[256];
  while (got->size() < keep) {
    ssize_t n = read(fds[0], buf, std::min(sizeof buf, keep - got->size()));
    if (n <= 0) break;
    got->append(buf, size_t(n));
  }
  close(fds[0]);
  const auto closed = std::chrono::steady_clock::now();
  Reaped r;
  int st = 0;
  for (int i = 0; i < 600; ++i) {
    if (waitpid(pid, &st, WNOHANG) == pid) break;
    if (i == 599) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
    }
    usleep(100000);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - closed).count();
  r.exited = WIFEXITED(st);
  r.code = r.exited ? WEXITSTATUS(st) : -1;
  r.signaled = WIFSIGNALED(st);
  r.signal = r.signaled ? WTERMSIG(st) : 0;
  return r;
}
}  // namespace

TEST(CliOutput, ClosedPipeStopsGenerationAndKeepsTheSession) {
  const fs::path d = fs::temp_directory_path() / ("anvil_closed_pipe_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string err = (d / "stderr.txt").string(), store = (d / "kv").string();
  for (const std::string cmd : {"generate", "run"}) {
    SCOPED_TRACE(cmd);
    std::string got;
    // 20,000 tokens take minutes on the CPU: only stopping at the closed pipe ends it in time.
    auto r = run_into_closed_pipe({cmd, "--device", "cpu", "-m", kModel, "-p", "def f(x):\n", "-n", "20000", "-c",
                                   "20010", "--temp", "0", "--kv-store", store, "--session", "s_" + cmd},
                                  10, err, &got);
    const std::string stderr_text = read_all(err);
    EXPECT_EQ(got.size(), 10u) << stderr_text;
    EXPECT_FALSE(r.signaled) << "killed by signal " << r.signal << " (SIGPIPE is 13): " << stderr_text;
    EXPECT_TRUE(r.exited && r.code == 141) << "exit code " << r.code << ": " << stderr_text;
    EXPECT_LT(r.seconds, 20) << "generation went on after the reader left";
    EXPECT_EQ(stderr_text.find("Broken pipe"), std::string::npos) << stderr_text;
    EXPECT_EQ(stderr_text.find("error"), std::string::npos) << "a closed pipe is not an error: " << stderr_text;
    EXPECT_NE(stderr_text.find("finish: interrupted"), std::string::npos) << stderr_text;
    // The session holds what was generated up to the stop: more than the prompt, far less than -n.
    auto show = run_anvil({"kv", "show", "s_" + cmd, "--kv-store", store, "--json"});
    ASSERT_EQ(show.exit_code, 0) << "the session was not recorded: " << show.out << stderr_text;
    const int tokens = nlohmann::json::parse(show.out)["tokens"].get<int>();
    EXPECT_GT(tokens, 6) << show.out;
    EXPECT_LT(tokens, 20000) << show.out;
  }
  fs::remove_all(d);
}

TEST(CliOutput, AFullDiskIsAnErrorNotASilentSuccess) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  const std::vector<std::vector<std::string>> commands = {
      {"generate", "--device", "cpu", "-m", kModel, "-p", "def f(x):\n", "-n", "8", "--no-kv-store"},
      {"generate", "--device", "cpu", "-m", kModel, "--ids", "1,2,3", "-n", "8", "--no-kv-store"},
      {"generate", "--device", "cpu", "-m", kModel, "-p", "def f(x):\n", "-n", "8", "--no-kv-store", "--json"},
      {"run", "--device", "cpu", "-m", kModel, "-p", "def f(x):\n", "-n", "8", "--no-kv-store"},
      {"tokenize", "-m", kModel, "-p", "def f(x):\n"},
      {"inspect", "-m", kModel, "--json"},
      {"--help"},
  };
  for (const auto& args : commands) {
    // stderr into the pipe that is read, stdout to the full device.
    auto r = run_shell(anvil_command(args) + " 2>&1 >/dev/full");
    EXPECT_EQ(r.exit_code, 1) << anvil_command(args) << "\n" << r.out;
    EXPECT_NE(r.out.find("anvil: error: cannot write the output: No space left on device"), std::string::npos)
        << anvil_command(args) << "\n" << r.out;
  }
}
