// The store's writer thread: drains the descriptor ring, copies each page from the device into
// host staging, appends its record to this process's segment, and at each flush fdatasyncs the
// segment and then commits the rows that reference it in one transaction (group commit).
// The class is KVStore's private part; only kvstore.cpp includes this file.
#pragma once
#include <unistd.h>
#include "kvstore/checksum.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "kvstore/catalog.h"
#include "kvstore/kvstore.h"
#include "runtime/kv_pool.h"

namespace anvil {

class KVStore::Writer {
  using Clock = std::chrono::steady_clock;
 public:
  explicit Writer(KVStore& s) : s_(s) {}
  ~Writer() {
    if (stage_) s_.backend_->free_host_staging(stage_);
    XXH3_freeState(xxh_);
  }

  Status init() {
    ANVIL_RETURN_IF_ERROR(db_.open(s_.opts_.dir + "/catalog.db", s_.opts_.busy_timeout_ms));
    ANVIL_RETURN_IF_ERROR(db_.exec("PRAGMA synchronous=NORMAL"));
    ANVIL_RETURN_IF_ERROR(has_page_.prepare(db_, "SELECT segment, offset FROM pages WHERE key = ?"));
    ANVIL_RETURN_IF_ERROR(ins_page_.prepare(db_,
        "INSERT OR IGNORE INTO pages(key, parent, fingerprint, first_pos, tokens, segment, offset, length, checksum, "
        "last_used) VALUES(?,?,?,?,?,?,?,?,?,?)"));
    ANVIL_RETURN_IF_ERROR(add_live_.prepare(db_, "UPDATE segments SET live_bytes = live_bytes + ? WHERE id = ?"));
    ANVIL_RETURN_IF_ERROR(set_end_.prepare(db_, "UPDATE segments SET committed_end = ? WHERE id = ?"));
    ANVIL_RETURN_IF_ERROR(seal_.prepare(db_, "UPDATE segments SET sealed = 1, committed_end = ? WHERE id = ?"));
    ANVIL_RETURN_IF_ERROR(touch_.prepare(db_, "UPDATE pages SET last_used = ? WHERE key = ?"));
    ANVIL_RETURN_IF_ERROR(old_tail_.prepare(db_,
        "SELECT tail_segment, tail_offset, tail_length, tail_checksum, tail_first, tail_n FROM sessions "
        "WHERE name = ? AND tail_segment IS NOT NULL AND tail_length > 0"));
    ANVIL_RETURN_IF_ERROR(
        row_tail_.prepare(db_, "SELECT tokens, tail_parent, fingerprint FROM sessions WHERE name = ?"));
    ANVIL_RETURN_IF_ERROR(put_session_.prepare(db_,
        "INSERT INTO sessions(name, fingerprint, tokens, durable_pos, tail_segment, tail_offset, tail_length, "
        "tail_checksum, tail_first, tail_n, tail_parent, updated, meta, sum) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT(name) DO UPDATE SET fingerprint=excluded.fingerprint, tokens=excluded.tokens, "
        "durable_pos=excluded.durable_pos, tail_segment=excluded.tail_segment, tail_offset=excluded.tail_offset, "
        "tail_length=excluded.tail_length, tail_checksum=excluded.tail_checksum, tail_first=excluded.tail_first, "
        "tail_n=excluded.tail_n, tail_parent=excluded.tail_parent, updated=excluded.updated, meta=excluded.meta, "
        "sum=excluded.sum"));
    ANVIL_RETURN_IF_ERROR(put_sess_page_.prepare(db_,
        "INSERT OR REPLACE INTO session_pages(session, idx, key) VALUES(?,?,?)"));
    ANVIL_RETURN_IF_ERROR(trim_sess_pages_.prepare(db_, "DELETE FROM session_pages WHERE session = ? AND idx >= ?"));
    ANVIL_ASSIGN_OR_RETURN(stage_, s_.backend_->alloc_host_staging(s_.page_bytes_));
    return Status::ok();
  }

