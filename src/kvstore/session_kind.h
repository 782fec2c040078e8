// What a session holds, read from its meta (SessionInfo::meta). Every anvil since sessions began
// has written one of two metas (git log -p of src/cli/cmd_run.cpp, cmd_generate.cpp and
// src/server/sessions.cpp):
//   ""   a completion document: anvil generate --session, the server's /v1/completions. Its token
//        ids are all of it; a prompt is appended to them.
//   {"messages": [...], "document": [...], "turns": N}   anvil run's format, which the server's
//        /v1/chat/completions records too (without "turns"): a conversation ("document" empty:
//        its messages are rendered through the chat template) or, for a model without a chat
//        template, anvil run's completion-mode text (the ids of the text so far in "document").
// A session is continued only by what records its kind: anvil generate and /v1/completions a
// completion document, anvil run and /v1/chat/completions a conversation, anvil run (a model without
// a chat template) its text. Anything else, rewriting the meta as its own kind, would lose the rest.
// A meta that is none of these was written by no anvil: kUnreadable. The store counts a row of the
// older format (no checksum, invariant 8 of kvstore.h) with such a meta as damaged (session_damage).
#pragma once
#include <string>

namespace anvil {

enum class SessionKind { kCompletion, kChat, kRunText, kUnreadable };

// The kind `meta` describes. A conversation is a JSON object whose "messages" is an array of
// objects each with a string "role", and whose "document" (when present) is an array of 32-bit
// token ids; kRunText when that array is not empty.
SessionKind session_kind(const std::string& meta);

// What a session of kind `k` holds, for messages: "a completion document", "a conversation", ...
std::string session_kind_what(SessionKind k);

// The kind's name in listings (GET /v1/sessions "type", anvil kv ls): "completion" (continued by
// anvil generate and /v1/completions), "chat" (anvil run and /v1/chat/completions), "run_text"
// (anvil run's completion-mode text: only anvil run continues it, neither endpoint) and "unknown"
// (kUnreadable: nothing continues it).
const char* session_kind_name(SessionKind k);

}  // namespace anvil
