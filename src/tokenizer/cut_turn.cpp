#include "tokenizer/cut_turn.h"

#include <algorithm>

#include "tokenizer/reasoning.h"
#include "tokenizer/stream_decoder.h"

namespace anvil {

std::optional<CutAnswer> cut_answer(const TokenizerConfig& cfg, const Tokenizer& tok,
                                    const nlohmann::ordered_json& messages, std::span<const int32_t> history,
                                    std::span<const int32_t> eos_ids, std::optional<bool> thinking) {
  if (!messages.is_array() || messages.empty() || !messages.back().is_object() ||
      messages.back().value("role", "") != "user")
    return std::nullopt;
  std::optional<size_t> asked;  // the prompt's length in tokens
  bool opens_reasoning = false;
  for (std::optional<bool> th : {thinking, std::optional<bool>(), std::optional<bool>(true), std::optional<bool>(false)}) {
    auto text = apply_chat_template(cfg, messages, nlohmann::ordered_json(), true, th);
    if (!text.is_ok()) continue;
    const std::vector<int32_t> ids = tok.encode(*text, /*add_special_tokens=*/false);  // the template wrote BOS
    if (history.size() >= ids.size() && std::equal(ids.begin(), ids.end(), history.begin()) &&
        (!asked || ids.size() > *asked)) {
      asked = ids.size();
      opens_reasoning = prompt_opens_reasoning(*text);
    }
  }
  if (!asked) return std::nullopt;
  // As the answer streamed (anvil run's TextOutput, the server's reply): whole characters, special
  // tokens skipped, the reasoning split off where the vocabulary has its tags.
  CutAnswer a;
  StreamDecoder dec(tok, /*skip_special=*/true);
  std::optional<ReasoningShaper> shaper;
  if (vocabulary_has_reasoning(tok)) shaper.emplace(opens_reasoning);
  auto add = [&](const std::string& text, bool last) {
    if (!shaper) {
      a.content += text;
      return;
    }
    auto o = shaper->push(text);
    a.reasoning += o.reasoning;
    a.content += o.content;
    if (last) {
      o = shaper->flush();
      a.reasoning += o.reasoning;
      a.content += o.content;
    }
  };
  for (size_t i = *asked; i < history.size(); ++i) {
    if (std::find(eos_ids.begin(), eos_ids.end(), history[i]) != eos_ids.end()) continue;
    ++a.tokens;
    add(dec.push(history[i]), false);
  }
  add(dec.flush(), true);
  return a;
}

bool take_up_cut_turn(const TokenizerConfig& cfg, const Tokenizer& tok, nlohmann::ordered_json* messages,
                      std::span<const int32_t> history, std::span<const int32_t> eos_ids,
                      std::optional<bool> thinking, CutAnswer* answer) {
  auto a = cut_answer(cfg, tok, *messages, history, eos_ids, thinking);
  if (!a) return false;
  if (a->tokens > 0) {
    // As anvil run and the server record an answer: its content, and its reasoning when there is any.
    nlohmann::ordered_json m = {{"role", "assistant"}, {"content", a->content}};
    if (!a->reasoning.empty()) m["reasoning_content"] = a->reasoning;
    messages->push_back(std::move(m));
  } else {
    messages->erase(messages->end() - 1);
  }
  if (answer) *answer = std::move(*a);
  return true;
}

}  // namespace anvil
