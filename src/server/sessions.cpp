#include "server/sessions.h"

namespace anvil::server {

using ojson = nlohmann::ordered_json;

namespace {
ojson parse_meta(const SessionInfo& s) { return ojson::parse(s.meta, nullptr, false); }
}  // namespace

bool is_chat_session(const SessionInfo& s) {
  ojson m = parse_meta(s);
  return m.is_object() && m.contains("messages") && m["messages"].is_array();
}

ApiError session_damaged_error(const SessionInfo& s) {
  ApiError e;
  e.status = 409;
  e.param = "session";
  e.code = "session_damaged";
  e.message = "session '" + s.name +
              "' is damaged: its token ids or conversation in the KV store fail their checksum, so it cannot be "
              "continued (it is kept as it is). Remove it with DELETE /v1/sessions/" + s.name + " (or anvil kv rm " +
              s.name + " on the server's store), then start it again";
  return e;
}

std::optional<ApiError> session_messages(const SessionInfo& s, ojson* messages) {
  ojson m = parse_meta(s);
  if (!m.is_object() || !m.contains("messages") || !m["messages"].is_array()) {
    ApiError e;
    e.param = "session";
    e.message = "session '" + s.name + "' holds a completion document (" + std::to_string(s.tokens.size()) +
                " tokens), not a conversation: continue it with /v1/completions";
    return e;
  }
  if (m.contains("document") && m["document"].is_array() && !m["document"].empty()) {
    ApiError e;
    e.param = "session";
    e.message = "session '" + s.name + "' was recorded by anvil run in completion mode (no chat template)";
    return e;
  }
  *messages = m["messages"];
  return std::nullopt;
}

std::string chat_session_meta(const ojson& messages) {
  return ojson{{"messages", messages}, {"document", ojson::array()}}.dump(-1, ' ', false,
                                                                         nlohmann::json::error_handler_t::replace);
}

ojson session_json(const SessionInfo& s, bool detail) {
  ojson j = ojson::object();
  j["id"] = s.name;
  j["object"] = "session";
  if (!s.damaged.empty()) {  // listed, marked: its tokens and messages are not trusted
    j["damaged"] = true;
    j["error"] = s.damaged;
    j["updated"] = s.updated_us / 1000000;
    return j;
  }
  const bool chat = is_chat_session(s);
  j["type"] = chat ? "chat" : "completion";
  j["tokens"] = s.tokens.size();
  j["durable_tokens"] = s.durable_pos;  // tokens whose KV is committed in the store
  j["updated"] = s.updated_us / 1000000;
  if (chat) {
    ojson m = parse_meta(s);
    j["messages"] = detail ? m["messages"] : ojson(m["messages"].size());
  }
  return j;
}

}  // namespace anvil::server
