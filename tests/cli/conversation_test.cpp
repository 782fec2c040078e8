// anvil run / generate as a conversation goes on: user text that is not UTF-8, a thinking model's
// answer as it is shown and kept in the history (against Qwen3's own template), stop strings
// around the <think> tags, a message too long for --ctx, and the per-turn seed across --resume.
// The thinking model is scripted (scripted_model.h): its reply is known, so the expectations are
// derived from the script, never copied from an output.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <tuple>

#include "cli_helpers.h"
#include "kvstore/kvstore.h"
#include "scripted_model.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_config.h"

using anvil::test::anvil_command;
using anvil::test::run_anvil;
using anvil::test::run_shell;
using anvil::test::shell_quote;
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

class Conversation : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = (fs::temp_directory_path() / ("anvil_conv_think_" + std::to_string(::getpid()))).string();
    error_ = anvil::test::make_think_model(model_);
  }
  static void TearDownTestSuite() { fs::remove_all(model_); }
  void SetUp() override {
    ASSERT_TRUE(error_.empty()) << error_;
    store_ = (fs::temp_directory_path() / ("anvil_conv_store_" + std::to_string(::getpid()) + "_" +
                                           ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                 .string();
    fs::remove_all(store_);
  }
  void TearDown() override { fs::remove_all(store_); }

  // The session `name` in this test's store: its token ids and meta.
  anvil::SessionInfo session(const std::string& name) {
    anvil::KVStoreOptions o;
    o.dir = store_;
    auto st = anvil::KVStore::open(o);
    EXPECT_TRUE(st.is_ok()) << st.status().message();
    if (!st.is_ok()) return {};
    auto s = (*st)->get_session(name);
    EXPECT_TRUE(s.is_ok() && s->has_value()) << name;
    return s.is_ok() && s->has_value() ? **s : anvil::SessionInfo{};
  }
  // `anvil run ARGS` with stdin from printf FORMAT; stdout, and stderr into *err.
  anvil::test::ProcResult run_piped(const std::string& printf_format, const std::vector<std::string>& args,
                                    std::string* err = nullptr) {
    const std::string err_file = store_ + ".err";
    auto r = run_shell("printf " + shell_quote(printf_format) + " | " + anvil_command(args) + " 2>" + err_file);
    std::ifstream f(err_file);
    if (err) *err = std::string(std::istreambuf_iterator<char>(f), {});
    fs::remove(err_file);
    return r;
  }

  static std::string model_, error_;
  std::string store_;
};
std::string Conversation::model_, Conversation::error_;

}  // namespace

using anvil::test::prompt_sizes;

// Input that is not UTF-8 is repaired (U+FFFD, as the tokenizer encodes it anyway) with a line
// naming the byte offset, in run with a session too (it used to abort while recording the meta):
// the conversation goes on, the session records valid text that encodes to the same tokens.
TEST_F(Conversation, InvalidUtf8InputIsReplacedAndTheSessionStaysValid) {
  std::string err;
  auto r = run_piped("hi\\n\\377\\376 bad\\nagain\\n",
                     {"run", "-m", model_, "-n", "5", "--kv-store", store_, "--session", "u1"}, &err);
  ASSERT_EQ(r.exit_code, 0) << r.out << err;
  EXPECT_NE(err.find("not valid UTF-8"), std::string::npos) << err;
  EXPECT_NE(err.find("byte offset 0"), std::string::npos) << err;
  auto meta = ojson::parse(session("u1").meta, nullptr, false);
  ASSERT_TRUE(meta.is_object()) << session("u1").meta;
  const ojson& msgs = meta["messages"];
  ASSERT_EQ(msgs.size(), 6u) << msgs.dump() << "\nthree questions, three answers";
  const std::string stored = msgs[2]["content"];
  EXPECT_TRUE(anvil::tok::is_valid_utf8(stored)) << stored;
  anvil::test::ScriptTokens tk(model_);
  EXPECT_EQ(tk.text(stored), tk.text("\xff\xfe bad")) << "the stored text encodes as the raw bytes did";
  EXPECT_EQ(msgs[4]["content"], "again");

  // -p in Latin-1: accepted, the offset named; the turn is the same as the repaired text typed.
  std::string latin1 = "caf\xe9";
  auto p = run_anvil({"run", "-m", model_, "-n", "5", "--kv-store", store_, "--session", "u2", "-p", latin1}, true);
  ASSERT_EQ(p.exit_code, 0) << p.out;
  EXPECT_NE(p.out.find("byte offset 3"), std::string::npos) << p.out;
  auto m2 = ojson::parse(session("u2").meta, nullptr, false);
  ASSERT_TRUE(m2.is_object());
  EXPECT_EQ(tk.text(m2["messages"][0]["content"].get<std::string>()), tk.text(latin1));
  // A resume of it works (the meta parses).
  auto q = run_anvil({"run", "-m", model_, "-n", "5", "--kv-store", store_, "--session", "u2", "--resume", "-p", "more"}, true);
  EXPECT_EQ(q.exit_code, 0) << q.out;
  // generate says it the same way.
  auto g = run_anvil({"generate", "-m", model_, "-n", "3", "--no-kv-store", "-p", latin1}, true);
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("byte offset 3"), std::string::npos) << g.out;
}

