// KVStore: open + recovery, the decode-thread side (ring, reap), restores, and sessions.
// The writer thread is writer.h; restores are restore.cpp; gc/verify/export are maintenance.cpp.
#include "kvstore/kvstore.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "kvstore/catalog.h"
#include "kvstore/checksum.h"
#include "runtime/kv_pool.h"

#include "kvstore/writer.h"

namespace anvil {

using Clock = std::chrono::steady_clock;

Result<Durability> parse_durability(const std::string& s) {
  if (s == "none") return Durability::kNone;
  if (s == "interval") return Durability::kInterval;
  if (s == "sync") return Durability::kSync;
  return invalid_argument("--kv-durability must be none, interval or sync, got '" + s + "'");
}

Result<uint64_t> parse_size(const std::string& s) {
  if (s.empty()) return invalid_argument("empty size");
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit(end);
  uint64_t mul = 1;
  if (unit == "" || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mul = 1ull << 10;
  else if (unit == "M" || unit == "MiB") mul = 1ull << 20;
  else if (unit == "G" || unit == "GiB") mul = 1ull << 30;
  else if (unit == "T" || unit == "TiB") mul = 1ull << 40;
  else return invalid_argument("size '" + s + "': expected a number with an optional K, M, G or T suffix");
  if (!(v >= 0)) return invalid_argument("size '" + s + "' must be >= 0");
  return uint64_t(v * double(mul));
}

bool valid_session_name(std::string_view s) {
  if (s.empty() || s.size() > 128 || s[0] == '.' || s[0] == '-') return false;
  for (char c : s) {
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!(alnum || c == '.' || c == '_' || c == '-')) return false;
  }
  return true;
}

std::string default_kv_store_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/anvil/kv";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/anvil/kv";
  return ".anvil-kv";
}

KVStore::KVStore(const KVStoreOptions& o) : opts_(o), restore_xxh_(XXH3_createState()) {}

Result<std::unique_ptr<KVStore>> KVStore::open(const KVStoreOptions& opts) {
  if (opts.dir.empty()) return invalid_argument("--kv-store: empty directory");
  if (opts.queue_pages < 2) return invalid_argument("kv store queue must hold at least 2 pages");
  if (opts.queue_pages > kMaxKVQueuePages)
    return invalid_argument("kv store queue holds at most " + std::to_string(kMaxKVQueuePages) + " pages, got " +
                            std::to_string(opts.queue_pages));
  if (opts.flush_ms < 1 || opts.flush_pages < 1) return invalid_argument("kv store flush interval must be >= 1");
  std::unique_ptr<KVStore> s(new KVStore(opts));
  s->env_ = opts.env ? opts.env : Env::posix();
  // A directory holding other things and nothing of a store is not one (a model directory given by
  // mistake): refused rather than filled with a catalog.
  if (s->env_->exists(opts.dir)) {
    auto names = s->env_->list_dir(opts.dir);
    if (names.is_ok() && !names->empty()) {
      bool store_file = false;
      for (const std::string& n : *names) {
        int64_t id;
        store_file = store_file || n.rfind("catalog.db", 0) == 0 || n == "locks" || n == "reserve" ||
                     parse_segment_file(n, &id);
      }
      if (!store_file)
        return invalid_argument("--kv-store " + opts.dir + ": not a KV store (it holds other files and no catalog.db); "
                                "give a new or empty directory, or an existing store");
    }
  }
  ANVIL_RETURN_IF_ERROR(s->env_->create_dirs(opts.dir).with_context("--kv-store"));
  ANVIL_RETURN_IF_ERROR(s->open_catalog());
  s->ensure_reserve();
  if (struct stat sb; ::stat((opts.dir + "/catalog.db").c_str(), &sb) == 0)
    s->catalog_dev_ = uint64_t(sb.st_dev), s->catalog_ino_ = uint64_t(sb.st_ino);
  ANVIL_RETURN_IF_ERROR(s->recover_segments());
  ANVIL_RETURN_IF_ERROR(s->prepare_reader());
  return s;
}

bool KVStore::catalog_in_place() const {
  struct stat sb;
  if (::stat((opts_.dir + "/catalog.db").c_str(), &sb) != 0) return false;
  return catalog_ino_ == 0 || (uint64_t(sb.st_dev) == catalog_dev_ && uint64_t(sb.st_ino) == catalog_ino_);
}

