// The engine's narrow hook into a durable page store (src/kvstore/ implements it). The engine calls
// it on its own (decode) thread: page_full when a page of a sequence becomes full and immutable,
// restore_* while building a new sequence's prefix, reap to take back pages the store retained.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/hash128.h"

namespace anvil {

class KVPool;

// A full page's durable identity is the engine's page key (runtime/kv_pool.h: kv_page_key, rooted
// at kv_cache_root of the model fingerprint and the KV layout); the store's fingerprint() is that root.

class PageStore {
 public:
  virtual ~PageStore() = default;
  // The fingerprint every page key of this store is chained from.
  virtual const Hash128& fingerprint() const = 0;
  // Pool page `page` of sequence `seq` now holds positions [first_pos, first_pos + P) = `tokens` and
  // will not change. Must not allocate or do I/O: it retains the page and queues a descriptor.
  // Returns whether it was queued; false: the store dropped it (its queue was full), so it stays a
  // miss unless page_offer hands it over again later.
  virtual bool page_full(int seq, const Hash128& key, const Hash128& parent, int first_pos,
                         std::span<const int32_t> tokens, int32_t page, KVPool& pool) = 0;
  // A full page that page_full dropped, offered again (no sequence owns it now: the prefix index
  // does). Queued only while the store's queue is at most half full, so that retries never take
  // the room fresh pages need; returns whether it was queued. Same rules as page_full otherwise.
  virtual bool page_offer(const Hash128& key, const Hash128& parent, int first_pos, std::span<const int32_t> tokens,
                          int32_t page, KVPool& pool) = 0;
  // Loads consecutive full pages of `tokens` starting at page index `first` (whose parent key is
  // `parent`), at most max_pages, into pages from the pool. Appends them and their keys; returns
  // how many. Each is validated before it is returned; a missing or bad page ends the run.
  virtual int restore_pages(std::span<const int32_t> tokens, int first, const Hash128& parent, int max_pages,
                            KVPool& pool, std::vector<int32_t>* pages, std::vector<Hash128>* keys) = 0;
  // A partial page (a session's persisted tail) holding positions [first_pos, first_pos + n) of
  // `tokens`, n <= max_tokens: returns n (the page in *page) or 0.
  virtual int restore_tail(std::span<const int32_t> tokens, int first_pos, const Hash128& parent, int max_tokens,
                           KVPool& pool, int32_t* page) = 0;
  // The token ids of the stored prefixes most recently used, most recent first: each a chain of
  // full pages from the root, together at most max_pages distinct pages (a prefix shared by several
  // is counted once; the last one taken may be cut short). For warming the prefix index at start
  // (Engine::warm_from_store). Default: none.
  virtual std::vector<std::vector<int32_t>> recent_prefixes(size_t max_pages) {
    (void)max_pages;
    return {};
  }
  // Full pages the store took (page_full, page_offer) but could not store: their write or the
  // commit of their batch failed (a full disk). Calls f(pool page, key, first position) for each,
  // once, so that the engine offers them again (page_offer) while its prefix index holds them.
  // The store hands them over once it has recovered (a later commit stored a page) or a retry
  // interval has passed since the last failure; `all`: now, whatever the time (before detaching).
  // Decode thread; no allocation. Default: none.
  virtual void take_failed(bool all, const std::function<void(int32_t, const Hash128&, int)>& f) {
    (void)all;
    (void)f;
  }
  // Blocks until every page queued so far is written and committed (or failed).
  virtual void flush() = 0;
  // Releases the pages the store has finished copying; with wait, first waits for all of them.
  virtual void reap(KVPool& pool, bool wait) = 0;
  // The same, waiting at most `max_wait` for them: true when none is left out.
  virtual bool reap_for(KVPool& pool, std::chrono::milliseconds max_wait) = 0;
};

}  // namespace anvil