  void run() {
    // A catalog whose live_bytes may have drifted (an older anvil's accounting) is recounted once,
    // here rather than in attach so that nothing waits for it (a scan of every page row: ~150 ms
    // for 100,000); the cap and compaction read live_bytes.
    if (auto fixed = live_bytes_recount_once(db_); fixed.is_ok() && *fixed > 0)
      std::fprintf(stderr, "[anvil] kv store %s: recounted the live bytes of %lld segments\n", s_.opts_.dir.c_str(),
                   (long long)*fixed);
    std::vector<int32_t> tokens(size_t(s_.layout_.page_size));
    while (true) {
      Desc d;
      bool have = false, stopping = false;
      {
        std::unique_lock<std::mutex> lk(s_.mu_);
        auto has_work = [&] { return s_.count_ > 0 || s_.stop_; };
        if (pending_records_ > 0 || any_dirty_) {
          auto deadline = first_pending_ + std::chrono::milliseconds(s_.opts_.flush_ms);
          s_.cv_writer_.wait_until(lk, deadline, has_work);
        } else {
          s_.cv_writer_.wait(lk, has_work);
        }
        if (s_.count_ > 0) {
          const size_t slot = s_.head_;
          d = s_.ring_[slot];
          std::copy_n(s_.ring_tokens_.begin() + slot * tokens.size(), tokens.size(), tokens.begin());
          s_.head_ = (s_.head_ + 1) % s_.ring_.size();
          --s_.count_;
          have = true;
          s_.cv_space_.notify_all();
        } else if (s_.stop_) {
          stopping = true;
          if (s_.abandon_) return;  // a simulated crash: no final flush
        }
      }
      const auto t0 = Clock::now();
      busy_from_ = t0;
      bool flush_now = stopping;
      if (have) {
        if (pending_records_ == 0 && !any_dirty_) first_pending_ = t0;
        if (d.kind == Desc::kPage) write_page(d, tokens.data());
        else if (d.kind == Desc::kTail) write_tail(d, tokens.data());
        else if (d.kind == Desc::kEnd) end_session(d);
        if (d.kind == Desc::kFlush) {
          flush_now = true;
          ticket_ = std::max(ticket_, d.ticket);
        }
        if (s_.opts_.durability == Durability::kSync || pending_records_ >= s_.opts_.flush_pages) flush_now = true;
      }
      if (!flush_now && (pending_records_ > 0 || any_dirty_) &&
          t0 - first_pending_ >= std::chrono::milliseconds(s_.opts_.flush_ms))
        flush_now = true;
      if (flush_now) flush();
      account_busy();
      if (stopping) return;
    }
  }

 private:
  // Takes the retained pool page back to the decode thread (released in KVStore::reap).
  void give_back(int32_t page) {
    if (page < 0) return;
    std::lock_guard<std::mutex> lk(s_.mu_);
    s_.released_.push_back(page);
    s_.cv_done_.notify_all();
  }

  Status ensure_segment() {
    if (seg_) return Status::ok();
    ANVIL_ASSIGN_OR_RETURN(NewSegment ns, segment_create(db_, s_.env_, s_.opts_.dir));
    seg_ = std::move(ns.file);
    seg_id_ = ns.id;
    committed_end_ = 0;
    writeback_mark_ = 0;
    return Status::ok();
  }

  // Appends header + staged data as one record of the current segment.
  Result<std::pair<int64_t, uint64_t>> append_record(const PageMeta& meta, size_t data_bytes) {
    ANVIL_RETURN_IF_ERROR(ensure_segment());
    std::string header = page_record_header(s_.layout_, meta, stage_, data_bytes);
    XXH3_64bits_reset(xxh_);
    XXH3_64bits_update(xxh_, header.data(), header.size());
    XXH3_64bits_update(xxh_, stage_, data_bytes);
    const uint64_t sum = XXH3_64bits_digest(xxh_);
    const int64_t off = int64_t(seg_->size());
    ANVIL_RETURN_IF_ERROR(seg_->append(header.data(), header.size()));
    ANVIL_RETURN_IF_ERROR(seg_->append(stage_, data_bytes));
    s_.counters_.bytes_written += int64_t(header.size() + data_bytes);
    start_writeback();
    return std::make_pair(off, sum);
  }

  // Has the disk start on the bytes appended since the last time, once there are writeback_bytes
  // of them (1 MiB), while this thread goes on copying and appending: the flush's fdatasync then
  // waits only for what is left instead of for the whole batch (64 qwen3-8b pages: 151 MB).
  // Durability is still the flush's (invariant 1); with durability none nothing is synced and no
  // hint is given. ANVIL_KV_WRITEBACK=0 turns it off (for measuring).
  void start_writeback() {
    static const bool on = [] {
      const char* e = std::getenv("ANVIL_KV_WRITEBACK");
      return !(e && e[0] == '0' && e[1] == 0);
    }();
    const uint64_t every = s_.opts_.writeback_bytes;
    if (!on || every == 0 || s_.opts_.durability == Durability::kNone) return;
    if (seg_->size() < writeback_mark_ + every) return;
    seg_->start_writeback();
    writeback_mark_ = seg_->size();
  }