Status KVStore::open_catalog() {
  const std::string path = opts_.dir + "/catalog.db";
  Status st = db_.open(path, opts_.busy_timeout_ms);
  if (st.is_ok()) st = catalog_init(db_);
  if (st.is_ok()) {
    // "The catalog is checked": a cheap structural check (integrity_check is kv verify's).
    auto q = catalog_int(db_, "SELECT 1 FROM pragma_quick_check WHERE quick_check = 'ok'");
    if (!q.is_ok()) st = q.status();
    else if (*q != 1) st = corrupt("catalog " + path + " failed PRAGMA quick_check");
  }
  if (st.is_ok()) {
    // A catalog of a later format (a newer anvil wrote it) is neither read nor changed.
    auto v = catalog_int(db_, "SELECT CAST(v AS INTEGER) FROM meta WHERE k = 'format_version'");
    if (!v.is_ok()) return v.status().with_context("catalog " + path);
    if (*v > kCatalogVersion)
      return unsupported("catalog " + path + " has format version " + std::to_string(*v) + "; this anvil reads " +
                         std::to_string(kCatalogVersion) + " (a newer anvil wrote it: use that one, or another --kv-store)");
    if (Status m = catalog_migrate(db_); !m.is_ok()) return m.with_context("catalog " + path + ": format 1 -> 2");
    return st;
  }
  if (st.code() != StatusCode::kCorrupt) return st.with_context("catalog " + path);
  if (!opts_.repair)
    return corrupt("catalog " + path + " is damaged (" + st.message() +
                   "); a model run on this store (anvil generate/run/serve) moves it aside and starts an empty "
                   "catalog; the session token ids in it are lost with it");
  // A corrupt catalog: every page in it is a miss anyway. Keep it for inspection, start afresh.
  db_.~SqliteDb();
  new (&db_) SqliteDb();
  const std::string aside = path + ".corrupt-" + std::to_string(now_us());
  std::fprintf(stderr, "[anvil] kv store: %s; moved aside to %s, starting an empty catalog\n", st.message().c_str(),
               aside.c_str());
  std::rename(path.c_str(), aside.c_str());
  for (const char* sfx : {"-wal", "-shm"}) (void)env_->remove(path + sfx);
  ANVIL_RETURN_IF_ERROR(db_.open(path, opts_.busy_timeout_ms));
  return catalog_init(db_);
}

// Invariant 2: bytes past committed_end of a segment whose writer is gone are truncated; such a
// segment is sealed (a new process always starts a segment of its own).
// A step that fails (a full disk, a read-only store) is reported and left for a later open: the
// segment stays unsealed and its extra bytes belong to no row, so nothing reads them meanwhile.
Status KVStore::recover_segments() {
  struct Open {
    int64_t id, end, pid;
  };
  std::vector<Open> open_segs;
  {
    SqliteStmt q;
    ANVIL_RETURN_IF_ERROR(q.prepare(db_, "SELECT id, committed_end, COALESCE(owner_pid, 0) FROM segments WHERE sealed = 0"));
    while (true) {
      ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
      if (!row) break;
      open_segs.push_back({q.col_int(0), q.col_int(1), q.col_int(2)});
    }
  }
  const int64_t self = int64_t(::getpid());
  for (const Open& o : open_segs) {
    const std::string path = segment_file(opts_.dir, o.id);
    // No file yet: another process may be between creating the row and the file; leave it.
    if (!env_->exists(path) || env_->locked_by_other(path)) continue;  // a live process appends to it
    // Its owner alive: it may be between creating the file and locking it (segment_create). A pid
    // reused since only delays recovery to a later open.
    if (o.pid > 0 && o.pid != self && (::kill(pid_t(o.pid), 0) == 0 || errno == EPERM)) continue;
    Status st;
    auto size = env_->file_size(path);
    if (!size.is_ok()) st = size.status();
    else if (*size > uint64_t(o.end)) st = env_->truncate(path, uint64_t(o.end));
    if (st.is_ok())
      st = db_.exec("UPDATE segments SET sealed = 1 WHERE id = " + std::to_string(o.id) + " AND sealed = 0");
    if (!st.is_ok()) {
      std::fprintf(stderr, "[anvil] kv store %s: recovering segment %lld left for later: %s\n", opts_.dir.c_str(),
                   (long long)o.id, st.message().c_str());
      break;  // the rest likely fail alike
    }
  }
  return Status::ok();
}

