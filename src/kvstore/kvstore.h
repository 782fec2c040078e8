// The durable KV store: every full KV page (and a session's partial tail page) persisted during
// decode at ~zero cost to the decode thread, keyed by its chain key, restorable after a restart.
//
// On disk (one directory, shared by any number of processes):
//   catalog.db      SQLite, WAL, synchronous=NORMAL: pages, segments, sessions, session_pages, meta
//   seg-NNNNNNNN.kv append-only segment files of page records (page_record.h: safetensors blobs)
//   reserve         4 MiB kept free for remove_session / gc on a full disk (kReserveBytes)
//   locks/          one lock file per claimed session name (claim_session)
//
// Invariants
//  1. Data before metadata: a catalog row references only segment bytes that were fdatasynced
//     before the transaction that inserted it committed (durability none skips the sync, and says
//     so). A segment's committed_end covers exactly the bytes some committed row may reference.
//  2. Segments are append-only while open, and each is written by exactly one process, which holds
//     its flock for as long as it appends. Bytes past committed_end belong to no one: recovery
//     (KVStore::open -> recover_segments) truncates them in every segment whose owner is gone.
//  3. A record is trusted only after three checks: the catalog's XXH3 of the record, the record's
//     own XXH3 of its data, and its metadata (fingerprint, key, parent, token ids) equal to what the
//     reader expected. A failed check is a miss (counted), never an error and never wrong KV.
//     A restore that fails at a record of its run checks every later record of the run too (they
//     are recomputed either way) and hands each bad row to the writer, whose next commit deletes
//     it: the recomputed pages are then stored again rather than deduplicated against damaged rows
//     (invariant 6), so one resume heals a session and its durable position counts no page known
//     bad. Sound rows past the first bad one are kept (another session may use them).
//  4. The decode thread never allocates, does I/O or touches SQLite for the store: page_full and
//     session_note take a mutex, retain the pool page and write a descriptor into a preallocated
//     ring. Only a named session may block it (back-pressure, counted in decode_blocked_ns); an
//     anonymous page that finds the ring full is dropped (counted). The engine offers a dropped
//     page again (page_offer) while the prefix index still holds it, once the ring is at most half
//     full, and before the store is detached; a page evicted before that is a future miss.
//  5. A pool page handed to the writer is retained until the writer has copied it to staging; the
//     decode thread takes it back in reap(). Full pages are immutable, and of a session's tail the
//     writer copies only the rows below the tail's fill mark, which are never written again.
//  6. A page key is stored once: the writer skips keys the catalog already has (INSERT OR IGNORE
//     covers two processes racing), so bytes written track unique KV.
//  7. Eviction (LRU under max_bytes) removes only pages that no session references and no reader of
//     this process has pinned; compaction moves live records out of mostly-dead sealed segments
//     before deleting them. A reader that loses a race with another process's GC gets a miss.
//     The order, and why: a session is what a user asked to keep, by name (kv rm gives it up); an
//     anonymous page is a cache of a prompt that may never come again. So anonymous pages go first,
//     least recently used first, in batches until the cap is met; a saved session's pages and tail
//     are never evicted, whether it is idle, claimed (anvil run between turns, a server request from
//     its validation) or being recorded, here or in another process. A recording's pages are
//     referenced from the transaction that commits them: the writer rewrites the session's row (its
//     tokens so far, its session_pages) in the commit that inserts a page of it, or that follows the
//     dedup of one against a stored page, not only once a tail note comes (every flush interval, so
//     never during a long prefill), since until then they were the catalog's oldest unreferenced
//     pages, this process's and any other's first victims. Until the recording's first tail note,
//     such a row keeps the tail it had (a resumed session's) where the recording's tokens begin with
//     all the tokens that tail is the KV of: its own, and before them those of its parent chain key
//     (tokens equal across the tail's positions alone may follow another prefix, as after anvil
//     run's dropped turns; that tail was kept, counted durable and exported as the session's KV).
//     What eviction cannot take may alone exceed the cap: the store then stays over it (the
//     documented exception), the writer says so on stderr once each time it happens
//     (over_cap_warnings), and kv gc reports its live bytes; removing sessions frees it. Left open:
//     a recording's page deduplicated against an anonymous page that another process evicts before
//     the flush that references it (one flush interval) is recomputed on resume.
//     verify, which reads rows in batches while a GC or a writer may run, reads again a row whose
//     record fails its checks and reports it only when the catalog still has that row unchanged
//     (compaction commits the moved rows before it deletes the old file).
//  8. A session's row (its token ids: the truth; KV is a cache of them) and its durable position
//     (tokens whose KV is committed for every layer) are rewritten at every flush, with the XXH3 of
//     its token ids and conversation (catalog format 2): a row that fails it is an error naming the
//     session (get_session, verify), never another conversation resumed. A row of format 1 (no
//     checksum) whose meta is of no kind anvil writes (session_kind.h) is damaged alike; every
//     reader (get_session, find_session, list_sessions, verify) says so by session_damage. A commit
//     that fails (a full disk fails SQLite's COMMIT) rolls the row and its page references back with
//     the batch's pages (lost: recomputed on resume), and the writer's account of the recording
//     with them (its committed leading pages, the references its row has: Writer::uncommitted_):
//     the next commit writes every reference again and counts durable only pages the catalog has.
//     (It kept both as if committed: the session's pages stayed unreferenced, evictable while it
//     was recorded, and its durable position, reported as saved, counted pages never stored.)
//  9. Any number of sessions may be recorded at once (the server records one per running request),
//     each under a distinct name and bound to at most one engine sequence at a time; a recording
//     lives from session_begin until session_finish has seen its last state committed. Across
//     processes a name is claimed first (claim_session: the flock of locks/<hash of the name>.lock,
//     held until session_finish or release_session), so two processes never record one session at
//     once. Whoever reads a session to continue it claims it before reading (anvil generate/run,
//     the server at a request's validation), so what it continues is what is committed; and
//     remove_session claims it too, so a session another process records is never removed under
//     it (a recording would write the row back, without the page references it wrote before).
// 10. A segment's live_bytes is the bytes of its distinct records that rows reference: every page
//     row's record, and every session tail record once however many session rows share it (a fork
//     shares its parent's). Whatever adds or drops a reference changes it in the same transaction:
//     the writer's commit (a new page; a session row's new tail, or its old tail let go when no
//     other row shares it, also when the new row has none), evict_lru and drop_bad_rows (a deleted
//     page), compact_segments (bytes moved from the old segment to the new, a shared tail once),
//     remove_session (its tail, unless a fork shares it); fork_session only adds a reference to a
//     record already counted. The size cap and compaction go by it. kv verify reports a segment
//     whose count disagrees; gc recounts it, and so does the first writer to start on a catalog
//     not marked as kept by this accounting (an older anvil's: live_bytes_recount_once).
// 11. A full page that the writer took but could not store (its append or fdatasync failed, or
//     the catalog commit of its batch: a full disk, an I/O error) is not lost for good: the writer
//     lists it (pages_failed: its pool page, chain key and position) and the engine takes the list
//     (take_failed) and offers each page again, as a dropped one (invariant 4), while its prefix
//     index still holds it under that key. The list is handed over once a later commit has stored
//     a page (the disk works again), or retry_ms after the last failure, doubled at each retry that
//     fails again up to 64 times (a disk that stays full is tried ever less often, never at every
//     step), and all of it before the store is detached
//     (Engine::persist_dropped). Nothing is counted durable before its own commit succeeds (a
//     session's durable position counts catalog rows only, invariant 8), and the list is bounded
//     by the pool's pages. A page evicted from the prefix index meanwhile is forgotten (a future
//     miss, recomputed and then stored), as a dropped one is. An owner that runs no step for a
//     while (an idle server) waits for failed_ready_at, woken by set_failed_listener's call when
//     pages fail or the store recovers, and offers them then, without a request.
//     Not retried, by design: (a) a session tail whose append failed. A tail is a partial page the
//     recording's sequence still writes: a later tail note of the recording (every flush interval)
//     supersedes it, and the final one (session_close) is of a sequence released right after,
//     whose partial page is in no prefix index, so its KV is gone from the pool and nothing is
//     left to write again; the session's token ids (the truth) are in its row (or session_finish
//     reports that the row did not commit), its durable position stops at its last stored page,
//     and a resume recomputes the tail's < page-size tokens. (b) A page whose copy off the device
//     failed (copy_failed): on the CPU the copy is a memcpy that cannot fail; CUDA's copier
//     (cuda_page_copy.cpp) keeps the first error of its device->host stream and returns it for
//     every later copy, so a retry could never succeed in this process (nor could any other page's
//     write: the store stops storing, said once on stderr, counted in write_errors). The page
//     stays a miss, recomputed and stored by the next process.
//
// A page's life (the function behind each transition):
//
//   [full in pool] --page_full--> enqueued --Writer::write_page--> written (appended, in the OS cache)
//        enqueued --(ring full, not a session)--> dropped          |
//        dropped --page_offer (ring half empty, still indexed)--> enqueued
//        written/synced --(append, sync or COMMIT failed)--> failed --take_failed + page_offer--> enqueued
//                                                                  v  Writer::flush: fdatasync
//                                   committed <--Writer::flush: COMMIT-- synced
//                                       |  ^  restore_pages: read, check, install in the pool (pinned)
//                                       v
//                 evicted (row deleted) --compact_segments--> reclaimed (segment rewritten/removed)
//        (Writer::evict_lru under max_bytes, of unreferenced pages only: a page of a session being
//         recorded is referenced by the commit that inserts it; KVStore::remove_session makes pages
//         unreferenced)
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "kvstore/env.h"
#include "kvstore/page_record.h"
#include "kvstore/sqlite_db.h"
#include "runtime/page_store.h"