  // True when the catalog (or this batch) has a sound copy of the page: a row whose record failed
  // a read, or lies in a lost segment, is deleted at the next commit and does not count.
  bool known(const Hash128& key) {
    if (pending_keys_.count(key)) return true;
    has_page_.bind(1, key);
    auto r = has_page_.step();
    bool found = r.is_ok() && *r;
    const int64_t seg = found ? has_page_.col_int(0) : 0, off = found ? has_page_.col_int(1) : 0;
    has_page_.reset();
    if (!found) return false;
    std::lock_guard<std::mutex> lk(s_.pin_mu_);
    return !s_.lost_segs_.count(seg) && !s_.bad_locs_.count({seg, off});
  }

  void write_page(const Desc& d, const int32_t* tokens) {
    // A recording's page: its row (and so its reference to this page) is written in the commit that
    // inserts the page, or that follows the dedup against a stored one (invariant 7).
    if (d.session) wsess(d.session);
    if (known(d.key)) {  // invariant 6
      give_back(d.page);
      ++s_.counters_.pages_deduped;
      return;
    }
    const PageLayout& L = s_.layout_;
    const uint8_t* src = static_cast<const uint8_t*>(s_.page_base(d.page));
    s_.backend_->copy_2d_to_host_async(stage_, s_.page_bytes_, src, s_.page_bytes_, s_.page_bytes_, 1, d.fence);
    const Status copied = s_.backend_->wait_host_copies();
    give_back(d.page);
    if (!copied.is_ok()) return copy_failed(copied);
    PageMeta meta;
    meta.fingerprint = s_.fingerprint_;
    meta.key = d.key;
    meta.parent = d.parent;
    meta.first_pos = d.first_pos;
    meta.tokens.assign(tokens, tokens + d.n);
    auto r = append_record(meta, L.data_bytes(d.n));
    if (!r.is_ok()) {
      failed_.push_back({d.page, d.first_pos, d.key});  // this page too: offered again (invariant 11)
      return write_failed(r.status());
    }
    pending_.push_back({d.key, d.parent, d.first_pos, std::move(meta.tokens), r->first,
                        int64_t(seg_->size()) - r->first, r->second, d.page});
    pending_keys_.insert(d.key);
    ++pending_records_;
    ++s_.counters_.pages_written;
    if (!d.session) anon_written_ = true;
  }

  // The writer's state of one recorded session (by recording id).
  struct Tail {
    bool valid = false;
    int64_t seg = 0, off = 0, len = 0;
    uint64_t sum = 0;
    int first = 0, n = 0;
    Hash128 parent;
  };
  struct WSess {
    bool dirty = false, ending = false;
    Tail tail;
    bool tail_committed = false;
    // A tail descriptor of this recording came (its tail state, or none on a page boundary). Before
    // one comes, a row written for the recording's pages keeps the tail the row had (a resumed
    // session's) where the recording's tokens still begin with all of that tail's (keep_row_tail).
    bool own_tail = false;
    std::vector<Hash128> keys;  // chain keys of the session's full pages, as far as computed
    // Leading pages committed, and page references (session_pages rows) written, as of the last
    // commit that succeeded (a failed one puts them back: uncommitted_).
    int present = 0, pages_written = 0;
  };
  WSess& wsess(int32_t id) {
    any_dirty_ = true;
    WSess& w = ws_[uint32_t(id)];
    w.dirty = true;
    return w;
  }
  // The recording's tokens (a copy; empty when it is gone).
  bool session_tokens(uint32_t id, size_t max_n, std::vector<int32_t>* toks, std::string* name = nullptr,
                      std::string* meta = nullptr) {
    std::lock_guard<std::mutex> lk(s_.sess_mu_);
    auto it = s_.recs_.find(id);
    if (it == s_.recs_.end()) return false;
    const auto& t = it->second->tokens;
    toks->assign(t.begin(), t.begin() + std::min(max_n, t.size()));
    if (name) *name = it->second->name;
    if (meta) *meta = it->second->meta;
    return true;
  }

  void end_session(const Desc& d) { wsess(d.session).ending = true; }

