// Sessions in the server: a request naming "session" continues a conversation (chat) or a document
// (completions) recorded in the durable KV store, and its turn is recorded back (docs/api.md).
//
// What a session holds: its token ids (the truth; its KV pages are a cache of them) and a meta text.
// A chat session's meta is {"messages": [...], "document": []}, the format anvil run records, so a
// conversation started in `anvil run --session` continues over HTTP and back. A chat request sends
// only its new messages; the server renders the stored messages + the new ones through the chat
// template (the stored tokens' pages make that prefix a cache hit) and, when the turn succeeds,
// records the new messages and the reply; a turn anvil run began and never finished is taken up first,
// as anvil run --resume does (tokenizer/cut_turn.h). A completion session (anvil generate's, or one started
// with /v1/completions) has no messages: the prompt is appended to its tokens.
//
// One request at a time per session: SessionLocks (session_locks.h) hands a name to one request; a
// second gets 409, unless the one holding it is on its way out (its client gone): it then waits.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvstore/kvstore.h"
#include "kvstore/session_kind.h"
#include "server/api_request.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::server {

// What takes up a chat session's cut turn (cut_turn.h): the model's tokenizer, chat template and
// end-of-sequence ids.
struct ChatModel {
  const TokenizerConfig& cfg;
  const Tokenizer& tok;
  std::span<const int32_t> eos_ids;
};

// An ApiError (400, param "session") when stored session `s` is not of the kind the endpoint
// continues (session_kind.h: a conversation for chat, a completion document for completions),
// naming what it holds and what continues it; nullopt when it is.
std::optional<ApiError> session_kind_error(const SessionInfo& s, bool chat);
// A stored session's conversation as a request naming it continues it: its messages, a turn anvil
// run began and never finished taken up as anvil run --resume takes it up (take_up_cut_turn: what
// was answered is the assistant's message, an unanswered question is dropped), rendered with the
// request's thinking flag (`thinking`) tried first; or session_kind_error's when it holds none. A
// session that does not exist yet has none. `taken_up`, when given: whether a cut turn was taken up
// (the messages then differ from the stored ones).
std::optional<ApiError> session_messages(const SessionInfo& s, const ChatModel& model, std::optional<bool> thinking,
                                         nlohmann::ordered_json* messages, bool* taken_up = nullptr);
// A request naming a session whose own record is damaged (KVStore::find_session: its token ids or
// conversation fail their checksum): 409 `session_damaged`, naming what is damaged and the remedy.
// The session is kept as it is (never continued, overwritten or dropped by a request); DELETE removes
// it. Damaged KV pages of a sound session are no error: they are recomputed (and stored again).
ApiError session_damaged_error(const SessionInfo& s);
// A session as a request's turn found it: whether it existed, its conversation as the turn
// continued it (chat) and its tokens (a completion document).
struct SessionBefore {
  bool existed = false;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  std::vector<int32_t> tokens;
};
// A turn whose last state the store could not commit (KVStore::session_finish's error `why`: a full
// disk, an I/O error): 507 `session_not_saved`, param "session", naming the session and the cause,
// and what session `name` holds instead, from `now` (read back from the store while the turn still
// claimed it; a chat session's messages as GET /v1/sessions/NAME shows them, through `model`)
// against `before`; `streamed` says where the reply went (the deltas, or the error's `response`).
ApiError session_not_saved_error(const std::string& name, bool chat, const SessionBefore& before, const Status& why,
                                 const Result<std::optional<SessionInfo>>& now, const ChatModel& model, bool streamed);
// DELETE of session `name` whose removal did not commit (KVStore::remove_session's error `why`;
// its transaction rolled back): 507 `session_not_removed`, saying the session is kept as it was.
ApiError session_not_removed_error(const std::string& name, const Status& why);
// The meta a chat session records: anvil run's format.
std::string chat_session_meta(const nlohmann::ordered_json& messages);
// GET /v1/sessions entry; with `detail`, the messages too: those a request naming it continues
// (session_messages), so that what is shown is what the next turn goes on from. A damaged session (list_sessions) is
// {id, object, damaged: true, error, updated}; its error names the session and why, never a path of
// the server's (the store's own message names its directory: the server's log may show that).
nlohmann::ordered_json session_json(const SessionInfo& s, bool detail, const ChatModel& model);

}  // namespace anvil::server
