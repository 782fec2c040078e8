// `anvil tokenize` run as a subprocess; its ids must equal the tokenizers fixture
// (tests/data/tokenizer/expected_*.jsonl, made by scripts/make_tokenizer_fixtures.py).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Proc {
  int exit_code = -1;
  std::string out, err;
};

std::string quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) r += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return r + "'";
}

// Runs `ANVIL_BINARY args` with `stdin_text` on stdin; captures stdout and stderr.
Proc run_tokenize_cli(const std::vector<std::string>& args, const std::string& stdin_text) {
  char in_path[] = "/tmp/anvil_tok_in_XXXXXX";
  char err_path[] = "/tmp/anvil_tok_err_XXXXXX";
  const int in_fd = mkstemp(in_path), err_fd = mkstemp(err_path);
  EXPECT_GE(in_fd, 0);
  EXPECT_GE(err_fd, 0);
  EXPECT_EQ(write(in_fd, stdin_text.data(), stdin_text.size()), ssize_t(stdin_text.size()));
  close(in_fd);
  close(err_fd);
  std::string cmd = quote(ANVIL_BINARY);
  for (const auto& a : args) cmd += " " + quote(a);
  cmd += " <" + quote(in_path) + " 2>" + quote(err_path);
  Proc p;
  FILE* f = popen(cmd.c_str(), "r");
  EXPECT_NE(f, nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) p.out.append(buf, n);
  const int st = pclose(f);
  p.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  std::ifstream e(err_path);
  std::stringstream ss;
  ss << e.rdbuf();
  p.err = ss.str();
  unlink(in_path);
  unlink(err_path);
  return p;
}

std::string data(const std::string& rel) { return std::string(ANVIL_TEST_DATA) + "/tokenizer/" + rel; }

// The corpus text and tokenizers' ids of one entry.
std::pair<std::string, std::vector<int32_t>> fixture(const std::string& tok, const std::string& name) {
  std::string text;
  std::vector<int32_t> ids;
  std::ifstream c(data("corpus.jsonl")), x(data("expected_" + tok + ".jsonl"));
  std::string line;
  while (std::getline(c, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["name"] == name) text = j["text"];
  }
  while (std::getline(x, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["name"] == name) ids = j["ids"].get<std::vector<int32_t>>();
  }
  return {text, ids};
}

std::string join_ids(const std::vector<int32_t>& ids, const char* sep) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? sep : "") + std::to_string(ids[i]);
  return s;
}

TEST(TokenizeCli, TextArgumentMatchesTokenizers) {
  for (const char* entry : {"special_qwen", "emoji", "contractions_upper"}) {
    const auto [text, ids] = fixture("qwen3", entry);
    ASSERT_FALSE(ids.empty()) << entry;
    const Proc p = run_tokenize_cli({"tokenize", "-m", data("qwen3"), "--text", text}, "");
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_EQ(p.out, join_ids(ids, " ") + "\n") << entry;
  }
}

TEST(TokenizeCli, StdinAndJsonMatchTokenizers) {
  const auto [text, ids] = fixture("tiny-code", "code_python");
  ASSERT_FALSE(ids.empty());
  const Proc p = run_tokenize_cli({"tokenize", "-m", data("tiny-code"), "--json"}, text);
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const auto j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), ids);
}

TEST(TokenizeCli, MissingTokenizerJsonIsAClearError) {
  const Proc p = run_tokenize_cli({"tokenize", "-m", std::string(ANVIL_TEST_DATA), "--text", "hi"}, "");
  EXPECT_NE(p.exit_code, 0);
  EXPECT_NE(p.err.find("tokenizer.json"), std::string::npos) << p.err;
  const Proc q = run_tokenize_cli({"tokenize", "-m", "/nonexistent/model", "--text", "hi"}, "");
  EXPECT_NE(q.exit_code, 0);
  EXPECT_NE(q.err.find("/nonexistent/model"), std::string::npos) << q.err;
}

}  // namespace
