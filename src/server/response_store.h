// The stored responses of /v1/responses (`store`, `previous_response_id`, GET and DELETE
// /v1/responses/{id}): each response's conversation (its input as chat messages, the request's
// instructions apart, and the reply as the assistant's message) and the Response object as it was
// sent, in an SQLite file of its own in the durable KV store's directory (`responses.db`), keyed by
// the response id and the model's fingerprint. Only text: the KV of a continued conversation is
// found again by the prefix cache (in memory or in the store), so a stored response pins no page.
// At most `keep` responses are kept, the oldest dropped first. Invariants:
//   1. a row is written whole in one statement (a reply and its conversation, or nothing);
//   2. a model sees only its own rows (fingerprint), as with sessions;
//   3. every call is serialized by one mutex over one connection (HTTP threads call it);
//   4. a row survives the process being killed (WAL, synchronous NORMAL), not necessarily a power cut.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "base/hash128.h"
#include "base/status.h"
#include "kvstore/sqlite_db.h"

namespace anvil::server {

struct StoredResponse {
  std::string messages;      // JSON array: the conversation, instructions excluded, reply included
  std::string instructions;  // the request's instructions ("" none)
  std::string response;      // JSON: the Response object as sent
};

class ResponseStore {
 public:
  // Opens (creating) dir/responses.db.
  Status open(const std::string& dir, const Hash128& fingerprint, int keep);
  Status put(const std::string& id, const StoredResponse& r);
  Result<std::optional<StoredResponse>> get(const std::string& id);
  // True when a row was removed.
  Result<bool> remove(const std::string& id);

 private:
  std::mutex mu_;
  SqliteDb db_;
  Hash128 fp_{};
  int keep_ = 0;
  int64_t seq_ = 0;  // insertion order within this process, after the clock
};

}  // namespace anvil::server
