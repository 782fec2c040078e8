// Engine semantics against jinja2 (tests/data/templates/expected_snippets.json, frozen by
// scripts/make_template_fixtures.py), and the errors a template outside the subset must give.
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"
#include "tokenizer/chat_template_internal.h"

namespace anvil {
namespace {

using ojson = nlohmann::ordered_json;

ojson load(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str());
}

TEST(TemplateEngine, SnippetsMatchJinja2) {
  const std::string dir = std::string(ANVIL_TEST_DATA) + "/templates";
  ojson spec = load(dir + "/snippets.json");
  ojson expected = load(dir + "/expected_snippets.json");
  for (auto& s : spec["snippets"]) {
    const std::string name = s["name"].get<std::string>();
    SCOPED_TRACE(name);
    ASSERT_TRUE(expected.contains(name)) << "re-run scripts/make_template_fixtures.py";
    const ojson& want = expected[name];
    auto t = ChatTemplate::compile(s["template"].get<std::string>());
    Result<std::string> out = t.is_ok() ? t->render(spec["context"]) : Result<std::string>(t.status());
    if (want.contains("error")) {
      // jinja2 raised: we must refuse too, with jinja2's message (Python's exception text).
      EXPECT_FALSE(out.is_ok()) << "expected the error '" << want["error"].get<std::string>() << "', rendered: "
                                << (out.is_ok() ? *out : "");
      if (out.is_ok()) continue;
      EXPECT_NE(out.status().message().find(want["error"].get<std::string>()), std::string::npos)
          << out.status().message();
      continue;
    }
    EXPECT_TRUE(out.is_ok()) << out.status().message();
    if (out.is_ok()) EXPECT_EQ(*out, want["text"].get<std::string>());
  }
}

Status compile_error(const std::string& src) {
  auto t = ChatTemplate::compile(src);
  return t.is_ok() ? Status::ok() : t.status();
}

Status render_error(const std::string& src, const ojson& ctx = ojson::object()) {
  auto t = ChatTemplate::compile(src);
  if (!t.is_ok()) return internal_error("compile failed: " + t.status().message());
  auto out = t->render(ctx);
  return out.is_ok() ? Status::ok() : out.status();
}

TEST(TemplateEngine, UnsupportedFilterNamesItAndTheLine) {
  Status st = render_error("line one\n{{ 'a b'|wordwrap }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("unsupported filter 'wordwrap' at line 2"), std::string::npos) << st.message();
}

TEST(TemplateEngine, UnsupportedTestNamesIt) {
  Status st = render_error("{{ 1 is prime }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("unsupported test 'prime'"), std::string::npos) << st.message();
}

TEST(TemplateEngine, UnsupportedTagNamesIt) {
  Status st = compile_error("a\n\n{% include 'other.jinja' %}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("unsupported tag 'include' at line 3"), std::string::npos) << st.message();
}

// jinja2 decodes "\N{BULLET}" through Python's Unicode name database, which we do not carry: the
// escape is a compile error naming it, never the literal text \N{BULLET} in the prompt.
TEST(TemplateEngine, UnicodeNameEscapeIsRefusedByName) {
  Status st = compile_error("a\n{{ '- ' if x else \"\\N{BULLET} \" }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("\\N{BULLET}"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("at line 2"), std::string::npos) << st.message();
  st = compile_error("{{ '\\N' }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("malformed \\N character escape"), std::string::npos) << st.message();
  // The other escapes Python's unicode-escape knows still decode.
  auto t = ChatTemplate::compile("{{ '\\u00e9\\x41\\101\\q' }}");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  auto out = t->render(ojson::object());
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "\xc3\xa9" "AA\\q");
}

// f(**x): x must be a mapping with string keys, and a keyword may come once (Python's TypeErrors;
// jinja2 prefixes the first with the name of its call() method, so these are not in snippets.json).
TEST(TemplateEngine, StarStarArgumentsMustBeAMappingOfNewKeywords) {
  const std::string m = "{% macro m(a=1) %}{{ a }}{% endmacro %}";
  Status st = render_error(m + "{{ m(**[1]) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("argument after ** must be a mapping, not list"), std::string::npos) << st.message();
  st = render_error(m + "{{ m(**{1: 2}) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("keywords must be strings"), std::string::npos) << st.message();
  st = render_error(m + "{{ m(a=1, **{'a': 2}) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("got multiple values for keyword argument 'a'"), std::string::npos) << st.message();
  st = render_error(m + "{{ m(**nothing) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'nothing' is undefined"), std::string::npos) << st.message();
}

TEST(TemplateEngine, UnclosedBlockSaysWhatWasOpen) {
  Status st = compile_error("{% for x in xs %}\n{% if x %}{{ x }}{% endfor %}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'if' opened at line 2"), std::string::npos) << st.message();
  st = compile_error("{% if true %}never closed");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("'endif'"), std::string::npos) << st.message();
}

TEST(TemplateEngine, UnclosedTagAndCommentAreErrors) {
  EXPECT_FALSE(compile_error("{{ x ").is_ok());
  EXPECT_FALSE(compile_error("{% if x ").is_ok());
  EXPECT_FALSE(compile_error("{# note").is_ok());
}

TEST(TemplateEngine, BadSyntaxIsAnError) {
  Status st = compile_error("{{ 1 + }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("line 1"), std::string::npos) << st.message();
  EXPECT_FALSE(compile_error("{{ (1, 2 }}").is_ok());
  EXPECT_FALSE(compile_error("{% endif %}").is_ok());
}

TEST(TemplateEngine, RaiseExceptionMessageIsSurfaced) {
  Status st = render_error("{% if x > 1 %}{{ raise_exception('Only one x, got ' ~ x) }}{% endif %}", {{"x", 3}});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("Only one x, got 3"), std::string::npos) << st.message();
}

TEST(TemplateEngine, AttributeOfUndefinedIsAnErrorNotEmptyOutput) {
  Status st = render_error("{{ message.content.strip() }}", {{"message", ojson::object()}});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("has no attribute 'content'"), std::string::npos) << st.message();
  EXPECT_FALSE(render_error("{{ 'a' + missing }}").is_ok());
}

TEST(TemplateEngine, RunawayMacroRecursionIsAnErrorNotACrash) {
  Status st = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("maximum recursion depth exceeded"), std::string::npos) << st.message();
  // Legitimate recursion (a JSON-schema walker) is fine.
  auto t = ChatTemplate::compile("{% macro d(n) %}{% if n > 0 %}[{{ d(n - 1) }}]{% endif %}{% endmacro %}{{ d(50) }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(ojson::object());
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, std::string(50, '[') + std::string(50, ']'));
}

// Repetition and padding past kMaxTemplateBuild (64 MiB) are an error naming the size, never an
// allocation that exhausts memory; within it they work.
TEST(TemplateEngine, HugeRepetitionAndPaddingAreErrors) {
  for (const char* src : {"{{ 'a' * 100000000000 }}", "{{ [1, 2] * 100000000000 }}", "{{ 'x'.center(100000000000) }}",
                          "{{ 'x'.ljust(100000000000) }}", "{{ 'x'.zfill(100000000000) }}", "{{ 'x'|center(100000000000) }}",
                          "{{ 'a\nb'|indent(100000000000) }}", "{{ '%100000000000d' % 1 }}",
                          "{{ '{:100000000000}'.format(1) }}", "{{ '%.99999999999999999999f' % 1.5 }}"}) {
    Status st = render_error(src);
    ASSERT_FALSE(st.is_ok()) << src;
    EXPECT_NE(st.message().find("67108864"), std::string::npos) << src << ": " << st.message();
  }
  auto t = ChatTemplate::compile("{{ ('ab' * 3)|length }} {{ 'x'.center(5, '*') }} {{ '%5d' % 7 }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(ojson::object());
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "6 **x**     7");
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += s;
  return out;
}

// A template nested past kMaxTemplateNesting (256) is a compile error naming the limit, never a
// stack overflow in the parser, the evaluator or the syntax tree's destructor.
TEST(TemplateEngine, DeepNestingIsACompileErrorNotACrash) {
  const int n = 100000;
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"blocks", repeat("{% if true %}", 10000) + "x" + repeat("{% endif %}", 10000)},
      {"for blocks", repeat("{% for a in [1] %}", 10000) + "x" + repeat("{% endfor %}", 10000)},
      {"parentheses", "{{ " + repeat("(", n) + "1" + repeat(")", n) + " }}"},
      {"lists", "{{ " + repeat("[", n) + "1" + repeat("]", n) + " }}"},
      {"dicts", "{{ " + repeat("{'a': ", n) + "1" + repeat("}", n) + " }}"},
      {"call arguments", "{{ " + repeat("f(", n) + "1" + repeat(")", n) + " }}"},
      {"operator chain", "{{ 1" + repeat(" + 1", n) + " }}"},
      {"concat chain", "{{ 'a'" + repeat(" ~ 'a'", n) + " }}"},
      {"and chain", "{{ x" + repeat(" and x", n) + " }}"},
      {"attribute chain", "{{ x" + repeat(".a", n) + " }}"},
      {"subscript chain", "{{ x" + repeat("[0]", n) + " }}"},
      {"filter chain", "{{ 'x'" + repeat("|upper", n) + " }}"},
      {"test chain", "{{ x" + repeat(" is defined", n) + " }}"},
      {"not", "{{ " + repeat("not ", n) + "1 }}"},
      {"unary minus", "{{ " + repeat("-", n) + "1 }}"},
      {"inline if", "{{ 1" + repeat(" if x else 1", n) + " }}"},
      {"set block filters", "{% set v" + repeat("|trim", n) + " %}x{% endset %}"},
  };
  for (auto& [what, src] : cases) {
    Status st = compile_error(src);
    ASSERT_FALSE(st.is_ok()) << what;
    EXPECT_NE(st.message().find("nests more than 256 levels deep"), std::string::npos) << what << ": " << st.message();
  }
  // Nesting a real template could use (jinja2 itself stops near 70 brackets and 98 blocks) is fine.
  auto t = ChatTemplate::compile(repeat("{% if true %}", 60) + "{{ " + repeat("(", 60) + repeat("[", 60) + "1" +
                                 repeat("]", 60) + repeat(")", 60) + "|length }}" + repeat("{% endif %}", 60));
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  auto out = t->render(ojson::object());
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "1");
}