Status KVStore::prepare_reader() {
  ANVIL_RETURN_IF_ERROR(q_page_.prepare(db_,
      "SELECT parent, tokens, segment, offset, length, checksum, first_pos FROM pages WHERE key = ?"));
  ANVIL_RETURN_IF_ERROR(q_tail_.prepare(db_,
      "SELECT tokens, tail_segment, tail_offset, tail_length, tail_checksum, tail_n FROM sessions "
      "WHERE tail_parent = ? AND tail_first = ? AND fingerprint = ? AND tail_n > 0 ORDER BY updated DESC"));
  return Status::ok();
}

std::string KVStore::segment_path(int64_t id) const { return segment_file(opts_.dir, id); }

Status KVStore::attach(Backend& backend, const KVCacheView& kv, const Hash128& fingerprint) {
  if (writer_) return internal_error("kv store: attached twice");
  backend_ = &backend;
  kv_base_ = kv.base;
  layout_ = PageLayout{kv.dtype, kv.n_layers, kv.n_kv_heads, kv.head_dim, kv.page_size};
  page_bytes_ = kv.page_bytes();
  fingerprint_ = fingerprint;
  const size_t Q = size_t(opts_.queue_pages);
  ring_.assign(Q, Desc{});
  ring_tokens_.assign(Q * size_t(kv.page_size), 0);
  released_.reserve(Q + 4);
  released_swap_.reserve(Q + 4);
  failed_cap_ = size_t(std::max<int64_t>(kv.n_pages, 1));
  writer_ = std::make_unique<Writer>(*this);
  ANVIL_RETURN_IF_ERROR(writer_->init());
  reserve_restore_staging();
  attached_at_ = Clock::now();
  writer_thread_ = std::thread([this] { writer_->run(); });
  return Status::ok();
}

KVStore::~KVStore() {
  if (writer_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_writer_.notify_all();
    writer_thread_.join();
  }
  for (void* s : staging_)
    if (s) backend_->free_host_staging(s);
  XXH3_freeState(restore_xxh_);
}

void KVStore::abandon() {
  if (!writer_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = abandon_ = true;
  }
  cv_writer_.notify_all();
  writer_thread_.join();
}

double KVStore::attached_seconds() const {
  if (!writer_) return 0;
  return std::chrono::duration<double>(Clock::now() - attached_at_).count();
}

// Decode thread (invariant 4). Returns false when the descriptor was not queued.
bool KVStore::push(const Desc& d, std::span<const int32_t> tokens, bool block, bool count_blocked, size_t limit) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  const size_t Q = ring_.size();
  if (limit > 0 && count_ >= limit) return false;  // page_offer: only into a ring with room to spare
  if (count_ == Q) {
    if (!block) {
      if (count_blocked)
        counters_.decode_blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      return false;
    }
    cv_space_.wait(lk, [&] { return count_ < Q || stop_; });
  }
  const size_t slot = (head_ + count_) % Q;
  ring_[slot] = d;
  std::copy(tokens.begin(), tokens.end(), ring_tokens_.begin() + slot * size_t(layout_.page_size));
  ++count_;
  if (int64_t(count_) > counters_.queue_high_water.load()) counters_.queue_high_water = int64_t(count_);
  if (d.page >= 0) ++retained_;
  lk.unlock();
  cv_writer_.notify_one();
  if (count_blocked)
    counters_.decode_blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  return true;
}

// A full page's descriptor, its pool page retained (invariant 5: until the writer has copied it)
// and a fence that the copy waits for (the step that completed the page only); queued as push
// decides (block, limit), else the page released. Returns whether it was queued.
bool KVStore::queue_page(int32_t session, bool block, size_t limit, const Hash128& key, const Hash128& parent,
                         int first_pos, std::span<const int32_t> tokens, int32_t page, KVPool& pool) {
  Desc d;
  d.kind = Desc::kPage;
  d.page = page;
  d.n = int32_t(tokens.size());
  d.first_pos = first_pos;
  d.key = key;
  d.parent = parent;
  d.session = session;
  pool.kv_page_retain(page);
  d.fence = backend_->record_fence();
  if (push(d, tokens, block, /*count_blocked=*/limit == 0, limit)) return true;
  pool.kv_page_release(page);
  return false;
}

