#include "kvstore/sqlite_db.h"

#include <cstring>

namespace anvil {

SqliteDb::~SqliteDb() {
  if (db_) sqlite3_close_v2(db_);
}

Status SqliteDb::open(const std::string& path, int busy_timeout_ms) {
  int rc = sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    Status s = io_error("open catalog " + path + ": " + (db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc)));
    if (db_) sqlite3_close_v2(db_);
    db_ = nullptr;
    return s;
  }
  sqlite3_busy_timeout(db_, busy_timeout_ms);
  return Status::ok();
}

Status SqliteDb::error(const std::string& what) const {
  int rc = sqlite3_extended_errcode(db_);
  std::string msg = what + ": " + sqlite3_errmsg(db_);
  if ((rc & 0xff) == SQLITE_CORRUPT || (rc & 0xff) == SQLITE_NOTADB) return corrupt(msg);
  return io_error(msg);
}

Status SqliteDb::exec(const std::string& sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "error";
    sqlite3_free(err);
    int rc = sqlite3_extended_errcode(db_) & 0xff;
    std::string msg = "catalog: " + sql.substr(0, 60) + ": " + m;
    return rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB ? corrupt(msg) : io_error(msg);
  }
  return Status::ok();
}

Status SqliteDb::commit() {
  Status st = exec("COMMIT");
  if (!st.is_ok() && !sqlite3_get_autocommit(db_)) (void)exec("ROLLBACK");
  return st;
}

SqliteStmt::~SqliteStmt() {
  if (st_) sqlite3_finalize(st_);
}

Status SqliteStmt::prepare(SqliteDb& db, const std::string& sql) {
  db_ = &db;
  sql_ = sql;
  if (sqlite3_prepare_v3(db.handle(), sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &st_, nullptr) != SQLITE_OK)
    return db.error("catalog: prepare " + sql.substr(0, 60));
  return Status::ok();
}

Result<bool> SqliteStmt::step() {
  int rc = sqlite3_step(st_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  Status s = db_->error("catalog: " + sql_.substr(0, 60));
  sqlite3_reset(st_);
  return s;
}

Status SqliteStmt::run() {
  auto r = step();
  reset();
  return r.status();
}

std::string SqliteStmt::col_text(int i) const {
  const unsigned char* t = sqlite3_column_text(st_, i);
  return t ? std::string(reinterpret_cast<const char*>(t), size_t(sqlite3_column_bytes(st_, i))) : std::string();
}

Hash128 SqliteStmt::col_hash(int i) const {
  Hash128 h;
  if (col_bytes(i) == sizeof h) std::memcpy(&h, col_blob(i), sizeof h);
  return h;
}

}  // namespace anvil