// Macro calls stack the levels of their bodies: past 1024 statements and expressions deep in all
// (or 256 macro calls) rendering stops with Python's RecursionError wording.
TEST(TemplateEngine, DeepRecursionThroughExpressionsIsAnErrorNotACrash) {
  Status st = render_error("{% macro f(n) %}{{ " + repeat("[", 200) + "f(n + 1)" + repeat("]", 200) +
                           " }}{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("maximum recursion depth exceeded"), std::string::npos) << st.message();
  st = render_error("{% macro f(n) %}" + repeat("{% if true %}", 200) + "{{ f(n + 1) }}" + repeat("{% endif %}", 200) +
                    "{% endmacro %}{{ f(0) }}");
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("maximum recursion depth exceeded"), std::string::npos) << st.message();
}

// A template can nest a value without bound at run time (a namespace attribute wrapped in a list
// on every iteration): printing or comparing it is an error past 512 levels, not a stack overflow.
TEST(TemplateEngine, ValuesNestedDeepAtRunTimeAreAnErrorNotACrash) {
  const std::string build =
      "{% set ns = namespace(x=none) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  for (const char* use : {"{{ ns.x }}", "{{ ns.x|tojson }}", "{{ ns.x|string }}", "{{ [ns.x] == [[ns.x]] }}",
                          "{{ [ns.x] < [[ns.x]] }}", "{{ ns }}"}) {
    Status st = render_error(build + use);
    ASSERT_FALSE(st.is_ok()) << use;
    EXPECT_NE(st.message().find("nests more than 512 levels deep"), std::string::npos) << use << ": " << st.message();
  }
  auto t = ChatTemplate::compile(build + "{{ ns.x == ns.x }} {{ ns.x|length }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(ojson::object());
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "True 1");  // the same object: equal without a walk, as in Python
}