bool KVStore::page_full(int seq, const Hash128& key, const Hash128& parent, int first_pos,
                        std::span<const int32_t> tokens, int32_t page, KVPool& pool) {
  if (!writer_) return true;  // (not attached: nothing to persist, nothing to offer again)
  int32_t session = 0;
  bool is_session = false;  // a session's page waits for room; any other is dropped when the ring is full
  {
    std::lock_guard<std::mutex> lk(sess_mu_);
    if (const SessRec* r = rec_of_seq(seq)) session = int32_t(r->id), is_session = true;
  }
  ++counters_.pages_enqueued;
  if (!queue_page(session, is_session, 0, key, parent, first_pos, tokens, page, pool)) {
    ++counters_.pages_dropped;
    return false;
  }
  return true;
}

bool KVStore::page_offer(const Hash128& key, const Hash128& parent, int first_pos, std::span<const int32_t> tokens,
                         int32_t page, KVPool& pool) {
  if (!writer_) return true;
  if (!queue_page(0, false, std::max<size_t>(1, ring_.size() / 2), key, parent, first_pos, tokens, page, pool))
    return false;
  ++counters_.pages_reoffered;
  return true;
}

void KVStore::pages_failed(const std::vector<FailedPage>& pages) {
  if (pages.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const FailedPage& p : pages)
      if (failed_.size() < failed_cap_) failed_.push_back(p);  // beyond: a future miss, as before
    failed_n_ = failed_.size();
    if (failed_retry_ms_ == 0) failed_retry_ms_ = std::max(opts_.retry_ms, 0);
    failed_ready_at_ = Clock::now() + std::chrono::milliseconds(failed_retry_ms_);
    failed_recovered_ = false;
    counters_.pages_failed += int64_t(pages.size());
  }
  notify_failed_listener();
}

void KVStore::writer_recovered() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    failed_recovered_ = true;
    failed_retry_ms_ = std::max(opts_.retry_ms, 0);
    failed_ready_at_ = Clock::now();
  }
  if (failed_n_ > 0) notify_failed_listener();  // they are due now
}

std::optional<Clock::time_point> KVStore::failed_ready_at() {
  std::lock_guard<std::mutex> lk(mu_);
  if (failed_.empty()) return std::nullopt;
  return failed_ready_at_;
}

void KVStore::set_failed_listener(std::function<void()> f) {
  std::lock_guard<std::mutex> lk(failed_listener_mu_);
  failed_listener_ = std::move(f);
}

void KVStore::notify_failed_listener() {
  std::lock_guard<std::mutex> lk(failed_listener_mu_);
  if (failed_listener_) failed_listener_();
}

void KVStore::take_failed(bool all, const std::function<void(int32_t, const Hash128&, int)>& f) {
  if (failed_n_ == 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (!all && Clock::now() < failed_ready_at_) return;
  // A retry while the store has not recovered: the next one waits twice as long (up to 64 times
  // retry_ms), so a disk that stays full costs ever fewer attempts.
  if (!failed_recovered_ && !all)
    failed_retry_ms_ = std::min<int64_t>(int64_t(failed_retry_ms_) * 2, int64_t(std::max(opts_.retry_ms, 0)) * 64);
  for (const FailedPage& p : failed_) f(p.page, p.key, p.first_pos);
  failed_.clear();  // keeps its capacity: the writer refills it
  failed_n_ = 0;
}

void KVStore::reap(KVPool& pool, bool wait) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (wait) cv_done_.wait(lk, [&] { return int64_t(released_.size()) == retained_; });
    released_swap_.swap(released_);
    retained_ -= int64_t(released_swap_.size());
  }
  for (int32_t p : released_swap_) pool.kv_page_release(p);
  released_swap_.clear();
}

bool KVStore::reap_for(KVPool& pool, std::chrono::milliseconds max_wait) {
  bool all;
  {
    std::unique_lock<std::mutex> lk(mu_);
    all = cv_done_.wait_for(lk, max_wait, [&] { return int64_t(released_.size()) == retained_; });
    released_swap_.swap(released_);
    retained_ -= int64_t(released_swap_.size());
  }
  for (int32_t p : released_swap_) pool.kv_page_release(p);
  released_swap_.clear();
  return all;
}

void KVStore::flush() {
  if (!writer_) return;
  Desc d;
  d.kind = Desc::kFlush;
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ticket = ++next_ticket_;
  }
  d.ticket = ticket;
  push(d, {}, true);
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return done_ticket_ >= ticket; });
}

// ---- sessions ----