  void write_tail(const Desc& d, const int32_t* tokens) {
    const PageLayout& L = s_.layout_;
    WSess& w = wsess(d.session);
    w.own_tail = true;
    if (d.page < 0) {  // the session's tokens only: its KV ends on a page boundary
      w.tail.valid = false;
      return;
    }
    // The tail's parent: the chain key of the session's page before it.
    std::vector<int32_t> toks;
    session_tokens(uint32_t(d.session), size_t(d.first_pos), &toks);
    extend_session_keys(w, toks, d.first_pos / L.page_size);
    if (d.first_pos && int(w.keys.size()) < d.first_pos / L.page_size) {  // the recording is gone
      give_back(d.page);
      return;
    }
    const Hash128 parent = d.first_pos ? w.keys[size_t(d.first_pos / L.page_size) - 1] : Hash128{};
    // Only the rows below the fill mark: the decode thread may be writing row d.n (invariant 5).
    const uint8_t* src = static_cast<const uint8_t*>(s_.page_base(d.page));
    s_.backend_->copy_2d_to_host_async(stage_, L.block_bytes(d.n), src, L.block_bytes(L.page_size), L.block_bytes(d.n),
                                       L.n_blocks(), d.fence);
    const Status copied = s_.backend_->wait_host_copies();
    give_back(d.page);
    if (!copied.is_ok()) return copy_failed(copied);
    PageMeta meta;
    meta.fingerprint = s_.fingerprint_;
    meta.parent = parent;
    meta.first_pos = d.first_pos;
    meta.tokens.assign(tokens, tokens + d.n);
    auto r = append_record(meta, L.data_bytes(d.n));
    if (!r.is_ok()) return write_failed(r.status());
    w.tail = Tail{true, seg_id_, r->first, int64_t(seg_->size()) - r->first, r->second, d.first_pos, d.n, parent};
    w.tail_committed = false;
    ++pending_records_;
    ++s_.counters_.tails_written;
  }

  // A failed device->host copy: the staging bytes are not the page's, so nothing is written (a
  // page becomes a future miss; a session's durable position does not advance).
  void copy_failed(const Status& st) {
    ++s_.counters_.write_errors;
    if (!copy_error_reported_) {
      std::fprintf(stderr, "[anvil] kv store: %s; the page is not saved\n", st.message().c_str());
      copy_error_reported_ = true;
    }
  }

  // A failed append or sync: the batch's records are abandoned (a session's durable position does
  // not advance; its pages are handed back to the engine to offer again, invariant 11), the
  // segment is cut back to its committed end and sealed, and the next record starts a new segment.
  void write_failed(const Status& st) {
    ++s_.counters_.write_errors;
    if (!warned_) {
      std::fprintf(stderr,
                   "[anvil] kv store: %s (pages of this batch are not persisted; they are offered again once the "
                   "store can write)\n",
                   st.message().c_str());
      warned_ = true;
    }
    lose_pending();
    pending_.clear();
    pending_keys_.clear();
    pending_records_ = 0;
    for (auto& [id, w] : ws_)
      if (w.tail.valid && !w.tail_committed) w.tail.valid = false;
    if (seg_) {
      (void)seg_->truncate(uint64_t(committed_end_));
      seal_.bind(1, committed_end_);
      seal_.bind(2, seg_id_);
      (void)seal_.run();
      seg_.reset();
    }
  }

  // The batch's pages (and any page failed_ already holds) go to the store's failed list, for the
  // engine to offer again (invariant 11).
  void lose_pending() {
    for (const Pending& p : pending_) failed_.push_back({p.page, p.first_pos, p.key});
    s_.pages_failed(failed_);
    failed_.clear();
  }

  void extend_session_keys(WSess& w, const std::vector<int32_t>& toks, int full) {
    const int P = s_.layout_.page_size;
    full = std::min(full, int(toks.size()) / P);
    while (int(w.keys.size()) < full) {
      const size_t i = w.keys.size();
      Hash128 parent = i ? w.keys[i - 1] : Hash128{};
      w.keys.push_back(kv_page_key(s_.fingerprint_, parent, std::span<const int32_t>(toks).subspan(i * P, P)));
    }
  }

  // The session's durable position: its leading full pages that are committed, plus the tail when
  // it continues them.
  int session_durable(WSess& w, const std::vector<int32_t>& toks) {
    const int P = s_.layout_.page_size;
    const int full = int(toks.size()) / P;
    extend_session_keys(w, toks, full);
    while (w.present < full && known(w.keys[size_t(w.present)])) ++w.present;
    int d = w.present * P;
    if (w.tail.valid && w.tail.first == d) d += w.tail.n;
    return std::min(d, int(toks.size()));
  }

