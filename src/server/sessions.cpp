#include "server/sessions.h"

#include "tokenizer/cut_turn.h"

namespace anvil::server {

using ojson = nlohmann::ordered_json;

namespace {
ojson parse_meta(const SessionInfo& s) { return ojson::parse(s.meta, nullptr, false); }
}  // namespace

ApiError session_damaged_error(const SessionInfo& s) {
  ApiError e;
  e.status = 409;
  e.param = "session";
  e.code = "session_damaged";
  // s.damaged names no path of the server's: what a client may be told.
  e.message = "session '" + s.name + "' is damaged (" + s.damaged +
              "), so it cannot be continued (it is kept as it is). Remove it with DELETE /v1/sessions/" + s.name +
              " (or anvil kv rm " + s.name + " on the server's store), then start it again";
  return e;
}

std::optional<ApiError> session_kind_error(const SessionInfo& s, bool chat) {
  const SessionKind k = session_kind(s.meta);
  if (k == (chat ? SessionKind::kChat : SessionKind::kCompletion)) return std::nullopt;
  ApiError e;
  e.param = "session";
  switch (k) {
    case SessionKind::kCompletion:
      e.message = "session '" + s.name + "' holds a completion document (" + std::to_string(s.tokens.size()) +
                  " tokens), not a conversation: continue it with /v1/completions";
      break;
    case SessionKind::kChat:
      e.message = "session '" + s.name + "' holds a conversation: continue it with /v1/chat/completions";
      break;
    case SessionKind::kRunText:
      e.message = "session '" + s.name +
                  "' was recorded by anvil run in completion mode (a model without a chat template): continue it "
                  "with anvil run --session " + s.name + " --resume";
      break;
    case SessionKind::kUnreadable:
      e.message = "session '" + s.name + "' holds " + session_kind_what(k) +
                  ": neither endpoint continues it; remove it with DELETE /v1/sessions/" + s.name;
      break;
  }
  return e;
}

std::optional<ApiError> session_messages(const SessionInfo& s, const ChatModel& model, std::optional<bool> thinking,
                                         ojson* messages, bool* taken_up) {
  if (auto e = session_kind_error(s, /*chat=*/true)) return e;
  *messages = parse_meta(s)["messages"];
  // A turn anvil run was killed in (its conversation ends with the question, its tokens run on past
  // its prompt): nothing to do for any other conversation (cut_answer looks no further than its
  // last message's role).
  const bool took = take_up_cut_turn(model.cfg, model.tok, messages, s.tokens, model.eos_ids, thinking);
  if (taken_up) *taken_up = took;
  return std::nullopt;
}

std::string chat_session_meta(const ojson& messages) {
  return ojson{{"messages", messages}, {"document", ojson::array()}}.dump(-1, ' ', false,
                                                                         nlohmann::json::error_handler_t::replace);
}

ojson session_json(const SessionInfo& s, bool detail, const ChatModel& model) {
  ojson j = ojson::object();
  j["id"] = s.name;
  j["object"] = "session";
  if (!s.damaged.empty()) {  // listed, marked: its tokens and messages are not trusted
    j["damaged"] = true;
    j["error"] = "session '" + s.name + "' is damaged (" + s.damaged + ")";  // no path of the server's
    j["updated"] = s.updated_us / 1000000;
    return j;
  }
  // Its kind as the endpoints take it (session_kind_error): "chat" only for a conversation, which
  // alone has messages; anvil run's completion-mode text is "run_text", continued by neither.
  const SessionKind kind = session_kind(s.meta);
  j["type"] = session_kind_name(kind);
  j["tokens"] = s.tokens.size();
  j["durable_tokens"] = s.durable_pos;  // tokens whose KV is committed in the store
  j["updated"] = s.updated_us / 1000000;
  if (kind == SessionKind::kChat) {
    ojson m;
    (void)session_messages(s, model, std::nullopt, &m);  // (a conversation: no error)
    j["messages"] = detail ? m : ojson(m.size());
  }
  return j;
}

}  // namespace anvil::server