struct XXH3_state_s;  // xxhash.h's streaming state

namespace anvil {

enum class Durability { kNone, kInterval, kSync };
Result<Durability> parse_durability(const std::string& s);

// The writer queue's largest capacity: its ring of descriptors and their tokens is allocated whole.
inline constexpr int kMaxKVQueuePages = 65536;

struct KVStoreOptions {
  std::string dir;
  uint64_t max_bytes = 8ull << 30;     // size cap; LRU eviction of unreferenced pages above it (invariant 7)
  Durability durability = Durability::kInterval;
  int flush_ms = 100;                  // interval durability: flush at least this often ...
  int flush_pages = 64;                // ... or after this many records
  int queue_pages = 256;               // ring capacity (descriptors)
  uint64_t segment_bytes = 256ull << 20;
  // The writer has the disk start on appended bytes (AppendFile::start_writeback) each time this
  // many have accumulated, so the flush's fdatasync waits for less (0: never; durability none never).
  uint64_t writeback_bytes = 1ull << 20;
  int busy_timeout_ms = 10000;         // SQLite lock wait (two processes on one store)
  // Full pages whose write or catalog commit failed (a full disk) are handed back to the engine to
  // offer again (take_failed, invariant 11) once a later commit has stored a page (the writer
  // recovered), or this long after the last failure; while it lasts, each retry doubles the wait
  // (up to 64 times this), so a disk that stays full is tried ever less often.
  int retry_ms = 1000;
  // A corrupt catalog: true (engines, for which the store is a cache) moves it aside and starts an
  // empty one; false (anvil kv, which inspects) returns the error and changes nothing.
  bool repair = true;
  Env* env = nullptr;                  // nullptr: the real file system
};

// Always on; --profile prints them.
struct KVStoreCounters {
  std::atomic<int64_t> pages_enqueued{0}, pages_written{0}, pages_deduped{0}, pages_dropped{0};
  std::atomic<int64_t> pages_reoffered{0};  // dropped pages queued again by page_offer
  std::atomic<int64_t> pages_failed{0};     // full pages a failed write or commit lost (take_failed)
  std::atomic<int64_t> tails_written{0}, bytes_written{0}, fsyncs{0}, transactions{0}, write_errors{0};
  std::atomic<int64_t> queue_high_water{0}, writer_busy_ns{0}, decode_blocked_ns{0};
  std::atomic<int64_t> sync_ns{0}, commit_ns{0};  // of writer_busy_ns: in fdatasync, in catalog commits
  std::atomic<int64_t> restored_pages{0}, restored_bytes{0}, restore_misses{0}, restore_corrupt{0};
  std::atomic<int64_t> restore_ns{0}, pages_evicted{0};
  // Times the writer found the store over its cap with nothing left to evict (warned on stderr).
  std::atomic<int64_t> over_cap_warnings{0};
};

struct SessionInfo {
  std::string name;
  Hash128 fingerprint;
  std::vector<int32_t> tokens;
  int durable_pos = 0;
  int tail_first = 0, tail_n = 0;
  int64_t updated_us = 0;
  std::string meta;  // free-form: what anvil writes is "" or a conversation (session_kind.h)
  // find_session/list_sessions only: not empty when the row is damaged (invariant 8): why, in a few
  // words naming neither the session nor the store's path (session_damage of catalog.h; the server
  // shows it to its clients). Its tokens and meta are then empty (never trusted); kv verify reports
  // it, kv rm removes it.
  std::string damaged;
};

struct StoreStats {
  int64_t pages = 0, page_bytes = 0, sessions = 0, segments = 0, segment_file_bytes = 0;
  int64_t live_bytes = 0;  // what the size cap goes by: page records and session tails (invariant 10)
};

class KVStore : public PageStore {
 public:
  // Opens (creating) the store and recovers it: see invariant 2 (a recovery step that fails, as on
  // a full disk, is reported and left for a later open). A corrupt catalog is moved aside and a
  // fresh one started (every page becomes a miss), or with repair off returned as an error.
  static Result<std::unique_ptr<KVStore>> open(const KVStoreOptions& opts);
  ~KVStore() override;  // flushes and stops the writer

