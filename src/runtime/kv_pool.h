// The paged KV cache in memory.
//
// Invariants
//  1. The pool is allocated once, from a byte budget: n_pages pages of KVCacheView::page_bytes().
//  2. A page is free (refcount 0, on the free list) or used (refcount >= 1). Every holder — a
//     sequence's page table, the prefix index — owns exactly one reference.
//  3. Only a sequence's last, partially filled page is ever written. A full page is immutable, so
//     sharing it between sequences needs no copy (prefix sharing is copy-on-write by construction:
//     a sequence that diverges inside a shared page gets a fresh page for its own tokens).
//  4. A full page has an identity, its chain hash H(model fingerprint, parent page hash, its P token
//     ids): equal hashes mean equal KV contents. The same identity keys the durable store.
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace anvil {

// The chain hash of a full page (xxh3-64).
uint64_t kv_page_hash(uint64_t model_fingerprint, uint64_t parent_hash, std::span<const int32_t> tokens);

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
  int32_t refcount(int32_t page) const { return refcount_[page]; }

  // Prefix index: full pages by chain hash. The index holds its own reference to each page and
  // gives it up, least recently used first, when the pool runs out of free pages.
  void prefix_insert(uint64_t hash, int32_t page);
  // The page with this identity (retained for the caller), or -1.
  int32_t prefix_lookup(uint64_t hash);
  size_t prefix_entries() const { return index_.size(); }

 private:
  bool evict_one();
  Backend& backend_;
  KVCacheView view_;
  std::vector<int32_t> refcount_;
  std::vector<int32_t> free_;
  struct Entry {
    int32_t page;
    std::list<uint64_t>::iterator lru_it;
  };
  std::unordered_map<uint64_t, Entry> index_;
  std::list<uint64_t> lru_;  // front = most recently used
};

}  // namespace anvil
