#include "kvstore/catalog.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "kvstore/checksum.h"
#include "kvstore/page_record.h"
#include "kvstore/session_kind.h"

namespace anvil {

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status catalog_init(SqliteDb& db) {
  // A new catalog's first switch to WAL takes an exclusive lock without waiting on the busy timeout:
  // two processes creating one store at once see "database is locked". Retried for up to 10 s.
  for (int attempt = 0;; ++attempt) {
    Status st = db.exec("PRAGMA journal_mode=WAL");
    if (st.is_ok()) break;
    if (attempt >= 1000 || st.message().find("locked") == std::string::npos) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ANVIL_RETURN_IF_ERROR(db.exec("PRAGMA synchronous=NORMAL"));
  return db.exec(R"(
    CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS segments(id INTEGER PRIMARY KEY AUTOINCREMENT,
      committed_end INTEGER NOT NULL DEFAULT 0, live_bytes INTEGER NOT NULL DEFAULT 0,
      sealed INTEGER NOT NULL DEFAULT 0, owner_pid INTEGER);
    CREATE TABLE IF NOT EXISTS pages(key BLOB PRIMARY KEY, parent BLOB NOT NULL, fingerprint BLOB NOT NULL,
      first_pos INTEGER NOT NULL, tokens BLOB NOT NULL, segment INTEGER NOT NULL, offset INTEGER NOT NULL,
      length INTEGER NOT NULL, checksum INTEGER NOT NULL, last_used INTEGER NOT NULL) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS pages_lru ON pages(last_used);
    CREATE INDEX IF NOT EXISTS pages_segment ON pages(segment);
    CREATE TABLE IF NOT EXISTS sessions(name TEXT PRIMARY KEY, fingerprint BLOB NOT NULL, tokens BLOB NOT NULL,
      durable_pos INTEGER NOT NULL, tail_segment INTEGER, tail_offset INTEGER, tail_length INTEGER,
      tail_checksum INTEGER, tail_first INTEGER, tail_n INTEGER, tail_parent BLOB,
      updated INTEGER NOT NULL, meta TEXT NOT NULL DEFAULT '', sum INTEGER);
    CREATE INDEX IF NOT EXISTS sessions_tail ON sessions(tail_parent, tail_first);
    CREATE INDEX IF NOT EXISTS sessions_tail_record ON sessions(tail_segment, tail_offset);
    CREATE TABLE IF NOT EXISTS session_pages(session TEXT NOT NULL, idx INTEGER NOT NULL, key BLOB NOT NULL,
      PRIMARY KEY(session, idx)) WITHOUT ROWID;
    CREATE INDEX IF NOT EXISTS session_pages_key ON session_pages(key);
    INSERT OR IGNORE INTO meta VALUES('format_version', ')" +
                 std::to_string(kCatalogVersion) + "');" +
                 // A catalog with no segment yet has nothing to recount (live_bytes_recount_once).
                 "INSERT OR IGNORE INTO meta SELECT 'live_bytes', 'exact' WHERE NOT EXISTS (SELECT 1 FROM segments);");
}

Status catalog_migrate(SqliteDb& db) {
  ANVIL_ASSIGN_OR_RETURN(int64_t v, catalog_int(db, "SELECT CAST(v AS INTEGER) FROM meta WHERE k = 'format_version'"));
  if (v != 1) return Status::ok();
  // Format 1 -> 2, in one transaction (two processes opening it at once: the second finds it done).
  ANVIL_RETURN_IF_ERROR(db.exec("BEGIN IMMEDIATE"));
  auto has = catalog_int(db, "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name = 'sum'");
  Status st = has.status();
  if (st.is_ok() && *has == 0) st = db.exec("ALTER TABLE sessions ADD COLUMN sum INTEGER");
  if (st.is_ok()) st = db.exec("UPDATE meta SET v = '2' WHERE k = 'format_version' AND v = '1'");
  if (st.is_ok()) st = db.commit();
  if (!st.is_ok()) (void)db.exec("ROLLBACK");
  return st;
}

uint64_t session_sum(const int32_t* tokens, size_t n, const std::string& meta) {
  XXH3_state_t* s = XXH3_createState();
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, tokens, n * sizeof(int32_t));
  XXH3_64bits_update(s, meta.data(), meta.size());
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

std::string session_damage(size_t token_bytes, const int32_t* tokens, const std::string& meta, const uint64_t* sum) {
  if (sum) {
    if (token_bytes % 4 != 0 || *sum != session_sum(tokens, token_bytes / 4, meta))
      return "its token ids or conversation fail their checksum";
    return "";
  }
  // Format 1: no checksum; what can be checked is that the row is one anvil could have written.
  if (token_bytes % 4 != 0)
    return "its token ids are cut short: " + std::to_string(token_bytes) +
           " bytes, not a whole number of ids, and its row, of an older store format, has no checksum";
  if (session_kind(meta) == SessionKind::kUnreadable)
    return "its conversation is unreadable: its meta is neither empty nor a conversation as anvil records one, and "
           "its row, of an older store format, has no checksum";
  return "";
}

std::string segment_file(const std::string& dir, int64_t id) {
  char b[32];
  std::snprintf(b, sizeof b, "seg-%08lld.kv", static_cast<long long>(id));
  return dir + "/" + b;
}

bool parse_segment_file(const std::string& name, int64_t* id) {
  if (name.size() != 15 || name.compare(0, 4, "seg-") != 0 || name.compare(12, 3, ".kv") != 0) return false;
  char* end = nullptr;
  *id = std::strtoll(name.c_str() + 4, &end, 10);
  return end == name.c_str() + 12;
}

Result<NewSegment> segment_create(SqliteDb& db, Env* env, const std::string& dir) {
  SqliteStmt ins;
  ANVIL_RETURN_IF_ERROR(ins.prepare(db, "INSERT INTO segments(committed_end, live_bytes, sealed, owner_pid) VALUES(0,0,0,?)"));
  ins.bind(1, int64_t(::getpid()));
  ANVIL_RETURN_IF_ERROR(ins.run());
  NewSegment s;
  s.id = sqlite3_last_insert_rowid(db.handle());
  const std::string path = segment_file(dir, s.id);
  ANVIL_ASSIGN_OR_RETURN(s.file, env->open_append(path));
  if (!s.file->try_lock()) return io_error(path + ": a new segment is locked by another process");
  if (s.file->size() != 0) ANVIL_RETURN_IF_ERROR(s.file->truncate(0));  // a stale file of a lost row
  ANVIL_RETURN_IF_ERROR(env->sync_dir(dir));
  return s;
}

Result<int64_t> catalog_int(SqliteDb& db, const std::string& sql) {
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(q.prepare(db, sql));
  ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
  return row ? q.col_int(0) : int64_t(0);
}

Result<int64_t> catalog_live_bytes(SqliteDb& db) {
  return catalog_int(db, "SELECT COALESCE(SUM(live_bytes), 0) FROM segments");
}

namespace {

// Session rows that reference the tail record at (seg, off).
Result<int64_t> tail_refs(SqliteDb& db, int64_t seg, int64_t off) {
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(q.prepare(db, "SELECT COUNT(*) FROM sessions WHERE tail_segment = ? AND tail_offset = ? AND "
                                      "tail_length > 0"));
  q.bind(1, seg);
  q.bind(2, off);
  ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
  return row ? q.col_int(0) : int64_t(0);
}

Status add_live(SqliteDb& db, int64_t seg, int64_t delta) {
  SqliteStmt u;
  ANVIL_RETURN_IF_ERROR(u.prepare(db, "UPDATE segments SET live_bytes = MAX(0, live_bytes + ?) WHERE id = ?"));
  u.bind(1, delta);
  u.bind(2, seg);
  return u.run();
}

// Per segment: its recorded live_bytes and the bytes its rows reference (pages, then each distinct
// tail record once).
constexpr const char* kLiveSql =
    "SELECT s.id, s.live_bytes, "
    "(SELECT COALESCE(SUM(p.length), 0) FROM pages p WHERE p.segment = s.id) + "
    "(SELECT COALESCE(SUM(t.len), 0) FROM (SELECT DISTINCT tail_offset, tail_length AS len FROM sessions "
    "WHERE tail_segment = s.id AND tail_length > 0) t) FROM segments s";

}  // namespace

Status tail_ref_added(SqliteDb& db, int64_t seg, int64_t off, int64_t len) {
  ANVIL_ASSIGN_OR_RETURN(int64_t n, tail_refs(db, seg, off));
  return n == 1 && len > 0 ? add_live(db, seg, len) : Status::ok();
}

Status tail_ref_dropped(SqliteDb& db, int64_t seg, int64_t off, int64_t len) {
  ANVIL_ASSIGN_OR_RETURN(int64_t n, tail_refs(db, seg, off));
  return n == 0 && len > 0 ? add_live(db, seg, -len) : Status::ok();
}

Result<std::vector<LiveMismatch>> live_bytes_mismatches(SqliteDb& db) {
  std::vector<LiveMismatch> out;
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(q.prepare(db, kLiveSql));
  while (true) {
    ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
    if (!row) break;
    if (q.col_int(1) != q.col_int(2)) out.push_back({q.col_int(0), q.col_int(1), q.col_int(2)});
  }
  return out;
}

Result<int64_t> live_bytes_recount(SqliteDb& db) {
  {
    ANVIL_ASSIGN_OR_RETURN(auto m, live_bytes_mismatches(db));
    if (m.empty()) return int64_t(0);
  }
  ANVIL_RETURN_IF_ERROR(db.exec("BEGIN IMMEDIATE"));
  auto m = live_bytes_mismatches(db);  // again, now that no other writer runs
  Status s = m.status();
  for (size_t i = 0; s.is_ok() && i < m->size(); ++i)
    s = db.exec("UPDATE segments SET live_bytes = " + std::to_string((*m)[i].referenced) + " WHERE id = " +
                std::to_string((*m)[i].segment));
  if (s.is_ok()) s = db.commit();
  if (!s.is_ok()) {
    (void)db.exec("ROLLBACK");
    return s;
  }
  return int64_t(m->size());
}

Result<int64_t> live_bytes_recount_once(SqliteDb& db) {
  ANVIL_ASSIGN_OR_RETURN(int64_t done, catalog_int(db, "SELECT COUNT(*) FROM meta WHERE k = 'live_bytes' AND v = 'exact'"));
  if (done) return int64_t(0);
  ANVIL_ASSIGN_OR_RETURN(int64_t fixed, live_bytes_recount(db));
  ANVIL_RETURN_IF_ERROR(db.exec("INSERT OR REPLACE INTO meta VALUES('live_bytes', 'exact')"));
  return fixed;
}

Result<int64_t> evict_lru(SqliteDb& db, uint64_t target, const std::function<bool(const Hash128&)>& pinned) {
  ANVIL_ASSIGN_OR_RETURN(int64_t live, catalog_live_bytes(db));
  if (uint64_t(live) <= target) return int64_t(0);
  SqliteStmt sel, del, seg;
  constexpr int kBatch = 1024;
  ANVIL_RETURN_IF_ERROR(sel.prepare(db,
      "SELECT key, segment, length FROM pages WHERE NOT EXISTS (SELECT 1 FROM session_pages sp WHERE sp.key = "
      "pages.key) ORDER BY last_used LIMIT " + std::to_string(kBatch)));
  ANVIL_RETURN_IF_ERROR(del.prepare(db, "DELETE FROM pages WHERE key = ?"));
  ANVIL_RETURN_IF_ERROR(seg.prepare(db, "UPDATE segments SET live_bytes = live_bytes - ? WHERE id = ?"));
  struct Victim {
    Hash128 key;
    int64_t seg, len;
  };
  int64_t evicted = 0;
  // A batch of the least recently used at a time, each in a transaction of its own, until the live
  // bytes are under the target or nothing evictable is left (a batch of pinned pages only).
  while (uint64_t(live) > target) {
    std::vector<Victim> victims;
    int64_t freed = 0;
    int seen = 0;
    while (true) {
      ANVIL_ASSIGN_OR_RETURN(bool row, sel.step());
      if (!row) break;
      ++seen;
      Victim v{sel.col_hash(0), sel.col_int(1), sel.col_int(2)};
      if (pinned(v.key)) continue;
      victims.push_back(v);
      freed += v.len;
      if (uint64_t(live - freed) <= target) break;
    }
    sel.reset();
    if (victims.empty()) break;
    ANVIL_RETURN_IF_ERROR(db.exec("BEGIN IMMEDIATE"));
    for (const Victim& v : victims) {
      del.bind(1, v.key);
      Status s = del.run();
      if (s.is_ok() && sqlite3_changes(db.handle()) == 1) {  // another process may have evicted it already
        seg.bind(1, v.len);
        seg.bind(2, v.seg);
        s = seg.run();
      }
      if (!s.is_ok()) {
        (void)db.exec("ROLLBACK");
        return s;
      }
    }
    ANVIL_RETURN_IF_ERROR(db.commit());
    evicted += int64_t(victims.size());
    if (seen < kBatch) break;  // that was every candidate
    ANVIL_ASSIGN_OR_RETURN(live, catalog_live_bytes(db));
  }
  return evicted;
}

Result<int64_t> compact_segments(SqliteDb& db, Env* env, const std::string& dir, const std::set<int64_t>& own) {
  int64_t reclaimed = 0;
  struct Seg {
    int64_t id, end, live;
  };
  std::vector<Seg> segs;
  {
    SqliteStmt q;
    ANVIL_RETURN_IF_ERROR(q.prepare(db, "SELECT id, committed_end, live_bytes FROM segments WHERE sealed = 1"));
    while (true) {
      ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      Seg s{q.col_int(0), q.col_int(1), q.col_int(2)};
      if (!own.count(s.id) && s.live * 2 <= s.end) segs.push_back(s);
    }
  }
  std::unique_ptr<AppendFile> out;
  int64_t out_id = 0;
  std::vector<uint8_t> buf;
  for (const Seg& sg : segs) {
    const std::string path = segment_file(dir, sg.id);
    // Live records of this segment: pages, and session tail records (each once, however many
    // session rows share it: a fork shares its parent's).
    struct Rec {
      bool tail;
      Hash128 key;  // page
      int64_t off, len, sum;
    };
    std::vector<Rec> recs;
    {
      SqliteStmt q;
      ANVIL_RETURN_IF_ERROR(q.prepare(db, "SELECT key, offset, length, checksum FROM pages WHERE segment = ?"));
      q.bind(1, sg.id);
      while (true) {
        ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
        if (!row) break;
        recs.push_back({false, q.col_hash(0), q.col_int(1), q.col_int(2), q.col_int(3)});
      }
      SqliteStmt t;
      ANVIL_RETURN_IF_ERROR(t.prepare(db,
          "SELECT DISTINCT tail_offset, tail_length, tail_checksum FROM sessions WHERE tail_segment = ? AND "
          "tail_length > 0"));
      t.bind(1, sg.id);
      while (true) {
        ANVIL_ASSIGN_OR_RETURN(bool row, t.step());
        if (!row) break;
        recs.push_back({true, {}, t.col_int(0), t.col_int(1), t.col_int(2)});
      }
    }
    struct Moved {
      Rec r;
      int64_t new_off;
    };
    std::vector<Moved> moved;
    if (!recs.empty()) {
      auto rf = env->open_read(path);
      if (!rf.is_ok()) continue;  // missing file: its rows are misses; verify reports them
      if (!out) {
        ANVIL_ASSIGN_OR_RETURN(NewSegment ns, segment_create(db, env, dir));
        out = std::move(ns.file);
        out_id = ns.id;
      }
      for (const Rec& r : recs) {
        buf.resize(size_t(r.len));
        if (!(*rf)->read_at(uint64_t(r.off), buf.data(), buf.size()).is_ok()) continue;
        if (int64_t(record_checksum(buf.data(), buf.size())) != r.sum) continue;  // corrupt: not carried over
        int64_t new_off = int64_t(out->size());
        ANVIL_RETURN_IF_ERROR(out->append(buf.data(), buf.size()));
        moved.push_back({r, new_off});
      }
      ANVIL_RETURN_IF_ERROR(out->sync());
    }
    ANVIL_RETURN_IF_ERROR(db.exec("BEGIN IMMEDIATE"));
    SqliteStmt up_page, up_tail, del_seg, add_live, end_seg;
    Status s = up_page.prepare(db, "UPDATE pages SET segment = ?, offset = ? WHERE key = ? AND segment = ? AND offset = ?");
    if (s.is_ok()) s = up_tail.prepare(db, "UPDATE sessions SET tail_segment = ?, tail_offset = ? WHERE tail_segment = ? AND tail_offset = ?");
    if (s.is_ok()) s = add_live.prepare(db, "UPDATE segments SET live_bytes = MAX(0, live_bytes + ?) WHERE id = ?");
    if (s.is_ok()) s = end_seg.prepare(db, "UPDATE segments SET committed_end = ? WHERE id = ?");
    for (const Moved& m : moved) {
      if (!s.is_ok()) break;
      // Moved only where the row still references the old record (another process may have
      // evicted, removed or moved it meanwhile); its bytes then move from one segment's live_bytes
      // to the other's, once per record (a shared tail's rows all move together).
      int b = 1;
      SqliteStmt& u = m.r.tail ? up_tail : up_page;
      u.bind(b++, out_id);
      u.bind(b++, m.new_off);
      if (!m.r.tail) u.bind(b++, m.r.key);
      u.bind(b++, sg.id);
      u.bind(b++, m.r.off);
      s = u.run();
      if (s.is_ok() && sqlite3_changes(db.handle()) >= 1) {
        add_live.bind(1, m.r.len);
        add_live.bind(2, out_id);
        s = add_live.run();
        if (s.is_ok()) {
          add_live.bind(1, -m.r.len);
          add_live.bind(2, sg.id);
          s = add_live.run();
        }
      }
    }
    if (s.is_ok() && out) {
      end_seg.bind(1, int64_t(out->size()));
      end_seg.bind(2, out_id);
      s = end_seg.run();
    }
    // The old segment goes only when nothing references it any more (a concurrent writer cannot
    // add to a sealed segment, but a concurrent compactor may have moved rows already).
    int64_t left = 0;
    if (s.is_ok()) {
      auto a = catalog_int(db, "SELECT (SELECT COUNT(*) FROM pages WHERE segment = " + std::to_string(sg.id) +
                                   ") + (SELECT COUNT(*) FROM sessions WHERE tail_segment = " + std::to_string(sg.id) + ")");
      s = a.status();
      if (s.is_ok()) left = *a;
    }
    if (s.is_ok() && left == 0) s = db.exec("DELETE FROM segments WHERE id = " + std::to_string(sg.id));
    if (!s.is_ok()) {
      (void)db.exec("ROLLBACK");
      return s;
    }
    ANVIL_RETURN_IF_ERROR(db.commit());
    if (left == 0) {
      auto size = env->file_size(path);
      if (env->remove(path).is_ok()) reclaimed += size.is_ok() ? int64_t(*size) : sg.end;
    }
  }
  if (out) {
    ANVIL_RETURN_IF_ERROR(db.exec("UPDATE segments SET sealed = 1 WHERE id = " + std::to_string(out_id)));
    reclaimed -= int64_t(out->size());
  }
  // Orphans: segment files with no catalog row (their rows were lost with a deleted catalog, or
  // their creation never committed) that no live process holds.
  ANVIL_ASSIGN_OR_RETURN(auto names, env->list_dir(dir));
  for (const std::string& n : names) {
    int64_t id;
    if (!parse_segment_file(n, &id) || own.count(id) || id == out_id) continue;
    ANVIL_ASSIGN_OR_RETURN(int64_t known, catalog_int(db, "SELECT COUNT(*) FROM segments WHERE id = " + std::to_string(id)));
    if (known) continue;
    const std::string path = dir + "/" + n;
    if (env->locked_by_other(path)) continue;
    auto size = env->file_size(path);
    if (env->remove(path).is_ok() && size.is_ok()) reclaimed += int64_t(*size);
  }
  ANVIL_RETURN_IF_ERROR(env->sync_dir(dir));
  return reclaimed;
}

}  // namespace anvil