  // Before the recording's first tail descriptor: the row's tail `old` stays the session's tail when
  // the recording's tokens begin with the tokens it is the KV of (a resume appends to them; anvil
  // run's dropped turns do not), so that rewriting the row for the recording's pages loses none of
  // its durable rows. Its own tokens equal is not enough: they may recur where the tail was on
  // another prefix (dropped turns of a repetitive text); the tail's parent, the chain key of every
  // token before it (and of the model), must be the recording's too.
  Status keep_row_tail(WSess& w, const std::string& name, const Tail& old, const std::vector<int32_t>& toks) {
    const int P = s_.layout_.page_size;
    w.tail.valid = false;
    row_tail_.bind(1, name);
    ANVIL_ASSIGN_OR_RETURN(bool row, row_tail_.step());
    bool keep = false;
    Hash128 parent;
    if (row && old.first >= 0 && old.first % P == 0 && old.n > 0 && size_t(old.first) + size_t(old.n) <= toks.size() &&
        size_t(row_tail_.col_bytes(0)) >= (size_t(old.first) + size_t(old.n)) * 4 &&
        row_tail_.col_hash(2) == s_.fingerprint_) {
      const int32_t* t = static_cast<const int32_t*>(row_tail_.col_blob(0));
      parent = row_tail_.col_hash(1);
      extend_session_keys(w, toks, old.first / P);
      const Hash128 chain = old.first ? w.keys[size_t(old.first / P) - 1] : Hash128{};
      keep = parent == chain && std::equal(t + old.first, t + old.first + old.n, toks.begin() + old.first);
    }
    row_tail_.reset();
    if (keep) {
      w.tail = old;
      w.tail.parent = parent;
      w.tail_committed = true;
    }
    return Status::ok();
  }

  // Rewrites the row of every session that changed since the last commit (invariant 8).
  Status commit_sessions(int64_t now) {
    for (auto& [id, w] : ws_) {
      if (!w.dirty) continue;
      std::vector<int32_t> toks;
      std::string name, meta;
      if (!session_tokens(id, SIZE_MAX, &toks, &name, &meta)) continue;
      uncommitted_.push_back({id, w.present, w.pages_written});  // undone if the transaction is not
      // The tail record the row references now (none when it has no row yet, or no tail).
      old_tail_.bind(1, name);
      ANVIL_ASSIGN_OR_RETURN(bool had, old_tail_.step());
      Tail old;
      if (had)
        old = Tail{true, old_tail_.col_int(0), old_tail_.col_int(1), old_tail_.col_int(2), uint64_t(old_tail_.col_int(3)),
                   int(old_tail_.col_int(4)), int(old_tail_.col_int(5)), {}};
      old_tail_.reset();
      if (had && !w.own_tail) ANVIL_RETURN_IF_ERROR(keep_row_tail(w, name, old, toks));
      // A committed tail that a compaction moved since (compact_segments rewrites the row): the
      // row's location is the live one, the one this process wrote may be deleted.
      if (had && w.tail.valid && w.tail_committed && old.len == w.tail.len && old.sum == w.tail.sum &&
          old.first == w.tail.first && old.n == w.tail.n) {
        w.tail.seg = old.seg;
        w.tail.off = old.off;
      }
      const int durable = session_durable(w, toks);
      put_session_.bind(1, name);
      put_session_.bind(2, s_.fingerprint_);
      put_session_.bind_blob(3, toks.data(), toks.size() * 4);
      put_session_.bind(4, int64_t(durable));
      if (w.tail.valid) {
        put_session_.bind(5, w.tail.seg);
        put_session_.bind(6, w.tail.off);
        put_session_.bind(7, w.tail.len);
        put_session_.bind(8, int64_t(w.tail.sum));
        put_session_.bind(9, int64_t(w.tail.first));
        put_session_.bind(10, int64_t(w.tail.n));
        put_session_.bind(11, w.tail.parent);
      }  // else NULL: bindings are cleared after every run
      put_session_.bind(12, now);
      put_session_.bind(13, meta);
      put_session_.bind(14, int64_t(session_sum(toks.data(), toks.size(), meta)));
      ANVIL_RETURN_IF_ERROR(put_session_.run());
      // live_bytes counts each referenced tail record once (catalog.h): the record the row let go
      // of leaves it unless another row (a fork's) still shares it, whether the row now has a new
      // tail or none (KV ending on a page boundary); the record it took up joins it unless it was
      // counted already (the row was removed and is written again).
      const bool same = had && w.tail.valid && old.seg == w.tail.seg && old.off == w.tail.off;
      if (had && !same) ANVIL_RETURN_IF_ERROR(tail_ref_dropped(db_, old.seg, old.off, old.len));
      if (w.tail.valid && !same) ANVIL_RETURN_IF_ERROR(tail_ref_added(db_, w.tail.seg, w.tail.off, w.tail.len));
      for (; w.pages_written < int(w.keys.size()); ++w.pages_written) {
        put_sess_page_.bind(1, name);
        put_sess_page_.bind(2, int64_t(w.pages_written));
        put_sess_page_.bind(3, w.keys[size_t(w.pages_written)]);
        ANVIL_RETURN_IF_ERROR(put_sess_page_.run());
      }
      trim_sess_pages_.bind(1, name);
      trim_sess_pages_.bind(2, int64_t(w.keys.size()));
      ANVIL_RETURN_IF_ERROR(trim_sess_pages_.run());
      committed_sessions_.push_back({id, durable});  // applied to the recording once COMMIT succeeds
    }
    return Status::ok();
  }

