// The store's SQLite catalog: schema, segment bookkeeping, LRU eviction and segment compaction.
// Shared by the writer thread (its own connection) and by maintenance (anvil kv, on the caller's
// connection). Every multi-row change is one transaction (BEGIN IMMEDIATE: two processes serialize
// on SQLite's lock, waiting up to the busy timeout).
//
// Tables
//   segments(id, committed_end, live_bytes, sealed, owner_pid)   one row per segment file
//     live_bytes: the bytes of the distinct records of the segment that rows reference: every
//     page row's length, plus each session tail record's length once however many session rows
//     share it (a fork shares its parent's tail). Every change of a reference changes it in the
//     same transaction (the writer's commit, evict_lru, compact_segments, remove_session,
//     fork_session adds a reference to a record already counted); live_bytes_recount repairs a
//     catalog that drifted (an older anvil's, or a bug), kv verify reports one.
//   pages(key, parent, fingerprint, first_pos, tokens, segment, offset, length, checksum, last_used)
//   sessions(name, fingerprint, tokens, durable_pos, tail_*, updated, meta, sum)
//     sum: XXH3-64 of the tokens blob then meta (session_sum), so a damaged row is an error, never
//     another conversation (format 2; rows of format 1 have none: their meta must at least be of
//     a kind anvil writes, session_damage)
//   session_pages(session, idx, key)   the full pages a session references (never evicted)
//   meta(k, v)                         format_version; live_bytes = 'exact' (live_bytes_recount_once)
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kvstore/env.h"
#include "kvstore/sqlite_db.h"

namespace anvil {

// 2: sessions.sum. A catalog of format 1 is brought to 2 when opened (the column added; its rows
// keep a NULL sum until they are next written).
inline constexpr int kCatalogVersion = 2;

// WAL, synchronous=NORMAL, the tables (idempotent), and format 1 brought to 2.
Status catalog_init(SqliteDb& db);

// Brings a catalog of format 1 to 2 (idempotent; nothing for other formats).
Status catalog_migrate(SqliteDb& db);

// A session row's checksum: XXH3-64 over its token ids' bytes, then its meta text.
uint64_t session_sum(const int32_t* tokens, size_t n, const std::string& meta);

// Why a session row is damaged, or "" when it is sound (invariant 8 of kvstore.h): its checksum
// fails (format 2), or, a row of format 1 having none, its token ids are cut mid-id or its meta is
// of no kind anvil writes (session_kind.h): such a meta is what a damaged row of that format looks
// like, never a session to continue or overwrite. A few words, naming neither session nor store.
// `sum`: the row's checksum, nullptr when it has none.
std::string session_damage(size_t token_bytes, const int32_t* tokens, const std::string& meta, const uint64_t* sum);

std::string segment_file(const std::string& dir, int64_t id);
bool parse_segment_file(const std::string& name, int64_t* id);

// A new segment of this process: a catalog row, the file created and flocked.
struct NewSegment {
  int64_t id = 0;
  std::unique_ptr<AppendFile> file;
};
Result<NewSegment> segment_create(SqliteDb& db, Env* env, const std::string& dir);

Result<int64_t> catalog_int(SqliteDb& db, const std::string& sql);
// Bytes of live records (pages and session tails).
Result<int64_t> catalog_live_bytes(SqliteDb& db);

// A session row now references the tail record (seg, off) of `len` bytes (call after the row was
// written): counted in live_bytes when it is the record's only reference.
Status tail_ref_added(SqliteDb& db, int64_t seg, int64_t off, int64_t len);
// A session row no longer references the tail record (seg, off) (call after the row was changed or
// deleted): its bytes leave live_bytes when no other row references it.
Status tail_ref_dropped(SqliteDb& db, int64_t seg, int64_t off, int64_t len);

// A segment whose recorded live_bytes differs from the bytes its rows reference.
struct LiveMismatch {
  int64_t segment = 0, recorded = 0, referenced = 0;
};
// Every such segment, read in the caller's snapshot (one statement).
Result<std::vector<LiveMismatch>> live_bytes_mismatches(SqliteDb& db);
// Sets every segment's live_bytes to the bytes its rows reference, in one transaction when any
// differs (a read only when none does). Returns the segments corrected.
Result<int64_t> live_bytes_recount(SqliteDb& db);
// live_bytes_recount, once per catalog: meta('live_bytes', 'exact') marks a catalog this accounting
// has kept since (a new one, or one recounted); older anvils do not clear it, so a catalog one of
// them wrote to since is recounted by gc (and reported by verify) instead. Returns the segments
// corrected.
Result<int64_t> live_bytes_recount_once(SqliteDb& db);

// Deletes the least recently used pages that no session references and `pinned` does not claim,
// in batches (a transaction each), until the live bytes are <= target or no such page is left.
// Returns the pages evicted.
Result<int64_t> evict_lru(SqliteDb& db, uint64_t target, const std::function<bool(const Hash128&)>& pinned);

// Rewrites the live records of sealed segments that are at most half live into a new segment and
// removes the old files; removes segment files the catalog does not know and no process holds.
// Returns the bytes reclaimed on disk.
Result<int64_t> compact_segments(SqliteDb& db, Env* env, const std::string& dir, const std::set<int64_t>& own);

int64_t now_us();

}  // namespace anvil
