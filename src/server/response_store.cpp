#include "server/response_store.h"

#include <chrono>

namespace anvil::server {

Status ResponseStore::open(const std::string& dir, const Hash128& fingerprint, int keep) {
  std::lock_guard<std::mutex> lk(mu_);
  fp_ = fingerprint;
  keep_ = keep;
  const std::string path = dir + "/responses.db";
  ANVIL_RETURN_IF_ERROR(db_.open(path, 10000));
  ANVIL_RETURN_IF_ERROR(db_.exec("PRAGMA journal_mode=WAL"));
  // A response's row commits without an fsync of its own (WAL, synchronous NORMAL: durable against a
  // crash of the process, the last ones may be lost with the machine's power): the reply waits for
  // its store, and an fsync per response is what DESIGN.md's peer paid per row.
  ANVIL_RETURN_IF_ERROR(db_.exec("PRAGMA synchronous=NORMAL"));
  return db_.exec(
      "CREATE TABLE IF NOT EXISTS responses(id TEXT NOT NULL, fingerprint BLOB NOT NULL, created INTEGER NOT NULL, "
      "messages TEXT NOT NULL, instructions TEXT NOT NULL, response TEXT NOT NULL, PRIMARY KEY(id, fingerprint))");
}

Status ResponseStore::put(const std::string& id, const StoredResponse& r) {
  std::lock_guard<std::mutex> lk(mu_);
  // Microseconds since the epoch, and a counter for rows of the same microsecond: the pruning order.
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  SqliteStmt ins;
  ANVIL_RETURN_IF_ERROR(ins.prepare(db_,
                                    "INSERT OR REPLACE INTO responses(id, fingerprint, created, messages, instructions, "
                                    "response) VALUES(?, ?, ?, ?, ?, ?)"));
  ins.bind(1, id);
  ins.bind(2, fp_);
  ins.bind(3, now * 1000 + (seq_++ % 1000));
  ins.bind(4, r.messages);
  ins.bind(5, r.instructions);
  ins.bind(6, r.response);
  ANVIL_RETURN_IF_ERROR(ins.run());
  if (keep_ <= 0) return Status::ok();
  SqliteStmt prune;
  ANVIL_RETURN_IF_ERROR(prune.prepare(db_,
                                      "DELETE FROM responses WHERE fingerprint = ? AND id NOT IN (SELECT id FROM "
                                      "responses WHERE fingerprint = ? ORDER BY created DESC LIMIT ?)"));
  prune.bind(1, fp_);
  prune.bind(2, fp_);
  prune.bind(3, int64_t(keep_));
  return prune.run();
}

Result<std::optional<StoredResponse>> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(
      q.prepare(db_, "SELECT messages, instructions, response FROM responses WHERE id = ? AND fingerprint = ?"));
  q.bind(1, id);
  q.bind(2, fp_);
  ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return std::optional<StoredResponse>();
  return std::optional<StoredResponse>(StoredResponse{q.col_text(0), q.col_text(1), q.col_text(2)});
}

Result<bool> ResponseStore::remove(const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  SqliteStmt d;
  ANVIL_RETURN_IF_ERROR(d.prepare(db_, "DELETE FROM responses WHERE id = ? AND fingerprint = ?"));
  d.bind(1, id);
  d.bind(2, fp_);
  ANVIL_RETURN_IF_ERROR(d.run());
  return sqlite3_changes(db_.handle()) > 0;
}

}  // namespace anvil::server