  // Binds the store to one model's KV layout and starts the writer thread. `fingerprint` is the
  // engine's cache root (kv_cache_root: every weight byte, the config, KV dtype, page size, layout).
  Status attach(Backend& backend, const KVCacheView& layout, const Hash128& fingerprint);
  // Blocks until every descriptor queued so far is committed (or failed).
  void flush() override;

  // ---- PageStore ----
  const Hash128& fingerprint() const override { return fingerprint_; }
  bool page_full(int seq, const Hash128& key, const Hash128& parent, int first_pos, std::span<const int32_t> tokens,
                 int32_t page, KVPool& pool) override;
  bool page_offer(const Hash128& key, const Hash128& parent, int first_pos, std::span<const int32_t> tokens,
                  int32_t page, KVPool& pool) override;
  int restore_pages(std::span<const int32_t> tokens, int first, const Hash128& parent, int max_pages, KVPool& pool,
                    std::vector<int32_t>* pages, std::vector<Hash128>* keys) override;
  int restore_tail(std::span<const int32_t> tokens, int first_pos, const Hash128& parent, int max_tokens,
                   KVPool& pool, int32_t* page) override;
  std::vector<std::vector<int32_t>> recent_prefixes(size_t max_pages) override;
  void take_failed(bool all, const std::function<void(int32_t, const Hash128&, int)>& f) override;
  // When full pages wait in the failed list (invariant 11): the time take_failed(false) hands them
  // over (it may have passed); nullopt when none wait. Any thread.
  std::optional<std::chrono::steady_clock::time_point> failed_ready_at();
  // Called by the writer thread, holding none of the store's locks, each time pages join the failed
  // list or the store recovers while some wait: so that an owner with nothing else to do (an idle
  // server) can wait for failed_ready_at and offer them again without a step. Keep it short; it must
  // not call into the store's writer-side (flush, session_finish). nullptr: none.
  void set_failed_listener(std::function<void()> f);
  void reap(KVPool& pool, bool wait) override;
  bool reap_for(KVPool& pool, std::chrono::milliseconds max_wait) override;