  // Deletes rows whose records failed a read (bad_), before this batch inserts their replacements.
  Status drop_bad_rows(const std::vector<BadRow>& bad) {
    for (const BadRow& b : bad) {
      std::string where = b.off < 0 ? "segment = " + std::to_string(b.seg)
                                    : "segment = " + std::to_string(b.seg) + " AND offset = " + std::to_string(b.off);
      ANVIL_ASSIGN_OR_RETURN(int64_t bytes, catalog_int(db_, "SELECT COALESCE(SUM(length), 0) FROM pages WHERE " + where));
      SqliteStmt del;
      ANVIL_RETURN_IF_ERROR(del.prepare(db_, "DELETE FROM pages WHERE " + where + (b.off < 0 ? "" : " AND key = ?")));
      if (b.off >= 0) del.bind(1, b.key);
      ANVIL_RETURN_IF_ERROR(del.run());
      ANVIL_RETURN_IF_ERROR(db_.exec("UPDATE segments SET live_bytes = MAX(0, live_bytes - " + std::to_string(bytes) +
                                     ") WHERE id = " + std::to_string(b.seg)));
    }
    return Status::ok();
  }

  Status commit() {
    committed_sessions_.clear();
    uncommitted_.clear();
    ANVIL_RETURN_IF_ERROR(db_.exec("BEGIN IMMEDIATE"));
    const int64_t now = now_us();
    int64_t live_added = 0;
    {
      std::vector<BadRow> bad;
      {
        std::lock_guard<std::mutex> lk(s_.pin_mu_);
        bad.swap(s_.bad_);
        s_.bad_locs_.clear();
        s_.lost_segs_.clear();
      }
      ANVIL_RETURN_IF_ERROR(drop_bad_rows(bad));
    }
    for (const Pending& p : pending_) {
      ins_page_.bind(1, p.key);
      ins_page_.bind(2, p.parent);
      ins_page_.bind(3, s_.fingerprint_);
      ins_page_.bind(4, int64_t(p.first_pos));
      ins_page_.bind_blob(5, p.tokens.data(), p.tokens.size() * 4);
      ins_page_.bind(6, seg_id_);
      ins_page_.bind(7, p.off);
      ins_page_.bind(8, p.len);
      ins_page_.bind(9, int64_t(p.sum));
      ins_page_.bind(10, now);
      ANVIL_RETURN_IF_ERROR(ins_page_.run());
      if (sqlite3_changes(db_.handle()) == 1) live_added += p.len;  // else another process stored it first
    }
    {
      std::vector<std::pair<Hash128, int64_t>> touched;
      {
        std::lock_guard<std::mutex> lk(s_.pin_mu_);
        touched.swap(s_.touched_);
      }
      for (auto& [k, t] : touched) {
        touch_.bind(1, t);
        touch_.bind(2, k);
        ANVIL_RETURN_IF_ERROR(touch_.run());
      }
    }
    ANVIL_RETURN_IF_ERROR(commit_sessions(now));
    if (seg_) {
      set_end_.bind(1, int64_t(seg_->size()));
      set_end_.bind(2, seg_id_);
      ANVIL_RETURN_IF_ERROR(set_end_.run());
      if (live_added) {
        add_live_.bind(1, live_added);
        add_live_.bind(2, seg_id_);
        ANVIL_RETURN_IF_ERROR(add_live_.run());
      }
    }
    return db_.commit();
  }