namespace {
bool disk_full(const Status& s) {
  return !s.is_ok() && (s.message().find("disk is full") != std::string::npos ||
                        s.message().find(std::strerror(ENOSPC)) != std::string::npos);
}
}  // namespace

Result<std::optional<SessionInfo>> KVStore::get_session(const std::string& name) {
  ANVIL_ASSIGN_OR_RETURN(auto s, find_session(name));
  if (s && !s->damaged.empty())
    return corrupt("kv store " + opts_.dir + ": session '" + name + "' is damaged (" + s->damaged +
                   "); remove it with anvil kv rm " + name);
  return s;
}

Result<std::optional<SessionInfo>> KVStore::find_session(const std::string& name) {
  SqliteStmt q;
  ANVIL_RETURN_IF_ERROR(q.prepare(db_,
      "SELECT fingerprint, tokens, durable_pos, COALESCE(tail_first, 0), COALESCE(tail_n, 0), updated, meta, sum "
      "FROM sessions WHERE name = ?"));
  q.bind(1, name);
  ANVIL_ASSIGN_OR_RETURN(bool row, q.step());
  if (!row) return std::optional<SessionInfo>();
  SessionInfo s;
  s.name = name;
  s.fingerprint = q.col_hash(0);
  const int32_t* t = static_cast<const int32_t*>(q.col_blob(1));
  s.tokens.assign(t, t + q.col_bytes(1) / 4);
  s.durable_pos = int(q.col_int(2));
  s.tail_first = int(q.col_int(3));
  s.tail_n = int(q.col_int(4));
  s.updated_us = q.col_int(5);
  s.meta = q.col_text(6);
  const uint64_t sum = uint64_t(q.col_int(7));
  // A damaged row is found, marked, never another conversation, nor taken for a missing one.
  if (std::string why = session_damage(size_t(q.col_bytes(1)), t, s.meta, q.col_null(7) ? nullptr : &sum);
      !why.empty()) {
    s.damaged = why;
    s.tokens.clear();  // not trusted
    s.meta.clear();
    s.tail_first = s.tail_n = 0;
  }
  return std::optional<SessionInfo>(std::move(s));
}

std::vector<SessionInfo> KVStore::list_sessions() {
  std::vector<SessionInfo> out;
  SqliteStmt q;
  if (!q.prepare(db_, "SELECT name FROM sessions ORDER BY name").is_ok()) return out;
  std::vector<std::string> names;
  while (true) {
    auto r = q.step();
    if (!r.is_ok() || !*r) break;
    names.push_back(q.col_text(0));
  }
  // A damaged row is listed, marked, never left out silently (its tokens are not trusted).
  for (const std::string& name : names) {
    auto s = find_session(name);
    if (s.is_ok()) {
      if (*s) out.push_back(std::move(**s));  // (none: removed meanwhile)
      continue;
    }
    SessionInfo e;  // a row that cannot be read now is listed too, with why
    e.name = name;
    e.damaged = "it could not be read: " + s.status().message();
    out.push_back(std::move(e));
  }
  return out;
}

Status KVStore::fork_session(const std::string& from, const std::string& to) {
  if (from == to) return invalid_argument("--fork: the new session must have another name than '" + from + "'");
  ANVIL_RETURN_IF_ERROR(db_.exec("BEGIN IMMEDIATE"));
  auto fail = [&](Status s) {
    (void)db_.exec("ROLLBACK");
    return s;
  };
  SqliteStmt exists, copy, copy_pages;
  Status st = exists.prepare(db_, "SELECT COUNT(*) FROM sessions WHERE name = ?");
  if (!st.is_ok()) return fail(st);
  exists.bind(1, to);
  auto r = exists.step();
  if (!r.is_ok()) return fail(r.status());
  if (exists.col_int(0) > 0) return fail(invalid_argument("--fork: session '" + to + "' already exists"));
  exists.reset();
  st = copy.prepare(db_,
      "INSERT INTO sessions(name, fingerprint, tokens, durable_pos, tail_segment, tail_offset, tail_length, "
      "tail_checksum, tail_first, tail_n, tail_parent, updated, meta, sum) SELECT ?, fingerprint, tokens, durable_pos, "
      "tail_segment, tail_offset, tail_length, tail_checksum, tail_first, tail_n, tail_parent, ?, meta, sum "
      "FROM sessions WHERE name = ?");
  if (!st.is_ok()) return fail(st);
  copy.bind(1, to);
  copy.bind(2, now_us());
  copy.bind(3, from);
  st = copy.run();
  if (!st.is_ok()) return fail(st);
  if (sqlite3_changes(db_.handle()) != 1) return fail(not_found("no session named '" + from + "' in " + opts_.dir));
  // The copied row shares the parent's tail record, already counted in live_bytes (catalog.h).
  st = copy_pages.prepare(db_, "INSERT INTO session_pages(session, idx, key) SELECT ?, idx, key FROM session_pages WHERE session = ?");
  if (!st.is_ok()) return fail(st);
  copy_pages.bind(1, to);
  copy_pages.bind(2, from);
  st = copy_pages.run();
  if (!st.is_ok()) return fail(st);
  return db_.commit();
}