  // ---- sessions ----
  Result<std::optional<SessionInfo>> get_session(const std::string& name);
  // Session `name` as list_sessions lists it: a damaged row (session_damage) is no error here but a
  // SessionInfo with `damaged` set (its fingerprint, durable position and update time read, which
  // the checksum does not cover; its tokens and meta left empty), nothing in the catalog changed.
  // For a caller that must tell a damaged session from a missing one (the server's requests).
  // get_session returns such a row as an error (kCorrupt) naming the store, the session and kv rm.
  Result<std::optional<SessionInfo>> find_session(const std::string& name);
  // Every session, by name; one whose row fails its checksum is listed too, with `damaged` set.
  std::vector<SessionInfo> list_sessions();
  // Copies session `from` (its tokens, tail and page references) to a new session `to`.
  Status fork_session(const std::string& from, const std::string& to);
  // Removes session `name` (its row and page references; gc evicts the pages). Refused (kBusy)
  // while it is being recorded, here or by another process: it claims the name first (invariant
  // 9), so a recording elsewhere cannot write the row back at its next flush. A claim this store
  // already holds (claim_session) is kept.
  Status remove_session(const std::string& name);
  // The reserve: kReserveBytes of dir/reserve, made when a store is opened (where there is room),
  // given up when remove_session or gc finds the disk full, so that freeing space never needs space
  // (SQLite's log grows before a delete commits); made again afterwards.
  static constexpr uint64_t kReserveBytes = 4ull << 20;
  // Claims session `name` for this store (invariant 9): refused (kBusy) while another process has
  // claimed it. A caller that reads the session before recording it claims it first, so that no
  // other process changes it in between, and holds it until release_session or the store closes:
  // anvil generate/run (across anvil run's turns), and the server from a request's validation to the
  // end of its turn. session_begin claims a name not claimed yet, and session_finish lets that claim
  // go; a claim taken here outlives the recording until release_session.
  Status claim_session(const std::string& name);
  void release_session(const std::string& name);
  // Starts recording sequence `seq` as session `name`, whose tokens so far are `tokens` (max_tokens
  // bounds its length: the token buffer is allocated here, not on the decode path). Refused while
  // `name` is already being recorded, here or by another process (kBusy), or `seq` already records
  // another session (invariant 9).
  Status session_begin(const std::string& name, int seq, std::span<const int32_t> tokens, int max_tokens,
                       const std::string& meta = "");
  // Decode thread, after each token of sequence `seq`: records it and, once per flush interval,
  // queues the tail page (pool page `tail_page` holding positions [n_kv - n_kv % P, n_kv)). A
  // sequence that records no session is ignored.
  void session_note(int seq, std::span<const int32_t> new_tokens, int n_kv, int32_t tail_page, KVPool& pool);
  // Moves session `name`'s recording to sequence `seq` (-1: detached, as while its request is
  // preempted; its tokens are kept and recording continues once it is bound again).
  Status session_rebind(const std::string& name, int seq);
  // Decode thread: queues the session's final tail (blocking on a full ring rather than lose it)
  // and stops taking notes; the sequence may be released right after. Never waits for the disk.
  Status session_close(const std::string& name, int n_kv, int32_t tail_page, KVPool& pool);
  // Any thread, after session_close: sets the session's meta (when not empty), waits until its
  // last state is committed and forgets the recording. Returns the durable position, or an error
  // naming the session when its last state could not be committed (a full disk: its row in the
  // catalog then holds an earlier state, or none).
  Result<int> session_finish(const std::string& name, const std::string& meta = "");
  // session_close + session_finish + taking the copied pages back (reap): for a caller that owns
  // the pool and may block (anvil generate / run).
  Result<int> session_end(int seq, int n_kv, int32_t tail_page, KVPool& pool, const std::string& meta = "");
  // True while `name` is being recorded (between session_begin and session_finish).
  bool session_recording(const std::string& name);

