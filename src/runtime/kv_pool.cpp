#include "runtime/kv_pool.h"

#include <xxhash.h>

#include <cassert>

namespace anvil {

uint64_t kv_page_hash(uint64_t model_fingerprint, uint64_t parent_hash, std::span<const int32_t> tokens) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &model_fingerprint, sizeof model_fingerprint);
  XXH3_64bits_update(st, &parent_hash, sizeof parent_hash);
  XXH3_64bits_update(st, tokens.data(), tokens.size_bytes());
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

KVPool::KVPool(Backend& backend, const KVCacheView& layout) : backend_(backend), view_(layout) {}

KVPool::~KVPool() {
  if (view_.base) backend_.free(view_.base);
}

Status KVPool::init() {
  if (view_.n_pages <= 0) return invalid_argument("KV cache: the memory budget leaves no page");
  size_t bytes = view_.page_bytes() * size_t(view_.n_pages);
  auto p = backend_.alloc(bytes);
  if (!p.is_ok())
    return p.status().with_context("KV cache: allocating " + std::to_string(view_.n_pages) + " pages (" +
                                   std::to_string(bytes >> 20) + " MiB)");
  view_.base = p.value();
  refcount_.assign(size_t(view_.n_pages), 0);
  free_.clear();
  for (int64_t i = view_.n_pages - 1; i >= 0; --i) free_.push_back(int32_t(i));
  return Status::ok();
}

int32_t KVPool::kv_page_alloc() {
  while (free_.empty())
    if (!evict_one()) return -1;
  int32_t p = free_.back();
  free_.pop_back();
  refcount_[p] = 1;
  return p;
}

void KVPool::kv_page_retain(int32_t page) {
  assert(refcount_[page] > 0);
  ++refcount_[page];
}

void KVPool::kv_page_release(int32_t page) {
  assert(refcount_[page] > 0);
  if (--refcount_[page] == 0) free_.push_back(page);
}

void KVPool::prefix_insert(uint64_t hash, int32_t page) {
  auto it = index_.find(hash);
  if (it != index_.end()) {  // already known: keep the existing page, refresh its recency
    lru_.splice(lru_.begin(), lru_, it->second.lru_it);
    return;
  }
  kv_page_retain(page);
  lru_.push_front(hash);
  index_.emplace(hash, Entry{page, lru_.begin()});
}

int32_t KVPool::prefix_lookup(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return -1;
  lru_.splice(lru_.begin(), lru_, it->second.lru_it);
  kv_page_retain(it->second.page);
  return it->second.page;
}

bool KVPool::evict_one() {
  // Oldest entry whose page only the index holds: releasing it frees the page.
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    auto e = index_.find(*it);
    if (refcount_[e->second.page] == 1) {
      int32_t page = e->second.page;
      lru_.erase(std::next(it).base());
      index_.erase(e);
      kv_page_release(page);
      return true;
    }
  }
  return false;
}

}  // namespace anvil