void KVStore::ensure_reserve() {
  const std::string path = opts_.dir + "/reserve";
  struct stat sb;
  if (::stat(path.c_str(), &sb) == 0 && uint64_t(sb.st_size) >= kReserveBytes) return;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const bool ok = ::posix_fallocate(fd, 0, off_t(kReserveBytes)) == 0;
  ::close(fd);
  if (!ok) ::unlink(path.c_str());  // no room for it now: the next open tries again
}

bool KVStore::free_reserve() { return ::unlink((opts_.dir + "/reserve").c_str()) == 0; }

// Invariant 9: claimed first, so that no recording (here or in another process) writes the row
// back after it is deleted; a claim this store already holds (anvil run's) is kept.
Status KVStore::remove_session(const std::string& name) {
  bool claimed_here = false;
  Status st;
  {
    std::lock_guard<std::mutex> lk(sess_mu_);
    if (rec_named(name))
      return busy("session '" + name + "' is being recorded by this process; it can be removed once its turn has ended");
    if (!claims_.count(name)) {
      st = claim_locked(name, /*held=*/true);
      if (disk_full(st) && free_reserve()) st = claim_locked(name, true);  // its lock file needs room
      claimed_here = st.is_ok();
    }
  }
  if (st.code() == StatusCode::kBusy)
    return busy("cannot remove session '" + name + "': it is in use by another process on the store " + opts_.dir +
                " (being recorded or continued); remove it once that process has finished with it");
  if (st.is_ok()) {
    st = remove_session_once(name);
    if (disk_full(st) && free_reserve()) st = remove_session_once(name);
  }
  ensure_reserve();
  if (claimed_here) release_session(name);
  return st;
}

Result<int64_t> KVStore::gc(std::optional<uint64_t> target) {
  auto r = gc_once(target);
  if (disk_full(r.status()) && free_reserve()) r = gc_once(target);
  ensure_reserve();
  return r;
}

Status KVStore::remove_session_once(const std::string& name) {
  ANVIL_RETURN_IF_ERROR(db_.exec("BEGIN IMMEDIATE"));
  SqliteStmt tail, del, del_pages;
  int64_t seg = 0, off = 0, len = 0;
  Status st = tail.prepare(db_,
      "SELECT COALESCE(tail_segment, 0), COALESCE(tail_offset, 0), COALESCE(tail_length, 0) FROM sessions WHERE name = ?");
  if (st.is_ok()) {
    tail.bind(1, name);
    auto r = tail.step();
    if (!r.is_ok()) st = r.status();
    else if (!*r) st = not_found("no session named '" + name + "' in " + opts_.dir);
    else seg = tail.col_int(0), off = tail.col_int(1), len = tail.col_int(2);
    tail.reset();
  }
  if (st.is_ok()) st = del.prepare(db_, "DELETE FROM sessions WHERE name = ?");
  if (st.is_ok()) {
    del.bind(1, name);
    st = del.run();
  }
  // Its tail's bytes are dead unless a fork of it shares the record (catalog.h: live_bytes).
  if (st.is_ok() && len > 0) st = tail_ref_dropped(db_, seg, off, len);
  if (st.is_ok()) st = del_pages.prepare(db_, "DELETE FROM session_pages WHERE session = ?");
  if (st.is_ok()) {
    del_pages.bind(1, name);
    st = del_pages.run();
  }
  if (!st.is_ok()) {
    (void)db_.exec("ROLLBACK");
    return st;
  }
  return db_.commit();
}

KVStore::SessRec* KVStore::rec_of_seq(int seq) {
  if (seq < 0) return nullptr;
  for (auto& [id, r] : recs_)
    if (r->seq == seq && !r->closed) return r.get();
  return nullptr;
}

