// KVStore restores: a run of full pages found in the catalog is read, checked (invariant 3) and
// landed in fresh pool pages, and handed to the engine only when the whole run succeeded; a
// session's partial tail page likewise. Anything missing or bad is a miss, never an error; after a
// bad record every later record of the run is checked too, and each bad one dropped by the writer
// (invariant 3), so that the recomputed pages are stored again.
//
// Restore bandwidth (docs/benchmarks.md): each record is read once, straight into its KV page on
// the CPU backend (on a device backend into one of two pinned staging slots, the host->device copy
// of page i overlapping the read of page i+1), checksummed chunk by chunk while in cache, and its
// header compared with the expected one instead of being parsed.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "kvstore/catalog.h"
#include "kvstore/checksum.h"
#include "kvstore/kvstore.h"
#include "runtime/kv_pool.h"

namespace anvil {

using Clock = std::chrono::steady_clock;

Result<ReadFile*> KVStore::segment_reader(int64_t seg) {
  auto it = readers_.find(seg);
  if (it != readers_.end()) return it->second.get();
  ANVIL_ASSIGN_OR_RETURN(auto f, env_->open_read(segment_path(seg)));
  ReadFile* p = f.get();
  readers_[seg] = std::move(f);
  return p;
}

Result<const uint8_t*> KVStore::read_record(int64_t seg, int64_t off, int64_t len, uint64_t sum, const Hash128& key,
                                            const Hash128& parent, int first_pos, std::span<const int32_t> tokens,
                                            PageMeta* meta) {
  const std::string label = segment_path(seg) + "@" + std::to_string(off);
  if (len <= 0 || len > int64_t(page_bytes_ + (1 << 20))) return corrupt(label + ": implausible record length");
  ANVIL_ASSIGN_OR_RETURN(ReadFile * f, segment_reader(seg));
  read_buf_.resize(size_t(len));
  ANVIL_RETURN_IF_ERROR(f->read_at(uint64_t(off), read_buf_.data(), read_buf_.size()));
  if (record_checksum(read_buf_.data(), read_buf_.size()) != sum) return corrupt(label + ": record checksum mismatch");
  const uint8_t* data = nullptr;
  // The catalog's checksum just covered every byte; the record's own data checksum is for
  // standalone readers and kv verify.
  ANVIL_RETURN_IF_ERROR(
      page_record_parse(read_buf_.data(), read_buf_.size(), layout_, fingerprint_, meta, &data, label, false));
  if (meta->key != key || meta->parent != parent || meta->first_pos != first_pos ||
      !std::equal(meta->tokens.begin(), meta->tokens.end(), tokens.begin(), tokens.end()))
    return corrupt(label + ": record identity (key, parent, position or token ids) differs from the request");
  return data;
}

namespace {

// Threads that read one run of records at once: several where pages are host memory or where the
// backend takes copies from several threads, when the run is long enough to share; up to 16 (CUDA
// on the H200, a 4,096-token qwen3-8b prefix after a restart, its staging pinned at attach: restored
// in 44.0 ms on 4 threads, 20.8-27.2 on 8, 16.0-20.5 on 16 over three server runs; session 14; one
// core's copy out of the page cache is bounded by the misses it keeps in flight). The restore
// blocks the engine's thread anyway, so using every core for those milliseconds costs nothing else.
// ANVIL_KV_RESTORE_THREADS=N sets the count (1 is serial).
int restore_threads_for(bool host_memory, bool concurrent_copies, size_t pages) {
  static const int forced = [] {
    const char* e = std::getenv("ANVIL_KV_RESTORE_THREADS");
    return e && *e ? std::min(16, std::max(1, std::atoi(e))) : 0;
  }();
  if (pages < 4 || !(host_memory || concurrent_copies)) return 1;
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  const int want = forced ? forced : std::min(hw, 16);
  return std::max(1, std::min<int>(want, int(pages / 2)));
}

}  // namespace

// Pins staging slots of a page each until there are `slots` (fewer if pinning fails).
void KVStore::pin_staging(size_t slots) {
  while (staging_.size() < slots) {
    auto s = backend_->alloc_host_staging(page_bytes_);
    if (!s.is_ok()) return;
    staging_.push_back(*s);
  }
}

// Pinning host memory is slow (cudaMallocHost of a 2.4 MB qwen3-8b page: ~1 ms), and a restore
// right after a restart is the one whose time matters most, so attach() pins a device's slots up
// front (for the most threads a restore takes); restore_pages still pins any that are missing (an
// allocation that failed here).
void KVStore::reserve_restore_staging() {
  if (backend_->device_memory_is_host()) return;
  const int threads = restore_threads_for(false, backend_->device_copies_concurrent(), size_t(1) << 20);
  pin_staging(size_t(2 * threads));
}

// One record of a run being restored: where the catalog says it is.
struct KVStore::RestoreItem {
  Hash128 key, parent;
  int64_t seg = 0, off = 0, len = 0;
  uint64_t sum = 0;
};

// Reads one full-page record into pool page `page` and checks it (invariant 3). The data goes
// straight into the page where the backend's memory is host memory (CPU), else into staging slot
// `slot`, from which an asynchronous host->device copy takes it. The checksum is computed chunk by
// chunk right after each chunk is read, while the bytes are still in this core's cache: one pass
// over memory (the read itself) instead of three (read, checksum, copy). A checksum thread
// overlapping the reads was tried and measured slower (docs/benchmarks.md).
Status KVStore::load_page_record(const RestoreItem& it, int first_pos, std::span<const int32_t> toks, int32_t page,
                                 int slot, RestoreScratch& scratch) {
  std::vector<uint8_t>* hdr = &scratch.hdr;
  const std::string label = segment_path(it.seg) + "@" + std::to_string(it.off);
  const int64_t hdr_len = it.len - int64_t(page_bytes_);
  if (hdr_len < 16 || hdr_len > (1 << 20)) return corrupt(label + ": implausible record length");
  ANVIL_ASSIGN_OR_RETURN(ReadFile * f, segment_reader(it.seg));
  hdr->resize(size_t(hdr_len));
  ANVIL_RETURN_IF_ERROR(f->read_at(uint64_t(it.off), hdr->data(), hdr->size()));
  const bool direct = backend_->device_memory_is_host();
  uint8_t* dst;
  if (direct) {
    dst = static_cast<uint8_t*>(page_base_mut(page));
  } else {
    dst = static_cast<uint8_t*>(staging_[size_t(slot)]);  // allocated by restore_pages
  }
  XXH3_state_s* xxh = scratch.xxh;
  XXH3_64bits_reset(xxh);
  XXH3_64bits_update(xxh, hdr->data(), hdr->size());
  constexpr size_t kChunk = 256 << 10;  // well inside L2: hashed before it is evicted
  for (size_t c = 0; c < page_bytes_; c += kChunk) {
    const size_t m = std::min(kChunk, page_bytes_ - c);
    ANVIL_RETURN_IF_ERROR(f->read_at(uint64_t(it.off + hdr_len) + c, dst + c, m));
    XXH3_64bits_update(xxh, dst + c, m);
  }
  if (XXH3_64bits_digest(xxh) != it.sum) return corrupt(label + ": record checksum mismatch");
  PageMeta want;
  want.fingerprint = fingerprint_;
  want.key = it.key;
  want.parent = it.parent;
  want.first_pos = first_pos;
  want.tokens.assign(toks.begin(), toks.end());
  if (!page_record_header_matches(hdr->data(), hdr->size(), layout_, want)) {
    // Not this version's exact header: parse the whole record the general way.
    std::vector<uint8_t>& rec = scratch.rec;
    rec.resize(size_t(it.len));
    std::memcpy(rec.data(), hdr->data(), hdr->size());
    std::memcpy(rec.data() + hdr->size(), dst, page_bytes_);
    PageMeta meta;
    const uint8_t* d = nullptr;
    ANVIL_RETURN_IF_ERROR(page_record_parse(rec.data(), rec.size(), layout_, fingerprint_, &meta, &d, label, false));
    if (meta.key != it.key || meta.parent != it.parent || meta.first_pos != first_pos || meta.tokens != want.tokens)
      return corrupt(label + ": record identity (key, parent, position or token ids) differs from the request");
  }
  if (!direct) {
    // At most one copy in flight per thread: its previous record's copy ran while this one was
    // read; wait for that slot's (slot ^ 1, the one this thread reads next) last copy only, not for
    // other threads' newer ones (on the H200 a 4,096-token restore on 2 threads took 88.9 against
    // 110.2 ms waiting for every copy; on 4, 58.9-60.3 either way: session 14), and queue this one.
    ANVIL_RETURN_IF_ERROR(backend_->wait_device_copies_from(staging_[size_t(slot ^ 1)]));
    backend_->copy_to_device_async(page_base_mut(page), dst, page_bytes_);
  }
  return Status::ok();
}

int KVStore::restore_pages(std::span<const int32_t> tokens, int first, const Hash128& parent_key, int max_pages,
                           KVPool& pool, std::vector<int32_t>* pages, std::vector<Hash128>* keys) {
  if (!writer_ || max_pages <= 0) return 0;
  const auto t0 = Clock::now();
  const int P = layout_.page_size;
  // 1. The catalog: the run of pages that are stored, their identity as the catalog has it first
  //    (invariant 3: a key match alone is never trusted). Primary-key probes only.
  std::vector<RestoreItem> run;
  Hash128 parent = parent_key;
  for (int i = first; i < first + max_pages; ++i) {
    auto toks = tokens.subspan(size_t(i) * P, size_t(P));
    const Hash128 key = kv_page_key(fingerprint_, parent, toks);
    q_page_.bind(1, key);
    auto row = q_page_.step();
    if (!row.is_ok() || !*row) {
      q_page_.reset();
      ++counters_.restore_misses;
      break;
    }
    const bool ident_ok = q_page_.col_hash(0) == parent && q_page_.col_bytes(1) == toks.size_bytes() &&
                          std::memcmp(q_page_.col_blob(1), toks.data(), toks.size_bytes()) == 0 &&
                          q_page_.col_int(6) == int64_t(i) * P;
    RestoreItem it{key, parent, q_page_.col_int(2), q_page_.col_int(3), q_page_.col_int(4),
                   uint64_t(q_page_.col_int(5))};
    q_page_.reset();
    if (!ident_ok) {  // the same key with other tokens: a collision (or a forged row); never used
      ++counters_.restore_corrupt;
      break;
    }
    run.push_back(it);
    parent = key;
  }
  if (run.empty()) {
    counters_.restore_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
    return 0;
  }
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    for (auto& it : run) pinned_.insert(it.key);
  }
  // 2. Read and check each record into a fresh pool page; the first failure ends the run.
  std::vector<int32_t> loaded;
  loaded.reserve(run.size());
  size_t failed_at = run.size();
  Status failed;
  RestoreScratch main_scratch{restore_xxh_, std::move(hdr_buf_), {}};
  const bool direct = backend_->device_memory_is_host();
  const int threads = restore_threads_for(direct, backend_->device_copies_concurrent(), run.size());
  // Pool pages, segment readers and staging are taken here first. Several threads then read the
  // records at once (one core's copy out of the page cache is bounded by the misses it can keep in
  // flight, well below the memory system's rate: on the H200 machine one thread restored 6.3 GB/s
  // where the copy to the device runs at ~50): with host memory (CPU backend) each into its own
  // pages, on a device through two pinned staging slots per thread. They touch only their records,
  // pages, slots and scratch. No record past the first failure is read.
  if (!direct) {
    pin_staging(size_t(2 * threads));
    if (staging_.size() < 2) {
      hdr_buf_ = std::move(main_scratch.hdr);
      counters_.restore_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      std::lock_guard<std::mutex> lk(pin_mu_);
      for (auto& it : run) pinned_.erase(pinned_.find(it.key));
      return 0;  // no staging: recomputed instead
    }
  }
  const int threads_here = direct ? threads : std::min(threads, int(staging_.size() / 2));
  for (size_t j = 0; j < run.size(); ++j) {
    const int32_t page = pool.kv_page_alloc();
    if (page < 0) break;  // pool full: the rest is recomputed
    loaded.push_back(page);
  }
  std::vector<Status> st(loaded.size());
  for (size_t j = 0; j < loaded.size(); ++j) {
    auto r = segment_reader(run[j].seg);
    if (!r.is_ok()) st[j] = r.status();
  }
  std::atomic<size_t> stop{loaded.size()};  // the first failing record seen so far
  auto work = [&](int w, RestoreScratch& scratch) {
    int k = 0;  // this thread's records so far: its slot alternates
    for (size_t j = size_t(w); j < stop.load(std::memory_order_relaxed); j += size_t(threads_here), ++k) {
      const int i = first + int(j);
      if (st[j].is_ok())
        st[j] = load_page_record(run[j], i * P, tokens.subspan(size_t(i) * P, size_t(P)), loaded[j], 2 * w + (k & 1),
                                 scratch);
      if (!st[j].is_ok()) {
        size_t cur = stop.load();
        while (j < cur && !stop.compare_exchange_weak(cur, j)) {
        }
      }
    }
  };
  std::vector<RestoreScratch> scratch(size_t(threads_here - 1));
  std::vector<std::thread> pool_threads;
  for (int w = 1; w < threads_here; ++w) {
    scratch[size_t(w - 1)].xxh = XXH3_createState();
    pool_threads.emplace_back(work, w, std::ref(scratch[size_t(w - 1)]));
  }
  work(0, main_scratch);
  for (auto& t : pool_threads) t.join();
  for (auto& sc : scratch) XXH3_freeState(sc.xxh);
  for (size_t j = 0; j < st.size(); ++j)
    if (!st[j].is_ok()) {
      failed_at = j;
      failed = st[j];
      break;
    }
  hdr_buf_ = std::move(main_scratch.hdr);
  if (failed_at < run.size()) {
    ++counters_.restore_corrupt;
    // Every page past the first failure is recomputed, so every one of them is checked now too:
    // a damaged row left standing would make the writer skip the recomputed page as already
    // stored (invariant 6) and count it durable, and the next restore stop there again (a
    // truncated segment healed one page per resume). Only the bad ones are dropped: a sound page
    // may be another session's too.
    std::vector<std::pair<size_t, StatusCode>> bad{{failed_at, failed.code()}};
    for (size_t j = failed_at + 1; j < run.size(); ++j) {
      const int i = first + int(j);
      PageMeta meta;
      auto r = read_record(run[j].seg, run[j].off, run[j].len, run[j].sum, run[j].key, run[j].parent, i * P,
                           tokens.subspan(size_t(i) * P, size_t(P)), &meta);
      if (!r.is_ok()) bad.push_back({j, r.status().code()});
    }
    std::lock_guard<std::mutex> lk(pin_mu_);
    for (auto [j, code] : bad) {
      const RestoreItem& it = run[j];
      const bool lost = code == StatusCode::kNotFound;
      if (lost && lost_segs_.count(it.seg)) continue;  // its rows all go already
      bad_.push_back({it.key, it.seg, lost ? -1 : it.off});
      if (lost) lost_segs_.insert(it.seg);
      else bad_locs_.insert({it.seg, it.off});
    }
  }
  // 3. Installed only now, after every page of the run loaded, validated and (on a device) landed.
  Status done = backend_->wait_device_copies();
  if (done.is_ok()) done = backend_->synchronize();
  const size_t n = done.is_ok() ? std::min(failed_at, loaded.size()) : 0;
  if (!done.is_ok()) ++counters_.restore_corrupt;
  for (size_t j = n; j < loaded.size(); ++j) pool.kv_page_release(loaded[j]);
  {
    std::lock_guard<std::mutex> lk(pin_mu_);
    const int64_t now = now_us();
    for (size_t j = 0; j < run.size(); ++j) {
      pinned_.erase(pinned_.find(run[j].key));
      if (j < n) touched_.push_back({run[j].key, now});
    }
  }
  for (size_t j = 0; j < n; ++j) {
    pages->push_back(loaded[j]);
    keys->push_back(run[j].key);
  }
  counters_.restored_pages += int64_t(n);
  counters_.restored_bytes += int64_t(n) * int64_t(page_bytes_);
  counters_.restore_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  return int(n);
}

