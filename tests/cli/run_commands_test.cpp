// The lines typed at anvil run's prompt (stdin piped): what is a command, what is refused, and what
// is sent to the model, read back from the conversation a session records (its meta's messages),
// so that a line sent by mistake shows as a turn of its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli_helpers.h"
#include "kvstore/kvstore.h"

using anvil::test::anvil_command;
using anvil::test::run_shell;
using anvil::test::shell_quote;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

class RunCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = (fs::temp_directory_path() / ("anvil_runcmd_" + std::to_string(::getpid()) + "_" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                 .string();
    fs::remove_all(store_);
  }
  void TearDown() override {
    fs::remove_all(store_);
    fs::remove(store_ + ".err");
  }

  // `anvil run` on the synthetic Qwen3 model (its chat template) with stdin from printf FORMAT,
  // recording session `session` in this test's store (none when empty); stdout, stderr into *err.
  anvil::test::ProcResult run(const std::string& printf_format, const std::string& session, std::string* err,
                              const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"run", "--synthetic", "tiny", "-n", "2", "--temp", "0"};
    if (session.empty()) args.push_back("--no-kv-store");
    else args.insert(args.end(), {"--kv-store", store_, "--session", session});
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_shell("printf " + shell_quote(printf_format) + " | " + anvil_command(args) + " 2>" + store_ + ".err");
    std::ifstream f(store_ + ".err");
    *err = std::string(std::istreambuf_iterator<char>(f), {});
    return r;
  }
  // The user messages of session `name`, in order.
  std::vector<std::string> user_messages(const std::string& name) {
    anvil::KVStoreOptions o;
    o.dir = store_;
    auto st = anvil::KVStore::open(o);
    EXPECT_TRUE(st.is_ok()) << st.status().message();
    if (!st.is_ok()) return {};
    auto s = (*st)->get_session(name);
    EXPECT_TRUE(s.is_ok() && s->has_value()) << name;
    if (!s.is_ok() || !s->has_value()) return {};
    auto meta = ojson::parse((*s)->meta, nullptr, false);
    EXPECT_TRUE(meta.is_object()) << (*s)->meta;
    std::vector<std::string> out;
    if (meta.is_object())
      for (const auto& m : meta["messages"])
        if (m["role"] == "user") out.push_back(m["content"]);
    return out;
  }

  std::string store_;
};

}  // namespace

using anvil::test::prompt_sizes;

// A mistyped command (/rest for /reset) was sent to the model as a message and kept as a turn. Now
// it is refused, naming the closest command and the list; so is a known command with words after
// it. Nothing is sent or recorded: the conversation is the one without those lines.
TEST_F(RunCommands, AnUnknownCommandIsRefusedNotSent) {
  std::string err;
  auto r = run("hello\\n/rest\\n/Reset\\n/reset now\\n/bogus\\nagain\\n", "s", &err);
  ASSERT_EQ(r.exit_code, 0) << r.out << err;
  EXPECT_NE(err.find("unknown command '/rest'; did you mean '/reset'? (commands: /help, /reset, /quit, /exit"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("unknown command '/Reset'; did you mean '/reset'?"), std::string::npos) << err;
  EXPECT_NE(err.find("unknown command '/bogus' (commands:"), std::string::npos) << err;
  EXPECT_NE(err.find("begin it with '//bogus'"), std::string::npos) << err;
  EXPECT_NE(err.find("/reset takes no arguments"), std::string::npos) << err;
  EXPECT_EQ(r.out.find("(conversation cleared)"), std::string::npos) << r.out;
  EXPECT_EQ(user_messages("s"), (std::vector<std::string>{"hello", "again"}));
  std::string err_plain;
  ASSERT_EQ(run("hello\\nagain\\n", "", &err_plain).exit_code, 0) << err_plain;
  EXPECT_EQ(prompt_sizes(err), prompt_sizes(err_plain)) << err << "\n---\n" << err_plain;
}

// Lines that start with '/' but are no command word go as typed (a path, a comment); "//word" sends
// "/word" (the way to send a command's name as text); a line that starts with a space is text.
TEST_F(RunCommands, SlashLinesThatAreNoCommandAreSentAsText) {
  std::string err;
  auto r = run("//reset\\n/usr/bin/python is broken\\n// a comment\\n//\\n/\\n /quit\\n/* c */\\n", "s", &err);
  ASSERT_EQ(r.exit_code, 0) << r.out << err;
  EXPECT_EQ(err.find("error"), std::string::npos) << err;
  EXPECT_EQ(user_messages("s"), (std::vector<std::string>{"/reset", "/usr/bin/python is broken", "// a comment", "//",
                                                          "/", " /quit", "/* c */"}));
}

// An empty line, or one of only whitespace, sends nothing (a line of spaces was a message); a command
// may have whitespace after it ("/reset  " was sent as text).
TEST_F(RunCommands, BlankLinesSendNothingAndCommandsAllowTrailingSpace) {
  std::string err;
  auto r = run("hi\\n\\n   \\n\\t \\n/reset  \\nok\\n/quit \\nnever\\n", "s", &err);
  ASSERT_EQ(r.exit_code, 0) << r.out << err;
  EXPECT_NE(r.out.find("(conversation cleared)"), std::string::npos) << r.out;
  EXPECT_EQ(user_messages("s"), (std::vector<std::string>{"ok"}));
  EXPECT_EQ(prompt_sizes(err).size(), 2u) << err;
}

// A line is read whole, a NUL byte in it too: fgets' C string dropped the rest of the line and ran
// it into the next one ("a\0b" + "next" was one message "anext").
TEST_F(RunCommands, ALineWithANulByteIsOneMessage) {
  std::string err;
  auto r = run("a\\000b\\nnext\\n", "s", &err);
  ASSERT_EQ(r.exit_code, 0) << r.out << err;
  EXPECT_EQ(user_messages("s"), (std::vector<std::string>{std::string("a\0b", 3), "next"}));
}

// /reset with --session clears the session too: it was cleared only in the running process, so a
// run that ended after /reset (Ctrl-D, /quit) left the old conversation, and --resume brought it
// back. The resumed run's next prompt is a fresh conversation's (its system message kept).
TEST_F(RunCommands, ResetThenEndOfInputLeavesTheSessionCleared) {
  std::string err;
  ASSERT_EQ(run("first\\nsecond\\n", "s", &err, {"--system", "Be brief."}).exit_code, 0) << err;
  auto reset = run("/reset\\n", "s", &err, {"--resume"});
  ASSERT_EQ(reset.exit_code, 0) << reset.out << err;
  EXPECT_EQ(err.find("error"), std::string::npos) << err;
  EXPECT_NE(reset.out.find("(conversation cleared)"), std::string::npos) << reset.out;
  EXPECT_EQ(user_messages("s"), std::vector<std::string>{});
  std::string err_resumed, err_fresh;
  auto resumed = run("again\\n", "s", &err_resumed, {"--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << err_resumed;
  EXPECT_NE(resumed.out.find("(resumed session s: 1 messages)"), std::string::npos) << resumed.out;
  ASSERT_EQ(run("again\\n", "", &err_fresh, {"--system", "Be brief."}).exit_code, 0) << err_fresh;
  EXPECT_EQ(prompt_sizes(err_resumed), prompt_sizes(err_fresh)) << err_resumed << "\n---\n" << err_fresh;
  EXPECT_EQ(user_messages("s"), (std::vector<std::string>{"again"}));
}