KVStore::SessRec* KVStore::rec_named(const std::string& name) {
  for (auto& [id, r] : recs_)
    if (r->name == name) return r.get();
  return nullptr;
}

bool KVStore::session_recording(const std::string& name) {
  std::lock_guard<std::mutex> lk(sess_mu_);
  return rec_named(name) != nullptr;
}

Status KVStore::claim_locked(const std::string& name, bool held) {
  if (auto it = claims_.find(name); it != claims_.end()) {
    it->second.held = it->second.held || held;
    return Status::ok();
  }
  const std::string dir = opts_.dir + "/locks";
  ANVIL_RETURN_IF_ERROR(env_->create_dirs(dir).with_context("kv store " + opts_.dir));
  const std::string path = dir + "/" + hash128(name.data(), name.size()).hex() + ".lock";
  ANVIL_ASSIGN_OR_RETURN(auto f, env_->open_append(path));
  if (!f->try_lock())
    return busy("session '" + name + "' is in use by another process on the store " + opts_.dir +
                " (one recording per session at a time)");
  claims_[name] = Claim{std::move(f), held};
  return Status::ok();
}

Status KVStore::claim_session(const std::string& name) {
  std::lock_guard<std::mutex> lk(sess_mu_);
  return claim_locked(name, true);
}

void KVStore::release_session(const std::string& name) {
  std::lock_guard<std::mutex> lk(sess_mu_);
  auto c = claims_.find(name);
  if (c == claims_.end()) return;
  if (rec_named(name)) c->second.held = false;  // a recording keeps it until session_finish
  else claims_.erase(c);
}

Status KVStore::session_begin(const std::string& name, int seq, std::span<const int32_t> tokens, int max_tokens,
                              const std::string& meta) {
  if (!writer_) return internal_error("kv store: session_begin before attach");
  if (name.empty()) return invalid_argument("--session: empty name");
  std::lock_guard<std::mutex> lk(sess_mu_);
  if (rec_named(name)) return busy("session '" + name + "' is already being recorded");
  if (rec_of_seq(seq)) return internal_error("kv store: sequence " + std::to_string(seq) + " already records a session");
  ANVIL_RETURN_IF_ERROR(claim_locked(name, false));
  auto r = std::make_unique<SessRec>();
  r->id = ++next_rec_id_;
  if (r->id == 0) r->id = ++next_rec_id_;  // 0 means "no session" in a descriptor
  r->name = name;
  r->meta = meta;
  r->seq = seq;
  r->tokens.reserve(size_t(std::max<int>(max_tokens, int(tokens.size()))) + 1);
  r->tokens.assign(tokens.begin(), tokens.end());
  r->last_tail = Clock::now();
  recs_[r->id] = std::move(r);
  return Status::ok();
}

Status KVStore::session_rebind(const std::string& name, int seq) {
  std::lock_guard<std::mutex> lk(sess_mu_);
  SessRec* r = rec_named(name);
  if (!r || r->closed) return internal_error("kv store: session '" + name + "' is not being recorded");
  if (seq >= 0 && rec_of_seq(seq)) return internal_error("kv store: sequence " + std::to_string(seq) + " already records a session");
  r->seq = seq;
  return Status::ok();
}

bool KVStore::push_tail(const SessRec& r, int n_kv, int32_t tail_page, KVPool& pool, bool block) {
  const int P = layout_.page_size;
  Desc d;
  d.kind = Desc::kTail;
  d.session = int32_t(r.id);
  d.n = n_kv % P;
  d.first_pos = n_kv - d.n;
  d.page = d.n > 0 ? tail_page : -1;
  // The parent is the chain key of the page before the tail; the writer computes it from the
  // session's tokens, so the decode thread computes nothing here. Only the decode thread appends
  // to r.tokens (this thread), so reading them unlocked is safe.
  const size_t first = std::min<size_t>(size_t(d.first_pos), r.tokens.size());
  auto toks = std::span<const int32_t>(r.tokens).subspan(first, std::min<size_t>(size_t(d.n), r.tokens.size() - first));
  if (d.page >= 0) {
    pool.kv_page_retain(d.page);
    d.fence = backend_->record_fence();
  }
  if (push(d, toks, block)) return true;
  if (d.page >= 0) pool.kv_page_release(d.page);  // ring full: the next interval tries again
  return false;
}