int KVStore::restore_tail(std::span<const int32_t> tokens, int first_pos, const Hash128& parent, int max_tokens,
                          KVPool& pool, int32_t* page_out) {
  if (!writer_ || max_tokens <= 0) return 0;
  const auto t0 = Clock::now();
  q_tail_.bind(1, parent);
  q_tail_.bind(2, int64_t(first_pos));
  q_tail_.bind(3, fingerprint_);
  struct Cand {
    int64_t seg, off, len;
    uint64_t sum;
    int n;
  };
  std::optional<Cand> best;
  while (true) {
    auto row = q_tail_.step();
    if (!row.is_ok() || !*row) break;
    const int n = int(q_tail_.col_int(5));
    const size_t sess_len = q_tail_.col_bytes(0) / 4;
    if (n > max_tokens || size_t(first_pos + n) > sess_len) continue;
    // The session's own token ids over the tail must equal the request's.
    const int32_t* st = static_cast<const int32_t*>(q_tail_.col_blob(0));
    if (!std::equal(st, st + first_pos + n, tokens.begin())) continue;
    if (!best || n > best->n)
      best = Cand{q_tail_.col_int(1), q_tail_.col_int(2), q_tail_.col_int(3), uint64_t(q_tail_.col_int(4)), n};
  }
  q_tail_.reset();
  if (!best) return 0;
  PageMeta meta;
  auto toks = tokens.subspan(size_t(first_pos), size_t(best->n));
  auto data = read_record(best->seg, best->off, best->len, best->sum, Hash128{}, parent, first_pos, toks, &meta);
  if (!data.is_ok()) {
    ++counters_.restore_corrupt;
    return 0;
  }
  int32_t page = pool.kv_page_alloc();
  if (page < 0) return 0;
  const size_t src_blk = layout_.block_bytes(best->n), dst_blk = layout_.block_bytes(layout_.page_size);
  uint8_t* dst = static_cast<uint8_t*>(page_base_mut(page));
  for (size_t b = 0; b < layout_.n_blocks(); ++b) backend_->copy_to_device(dst + b * dst_blk, *data + b * src_blk, src_blk);
  if (!backend_->synchronize().is_ok()) {
    pool.kv_page_release(page);
    ++counters_.restore_corrupt;
    return 0;
  }
  counters_.restored_bytes += int64_t(layout_.data_bytes(best->n));
  counters_.restore_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  *page_out = page;
  return best->n;
}

}  // namespace anvil
