// ReasoningSplitter: the reasoning/content split is the same for every chunking of the stream.
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/reasoning.h"

namespace anvil {
namespace {

using Out = ReasoningSplitter::Out;

Out run_chunks(bool starts_in, const std::vector<std::string>& chunks) {
  ReasoningSplitter s(starts_in);
  Out all;
  auto add = [&](const Out& o) {
    all.reasoning += o.reasoning;
    all.content += o.content;
  };
  for (const auto& c : chunks) add(s.push(c));
  add(s.flush());
  return all;
}

// The reference split, computed on the whole text at once.
Out reference(bool in, const std::string& text) {
  Out o;
  size_t p = 0;
  for (;;) {
    const std::string tag = in ? "</think>" : "<think>";
    const size_t at = text.find(tag, p);
    std::string& side = in ? o.reasoning : o.content;
    if (at == std::string::npos) {
      side += text.substr(p);
      return o;
    }
    side += text.substr(p, at - p);
    p = at + tag.size();
    in = !in;
  }
}

void check_all_splits(bool starts_in, const std::string& text) {
  const Out want = reference(starts_in, text);
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      const Out got = run_chunks(starts_in, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      ASSERT_EQ(got.reasoning, want.reasoning) << i << "," << j;
      ASSERT_EQ(got.content, want.content) << i << "," << j;
    }
}

TEST(ReasoningSplitter, TagsSpanningChunksAtEverySplitPoint) {
  check_all_splits(false, "<think>\nLet me see.\n</think>\n\nThe answer is 4.");
  check_all_splits(false, "no reasoning at all < think > </thin");
  check_all_splits(true, "already thinking</think>answer");
  check_all_splits(false, "a<think>b</think>c<think>d</think>e");
  check_all_splits(false, "<<think><</think>>");
  check_all_splits(true, "unterminated reasoning </thi");
}

TEST(ReasoningSplitter, KnownSplit) {
  const Out o = run_chunks(false, {"<thi", "nk>plan", "</th", "ink>done"});
  EXPECT_EQ(o.reasoning, "plan");
  EXPECT_EQ(o.content, "done");
  const Out p = run_chunks(true, {"plan", "</think>", "done"});
  EXPECT_EQ(p.reasoning, "plan");
  EXPECT_EQ(p.content, "done");
}

TEST(ReasoningSplitter, PartialTagIsFlushedAsText) {
  ReasoningSplitter s;
  Out a = s.push("x <thin");
  EXPECT_EQ(a.content, "x ");
  Out b = s.flush();
  EXPECT_EQ(b.content, "<thin");
  EXPECT_FALSE(s.in_reasoning());
}

// Whether the answer starts inside reasoning, decided on prompts rendered by transformers
// (tests/data/templates/expected_real.json): R1-distill and QwQ open <think> in the generation
// prompt; Qwen3 with enable_thinking=false closes an empty block; DeepSeek-V3.1 closes it unless
// thinking is asked for.
TEST(PromptOpensReasoning, OnReferenceRenderings) {
  std::ifstream f(std::string(ANVIL_TEST_DATA) + "/templates/expected_real.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto e = nlohmann::json::parse(ss.str());
  auto text = [&](const char* t, const char* c) { return e[t][c]["text"].get<std::string>(); };
  EXPECT_TRUE(prompt_opens_reasoning(text("deepseek-r1-distill-qwen", "single_user")));
  EXPECT_TRUE(prompt_opens_reasoning(text("qwq-style", "multi_turn")));
  EXPECT_TRUE(prompt_opens_reasoning(text("deepseek-v3.1", "thinking_on")));
  EXPECT_FALSE(prompt_opens_reasoning(text("deepseek-v3.1", "thinking_default")));
  EXPECT_FALSE(prompt_opens_reasoning(text("qwen3", "thinking_off")));
  EXPECT_FALSE(prompt_opens_reasoning(text("qwen3", "thinking_default")));
  EXPECT_FALSE(prompt_opens_reasoning(text("qwen3", "reasoning_history")));  // history blocks are closed
  EXPECT_FALSE(prompt_opens_reasoning(text("llama3.1-json-tools", "single_user")));
  // The tag in a user's text opens nothing: only a prompt that ends with it (the template's).
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>user\nWhat does the <think> tag do?<|im_end|>\n"
                                      "<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_reasoning("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
}

}  // namespace
}  // namespace anvil