  // ---- maintenance (anvil kv) ----
  StoreStats stats();
  // Evicts LRU unreferenced pages until the store is under max_bytes (or `target` bytes when
  // given) or none is left (sessions' KV is never evicted: stats().live_bytes may stay above it),
  // then compacts segments that are mostly dead. Returns the bytes reclaimed on disk.
  Result<int64_t> gc(std::optional<uint64_t> target = std::nullopt);
  // PRAGMA integrity_check, every record's checksums and metadata, every segment's length.
  // Appends one line per problem; ok when none.
  Status verify(std::vector<std::string>* problems, int64_t* records_checked);
  // Writes session `name`'s KV (every full page in order, then its tail) as one safetensors file:
  // layer.<l>.k/v [n_kv_heads, durable_pos, head_dim] plus its tokens in the metadata. Needs only
  // the catalog: the layout comes from the records themselves.
  Status export_session(const std::string& name, const std::string& path);

  // Tests: stops the writer the way a crash would, without its final flush (records appended but
  // not yet synced and committed stay so). The store is unusable afterwards; destroy it.
  void abandon();

  const KVStoreCounters& counters() const { return counters_; }
  // Descriptors waiting in the ring now.
  size_t queued() {
    std::lock_guard<std::mutex> lk(mu_);
    return count_;
  }
  // Seconds since attach (for writer busy %).
  double attached_seconds() const;
  const std::string& dir() const { return opts_.dir; }
  const KVStoreOptions& options() const { return opts_; }

