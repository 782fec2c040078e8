#include "server/openai_reply.h"

#include <algorithm>
#include <cmath>

#include "tokenizer/byte_level.h"

namespace anvil::server {

namespace {
std::string dump(const ojson& j) { return dump_json(j); }
}  // namespace

ojson token_bytes_json(const std::string& s) {
  ojson a = ojson::array();
  for (unsigned char c : s) a.push_back(int(c));
  return a;
}

std::string Reply::token_string(int32_t id) const { return tok::utf8_lossy(tok->token_raw_bytes(id)); }

std::string dump_json(const ojson& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

ojson Reply::chat_logprobs(const std::vector<TokenInfo>& toks) const {
  ojson a = ojson::array();
  for (const TokenInfo& t : toks) {
    // "token" is the token's text (a partial character shows as U+FFFD); "bytes" its own bytes, from
    // which a client rebuilds characters split over tokens, as OpenAI's (token_string).
    std::string piece = token_string(t.id);
    ojson top = ojson::array();
    for (const TokenLogprob& x : t.top)
      top.push_back({{"token", token_string(x.id)}, {"logprob", x.logprob}, {"bytes", token_bytes_json(tok->token_raw_bytes(x.id))}});
    a.push_back({{"token", piece}, {"logprob", t.logprob}, {"bytes", token_bytes_json(tok->token_raw_bytes(t.id))},
                 {"top_logprobs", top}});
  }
  return a;
}
// Appends the legacy completions logprobs of `toks` to the four parallel arrays in *o.

void Reply::completion_logprobs(const std::vector<TokenInfo>& toks, ojson* o) {
  for (const TokenInfo& t : toks) {
    std::string piece = token_string(t.id);
    (*o)["tokens"].push_back(piece);
    if (std::isnan(t.logprob)) {  // an echoed prompt's first token: nothing predicts it (OpenAI: null)
      (*o)["token_logprobs"].push_back(nullptr);
      (*o)["top_logprobs"].push_back(nullptr);
      if (!offsets) offsets = std::make_unique<TextOffsets>(*tok, /*skip_special=*/true);
      (*o)["text_offset"].push_back(offsets->push(t.id));
      continue;
    }
    (*o)["token_logprobs"].push_back(t.logprob);
    ojson top = ojson::object();
    // The legacy format keys the alternatives by their text: tokens that decode alike (pieces of one
    // character all decode to U+FFFD) share a key, which keeps the likeliest of them (the first).
    for (const TokenLogprob& x : t.top) top.emplace(token_string(x.id), x.logprob);
    // And the sampled token, when it is not among them (OpenAI: "the API will always return the
    // logprob of the sampled token, so there may be up to logprobs+1 elements"; vLLM does so too):
    // logprobs 0 gives the sampled token alone.
    top.emplace(piece, t.logprob);
    (*o)["top_logprobs"].push_back(top);
    // Offsets count characters of the text, as OpenAI's: a character counts where its first byte is
    // (tokenizer/text_offsets.h: the text's own rules, U+FFFD and skipped special tokens included).
    if (!offsets) offsets = std::make_unique<TextOffsets>(*tok, /*skip_special=*/true);  // as the scheduler decodes
    (*o)["text_offset"].push_back(offsets->push(t.id));
  }
}

ojson Reply::usage() const {
  const int p = job->prompt_tokens(), c = job->completion_tokens();
  return ojson{{"prompt_tokens", p},
               {"completion_tokens", c},
               {"total_tokens", p + c},
               {"prompt_tokens_details", {{"cached_tokens", job->cached_tokens()}}}};
}

ojson Reply::chunk(ojson choice) const {
  choice["index"] = index;
  return ojson{{"id", id},
               {"object", chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created},
               {"model", model},
               {"choices", ojson::array({choice})}};
}

ojson Reply::tool_calls_json(const std::vector<ToolCall>& calls, int first_index, bool with_index) {
  ojson a = ojson::array();
  int i = first_index;
  for (const ToolCall& c : calls) {
    ojson j = ojson::object();
    if (with_index) j["index"] = i;
    j["id"] = c.id;
    j["type"] = "function";
    j["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    a.push_back(j);
    ++i;
  }
  return a;
}
// SSE chunk(s) for a delta (streaming); accumulates (non-streaming). Returns "" when nothing to send.

std::string Reply::on_delta(const JobEvent& e) {
  std::string sse;
  if (chat) {
    ChatOutput::Delta d = out->push(e.text);
    ojson lp = logprobs ? chat_logprobs(e.tokens) : ojson();
    content += d.content;  // kept while streaming too: a session records the whole message
    reasoning += d.reasoning;
    for (auto& c : d.tool_calls) calls.push_back(c);
    if (!stream) {
      if (logprobs) for (auto& x : lp) lp_chat.push_back(x);
      return "";
    }
    return chat_delta_sse(d, lp);
  }
  // echo: the prompt's event (JobEvent::has_prompt) is the prompt's text and tokens, before the rest.
  const std::string& text = e.has_prompt ? echo_text : e.text;
  const std::vector<TokenInfo>& toks = e.has_prompt ? e.prompt : e.tokens;
  if (!stream) {
    content += text;
    if (logprobs) completion_logprobs(toks, &lp_completion);
    return "";
  }
  ojson lp;
  if (logprobs) {
    lp = {{"tokens", ojson::array()}, {"token_logprobs", ojson::array()}, {"top_logprobs", ojson::array()},
          {"text_offset", ojson::array()}};
    completion_logprobs(toks, &lp);
  }
  if (text.empty() && !logprobs) return "";
  return "data: " + dump(chunk({{"text", text}, {"logprobs", lp}, {"finish_reason", nullptr}})) + "\n\n";
}

std::string Reply::chat_delta_sse(const ChatOutput::Delta& d, const ojson& lp) {
  if (d.empty() && lp.is_null()) return "";
  ojson delta = ojson::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty() || (d.reasoning.empty() && d.tool_calls.empty())) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    delta["tool_calls"] = tool_calls_json(d.tool_calls, n_calls, true);
    n_calls += int(d.tool_calls.size());
  }
  ojson lpj = lp.is_null() ? ojson() : ojson{{"content", lp}};
  return "data: " + dump(chunk({{"delta", delta}, {"logprobs", lpj}, {"finish_reason", nullptr}})) + "\n\n";
}
// The end: flushes held text; streaming gets the final chunk(s) and [DONE].

std::string Reply::on_done(const std::string& reason) {
  std::string sse = on_finish(reason);  // first: on_close reads what it settles
  return sse + on_close();
}

std::string Reply::on_finish(const std::string& reason) {
  finish = reason;
  if (!chat) return "";
  ChatOutput::Delta d = out->flush();
  content += d.content;
  reasoning += d.reasoning;
  for (auto& c : d.tool_calls) calls.push_back(c);
  if (!calls.empty() && finish == "stop") finish = "tool_calls";
  violation = tool_choice_violation();
  // The held text of a call that never closed is not sent when it breaks tool_choice: the
  // request fails instead of returning text the client did not ask for (as without streaming).
  return stream && violation.empty() ? chat_delta_sse(d, ojson()) : "";
}

std::string Reply::error_close(const ojson& error_body) { return "data: " + dump(error_body) + "\n\ndata: [DONE]\n\n"; }

std::string Reply::on_close() const {
  if (!stream) return "";
  if (!violation.empty()) return error_close(violation_body());  // the last chunk is the error instead of a finish_reason
  std::string sse = finish_sse();
  if (include_usage) sse += usage_sse(usage());
  return sse + "data: [DONE]\n\n";
}

ojson Reply::violation_body() const {
  return {{"error", {{"message", violation}, {"type", "server_error"}, {"param", "tool_choice"},
                     {"code", "tool_choice_not_followed"}}}};
}

std::string Reply::role_sse() const {
  if (!chat) return "";
  return "data: " + dump(chunk({{"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                               {"finish_reason", nullptr}})) + "\n\n";
}

std::string Reply::finish_sse() const {
  if (chat) return "data: " + dump(chunk({{"delta", ojson::object()}, {"logprobs", nullptr}, {"finish_reason", finish}})) + "\n\n";
  return "data: " + dump(chunk({{"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish}})) + "\n\n";
}

std::string Reply::usage_sse(const ojson& u) const {
  ojson c = chunk(ojson::object());
  c["choices"] = ojson::array();
  c["usage"] = u;
  return "data: " + dump(c) + "\n\n";
}

std::string Reply::tool_choice_violation() const {
  if (!tool_required || finish == "length" || finish == "cancelled") return "";  // cut short: not the model's choice
  if (calls.empty())
    return "tool_choice asked for a tool call, but the model's reply has no valid <tool_call> block (its text: " +
           content.substr(0, 200) + ")";
  for (const ToolCall& c : calls)
    if (std::find(allowed_tools.begin(), allowed_tools.end(), c.name) == allowed_tools.end())
      return "tool_choice allows only " + (allowed_tools.size() == 1 ? "'" + allowed_tools[0] + "'" : "the given tools") +
             ", but the model called '" + c.name + "'";
  return "";
}

ojson Reply::assistant_message() const {
  ojson msg = ojson::object();
  msg["role"] = "assistant";
  msg["content"] = content;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  if (!calls.empty()) msg["tool_calls"] = tool_calls_json(calls, 0, false);
  return msg;
}

ojson Reply::response() const {
  ojson choice = ojson::object();
  choice["index"] = index;
  if (chat) {
    ojson msg = ojson::object();
    msg["role"] = "assistant";
    msg["content"] = content.empty() && !calls.empty() ? ojson() : ojson(content);
    if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
    if (!calls.empty()) msg["tool_calls"] = tool_calls_json(calls, 0, false);
    choice["message"] = msg;
    choice["logprobs"] = logprobs ? ojson{{"content", lp_chat}} : ojson();
  } else {
    choice["text"] = content;
    choice["logprobs"] = logprobs ? lp_completion : ojson();
  }
  choice["finish_reason"] = finish;
  return ojson{{"id", id},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created},
               {"model", model},
               {"choices", ojson::array({choice})},
               {"usage", usage()}};
}

}  // namespace anvil::server