// Dropping such a value does not recurse once per level (that overflowed the stack near 50,000 levels).
TEST(TemplateEngine, DeeplyNestedValueIsDestroyedWithoutRecursion) {
  using chat_template_detail::Value;
  Value v = Value::none();
  for (int k = 0; k < 200000; ++k) {
    chat_template_detail::ValueDict d;
    d.set("x", Value::make_list({std::move(v), Value::integer(k)}));
    v = Value::make_dict(std::move(d));
  }
  Value shared = v;  // a part still referenced elsewhere survives
  v = Value::none();
  ASSERT_EQ(shared.kind, chat_template_detail::Kind::kDict);
  EXPECT_EQ((*shared.dict->find("x")->list)[1].i, 199999);
  shared = Value::none();
}

// Input the engine cannot hold is refused, not corrupted: an integer past 64 bits (json.loads
// keeps it exact, so wrapping it would print another number) and nesting past 256 levels.
TEST(TemplateEngine, InputBeyondTheEngineIsAnErrorNotAWrongValue) {
  auto t = ChatTemplate::compile("{{ x|tojson }}");
  ASSERT_TRUE(t.is_ok());
  auto big = t->render(ojson::parse(R"({"x": {"id": 10000000000000000001}})"));
  ASSERT_FALSE(big.is_ok()) << *big;
  EXPECT_NE(big.status().message().find("10000000000000000001"), std::string::npos) << big.status().message();
  auto ok = t->render(ojson::parse(R"({"x": {"id": 9223372036854775807}})"));
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(*ok, R"({"id": 9223372036854775807})");
  auto deep = t->render(ojson::parse("{\"x\": " + std::string(5000, '[') + std::string(5000, ']') + "}"));
  ASSERT_FALSE(deep.is_ok());
  EXPECT_NE(deep.status().message().find("levels deep"), std::string::npos) << deep.status().message();
}