// The answer after </think> is what Qwen3's template keeps of an assistant turn: its leading
// newlines stripped. run -p and generate print it so, and run's history holds it so: the second
// turn's prompt is the template's rendering of the raw first reply (the template strips it
// itself: an independent reference), and run stores what the server stores (content and
// reasoning_content).
TEST_F(Conversation, ThinkingAnswerIsTrimmedAsTheTemplateKeepsIt) {
  const std::string answer = anvil::test::lstrip_newlines(anvil::test::kThinkReply.substr(anvil::test::kThinkReply.find("</think>") + 8));
  auto r = run_anvil({"run", "-m", model_, "-p", "hi", "--no-kv-store"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, answer + "\n");
  auto g = run_anvil({"generate", "-m", model_, "-p", "hi", "--no-kv-store"});
  ASSERT_EQ(g.exit_code, 0) << g.out;
  EXPECT_EQ(g.out, answer + "\n");
  auto gj = run_anvil({"generate", "-m", model_, "-p", "hi", "--no-kv-store", "--json"});
  auto j = nlohmann::json::parse(gj.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << gj.out;
  EXPECT_EQ(j["text"], answer);
  EXPECT_EQ(j["reasoning"], anvil::test::kThinkReasoning);
  // --show-reasoning: the reasoning, a blank line, the answer.
  auto gs = run_anvil({"generate", "-m", model_, "-p", "hi", "--no-kv-store", "--show-reasoning"});
  EXPECT_EQ(gs.out, anvil::test::kThinkReasoning + "\n\n" + answer + "\n");

  std::string err;
  auto two = run_piped("hi\\nagain\\n", {"run", "-m", model_, "--kv-store", store_, "--session", "t1"}, &err);
  ASSERT_EQ(two.exit_code, 0) << two.out << err;
  anvil::SessionInfo s = session("t1");
  auto meta = ojson::parse(s.meta, nullptr, false);
  ASSERT_TRUE(meta.is_object());
  EXPECT_EQ(meta["messages"][1],
            (ojson{{"role", "assistant"}, {"content", answer}, {"reasoning_content", anvil::test::kThinkReasoning}}));
  auto cfg = anvil::load_tokenizer_config(model_);
  ASSERT_TRUE(cfg.is_ok());
  ojson raw = ojson::array({ojson{{"role", "user"}, {"content", "hi"}},
                            ojson{{"role", "assistant"}, {"content", anvil::test::kThinkReply}},
                            ojson{{"role", "user"}, {"content", "again"}}});
  auto text = anvil::apply_chat_template(*cfg, raw, ojson(), true, std::nullopt);
  ASSERT_TRUE(text.is_ok()) << text.status().message();
  anvil::test::ScriptTokens tk(model_);
  const std::vector<int32_t> want = tk.text(*text);
  ASSERT_GE(s.tokens.size(), want.size());
  EXPECT_EQ(std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + want.size()), want)
      << "the second turn's prompt is the template's own rendering of the history";
}

// Stop strings never cut a <think>/</think> tag: they match inside the reasoning or the answer
// (or a whole tag), so no fragment of a tag is ever printed. Expected text from the script.
TEST_F(Conversation, StopStringsNeverSplitTheReasoningTags) {
  for (std::string stop : {">", "<", "/", "think", "k>", "<th", "me", "Answer", ": ", "\n", "</think>", "<think>",
                           "think</think>", "zzz"}) {
    std::string want_r, want_c;
    anvil::test::think_reply_under_stop(stop, &want_r, &want_c);
    auto g = run_anvil({"generate", "-m", model_, "-p", "hi", "--no-kv-store", "--json", "--stop", stop});
    auto j = nlohmann::json::parse(g.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << stop << ": " << g.out;
    EXPECT_EQ(j["reasoning"], want_r) << "stop " << nlohmann::json(stop).dump();
    EXPECT_EQ(j["text"], want_c) << "stop " << nlohmann::json(stop).dump();
    EXPECT_EQ(j["finish_reason"], "stop");
    // The plain output shows the same answer.
    if (stop == ">" || stop == "think" || stop == ": ") {
      auto p = run_anvil({"generate", "-m", model_, "-p", "hi", "--no-kv-store", "--stop", stop});
      EXPECT_EQ(p.out, want_c + "\n") << "stop " << nlohmann::json(stop).dump();
    }
  }
}

// A "</think>" with no reasoning open is text of the answer, and a stop string matches inside it
// as in any text (the server's rule: ServeThinking.StopStringsMatchInsideTagsThatSwitchNothing).
// It used to be atomic wherever it stood: --stop ink printed "Hi</think> there..." whole.
TEST(ConversationStrayTags, StopStringsMatchInsideTagsThatSwitchNothing) {
  const std::string model = (fs::temp_directory_path() / ("anvil_conv_stray_" + std::to_string(::getpid()))).string();
  ASSERT_EQ(anvil::test::make_stray_tags_model(model), "");
  const std::string& reply = anvil::test::kStrayTagsReply;
  for (std::string stop : {"ink", "n", "/", "ool", "zzz"}) {
    const std::string want = reply.substr(0, std::min(reply.size(), reply.find(stop)));
    auto g = run_anvil({"generate", "-m", model, "-p", "hi", "--no-kv-store", "--json", "--stop", stop});
    auto j = nlohmann::json::parse(g.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << stop << ": " << g.out;
    EXPECT_EQ(j["text"], want) << "stop " << nlohmann::json(stop).dump();
    EXPECT_EQ(j["finish_reason"], "stop");
    auto p = run_anvil({"generate", "-m", model, "-p", "hi", "--no-kv-store", "--stop", stop});
    EXPECT_EQ(p.out, want + "\n") << "stop " << nlohmann::json(stop).dump();
  }
  fs::remove_all(model);
}

// -n cuts the answer inside a character: it ends with U+FFFD, as decode gives it, and a stop string
// that completes in that last text ends the answer at a stop: finish "stop" (it said "length").
TEST(ConversationCutChar, StopStringCompletedByTheLastHeldTextIsAStop) {
  const std::string model = (fs::temp_directory_path() / ("anvil_conv_cut_" + std::to_string(::getpid()))).string();
  ASSERT_EQ(anvil::test::make_cut_char_model(model), "");
  const std::string fffd = "\xEF\xBF\xBD";
  for (const auto& [stop, want, finish] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"zzz", "Hi" + fffd, "length"}, {fffd, "Hi", "stop"}}) {
    auto g = run_anvil({"generate", "-m", model, "-p", "hi", "-n", "3", "--no-kv-store", "--json", "--stop", stop});
    auto j = nlohmann::json::parse(g.out, nullptr, false);
    ASSERT_TRUE(j.is_object()) << g.out;
    EXPECT_EQ(j["text"], want) << nlohmann::json(stop).dump();
    EXPECT_EQ(j["finish_reason"], finish) << nlohmann::json(stop).dump();
    auto p = run_anvil({"generate", "-m", model, "-p", "hi", "-n", "3", "--no-kv-store", "--stop", stop});
    EXPECT_EQ(p.out, want + "\n") << nlohmann::json(stop).dump();
  }
  fs::remove_all(model);
}

// A message too long for --ctx even alone is refused and the conversation is unchanged: the
// transcript around it is the one without it (no turn dropped for it).
TEST_F(Conversation, TooLongMessageLeavesTheHistoryAlone) {
  std::string long_line;
  for (int i = 0; i < 300; ++i) long_line += "word ";
  const std::vector<std::string> args = {"run", "--synthetic", "tiny", "-n", "24", "-c", "256", "--temp", "0",
                                         "--no-kv-store"};
  std::string err_with, err_without;
  auto with = run_piped("hi\\n" + long_line + "\\nok\\n", args, &err_with);
  auto without = run_piped("hi\\nok\\n", args, &err_without);
  ASSERT_EQ(without.exit_code, 0) << err_without;
  EXPECT_EQ(with.exit_code, 0) << err_with;
  EXPECT_NE(err_with.find("too long"), std::string::npos) << err_with;
  EXPECT_EQ(err_with.find("dropped"), std::string::npos) << err_with;
  EXPECT_EQ(prompt_sizes(err_with), prompt_sizes(err_without)) << err_with << "\n---\n" << err_without;
  ASSERT_EQ(prompt_sizes(err_without).size(), 2u) << err_without;
  EXPECT_GT(prompt_sizes(err_without)[1], prompt_sizes(err_without)[0]) << "turn 'ok' sees turn 'hi'";
  // Every answer is the same: the refused turn prints only its prompt marker.
  std::string w = with.out;
  const size_t refused = w.find("> > ");
  ASSERT_NE(refused, std::string::npos) << w;
  w.erase(refused, 2);
  EXPECT_EQ(w, without.out);
}

// Completion mode (a model without a chat template) refuses a message over --ctx as chat mode does,
// instead of cutting its first tokens (run -f long.txt -c 64 answered the text's last 60 tokens),
// and as generate refuses such a prompt; only the earlier text gives way to a new message.
TEST_F(Conversation, CompletionModeRefusesAMessageOverTheContext) {
  const std::string code_model = std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4";
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += "def f(x):\n    return x\n";
  const fs::path file = fs::path(store_ + ".long.txt");
  { std::ofstream(file) << long_text; }
  for (const char* command : {"run", "generate"}) {
    auto r = run_anvil({command, "-m", code_model, "-f", file.string(), "-c", "64", "-n", "4", "--no-kv-store"}, true);
    EXPECT_EQ(r.exit_code, 1) << command << ": " << r.out;
    EXPECT_NE(r.out.find("(raise --ctx)"), std::string::npos) << command << ": " << r.out;
    EXPECT_EQ(r.out.find("dropped"), std::string::npos) << command << ": " << r.out;
    EXPECT_EQ(r.out.find("[anvil] prompt"), std::string::npos) << command << " answered: " << r.out;
  }
  fs::remove(file);
  // Typed: the long line is refused and the text so far is unchanged; the next line continues it.
  std::string long_line;
  for (int i = 0; i < 100; ++i) long_line += "x = 1; ";
  const std::vector<std::string> args = {"run", "-m", code_model, "-n", "8", "-c", "128", "--temp", "0", "--no-kv-store"};
  std::string err_with, err_without;
  auto with = run_piped("def f(x):\n" + long_line + "\n    return x\n", args, &err_with);
  auto without = run_piped("def f(x):\n    return x\n", args, &err_without);
  ASSERT_EQ(without.exit_code, 0) << err_without;
  EXPECT_EQ(with.exit_code, 0) << err_with;
  EXPECT_NE(err_with.find("the message is too long: it is"), std::string::npos) << err_with;
  EXPECT_NE(err_with.find("the text so far is unchanged"), std::string::npos) << err_with;
  EXPECT_EQ(err_with.find("dropped"), std::string::npos) << err_with;
  EXPECT_EQ(prompt_sizes(err_with), prompt_sizes(err_without)) << err_with << "\n---\n" << err_without;
  // A text that outgrows the context loses its oldest tokens, never the new line's: each turn's
  // prompt holds at least the line just typed.
  std::string lines;
  for (int i = 0; i < 6; ++i) lines += "def function_number_" + std::to_string(i) + "(a, b, c):\n";
  std::string err_grow;
  auto grow = run_piped(lines, {"run", "-m", code_model, "-n", "16", "-c", "48", "--temp", "0", "--no-kv-store"},
                        &err_grow);
  EXPECT_EQ(grow.exit_code, 0) << err_grow;
  EXPECT_NE(err_grow.find("the text no longer fits in --ctx 48: dropped its first"), std::string::npos) << err_grow;
  EXPECT_EQ(err_grow.find("too long"), std::string::npos) << err_grow;
  EXPECT_EQ(prompt_sizes(err_grow).size(), 6u) << err_grow;
}

// Answer k of a session uses seed + k, also when the session is resumed in a new process: a sampled
// conversation interrupted after each turn gives the uninterrupted one's answers.
TEST_F(Conversation, ResumedSessionContinuesTheSeedSequence) {
  const std::vector<std::string> common = {"run", "--synthetic", "tiny", "-n", "12", "--temp", "1", "--seed", "7"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto whole = run_piped("hello\\nsecond turn\\nthird\\n", with({"--no-kv-store"}));
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  // stdout: "> " answer "\n" per turn, then the last "> ".
  std::vector<std::string> answers;
  for (size_t at = 0; (at = whole.out.find("> ", at)) != std::string::npos;) {
    size_t end = whole.out.find("\n> ", at);
    if (end == std::string::npos) break;
    answers.push_back(whole.out.substr(at + 2, end - at - 2));
    at = end + 1;
  }
  ASSERT_EQ(answers.size(), 3u) << whole.out;
  std::vector<std::string> turns = {"hello", "second turn", "third"};
  for (size_t k = 0; k < turns.size(); ++k) {
    std::vector<std::string> extra = {"--kv-store", store_, "--session", "s1", "-p", turns[k]};
    if (k > 0) extra.push_back("--resume");
    auto r = run_anvil(with(extra));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::string got = r.out;
    if (k > 0) got.erase(0, got.find('\n') + 1);  // "(resumed session s1: ...)"
    EXPECT_EQ(got, answers[k] + "\n") << "turn " << k;
  }
}

// A session's system message stays when a resumed run drops the oldest turns (the conversation no
// longer fits in --ctx) or clears it with /reset, as in an uninterrupted run: the resumed run
// without --system took the system message for the oldest turn and dropped it (later prompts then
// differed from the uninterrupted run's), and /reset cleared it.
TEST_F(Conversation, AResumedSessionKeepsItsSystemMessage) {
  const std::string system = "You are a careful assistant who answers briefly.";
  const std::vector<std::string> turns = {"first question", "second question", "third question", "fourth question",
                                          "fifth question"};
  const std::vector<std::string> common = {"run", "--synthetic", "tiny", "-n", "16", "-c", "128", "--temp", "0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = common;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::string lines, err_whole;
  for (const auto& t : turns) lines += t + "\\n";
  auto whole = run_piped(lines, with({"--no-kv-store", "--system", system}), &err_whole);
  ASSERT_EQ(whole.exit_code, 0) << err_whole;
  ASSERT_NE(err_whole.find("dropped"), std::string::npos) << "no turn was dropped: raise the turns\n" << err_whole;
  std::vector<int> resumed;
  for (size_t k = 0; k < turns.size(); ++k) {
    std::vector<std::string> extra = {"--kv-store", store_, "--session", "s", "-p", turns[k]};
    if (k == 0) extra.insert(extra.end(), {"--system", system});
    else extra.push_back("--resume");
    auto r = run_anvil(with(extra), true);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    for (int n : prompt_sizes(r.out)) resumed.push_back(n);
  }
  EXPECT_EQ(resumed, prompt_sizes(err_whole)) << err_whole;
  auto meta = ojson::parse(session("s").meta);
  ASSERT_FALSE(meta["messages"].empty());
  EXPECT_EQ(meta["messages"][0], (ojson{{"role", "system"}, {"content", system}})) << meta.dump();
  // /reset in a resumed run keeps the system message: its next prompt is a fresh conversation's.
  std::string err_reset, err_fresh;
  auto reset = run_piped("/reset\\nhello\\n", with({"--kv-store", store_, "--session", "s", "--resume"}), &err_reset);
  auto fresh = run_piped("hello\\n", with({"--no-kv-store", "--system", system}), &err_fresh);
  ASSERT_EQ(reset.exit_code, 0) << err_reset;
  ASSERT_EQ(fresh.exit_code, 0) << err_fresh;
  EXPECT_EQ(prompt_sizes(err_reset), prompt_sizes(err_fresh)) << err_reset << "\n---\n" << err_fresh;
  std::string after = reset.out.substr(reset.out.find('\n') + 1);  // "(resumed session s: ...)"
  const std::string cleared = "(conversation cleared)\n> ";
  ASSERT_NE(after.find(cleared), std::string::npos) << after;
  after.erase(after.find(cleared), cleared.size());
  EXPECT_EQ(after, fresh.out) << "the same answer";
}

// --system on a resumed (or forked) conversation: the one it began with is kept, so another one was
// dropped without a word. Now it may repeat the conversation's own; another (or one for a session
// begun without) is refused, exit code 1, and the session is left as it is (no fork made).
TEST_F(Conversation, ASystemMessageOtherThanTheSessionsIsRefused) {
  auto run = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"run", "--synthetic", "tiny", "-n", "4", "--temp", "0", "--kv-store", store_};
    a.insert(a.end(), extra.begin(), extra.end());
    return run_anvil(a, true);
  };
  ASSERT_EQ(run({"--session", "s", "--system", "Be brief.", "-p", "hi"}).exit_code, 0);
  auto same = run({"--session", "s", "--resume", "--system", "Be brief.", "-p", "again"});
  EXPECT_EQ(same.exit_code, 0) << same.out;
  const auto before = session("s");
  for (const auto& extra : {std::vector<std::string>{"--resume"}, std::vector<std::string>{"--fork", "t"}}) {
    std::vector<std::string> a = {"--session", "s", "--system", "Be verbose.", "-p", "more"};
    a.insert(a.end(), extra.begin(), extra.end());
    auto other = run(a);
    EXPECT_EQ(other.exit_code, 1) << other.out;
    EXPECT_NE(other.out.find("--system: session 's' began with another system message"), std::string::npos)
        << other.out;
  }
  const auto after = session("s");
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.meta, before.meta);
  anvil::KVStoreOptions o;
  o.dir = store_;
  auto st = anvil::KVStore::open(o);
  ASSERT_TRUE(st.is_ok());
  auto t = (*st)->get_session("t");
  ASSERT_TRUE(t.is_ok());
  EXPECT_FALSE(t->has_value()) << "the refused --fork made a session";
  st->reset();
  ASSERT_EQ(run({"--session", "n", "-p", "hi"}).exit_code, 0);
  auto none = run({"--session", "n", "--resume", "--system", "Be brief.", "-p", "again"});
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_NE(none.out.find("session 'n' has no system message"), std::string::npos) << none.out;
}
