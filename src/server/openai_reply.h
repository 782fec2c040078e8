// One request's reply: turns the scheduler's job events into OpenAI JSON — SSE chunks while
// streaming, or one chat.completion / text_completion object at the end. Chat replies go through
// ChatOutput (reasoning_content, tool_calls); logprobs are rendered in the chat format
// (content[{token, logprob, bytes, top_logprobs}]; bytes: the token's own bytes,
// Tokenizer::token_raw_bytes, so the bytes of a reply's tokens joined are its text's, up to the
// decoder's cut of the text's first space; token: those bytes as text, so one holding part of a
// character shows U+FFFD and a SentencePiece "▁word" keeps its space) or the legacy completions one.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_output.h"
#include "server/job.h"
#include "tokenizer/text_offsets.h"
#include "tokenizer/tokenizer.h"

namespace anvil::server {

using ojson = nlohmann::ordered_json;

// JSON text; invalid UTF-8 (never expected: text comes from StreamDecoder) is replaced, not thrown.
std::string dump_json(const ojson& j);

// A token's bytes as logprobs give them (OpenAI's "bytes"): an array of integers 0..255.
ojson token_bytes_json(const std::string& bytes);

struct Reply {
  bool chat = false;
  bool stream = false, include_usage = false, logprobs = false;
  int index = 0;  // the choice's index (n > 1, several prompts)
  std::string id, model;
  int64_t created = 0;
  std::shared_ptr<Job> job;
  std::unique_ptr<ChatOutput> out;  // chat only
  const Tokenizer* tok = nullptr;
  // Accumulated (non-streaming) or running state.
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  ojson lp_chat = ojson::array();
  ojson lp_completion = {{"tokens", ojson::array()}, {"token_logprobs", ojson::array()},
                         {"top_logprobs", ojson::array()}, {"text_offset", ojson::array()}};
  std::unique_ptr<TextOffsets> offsets;  // completions' text_offset, made on first use
  // Completions' echo: the prompt's text, which the reply repeats first (GenerationParams::echo; the
  // prompt's event, JobEvent::has_prompt, carries its tokens): the prompt as sent, or for token
  // ids their decode (special tokens skipped, as the offsets count them).
  std::string echo_text;
  int n_calls = 0;
  std::string finish;
  // tool_choice "required" or a named function: the reply must call one of allowed_tools.
  bool tool_required = false;
  std::vector<std::string> allowed_tools;
  std::string violation;  // set by on_done: why the reply does not follow tool_choice ("" when it does)

  // Event handlers: the SSE text to write now ("" when nothing; always "" when not streaming).
  std::string on_delta(const JobEvent& e);
  std::string on_done(const std::string& reason);  // last chunks, usage, [DONE]: on_finish + on_close
  // on_done in two steps, for a caller that acts between them (a session's turn is saved once the
  // reply is whole: assistant_message): the held text (on_finish: finish, violation and the
  // accumulated reply are final after it), then the chunk with finish_reason, usage and [DONE]
  // (on_close), or instead of them an error event and [DONE] (error_close).
  std::string on_finish(const std::string& reason);
  std::string on_close() const;
  // on_close's parts, for a reply of several choices (HttpServer's serve_choices): the chunk with
  // this choice's finish_reason, a usage chunk, and the error body of a broken tool_choice.
  std::string finish_sse() const;
  // A chat stream's first chunk (the assistant's role, empty content); "" for completions.
  std::string role_sse() const;
  std::string usage_sse(const nlohmann::ordered_json& usage) const;
  nlohmann::ordered_json violation_body() const;
  static std::string error_close(const nlohmann::ordered_json& error_body);
  ojson response() const;                            // the non-streaming body, after on_done
  ojson chunk(ojson choice) const;                   // one chunk object around `choice`
  ojson usage() const;
  // The reply as a message of the conversation (content, reasoning_content when the model wrote
  // reasoning, tool_calls), as a client echoes the reply back: what a session records. The chat
  // template decides whether the reasoning is rendered (Qwen3: only for the turns after the last
  // user message, the tool-call loop), so a session renders as the stateless request would.
  ojson assistant_message() const;

 private:
  std::string tool_choice_violation() const;
  // A token's "token" string: the lossy UTF-8 of its own bytes. vLLM's is decode() of the token
  // alone with the spaces of its leading "▁" put back (convert_ids_list_to_tokens), where the
  // pre-tokenizer is Metaspace (Llama 2 re-converted, TinyLlama): the same text there; this does
  // it for every decoder, Mistral's legacy Replace-based layout too (vLLM: the word without its
  // space). A byte-fallback token shows U+FFFD in both.
  std::string token_string(int32_t id) const;
  ojson chat_logprobs(const std::vector<TokenInfo>& toks) const;
  void completion_logprobs(const std::vector<TokenInfo>& toks, ojson* o);
  static ojson tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool with_index);
  std::string chat_delta_sse(const ChatOutput::Delta& d, const ojson& lp);
};

}  // namespace anvil::server
