// The answer of a chat turn that was cut short. anvil run records a session's conversation when a
// turn begins (ending with the question) and the turn's token ids at every flush, so a process
// killed mid-answer leaves a conversation whose last message is the question and token ids that
// run past its prompt. Whoever continues the session (anvil run --resume, the server naming it)
// takes the turn up from them alike: what was answered becomes the assistant message (as the
// answer would have been recorded), and a question that got no answer is dropped, so the roles
// still alternate and both give the same conversation.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil {

struct CutAnswer {
  int tokens = 0;  // answered tokens (end-of-sequence ones not counted); 0: the question was never answered
  std::string reasoning, content;  // shaped as a reply is (ReasoningShaper): the recorded message's
};

// `messages` ends with the cut turn's question and `history` is the session's token ids. The turn's
// prompt is the conversation rendered with the thinking flag of the run that began it, which need
// not be the one at hand (`thinking`, tried first; then unset, true, false): of the renderings
// `history` begins with, the longest (Qwen3's enable_thinking=false one adds an empty think block to
// the other). nullopt when `messages` does not end with a user message or no rendering fits (there
// is nothing to take up).
std::optional<CutAnswer> cut_answer(const TokenizerConfig& cfg, const Tokenizer& tok,
                                    const nlohmann::ordered_json& messages, std::span<const int32_t> history,
                                    std::span<const int32_t> eos_ids, std::optional<bool> thinking);

// The conversation that continues: `messages` with the answer appended, or the unanswered question
// dropped. False (and `messages` unchanged) when cut_answer finds nothing to take up.
bool take_up_cut_turn(const TokenizerConfig& cfg, const Tokenizer& tok, nlohmann::ordered_json* messages,
                      std::span<const int32_t> history, std::span<const int32_t> eos_ids,
                      std::optional<bool> thinking, CutAnswer* answer = nullptr);

}  // namespace anvil