void KVStore::session_note(int seq, std::span<const int32_t> new_tokens, int n_kv, int32_t tail_page, KVPool& pool) {
  const auto t0 = Clock::now();
  SessRec* r;
  bool due;
  {
    std::lock_guard<std::mutex> lk(sess_mu_);
    r = rec_of_seq(seq);
    if (!r) return;
    for (int32_t t : new_tokens)
      if (r->tokens.size() < r->tokens.capacity()) r->tokens.push_back(t);  // never reallocates
    due = t0 - r->last_tail >= std::chrono::milliseconds(opts_.flush_ms);
    if (due) r->last_tail = t0;
  }
  counters_.decode_blocked_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  // r stays valid: only session_finish erases a recording, and only after session_close, which
  // runs on this thread.
  if (due) push_tail(*r, n_kv, tail_page, pool, false);
}

Status KVStore::session_close(const std::string& name, int n_kv, int32_t tail_page, KVPool& pool) {
  SessRec* r;
  {
    std::lock_guard<std::mutex> lk(sess_mu_);
    r = rec_named(name);
    if (!r || r->closed) return internal_error("kv store: session '" + name + "' is not being recorded");
    r->closed = true;
    r->seq = -1;
  }
  n_kv = std::min<int>(n_kv, int(r->tokens.size()));
  push_tail(*r, n_kv, tail_page, pool, true);  // blocks on a full ring rather than lose the final state
  return Status::ok();
}

Result<int> KVStore::session_finish(const std::string& name, const std::string& meta) {
  uint32_t id;
  {
    std::lock_guard<std::mutex> lk(sess_mu_);
    SessRec* r = rec_named(name);
    if (!r || !r->closed) return internal_error("kv store: session '" + name + "' was not closed");
    if (!meta.empty()) r->meta = meta;
    id = r->id;
  }
  Desc d;
  d.kind = Desc::kEnd;
  d.session = int32_t(id);
  push(d, {}, true, /*count_blocked=*/false);  // any thread, not the decode one
  flush();  // commits the final tail, the tokens and the meta in one transaction
  std::lock_guard<std::mutex> lk(sess_mu_);
  auto it = recs_.find(id);
  const int durable = it->second->final_durable;
  const bool saved = it->second->saved;
  const std::string why = it->second->save_error;
  recs_.erase(it);
  if (auto c = claims_.find(name); c != claims_.end() && !c->second.held) claims_.erase(c);
  if (!saved)
    return io_error("kv store " + opts_.dir + ": session '" + name + "' was not saved: " +
                    (why.empty() ? std::string("its last state was not committed") : why));
  // Committed, but into files that are gone if the directory was removed (or replaced) meanwhile.
  if (!catalog_in_place())
    return io_error("kv store " + opts_.dir + ": session '" + name + "' was not saved: the store's catalog " +
                    opts_.dir + "/catalog.db was removed or replaced while this process ran");
  return durable;
}

Result<int> KVStore::session_end(int seq, int n_kv, int32_t tail_page, KVPool& pool, const std::string& meta) {
  std::string name;
  {
    std::lock_guard<std::mutex> lk(sess_mu_);
    SessRec* r = rec_of_seq(seq);
    if (!r) return internal_error("kv store: sequence " + std::to_string(seq) + " records no session");
    name = r->name;
  }
  ANVIL_RETURN_IF_ERROR(session_close(name, n_kv, tail_page, pool));
  auto d = session_finish(name, meta);
  reap(pool, true);
  return d;
}

StoreStats KVStore::stats() {
  StoreStats s;
  auto get = [&](const char* sql) {
    auto r = catalog_int(db_, sql);
    return r.is_ok() ? *r : int64_t(0);
  };
  s.pages = get("SELECT COUNT(*) FROM pages");
  s.page_bytes = get("SELECT COALESCE(SUM(length), 0) FROM pages");
  s.sessions = get("SELECT COUNT(*) FROM sessions");
  s.segments = get("SELECT COUNT(*) FROM segments");
  if (auto live = catalog_live_bytes(db_); live.is_ok()) s.live_bytes = *live;
  auto names = env_->list_dir(opts_.dir);
  if (names.is_ok())
    for (auto& n : *names) {
      int64_t id;
      if (!parse_segment_file(n, &id)) continue;
      auto sz = env_->file_size(opts_.dir + "/" + n);
      if (sz.is_ok()) s.segment_file_bytes += int64_t(*sz);
    }
  return s;
}

}  // namespace anvil
