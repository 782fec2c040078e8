// `anvil run` driven through a pseudo-terminal, as a person would use it: type a message, get an
// answer, Ctrl-C stops an answer without quitting, /reset, /quit.
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>

namespace {

class Pty {
 public:
  explicit Pty(const std::vector<std::string>& args) {
    pid_ = forkpty(&fd_, nullptr, nullptr, nullptr);
    if (pid_ == 0) {
      std::vector<char*> argv;
      argv.push_back(const_cast<char*>(ANVIL_BINARY));
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(ANVIL_BINARY, argv.data());
      _exit(127);
    }
  }
  ~Pty() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  void send(const std::string& s) { ASSERT_EQ(write(fd_, s.data(), s.size()), ssize_t(s.size())); }
  // Reads until `needle` appears in the output after `from` (returns true) or the timeout passes.
  bool wait_for(const std::string& needle, size_t from, int timeout_ms = 60000) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (out_.find(needle, from) == std::string::npos) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, int(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0) return out_.find(needle, from) != std::string::npos;
      out_.append(buf, size_t(n));
    }
    return true;
  }
  int wait_exit(int timeout_ms = 30000) {
    auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < end) {
      char buf[4096];
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) > 0) {
        ssize_t n = read(fd_, buf, sizeof buf);
        if (n > 0) out_.append(buf, size_t(n));
      }
      int st;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
    }
    return -2;
  }
  const std::string& out() const { return out_; }

 private:
  int fd_ = -1;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string out_;
};

}  // namespace

TEST(RunPty, MultiTurnChatResetAndQuit) {
  // A synthetic model with the Qwen3 tokenizer and chat template: random weights, so the answer is
  // noise, but the loop, history, reset and quit are real.
  Pty p({"run", "--synthetic", "tiny:q4g64", "-n", "8", "--temp", "0"});
  ASSERT_TRUE(p.wait_for("> ", 0)) << p.out();
  size_t mark = p.out().size();
  p.send("Hello there\r");
  ASSERT_TRUE(p.wait_for("\n> ", mark)) << p.out();
  mark = p.out().size();
  p.send("And a second turn\r");
  ASSERT_TRUE(p.wait_for("\n> ", mark)) << p.out();
  mark = p.out().size();
  p.send("/reset\r");
  ASSERT_TRUE(p.wait_for("(conversation cleared)", mark)) << p.out();
  ASSERT_TRUE(p.wait_for("> ", mark)) << p.out();
  p.send("/quit\r");
  EXPECT_EQ(p.wait_exit(), 0) << p.out();
}

TEST(RunPty, CtrlCStopsTheAnswerNotTheProgram) {
  // A long answer (EOS can still end it early; then Ctrl-C lands at the prompt, which must not quit
  // either).
  Pty p({"run", "--synthetic", "tiny:q4g64", "-n", "100000", "--temp", "0", "-c", "200000"});
  ASSERT_TRUE(p.wait_for("> ", 0)) << p.out();
  size_t mark = p.out().size();
  p.send("Write forever\r");
  usleep(1500 * 1000);
  p.send("\x03");  // Ctrl-C through the terminal: SIGINT to the foreground process
  ASSERT_TRUE(p.wait_for("> ", mark + 1)) << p.out();
  // The answer's summary (speed, peak memory) is printed when it is interrupted too.
  EXPECT_NE(p.out().find("peak memory", mark), std::string::npos) << p.out();
  mark = p.out().size();
  p.send("/quit\r");
  EXPECT_EQ(p.wait_exit(), 0) << p.out();
}

TEST(RunPty, CompletionModeWithoutTemplate) {
  std::string model = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
  Pty p({"run", "-m", model, "-n", "16", "--temp", "0"});
  ASSERT_TRUE(p.wait_for("> ", 0)) << p.out();
  EXPECT_NE(p.out().find("completion mode"), std::string::npos) << p.out();
  size_t mark = p.out().size();
  p.send("def add(a, b):\r");
  ASSERT_TRUE(p.wait_for("\n> ", mark)) << p.out();
  p.send("\x04");  // Ctrl-D: end of input quits
  EXPECT_EQ(p.wait_exit(), 0) << p.out();
  // ... after a newline, so that the shell's prompt is not left after "> ".
  EXPECT_EQ(p.out().substr(p.out().size() - std::min<size_t>(4, p.out().size())), "> \r\n") << p.out();
}

namespace {
// The answer text of the turn whose output starts at `from`: up to the summary line.
std::string answer_after(const std::string& out, size_t from) {
  size_t end = out.find("[anvil] prompt", from);
  return out.substr(from, end == std::string::npos ? std::string::npos : end - from);
}
}  // namespace

TEST(RunPty, SameQuestionAfterResetSamplesAFreshAnswer) {
  // Each turn draws from its own seed (session seed + turn): before, every turn reused seed 0.
  Pty p({"run", "--synthetic", "tiny:q4g64", "-n", "12", "--temp", "1.0", "--seed", "11"});
  ASSERT_TRUE(p.wait_for("> ", 0)) << p.out();
  size_t mark = p.out().size();
  p.send("Tell me a story\r");
  ASSERT_TRUE(p.wait_for("\n> ", mark)) << p.out();
  const std::string first = answer_after(p.out(), mark);
  EXPECT_NE(p.out().find("peak memory", mark), std::string::npos) << p.out();
  mark = p.out().size();
  p.send("/reset\r");
  ASSERT_TRUE(p.wait_for("(conversation cleared)", mark)) << p.out();
  ASSERT_TRUE(p.wait_for("> ", mark)) << p.out();
  mark = p.out().size();
  p.send("Tell me a story\r");
  ASSERT_TRUE(p.wait_for("\n> ", mark)) << p.out();
  EXPECT_NE(answer_after(p.out(), mark), first) << p.out();
  p.send("/quit\r");
  EXPECT_EQ(p.wait_exit(), 0) << p.out();
}

TEST(RunPty, LongConversationDropsTheOldestTurns) {
  // --ctx 96 holds about three short turns of the Qwen3 template plus 16-token answers: later turns
  // must drop the oldest ones (and say so) rather than fail.
  Pty p({"run", "--synthetic", "tiny:q4g64", "-n", "16", "--temp", "0", "--ctx", "96"});
  ASSERT_TRUE(p.wait_for("> ", 0)) << p.out();
  for (int turn = 0; turn < 7; ++turn) {
    size_t mark = p.out().size();
    p.send("Turn number " + std::to_string(turn) + " of a long talk\r");
    ASSERT_TRUE(p.wait_for("\n> ", mark)) << "turn " << turn << ": " << p.out();
    EXPECT_NE(p.out().find("[anvil] prompt", mark), std::string::npos) << "turn " << turn << ": " << p.out();
  }
  EXPECT_NE(p.out().find("dropped the"), std::string::npos) << p.out();
  EXPECT_EQ(p.out().find("error"), std::string::npos) << p.out();
  p.send("/quit\r");
  EXPECT_EQ(p.wait_exit(), 0) << p.out();
}