 private:
  class Writer;
  friend class Writer;
  struct Desc {
    enum Kind : int32_t { kPage, kTail, kFlush, kEnd } kind = kPage;  // kEnd: a session's last commit
    int32_t page = -1;
    int32_t n = 0;          // tokens in the page (P for a full page)
    int32_t first_pos = 0;
    int32_t session = 0;    // a recording id (SessRec::id): a session's page, never dropped; 0: none
    Hash128 key, parent;
    uint64_t ticket = 0;    // kFlush
    uint64_t fence = 0;     // kPage/kTail: Backend::record_fence() when the page was handed over
  };
  explicit KVStore(const KVStoreOptions& o);
  Status open_catalog();
  void ensure_reserve();  // best effort
  bool free_reserve();    // whether there was one to free
  Status remove_session_once(const std::string& name);
  Result<int64_t> gc_once(std::optional<uint64_t> target);
  // Whether dir/catalog.db is still the file this store opened (not removed or replaced since).
  bool catalog_in_place() const;
  Status recover_segments();
  std::string segment_path(int64_t id) const;
  Status prepare_reader();
  // count_blocked: the caller is the decode thread (its time here is decode_blocked_ns).
  // limit: queue only while fewer than this many descriptors are waiting (0: the ring's capacity).
  bool push(const Desc& d, std::span<const int32_t> tokens, bool block, bool count_blocked = true, size_t limit = 0);
  bool queue_page(int32_t session, bool block, size_t limit, const Hash128& key, const Hash128& parent, int first_pos,
                  std::span<const int32_t> tokens, int32_t page, KVPool& pool);
  Result<ReadFile*> segment_reader(int64_t seg);
  struct RestoreItem;
  // One restoring thread's buffers: its checksum state, the record header, the general-parse fallback.
  struct RestoreScratch {
    XXH3_state_s* xxh = nullptr;
    std::vector<uint8_t> hdr, rec;
  };
  // Pins the staging slots a device's restores use (2 per restore thread) ahead of the first restore.
  void reserve_restore_staging();
  void pin_staging(size_t slots);
  Status load_page_record(const RestoreItem& it, int first_pos, std::span<const int32_t> toks, int32_t page, int slot,
                          RestoreScratch& scratch);
  // Reads and validates one record into read_buf_; returns its data pointer.
  Result<const uint8_t*> read_record(int64_t seg, int64_t off, int64_t len, uint64_t sum, const Hash128& key,
                                     const Hash128& parent, int first_pos, std::span<const int32_t> tokens,
                                     PageMeta* meta);

  KVStoreOptions opts_;
  Env* env_ = nullptr;
  SqliteDb db_;  // the caller's connection: restore lookups, sessions, maintenance
  uint64_t catalog_dev_ = 0, catalog_ino_ = 0;  // the catalog file opened (catalog_in_place)
  SqliteStmt q_page_, q_tail_, q_seg_;
  std::map<int64_t, std::unique_ptr<ReadFile>> readers_;
  std::vector<uint8_t> read_buf_;
  // restore.cpp: a record's header, two staging slots (device backends), the running checksum.
  std::vector<uint8_t> hdr_buf_;
  std::vector<void*> staging_;  // pinned slots for a device's restores: 2 per restore thread
  XXH3_state_s* restore_xxh_ = nullptr;

  Backend* backend_ = nullptr;
  void* kv_base_ = nullptr;  // the pool's storage (KVCacheView::base)
  const void* page_base(int32_t p) const { return static_cast<const uint8_t*>(kv_base_) + size_t(p) * page_bytes_; }
  void* page_base_mut(int32_t p) { return static_cast<uint8_t*>(kv_base_) + size_t(p) * page_bytes_; }
  PageLayout layout_;
  Hash128 fingerprint_;
  size_t page_bytes_ = 0;
  std::chrono::steady_clock::time_point attached_at_;