TEST(TemplateEngine, IntegerOverflowIsAnErrorNotAWrongNumber) {
  auto render = [](const std::string& src) {
    auto t = ChatTemplate::compile(src);
    return t.is_ok() ? t->render(ojson::object()) : Result<std::string>(t.status());
  };
  auto ok = render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ (-1) ** 1000000000000 }} {{ 0 ** 0 }}");
  ASSERT_TRUE(ok.is_ok()) << ok.status().message();
  EXPECT_EQ(*ok, "4611686018427387904 -9223372036854775808 4052555153018976267 1 1");  // Python's values
  for (const char* src : {"{{ 2 ** 63 }}", "{{ 9223372036854775807 + 1 }}", "{{ 4294967296 * 4294967296 }}",
                          "{{ -9223372036854775807 - 2 }}"}) {
    auto bad = render(src);
    ASSERT_FALSE(bad.is_ok()) << src << " gave " << *bad;
    EXPECT_NE(bad.status().message().find("integer overflow"), std::string::npos) << bad.status().message();
  }
}

TEST(TemplateEngine, StrftimeNowFormatsToday) {
  auto t = ChatTemplate::compile("{{ strftime_now('%Y') }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(ojson::object());
  ASSERT_TRUE(out.is_ok());
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  EXPECT_EQ(*out, std::to_string(1900 + tm.tm_year));
}

TEST(TemplateEngine, ContextKeyOrderIsPreservedByTojson) {
  auto t = ChatTemplate::compile("{{ d|tojson }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(ojson::parse(R"({"d": {"zeta": 1, "alpha": 2}})"));
  ASSERT_TRUE(out.is_ok());
  EXPECT_EQ(*out, R"({"zeta": 1, "alpha": 2})");  // Python dicts keep insertion order
}

}  // namespace
}  // namespace anvil
