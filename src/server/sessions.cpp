#include "server/sessions.h"

#include <algorithm>

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

ApiError session_not_saved_error(const std::string& name, bool chat, const SessionBefore& before, const Status& why,
                                 const Result<std::optional<SessionInfo>>& now, const ChatModel& model, bool streamed) {
  std::string holds;
  bool as_before = false;  // nothing of the turn is in it: sending the turn again is the remedy
  if (!now.is_ok()) {
    holds = "what the session holds now could not be read (" + now.status().message() + ")";
  } else if (!*now) {
    holds = before.existed ? "the session no longer exists" : "the session was not created";
    as_before = !before.existed;
  } else if (const SessionInfo& s = **now; !s.damaged.empty()) {
    holds = "its stored record is damaged (" + s.damaged + ")";
  } else if (chat) {
    // Every state the turn recorded has the conversation it continued as its meta: mid-turn
    // flushes that committed change only the tokens, which the next turn renders anew.
    ojson shown = ojson::array();
    const bool read = !session_messages(s, model, std::nullopt, &shown);
    const std::string n = std::to_string(shown.size()) + (shown.size() == 1 ? " message" : " messages");
    as_before = read && shown == before.messages;
    holds = as_before ? "it holds its conversation as it was before this turn (" + n +
                            "): this turn's messages and reply are not in it"
                      : "it holds a conversation of " + n + ", as GET /v1/sessions/" + name + " shows it";
  } else {
    // A completion document is its tokens: a mid-turn flush that committed holds part of the turn.
    const size_t n = s.tokens.size(), b = before.tokens.size();
    const bool extends =
        before.existed && n >= b && std::equal(before.tokens.begin(), before.tokens.end(), s.tokens.begin());
    as_before = extends && n == b;
    if (as_before)
      holds = "it holds its document as it was before this turn (" + std::to_string(b) +
              " tokens): this turn's prompt and reply are not in it";
    else if (extends)
      holds = "it holds " + std::to_string(n) + " tokens: its document before this turn (" + std::to_string(b) +
              " tokens) and the first " + std::to_string(n - b) + " of this turn's prompt and reply; the rest is not in it";
    else
      holds = "it holds " + std::to_string(n) + " tokens, as GET /v1/sessions/" + name + " shows them";
  }
  ApiError e;
  e.status = 507;
  e.param = "session";
  e.type = "server_error";
  e.code = "session_not_saved";
  e.message = why.message() + "; " + holds;  // why names the session ("session 'NAME' was not saved: ...")
  if (as_before) e.message += "; send the turn again once the store can save it";
  e.message += streamed ? " (the reply is the text streamed before this error)" : " (the reply is in this error's 'response')";
  return e;
}

ApiError session_not_removed_error(const std::string& name, const Status& why) {
  ApiError e;
  e.status = 507;
  e.param = "session";
  e.type = "server_error";
  e.code = "session_not_removed";
  // remove_session rolls its transaction back: the row and its page references are as they were.
  e.message = "session '" + name + "' was not removed: " + why.message() +
              "; it is kept as it was (nothing of it changed): remove it again once the store can commit";
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