  // The ring (invariant 4): capacity opts_.queue_pages; tokens of slot i at ring_tokens_[i * P].
  std::mutex mu_;
  std::condition_variable cv_writer_, cv_space_, cv_done_;
  std::vector<Desc> ring_;
  std::vector<int32_t> ring_tokens_;
  size_t head_ = 0, count_ = 0;
  bool stop_ = false, abandon_ = false;
  uint64_t next_ticket_ = 0, done_ticket_ = 0;
  // Pages the writer has copied, waiting for the decode thread to release them (reap()).
  std::vector<int32_t> released_, released_swap_;
  int64_t retained_ = 0;
  // Full pages a failed write or commit lost (invariant 11), for take_failed: at most the pool's
  // pages (a page is listed once per failure; the engine keeps one slot per pool page anyway).
  struct FailedPage {
    int32_t page, first_pos;
    Hash128 key;
  };
  std::vector<FailedPage> failed_;
  std::atomic<size_t> failed_n_{0};  // failed_.size(), read without mu_ by the decode thread
  size_t failed_cap_ = 0;
  std::chrono::steady_clock::time_point failed_ready_at_{};  // handed over from then on
  int failed_retry_ms_ = 0;        // the wait after a failure: retry_ms, doubled at each retry that
  bool failed_recovered_ = false;  // ... came before the store recovered (a commit stored a page)
  // Writer: `pages` were lost (not stored); the store recovered (a commit stored a page).
  void pages_failed(const std::vector<FailedPage>& pages);
  void writer_recovered();
  std::mutex failed_listener_mu_;  // held while the listener runs, so that clearing it waits for that
  std::function<void()> failed_listener_;
  void notify_failed_listener();

  // Sessions being recorded (invariant 9), by recording id (the descriptor's `session`). The
  // decode thread finds a sequence's recording by a scan: there are at most a few dozen.
  struct SessRec {
    uint32_t id = 0;
    std::string name, meta;
    int seq = -1;                 // the engine sequence it records; -1: detached or closed
    bool closed = false;          // session_close ran: no more notes, the final tail is queued
    std::vector<int32_t> tokens;  // capacity reserved by session_begin: session_note never reallocates
    std::chrono::steady_clock::time_point last_tail;
    int final_durable = 0;        // set by the writer's commit
    // Whether the session's row as last written committed (writer); when not, why.
    bool saved = false;
    std::string save_error;
  };
  SessRec* rec_of_seq(int seq);                  // with sess_mu_ held; nullptr when none
  SessRec* rec_named(const std::string& name);   // with sess_mu_ held
  // Queues the tail descriptor of `r` (page -1: its KV ends on a page boundary).
  bool push_tail(const SessRec& r, int n_kv, int32_t tail_page, KVPool& pool, bool block);
  std::mutex sess_mu_;
  std::map<uint32_t, std::unique_ptr<SessRec>> recs_;
  // Claimed names: their flocked lock files, and whether claim_session took them (held until
  // release_session or the store closes) rather than session_begin (let go by session_finish).
  struct Claim {
    std::unique_ptr<AppendFile> lock;
    bool held = false;
  };
  std::map<std::string, Claim> claims_;
  Status claim_locked(const std::string& name, bool held);  // with sess_mu_ held
  uint32_t next_rec_id_ = 0;

  // Keys pinned by a restore in progress (invariant 7); shared with the writer's GC.
  std::mutex pin_mu_;
  std::multiset<Hash128> pinned_;
  std::vector<std::pair<Hash128, int64_t>> touched_;  // LRU hits for the writer to record
  // Rows that failed a read (invariant 3), for the writer to delete so the recomputed page is
  // stored again: (key, segment, offset); offset -1 = the whole segment file is gone.
  struct BadRow {
    Hash128 key;
    int64_t seg, off;
  };
  std::vector<BadRow> bad_;
  std::set<std::pair<int64_t, int64_t>> bad_locs_;  // (segment, offset) of bad_ rows
  std::set<int64_t> lost_segs_;                      // segments whose file is gone

  std::unique_ptr<Writer> writer_;
  std::thread writer_thread_;
  KVStoreCounters counters_;
};

// A session name a new session may take: 1..128 of [A-Za-z0-9._-], not starting with '.' or '-'
// (it appears in the server's URLs and on command lines).
bool valid_session_name(std::string_view s);

// Where the store lives by default: $XDG_CACHE_HOME/anvil/kv, else ~/.cache/anvil/kv.
std::string default_kv_store_dir();

// "8G", "512M", "100000" (bytes): for --kv-store-max.
Result<uint64_t> parse_size(const std::string& s);

}  // namespace anvil
