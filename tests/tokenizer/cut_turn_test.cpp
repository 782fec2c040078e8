// cut_turn.h: the answer of a chat turn cut short, found from the conversation as the turn began and
// the session's token ids, with Qwen3's tokenizer and chat template. The prompts are rendered here
// through the same template with each thinking flag, and the answers written as token ids, so the
// expectations come from the inputs, never from an output.
#include "tokenizer/cut_turn.h"

#include <gtest/gtest.h>

#include "tokenizer/tokenizer_config.h"
#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

using ojson = nlohmann::ordered_json;

class CutTurn : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Tokenizer::load(test::tokenizer_data("qwen3/tokenizer.json"));
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    tok_ = std::move(*t);
    auto c = load_tokenizer_config(test::tokenizer_data("qwen3"));
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    cfg_ = std::move(*c);
    eos_ = {*tok_->token_to_id("<|im_end|>")};
    messages_ = ojson::array({{{"role", "system"}, {"content", "Be brief."}},
                              {{"role", "user"}, {"content", "Hi"}},
                              {{"role", "assistant"}, {"content", "Hello."}},
                              {{"role", "user"}, {"content", "And then?"}}});
  }
  std::vector<int32_t> prompt(std::optional<bool> thinking) const {
    auto text = apply_chat_template(cfg_, messages_, ojson(), true, thinking);
    EXPECT_TRUE(text.is_ok());
    return tok_->encode(*text, false);
  }
  std::vector<int32_t> then(std::vector<int32_t> ids, const std::string& text) const {
    for (int32_t t : tok_->encode(text, false)) ids.push_back(t);
    return ids;
  }
  std::unique_ptr<Tokenizer> tok_;
  TokenizerConfig cfg_;
  std::vector<int32_t> eos_;
  ojson messages_;
};

// The turn began with enable_thinking=false (its prompt ends with an empty think block) and is
// taken up with every hint: the prompt found is that one, so the answer is the tokens after it.
TEST_F(CutTurn, ThePromptIsFoundWhateverTheThinkingHint) {
  const auto asked = prompt(false);
  ASSERT_NE(asked, prompt(std::nullopt)) << "the flag changes Qwen3's prompt";
  const auto history = then(asked, "So it goes");
  const int answered = int(history.size() - asked.size());
  for (std::optional<bool> hint : {std::optional<bool>(), std::optional<bool>(true), std::optional<bool>(false)}) {
    auto a = cut_answer(cfg_, *tok_, messages_, history, eos_, hint);
    ASSERT_TRUE(a.has_value());
    EXPECT_EQ(a->tokens, answered);
    EXPECT_EQ(a->content, "So it goes");
    EXPECT_EQ(a->reasoning, "");
  }
}

// A turn that thought: the reasoning is split off and trimmed as a reply is; the end-of-sequence
// token is no answered token; the message appended is the one anvil run and the server record.
TEST_F(CutTurn, ReasoningIsSplitOffAndTheMessageAppended) {
  auto history = then(prompt(std::nullopt), "<think>\nWhy not.\n</think>\n\nBecause.");
  const int answered = int(history.size() - prompt(std::nullopt).size());
  history.push_back(eos_[0]);
  ojson m = messages_;
  CutAnswer a;
  ASSERT_TRUE(take_up_cut_turn(cfg_, *tok_, &m, history, eos_, std::optional<bool>(false), &a));
  EXPECT_EQ(a.tokens, answered);
  ASSERT_EQ(m.size(), messages_.size() + 1);
  EXPECT_EQ(m.back(), (ojson{{"role", "assistant"}, {"content", "Because."}, {"reasoning_content", "Why not."}}));
}

// No answered token: the question is dropped. Token ids that no rendering begins, or a conversation
// that does not end with a question: nothing to take up, the messages are left alone.
TEST_F(CutTurn, AnUnansweredQuestionIsDroppedAndAnythingElseLeftAlone) {
  ojson m = messages_;
  auto history = prompt(std::nullopt);
  history.push_back(eos_[0]);
  CutAnswer a;
  ASSERT_TRUE(take_up_cut_turn(cfg_, *tok_, &m, history, eos_, std::nullopt, &a));
  EXPECT_EQ(a.tokens, 0);
  EXPECT_EQ(m, ojson(messages_.begin(), messages_.end() - 1));

  m = messages_;
  auto other = prompt(std::nullopt);
  other[other.size() / 2] += 1;
  EXPECT_FALSE(take_up_cut_turn(cfg_, *tok_, &m, other, eos_, std::nullopt));
  auto short_of_it = prompt(std::nullopt);
  short_of_it.pop_back();
  EXPECT_FALSE(cut_answer(cfg_, *tok_, m, short_of_it, eos_, std::nullopt));
  EXPECT_EQ(m, messages_);
  m.push_back({{"role", "assistant"}, {"content", "x"}});
  EXPECT_FALSE(cut_answer(cfg_, *tok_, m, then(prompt(std::nullopt), "x"), eos_, std::nullopt));
}

}  // namespace
}  // namespace anvil