  void flush() {
    if (pending_records_ > 0 && s_.opts_.durability != Durability::kNone) {
      const auto ts = Clock::now();
      Status st = seg_->sync();  // invariant 1: data durable before the rows that reference it
      s_.counters_.sync_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - ts).count();
      ++s_.counters_.fsyncs;
      if (!st.is_ok()) write_failed(st);
    }
    bool touched;
    {
      std::lock_guard<std::mutex> lk(s_.pin_mu_);
      touched = !s_.touched_.empty() || !s_.bad_.empty();
    }
    if (pending_records_ > 0 || any_dirty_ || touched) {
      const auto tc = Clock::now();
      Status st = commit();
      s_.counters_.commit_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - tc).count();
      ++s_.counters_.transactions;
      if (!st.is_ok()) {
        (void)db_.exec("ROLLBACK");
        // The rolled back rows and references are not written, nor durable the batch's pages, lost
        // with it (its records are past committed_end): the next commit writes them again from there.
        for (const Uncommitted& u : uncommitted_)
          if (auto it = ws_.find(u.id); it != ws_.end()) {
            it->second.present = u.present;
            it->second.pages_written = u.pages_written;
          }
        ++s_.counters_.write_errors;
        if (!commit_warned_) {
          std::fprintf(stderr,
                       "[anvil] kv store: catalog commit failed: %s (its pages are offered again once a commit "
                       "succeeds)\n",
                       st.message().c_str());
          commit_warned_ = true;
        }
        commit_error_ = st.message();
        lose_pending();  // the batch's pages: not stored, offered again (invariant 11)
      } else {
        if (seg_) committed_end_ = int64_t(seg_->size());
        if (pending_records_ > 0) s_.writer_recovered();  // records written, synced and committed
        for (auto& [id, w] : ws_)
          if (w.tail.valid) w.tail_committed = true;
        commit_error_.clear();
        std::lock_guard<std::mutex> lk(s_.sess_mu_);
        for (auto [id, durable] : committed_sessions_)
          if (auto it = s_.recs_.find(id); it != s_.recs_.end()) {
            it->second->final_durable = durable;
            it->second->saved = true;
          }
      }
    }
    pending_.clear();
    pending_keys_.clear();
    pending_records_ = 0;
    // A session whose row did not commit stays dirty, so the next flush writes it again; an ended
    // one goes with this flush either way, and session_finish reports a row that never committed.
    any_dirty_ = false;
    for (auto it = ws_.begin(); it != ws_.end();) {
      WSess& w = it->second;
      if (w.dirty && !commit_error_.empty()) {
        std::lock_guard<std::mutex> lk(s_.sess_mu_);
        if (auto r = s_.recs_.find(it->first); r != s_.recs_.end()) {
          r->second->saved = false;
          r->second->save_error = commit_error_;
        }
      }
      w.dirty = w.dirty && !commit_error_.empty() && !w.ending;
      any_dirty_ = any_dirty_ || w.dirty;
      it = w.ending ? ws_.erase(it) : std::next(it);
    }
    if (seg_ && seg_->size() >= s_.opts_.segment_bytes) {  // roll over: seal this segment
      seal_.bind(1, committed_end_);
      seal_.bind(2, seg_id_);
      if (seal_.run().is_ok()) seg_.reset();
    }
    maybe_gc();
    account_busy();  // before the flush is done: a caller of flush() reads writer_busy_ns after it
    std::lock_guard<std::mutex> lk(s_.mu_);
    s_.done_ticket_ = std::max(s_.done_ticket_, ticket_);
    s_.cv_done_.notify_all();
  }

  // Adds the time since busy_from_ to writer_busy_ns (the loop's iteration so far).
  void account_busy() {
    const auto now = Clock::now();
    s_.counters_.writer_busy_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(now - busy_from_).count();
    busy_from_ = now;
  }

  void maybe_gc() {
    // Over the cap with nothing evictable (sessions' KV only): the search for victims scans every
    // page, so it is not run again at every flush while nothing new could be evictable: not until
    // this writer stores an anonymous page, or kRetryOverCap passed (pages a session gave up here or
    // in another process: kv rm, a run's dropped turns, add no bytes meanwhile).
    const auto now = Clock::now();
    if (stuck_over_cap_ && !anon_written_ && now < retry_gc_at_) return;
    anon_written_ = false;
    auto live = catalog_live_bytes(db_);
    if (!live.is_ok() || uint64_t(*live) <= s_.opts_.max_bytes) {
      stuck_over_cap_ = false;
      return;
    }
    // Evict to 90% of the cap so eviction runs in batches, not at every flush.
    auto pinned = [this](const Hash128& k) {
      std::lock_guard<std::mutex> lk(s_.pin_mu_);
      return s_.pinned_.count(k) > 0 || pending_keys_.count(k) > 0;
    };
    auto n = evict_lru(db_, s_.opts_.max_bytes / 10 * 9, pinned);
    if (n.is_ok()) s_.counters_.pages_evicted += *n;
    stuck_over_cap_ = warn_over_cap();
    retry_gc_at_ = now + kRetryOverCap;
    std::set<int64_t> own;
    if (seg_) own.insert(seg_id_);
    (void)compact_segments(db_, s_.env_, s_.opts_.dir, own);
  }

  // What eviction cannot take (invariant 7: pages sessions reference, session tails, pages a
  // restore has pinned) may alone exceed the cap: the store then stays over it. Said once each time
  // it happens (again after the store was back under its cap), with what frees the room.
  // Returns whether the store is still over its cap.
  bool warn_over_cap() {
    auto live = catalog_live_bytes(db_);
    if (!live.is_ok()) return false;
    const bool over = uint64_t(*live) > s_.opts_.max_bytes;
    if (over && !over_cap_warned_) {
      auto mib = [](int64_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; };
      std::fprintf(stderr,
                   "[anvil] kv store %s: %s live after eviction, over --kv-store-max %s: what is left is the KV "
                   "of saved sessions (their pages and tails), which is never evicted; the store stays over its "
                   "cap until sessions are removed (anvil kv rm NAME) or the cap is raised\n",
                   s_.opts_.dir.c_str(), mib(*live).c_str(), mib(int64_t(s_.opts_.max_bytes)).c_str());
      ++s_.counters_.over_cap_warnings;
    }
    over_cap_warned_ = over;
    return over;
  }

  struct Pending {
    Hash128 key, parent;
    int first_pos;
    std::vector<int32_t> tokens;
    int64_t off, len;
    uint64_t sum;
    int32_t page;  // the pool page it was copied from (the engine offers it again if lost)
  };
  std::vector<FailedPage> failed_;  // pages lost by this failure, for lose_pending
  KVStore& s_;
  SqliteDb db_;
  SqliteStmt has_page_, ins_page_, add_live_, set_end_, seal_, touch_, old_tail_, row_tail_, put_session_,
      put_sess_page_, trim_sess_pages_;
  void* stage_ = nullptr;
  XXH3_state_t* xxh_ = XXH3_createState();
  bool copy_error_reported_ = false;
  std::unique_ptr<AppendFile> seg_;
  int64_t seg_id_ = 0, committed_end_ = 0;
  uint64_t writeback_mark_ = 0;  // the segment size at the last start_writeback
  std::vector<Pending> pending_;
  std::set<Hash128> pending_keys_;
  int pending_records_ = 0;
  Clock::time_point first_pending_;
  uint64_t ticket_ = 0;
  bool warned_ = false, commit_warned_ = false;
  bool over_cap_warned_ = false;  // warn_over_cap said so, and the store has not been under its cap since
  // maybe_gc's back-off while sessions alone keep the store over its cap.
  static constexpr std::chrono::seconds kRetryOverCap{5};
  bool stuck_over_cap_ = false, anon_written_ = false;
  Clock::time_point retry_gc_at_{};
  Clock::time_point busy_from_{};  // the start of the time not yet added to writer_busy_ns
  std::string commit_error_;  // the last catalog commit's error; empty once one succeeds
  std::vector<std::pair<uint32_t, int>> committed_sessions_;  // (recording, durable) rows of this commit
  // What commit_sessions found of each recording it wrote (its committed leading pages, the page
  // references its row has): put back when the transaction fails, with the pages of the batch.
  struct Uncommitted {
    uint32_t id;
    int present, pages_written;
  };
  std::vector<Uncommitted> uncommitted_;
  // The recorded sessions.
  std::map<uint32_t, WSess> ws_;
  bool any_dirty_ = false;  // some ws_ entry is dirty

 public:
  int64_t segment_id() const { return seg_ ? seg_id_ : -1; }
};

}  // namespace anvil
