// The paged KV cache in memory.
//
// Invariants
//  1. The pool is allocated once, from a byte budget: n_pages pages of KVCacheView::page_bytes().
//  2. A page is free (refcount 0, on the free list) or used (refcount >= 1). Every holder — a
//     sequence's page table, the prefix index — owns exactly one reference. Retaining or releasing
//     a free page is a bug and aborts (in every build type).
//  3. Only a sequence's last, partially filled page is ever written. A full page is immutable, so
//     sharing it between sequences needs no copy (prefix sharing is copy-on-write by construction:
//     a sequence that diverges inside a shared page gets a fresh page for its own tokens).
//  4. A full page has an identity, its key kv_page_key(root, parent key, its P token ids), where the
//     root (kv_cache_root) covers everything that changes KV values: the model fingerprint (every
//     weight byte and the config), the KV dtype, the page size and the layout version. The key is
//     not trusted alone: the index stores each page's parent key and token ids and a lookup must
//     match them too. The same identity keys the durable store.
//  5. The prefix index is a forest: an entry is inserted only under a parent that is indexed (or
//     as a root), and only entries without indexed children are evicted, so no indexed page is
//     ever unreachable from a root. Eviction takes the least recently used evictable entry in O(1).
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "base/hash128.h"

namespace anvil {

// Bump when the KV page layout or the meaning of its values changes (KVCacheView, RoPE, ...).
inline constexpr uint32_t kKVLayoutVersion = 1;

// The root of every page chain: H(model fingerprint, KV dtype, page size, layout version).
Hash128 kv_cache_root(const Hash128& model_fingerprint, DType kv_dtype, int page_size);
// The key of a full page: H(root, parent key (zero for the first page), the page's token ids).
Hash128 kv_page_key(const Hash128& root, const Hash128& parent, std::span<const int32_t> tokens);

class KVPool {
 public:
  KVPool(Backend& backend, const KVCacheView& layout);
  ~KVPool();
  // Allocates the pool storage: layout.n_pages pages.
  Status init();

  const KVCacheView& view() const { return view_; }
  int page_size() const { return view_.page_size; }
  int64_t n_pages() const { return view_.n_pages; }
  int64_t n_free() const { return int64_t(free_.size()); }

  // A fresh page with refcount 1, or -1 when none is free even after evicting cached prefixes.
  int32_t kv_page_alloc();
  void kv_page_retain(int32_t page);
  void kv_page_release(int32_t page);
  int32_t refcount(int32_t page) const { return refcount_[size_t(page)]; }

  // Prefix index: full pages by key. The index holds its own reference to each page and gives it
  // up, least recently used leaf first, when the pool runs out of free pages.
  // Indexes `page` (a full page whose key, parent and tokens are given) unless the key is already
  // indexed or the parent is not (the page would be unreachable). Returns whether it was indexed.
  // An indexed page with the same key, parent and tokens that only the index holds is replaced by
  // `page` and freed (a sequence that computed a stored prefix again holds it once, not twice).
  bool prefix_insert(const Hash128& key, const Hash128& parent, std::span<const int32_t> tokens, int32_t page);
  // The page with this key whose parent and token ids are also equal (retained for the caller), or -1.
  int32_t prefix_lookup(const Hash128& key, const Hash128& parent, std::span<const int32_t> tokens);
  size_t prefix_entries() const { return index_.size(); }
  // The token ids of `page` if the index holds it under `key` (and its parent key in *parent), else
  // null. For the store's dropped pages (Engine::offer_dropped): is the page still what it was?
  const std::vector<int32_t>* prefix_tokens_of(int32_t page, const Hash128& key, Hash128* parent) const;
  // Pages loaded from the durable store ahead of any request (Engine::warm_from_store) are marked;
  // the first sequence that reuses one takes the mark, so its tokens count as restored from the
  // store for that sequence, as they would have without the warm-up. A fresh page has no mark.
  void mark_from_store(int32_t page) { from_store_[size_t(page)] = 1; }
  bool take_from_store(int32_t page) {
    const bool m = from_store_[size_t(page)] != 0;
    from_store_[size_t(page)] = 0;
    return m;
  }
  // Drops every entry that only the index holds (no sequence uses its page, no child below it),
  // leaves first, until none is left; returns how many. For a scratch sequence's pages (warm_up).
  size_t prefix_evict_unused();

 private:
  struct Entry {
    Hash128 key, parent;
    std::vector<int32_t> tokens;
    int32_t page = -1;
    int children = 0;  // indexed entries whose parent this is
    bool in_lru = false;
    std::list<Entry*>::iterator lru_it;
  };
  bool evict_one();
  void check_used(int32_t page, const char* what) const;
  // Puts e on (or takes it off) the evictable list as its state says: only the index holds its
  // page and no indexed child hangs below it.
  void update_evictable(Entry* e, bool most_recent);
  Backend& backend_;
  KVCacheView view_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
  std::vector<uint8_t> from_store_;  // mark_from_store, per page
  std::vector<Entry*> entry_of_page_;  // the index entry holding each page, or null
  std::unordered_map<Hash128, Entry, Hash128Hasher> index_;
  std::list<Entry*> lru_;  // evictable entries; front = most recently used
};

}  // namespace anvil
