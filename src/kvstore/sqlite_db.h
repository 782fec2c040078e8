// A thin RAII layer over SQLite for the store's catalog: a connection and reusable prepared
// statements. Errors come back as Status naming the statement and SQLite's message.
#pragma once
#include <sqlite3.h>

#include <cstdint>
#include <string>

#include "base/hash128.h"
#include "base/status.h"

namespace anvil {

class SqliteDb {
 public:
  SqliteDb() = default;
  ~SqliteDb();
  SqliteDb(const SqliteDb&) = delete;
  SqliteDb& operator=(const SqliteDb&) = delete;
  // Opens (creating) the database; sets the busy timeout so concurrent processes wait for a lock
  // instead of failing.
  Status open(const std::string& path, int busy_timeout_ms);
  Status exec(const std::string& sql);
  // COMMIT, and where it fails with the transaction still open (SQLite leaves it open after some
  // errors, e.g. a busy lock or a deferred constraint, and rolls back by itself after others, e.g. a
  // full disk), ROLLBACK: a failed commit never leaves the connection inside a transaction, where
  // the next BEGIN would fail and later statements would join the abandoned one.
  Status commit();
  sqlite3* handle() const { return db_; }
  Status error(const std::string& what) const;

 private:
  sqlite3* db_ = nullptr;
};

class SqliteStmt {
 public:
  SqliteStmt() = default;
  ~SqliteStmt();
  SqliteStmt(const SqliteStmt&) = delete;
  SqliteStmt& operator=(const SqliteStmt&) = delete;
  Status prepare(SqliteDb& db, const std::string& sql);
  // Binding (1-based, as SQLite). Blobs and text are copied (SQLITE_TRANSIENT).
  void bind(int i, int64_t v) { sqlite3_bind_int64(st_, i, v); }
  void bind(int i, const std::string& text) { sqlite3_bind_text(st_, i, text.data(), int(text.size()), SQLITE_TRANSIENT); }
  // An empty blob is bound as one, never as NULL (sqlite3_bind_blob makes a null pointer NULL, so
  // an empty std::vector's data() did, which a NOT NULL column refuses: a session of no tokens).
  void bind_blob(int i, const void* p, size_t n) {
    if (n == 0) sqlite3_bind_zeroblob(st_, i, 0);
    else sqlite3_bind_blob(st_, i, p, int(n), SQLITE_TRANSIENT);
  }
  void bind(int i, const Hash128& h) { bind_blob(i, &h, sizeof h); }
  // One step: true with a row, false when done; errors as Status.
  Result<bool> step();
  // Runs to completion (INSERT/UPDATE/DELETE), then resets.
  Status run();
  void reset() {
    sqlite3_reset(st_);
    sqlite3_clear_bindings(st_);
  }
  int64_t col_int(int i) const { return sqlite3_column_int64(st_, i); }
  bool col_null(int i) const { return sqlite3_column_type(st_, i) == SQLITE_NULL; }
  std::string col_text(int i) const;
  const void* col_blob(int i) const { return sqlite3_column_blob(st_, i); }
  size_t col_bytes(int i) const { return size_t(sqlite3_column_bytes(st_, i)); }
  Hash128 col_hash(int i) const;

 private:
  SqliteDb* db_ = nullptr;
  sqlite3_stmt* st_ = nullptr;
  std::string sql_;
};

}  // namespace anvil
