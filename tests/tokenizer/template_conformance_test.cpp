// Every conversation in tests/data/templates/conversations.json rendered by our engine must equal,
// byte for byte, what transformers/jinja2 produced (scripts/make_template_fixtures.py).
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_config.h"

namespace anvil {
namespace {

using ojson = nlohmann::ordered_json;
const std::string kDir = std::string(ANVIL_TEST_DATA) + "/templates";

ojson load(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str());
}

void check_template(const std::string& name) {
  auto cfg = load_tokenizer_config(kDir + "/" + name);
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  ojson cases = load(kDir + "/conversations.json");
  ojson expected = load(kDir + "/expected_" + name + ".json");
  int checked = 0;
  for (auto& c : cases) {
    bool wanted = false;
    for (auto& t : c["templates"]) wanted |= t == name;
    if (!wanted) continue;
    std::string case_name = c["name"].get<std::string>();
    SCOPED_TRACE(name + "/" + case_name);
    ASSERT_TRUE(expected.contains(case_name)) << "no expected rendering; re-run scripts/make_template_fixtures.py";
    std::optional<bool> thinking;  // absent/null: not passed, the template's default applies
    if (c.contains("enable_thinking") && !c["enable_thinking"].is_null()) thinking = c["enable_thinking"].get<bool>();
    auto out = apply_chat_template(*cfg, c["messages"], c.value("tools", ojson(nullptr)),
                                   c["add_generation_prompt"].get<bool>(), thinking,
                                   c.value("extra_context", ojson::object()));
    const ojson& want = expected[case_name];
    if (want.contains("error")) {
      ASSERT_FALSE(out.is_ok()) << "expected an error, got: " << out.value();
      // raise_exception's message must be surfaced verbatim.
      EXPECT_NE(out.status().message().find(want["error"].get<std::string>()), std::string::npos)
          << out.status().message();
    } else {
      ASSERT_TRUE(out.is_ok()) << out.status().message();
      EXPECT_EQ(*out, want["text"].get<std::string>());
    }
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

TEST(TemplateConformance, Qwen3) { check_template("qwen3"); }
TEST(TemplateConformance, Llama3) { check_template("llama3"); }

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Real-world chat templates (tests/data/templates/real/) x conversations with tool definitions,
// tool calls and results, reasoning content and the three enable_thinking states, against
// transformers' render_jinja_template (frozen by scripts/make_template_fixtures.py). Where the
// reference raised (raise_exception, or a Python TypeError on the conversation), we must refuse
// with the same message.
// The instant scripts/make_template_fixtures.py pins transformers' strftime_now to (ANVIL_TEMPLATE_NOW
// there too), in UTC: templates that date their prompt (SmolLM3, Mistral Small, Llama 3.x, LFM2)
// then render the same text on any day.
constexpr const char* kFixtureNow = "1796558400";  // 2026-12-06 12:00:00 UTC

struct PinnedClock {
  std::string old_tz;
  bool had_tz = false;
  PinnedClock() {
    if (const char* tz = std::getenv("TZ")) old_tz = tz, had_tz = true;
    ::setenv("TZ", "UTC", 1);
    ::tzset();
    ::setenv("ANVIL_TEMPLATE_NOW", kFixtureNow, 1);
  }
  ~PinnedClock() {
    ::unsetenv("ANVIL_TEMPLATE_NOW");
    if (had_tz) ::setenv("TZ", old_tz.c_str(), 1);
    else ::unsetenv("TZ");
    ::tzset();
  }
};

TEST(TemplateConformance, RealTemplates) {
  PinnedClock clock;
  ojson spec = load(kDir + "/real/sources.json");
  ojson cases = load(kDir + "/conversations_real.json");
  ojson expected = load(kDir + "/expected_real.json");
  int templates = 0, rendered = 0, refused = 0;
  for (auto it = spec["templates"].begin(); it != spec["templates"].end(); ++it) {
    const std::string name = it.key();
    TokenizerConfig cfg;
    cfg.chat_template = read_text(kDir + "/real/" + name + ".jinja");
    ASSERT_FALSE(cfg.chat_template.empty()) << name;
    cfg.source = name;
    if (it.value()["bos_token"].is_string()) {
      cfg.bos_token = it.value()["bos_token"].get<std::string>();
      cfg.has_bos_token = true;
    }
    if (it.value()["eos_token"].is_string()) {
      cfg.eos_token = it.value()["eos_token"].get<std::string>();
      cfg.has_eos_token = true;
    }
    ASSERT_TRUE(expected.contains(name)) << name << ": re-run scripts/make_template_fixtures.py";
    ++templates;
    for (auto& c : cases) {
      const std::string case_name = c["name"].get<std::string>();
      SCOPED_TRACE(name + " / " + case_name);
      ASSERT_TRUE(expected[name].contains(case_name)) << "re-run scripts/make_template_fixtures.py";
      const ojson& want = expected[name][case_name];
      std::optional<bool> thinking;
      if (c.contains("enable_thinking") && !c["enable_thinking"].is_null()) thinking = c["enable_thinking"].get<bool>();
      auto out = apply_chat_template(cfg, c["messages"], c.value("tools", ojson(nullptr)),
                                     c["add_generation_prompt"].get<bool>(), thinking, spec["extra_context"]);
      if (want.contains("error")) {
        EXPECT_FALSE(out.is_ok()) << "transformers refused (" << want["error"].get<std::string>()
                                  << "), we rendered:\n" << (out.is_ok() ? *out : "");
        if (!out.is_ok())
          EXPECT_NE(out.status().message().find(want["error"].get<std::string>()), std::string::npos)
              << out.status().message();
        ++refused;
      } else {
        EXPECT_TRUE(out.is_ok()) << out.status().message();
        if (out.is_ok()) EXPECT_EQ(*out, want["text"].get<std::string>());
        ++rendered;
      }
    }
  }
  EXPECT_GE(templates, 20);
  EXPECT_GE(rendered, 250);
  EXPECT_GE(refused, 20);
}

// A server request's chat_template_kwargs travel as extra_context: {"enable_thinking": false}
// there renders exactly like the --no-thinking flag, and any other variable reaches the template.
TEST(TemplateConformance, ChatTemplateKwargsAsExtraContext) {
  ojson expected = load(kDir + "/expected_real.json");
  TokenizerConfig cfg;
  cfg.chat_template = read_text(kDir + "/real/deepseek-v3.1.jinja");
  cfg.bos_token = "<｜begin▁of▁sentence｜>";
  cfg.has_bos_token = true;
  ojson msgs = ojson::parse(R"([{"role": "user", "content": "Is 97 prime?"}])");
  for (auto [value, case_name] : {std::pair{true, "thinking_on"}, std::pair{false, "thinking_off"}}) {
    auto out = apply_chat_template(cfg, msgs, nullptr, true, std::nullopt, ojson{{"enable_thinking", value}});
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    EXPECT_EQ(*out, expected["deepseek-v3.1"][case_name]["text"].get<std::string>());
  }
  // DeepSeek-V3.1 also reads its own "thinking" variable, which wins over enable_thinking.
  auto out = apply_chat_template(cfg, msgs, nullptr, true, false, ojson{{"thinking", true}});
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, expected["deepseek-v3.1"]["thinking_on"]["text"].get<std::string>());
}

TEST(TemplateConformance, TinyCodeHasNoChatTemplate) {
  auto cfg = load_tokenizer_config(std::string(ANVIL_SOURCE_DIR) + "/models/anvil-tiny-code-q4");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().message();
  EXPECT_TRUE(cfg->chat_template.empty());
  EXPECT_EQ(cfg->eos_token, "<|endoftext|>");
  EXPECT_FALSE(cfg->has_bos_token);  // "bos_token": null
  auto out = apply_chat_template(*cfg, ojson::parse(R"([{"role":"user","content":"hi"}])"), nullptr, true, true);
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("no chat template"), std::string::npos) << out.status().message();
}

// JSON null is Python None everywhere the template looks, except one place: transformers 5.x's
// apply_chat_template drops the keys of a message whose value is None (_normalize_chat_messages:
// "content": null becomes a missing key), and so do we. Nulls nested deeper (tool-call arguments),
// in tools and in extra variables stay None. Expected: transformers 5.25 (_normalize_chat_messages
// then render_jinja_template) on these inputs.
TEST(TemplateConformance, NullsAreNoneButNullMessageKeysAreDroppedLikeTransformers) {
  TokenizerConfig cfg;
  cfg.chat_template =
      "{% for m in messages %}{{ m.role }}:{{ 'content' in m }}/{{ m.content is defined }}/{{ m.content is none }}"
      "{% if m.tool_calls is defined %}/{{ m.tool_calls[0].function.arguments|tojson }}/"
      "{{ m.tool_calls[0].function.arguments.unit is none }}{% endif %};{% endfor %}"
      "{{ tools[0].function.parameters is none }}/{{ tools[0].function.description|tojson }}/{{ extra is none }}/"
      "{{ extra|default('d') }}";
  ojson msgs = ojson::parse(R"([{"role": "user", "content": "Weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function",
      "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": null}}}]}])");
  ojson tools = ojson::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "description": null, "parameters": null}}])");
  auto out = apply_chat_template(cfg, msgs, tools, false, std::nullopt, ojson{{"extra", nullptr}});
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out,
            "user:True/True/False;assistant:False/False/False/{\"city\": \"Paris\", \"unit\": null}/True;"
            "True/null/True/None");
}

TEST(TemplateConformance, MissingConfigIsNotFound) {
  auto cfg = load_tokenizer_config(kDir + "/does-not-exist");
  ASSERT_FALSE(cfg.is_ok());
  EXPECT_EQ(cfg.status().code(), StatusCode::kNotFound);
  EXPECT_NE(cfg.status().message().find("tokenizer_config.json"), std::string::npos);
}

}  // namespace
}  // namespace anvil
