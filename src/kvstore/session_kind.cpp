#include "kvstore/session_kind.h"

#include <cstdint>
#include <nlohmann/json.hpp>

namespace anvil {

SessionKind session_kind(const std::string& meta) {
  if (meta.empty()) return SessionKind::kCompletion;
  const nlohmann::json m = nlohmann::json::parse(meta, nullptr, false);
  if (!m.is_object()) return SessionKind::kUnreadable;
  auto messages = m.find("messages");
  if (messages == m.end() || !messages->is_array()) return SessionKind::kUnreadable;
  for (const auto& msg : *messages)
    if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string()) return SessionKind::kUnreadable;
  auto document = m.find("document");
  if (document == m.end()) return SessionKind::kChat;
  if (!document->is_array()) return SessionKind::kUnreadable;
  for (const auto& id : *document)
    if (!id.is_number_integer() || id.get<int64_t>() < INT32_MIN || id.get<int64_t>() > INT32_MAX)
      return SessionKind::kUnreadable;
  return document->empty() ? SessionKind::kChat : SessionKind::kRunText;
}

std::string session_kind_what(SessionKind k) {
  switch (k) {
    case SessionKind::kCompletion: return "a completion document (recorded by anvil generate or /v1/completions)";
    case SessionKind::kChat: return "a conversation (recorded by anvil run or /v1/chat/completions)";
    case SessionKind::kRunText:
      return "anvil run's completion-mode text (recorded by anvil run for a model without a chat template)";
    case SessionKind::kUnreadable: break;
  }
  return "a record of no kind anvil writes (its meta is neither empty nor a conversation)";
}

const char* session_kind_name(SessionKind k) {
  switch (k) {
    case SessionKind::kCompletion: return "completion";
    case SessionKind::kChat: return "chat";
    case SessionKind::kRunText: return "run_text";
    case SessionKind::kUnreadable: break;
  }
  return "unknown";
}

}  // namespace anvil
