// `anvil template` as a subprocess: its stdout must equal the jinja2/transformers rendering
// (tests/data/templates/expected_qwen3.json) byte for byte, and bad input must fail loudly.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace {

using ojson = nlohmann::ordered_json;
const std::string kDir = std::string(ANVIL_TEST_DATA) + "/templates";

ojson load(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str());
}

struct RunResult {
  int exit_code;
  std::string out;  // stdout, or stdout+stderr when merge_stderr
};

RunResult run(const std::string& args, bool merge_stderr = false) {
  std::string cmd = std::string(ANVIL_BINARY) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / ("anvil_template_test_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

ojson find_case(const std::string& name) {
  for (auto& c : load(kDir + "/conversations.json"))
    if (c["name"] == name) return c;
  return nullptr;
}

TEST(CliTemplate, MatchesReferenceByteForByte) {
  ojson expected = load(kDir + "/expected_qwen3.json");
  for (const char* name : {"multi_turn", "thinking_disabled", "tool_call_dict_args", "single_user_no_gen"}) {
    SCOPED_TRACE(name);
    ojson c = find_case(name);
    ASSERT_FALSE(c.is_null());
    std::string args = "template -m " + kDir + "/qwen3 --messages " + write_temp("m.json", c["messages"].dump());
    if (c.contains("tools")) args += " --tools " + write_temp("t.json", c["tools"].dump());
    if (!c["add_generation_prompt"].get<bool>()) args += " --no-generation-prompt";
    args += c["enable_thinking"].get<bool>() ? " --thinking" : " --no-thinking";
    RunResult r = run(args);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.out, expected[name]["text"].get<std::string>());
  }
}

// An explicit --thinking / --no-thinking wins over enable_thinking among --context's variables.
TEST(CliTemplate, ThinkingFlagWinsOverTheContextFile) {
  ojson c = find_case("multi_turn");
  ASSERT_FALSE(c.is_null());
  const std::string base = "template -m " + kDir + "/qwen3 --messages " + write_temp("m2.json", c["messages"].dump());
  const std::string ctx = write_temp("ctx.json", R"({"enable_thinking": false})");
  RunResult flag_only = run(base + " --thinking");
  RunResult both = run(base + " --thinking --context " + ctx);
  RunResult ctx_only = run(base + " --context " + ctx);
  RunResult off = run(base + " --no-thinking");
  ASSERT_EQ(flag_only.exit_code, 0);
  EXPECT_EQ(both.out, flag_only.out);
  EXPECT_EQ(ctx_only.out, off.out) << "without the flag the context file's value applies";
  EXPECT_NE(flag_only.out, off.out) << "the case must render thinking on and off differently";
}

// A model directory whose tokenizer_config.json carries one of the real templates.
std::string model_dir_with(const std::string& template_name) {
  ojson src = load(kDir + "/real/sources.json")["templates"][template_name];
  std::ifstream f(kDir + "/real/" + template_name + ".jinja", std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  ojson cfg = {{"chat_template", ss.str()}, {"bos_token", src["bos_token"]}, {"eos_token", src["eos_token"]}};
  auto dir = std::filesystem::temp_directory_path() / ("anvil_template_test_" + std::to_string(getpid()) + "_" + template_name);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json", std::ios::binary) << cfg.dump();
  return dir.string();
}

ojson find_real_case(const std::string& name) {
  for (auto& c : load(kDir + "/conversations_real.json"))
    if (c["name"] == name) return c;
  return nullptr;
}

// No flag: enable_thinking is not passed and the template's default applies (DeepSeek-V3.1:
// off, Qwen3: on); --thinking / --no-thinking pass true / false. Against transformers' renderings.
TEST(CliTemplate, ThinkingFlagsAreTriState) {
  ojson expected = load(kDir + "/expected_real.json");
  for (const char* tmpl : {"deepseek-v3.1", "qwen3", "glm-4.5"}) {
    std::string dir = model_dir_with(tmpl);
    for (auto [flag, case_name] : {std::pair{"", "thinking_default"}, std::pair{" --thinking", "thinking_on"},
                                   std::pair{" --no-thinking", "thinking_off"}}) {
      SCOPED_TRACE(std::string(tmpl) + flag);
      ojson c = find_real_case(case_name);
      ASSERT_FALSE(c.is_null());
      RunResult r = run("template -m " + dir + " --messages " + write_temp("m.json", c["messages"].dump()) + flag);
      EXPECT_EQ(r.exit_code, 0);
      EXPECT_EQ(r.out, expected[tmpl][case_name]["text"].get<std::string>());
    }
  }
  RunResult both = run("template -m " + model_dir_with("qwen3") + " --messages " +
                           write_temp("m.json", find_real_case("single_user")["messages"].dump()) +
                           " --thinking --no-thinking",
                       true);
  EXPECT_NE(both.exit_code, 0) << both.out;
}

// raise_exception in the template: no rendering on stdout, the template's message, a failing exit.
TEST(CliTemplate, RaiseExceptionIsAnError) {
  ojson c = find_real_case("roles_not_alternating");
  std::string m = write_temp("m.json", c["messages"].dump());
  RunResult out = run("template -m " + model_dir_with("gemma-it") + " --messages " + m);
  EXPECT_NE(out.exit_code, 0);
  EXPECT_EQ(out.out, "");
  RunResult err = run("template -m " + model_dir_with("gemma-it") + " --messages " + m, true);
  EXPECT_NE(err.out.find("raise_exception: Conversation roles must alternate user/assistant/user/assistant/..."),
            std::string::npos)
      << err.out;
}

// "-" reads a JSON file from stdin, with the same rendering as the file; only one flag may take it.
TEST(CliTemplate, DashReadsStdin) {
  ojson expected = load(kDir + "/expected_qwen3.json");
  ojson c = find_case("tool_call_dict_args");
  ASSERT_FALSE(c.is_null());
  ASSERT_TRUE(c.contains("tools"));
  const std::string m = write_temp("m3.json", c["messages"].dump()), t = write_temp("t3.json", c["tools"].dump());
  const std::string base = "template -m " + kDir + "/qwen3" +
                           (c["add_generation_prompt"].get<bool>() ? "" : " --no-generation-prompt") +
                           (c["enable_thinking"].get<bool>() ? " --thinking" : " --no-thinking");
  RunResult messages_in = run(base + " --messages - --tools " + t + " < " + m);
  EXPECT_EQ(messages_in.exit_code, 0) << messages_in.out;
  EXPECT_EQ(messages_in.out, expected["tool_call_dict_args"]["text"].get<std::string>());
  RunResult tools_in = run(base + " --messages " + m + " --tools - < " + t);
  EXPECT_EQ(tools_in.exit_code, 0) << tools_in.out;
  EXPECT_EQ(tools_in.out, expected["tool_call_dict_args"]["text"].get<std::string>());
  RunResult twice = run(base + " --messages - --tools - < " + m, true);
  EXPECT_EQ(twice.exit_code, 1) << twice.out;
  EXPECT_NE(twice.out.find("stdin ('-') can be read once"), std::string::npos) << twice.out;
  RunResult bad = run(base + " --messages - < /dev/null", true);
  EXPECT_EQ(bad.exit_code, 1) << bad.out;
  EXPECT_NE(bad.out.find("--messages - (stdin): not valid JSON"), std::string::npos) << bad.out;
}

TEST(CliTemplate, BadMessagesJsonFails) {
  std::string bad = write_temp("bad.json", "[{\"role\": \"user\", \"content\": ");
  RunResult r = run("template -m " + kDir + "/qwen3 --messages " + bad, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("not valid JSON"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(bad), std::string::npos) << r.out;  // names the file
}

TEST(CliTemplate, ModelWithoutChatTemplateFails) {
  std::string m = write_temp("m2.json", R"([{"role":"user","content":"hi"}])");
  RunResult r = run("template -m " + std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4 --messages " + m, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("no chat template"), std::string::npos) << r.out;
}

}  // namespace
