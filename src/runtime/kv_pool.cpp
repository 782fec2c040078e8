#include "runtime/kv_pool.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace anvil {

Hash128 kv_cache_root(const Hash128& model_fingerprint, DType kv_dtype, int page_size) {
  Hasher128 h;
  static constexpr char kTag[] = "anvil.kv_cache_root";
  h.update(kTag, sizeof kTag);
  h.update(model_fingerprint);
  h.update_pod(uint32_t(kv_dtype));
  h.update_pod(int32_t(page_size));
  h.update_pod(kKVLayoutVersion);
  return h.digest();
}

Hash128 kv_page_key(const Hash128& root, const Hash128& parent, std::span<const int32_t> tokens) {
  Hasher128 h;
  h.update(root);
  h.update(parent);
  h.update_pod(uint64_t(tokens.size()));
  h.update(tokens.data(), tokens.size_bytes());
  return h.digest();
}

KVPool::KVPool(Backend& backend, const KVCacheView& layout) : backend_(backend), view_(layout) {}

KVPool::~KVPool() {
  if (view_.base) backend_.free(view_.base);
}

Status KVPool::init() {
  if (view_.n_pages <= 0) return invalid_argument("KV cache: the memory budget leaves no page");
  if (view_.n_pages > INT32_MAX) return invalid_argument("KV cache: too many pages");
  size_t bytes = 0;
  if (__builtin_mul_overflow(view_.page_bytes(), size_t(view_.n_pages), &bytes))
    return invalid_argument("KV cache: " + std::to_string(view_.n_pages) + " pages of " +
                            std::to_string(view_.page_bytes()) + " bytes do not fit in 64-bit memory");
  auto p = backend_.alloc(bytes);
  if (!p.is_ok())
    return p.status().with_context("KV cache: allocating " + std::to_string(view_.n_pages) + " pages (" +
                                   std::to_string(bytes >> 20) + " MiB)");
  view_.base = p.value();
  refcount_.assign(size_t(view_.n_pages), 0);
  entry_of_page_.assign(size_t(view_.n_pages), nullptr);
  from_store_.assign(size_t(view_.n_pages), 0);
  free_.clear();
  for (int64_t i = view_.n_pages - 1; i >= 0; --i) free_.push_back(int32_t(i));
  return Status::ok();
}

void KVPool::check_used(int32_t page, const char* what) const {
  if (page < 0 || page >= int32_t(refcount_.size()) || refcount_[size_t(page)] <= 0) {
    // A broken refcount means pages are shared that should not be: stop before KV is corrupted.
    std::fprintf(stderr, "anvil: KV pool: %s of page %d, which is %s\n", what, int(page),
                 page < 0 || page >= int32_t(refcount_.size()) ? "out of range" : "free");
    std::abort();
  }
}

int32_t KVPool::kv_page_alloc() {
  while (free_.empty())
    if (!evict_one()) return -1;
  int32_t p = free_.back();
  free_.pop_back();
  refcount_[size_t(p)] = 1;
  from_store_[size_t(p)] = 0;
  return p;
}

void KVPool::kv_page_retain(int32_t page) {
  check_used(page, "retain");
  ++refcount_[size_t(page)];
  if (Entry* e = entry_of_page_[size_t(page)]) update_evictable(e, true);
}

void KVPool::kv_page_release(int32_t page) {
  check_used(page, "release");
  if (--refcount_[size_t(page)] == 0) {
    free_.push_back(page);
    return;
  }
  if (Entry* e = entry_of_page_[size_t(page)]) update_evictable(e, true);
}

void KVPool::update_evictable(Entry* e, bool most_recent) {
  const bool evictable = refcount_[size_t(e->page)] == 1 && e->children == 0;
  if (e->in_lru) {
    lru_.erase(e->lru_it);
    e->in_lru = false;
  }
  if (!evictable) return;
  if (most_recent) {
    lru_.push_front(e);
    e->lru_it = lru_.begin();
  } else {
    lru_.push_back(e);
    e->lru_it = std::prev(lru_.end());
  }
  e->in_lru = true;
}

const std::vector<int32_t>* KVPool::prefix_tokens_of(int32_t page, const Hash128& key, Hash128* parent) const {
  if (page < 0 || size_t(page) >= entry_of_page_.size()) return nullptr;
  const Entry* e = entry_of_page_[size_t(page)];
  if (!e || !(e->key == key)) return nullptr;
  *parent = e->parent;
  return &e->tokens;
}

bool KVPool::prefix_insert(const Hash128& key, const Hash128& parent, std::span<const int32_t> tokens, int32_t page) {
  check_used(page, "prefix_insert");
  if (auto it = index_.find(key); it != index_.end()) {
    // Already known. Where the indexed page holds the same prefix and nothing but the index uses it
    // (loaded ahead of any request, or left by a finished one) while the caller computed the same
    // page again, the index takes the caller's page and the duplicate goes back to the free list.
    // Kept, it could not be evicted while the caller's next page is indexed under it (invariant 5),
    // so a sequence that regenerates a stored chain would hold its pages twice, and a request sized
    // to the pool would find it full. A colliding key, or a page others use, is left as it is.
    Entry& e = it->second;
    if (e.page == page || refcount_[size_t(e.page)] != 1 || e.parent != parent || entry_of_page_[size_t(page)] ||
        !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end()))
      return false;
    const int32_t old = e.page;
    entry_of_page_[size_t(old)] = nullptr;
    entry_of_page_[size_t(page)] = &e;
    e.page = page;
    ++refcount_[size_t(page)];  // the index's own reference (the caller holds one, so not evictable)
    update_evictable(&e, true);
    kv_page_release(old);  // refcount 1 -> 0: onto the free list
    return true;
  }
  Entry* parent_entry = nullptr;
  if (!parent.is_zero()) {
    auto pit = index_.find(parent);
    if (pit == index_.end()) return false;  // unreachable from a root: not worth a page
    parent_entry = &pit->second;
  }
  if (entry_of_page_[size_t(page)]) return false;  // indexed under another key already
  Entry& e = index_[key];
  e.key = key;
  e.parent = parent;
  e.tokens.assign(tokens.begin(), tokens.end());
  e.page = page;
  entry_of_page_[size_t(page)] = &e;
  ++refcount_[size_t(page)];  // the index's own reference (the caller holds one, so not evictable)
  if (parent_entry) {
    ++parent_entry->children;
    update_evictable(parent_entry, true);
  }
  return true;
}

int32_t KVPool::prefix_lookup(const Hash128& key, const Hash128& parent, std::span<const int32_t> tokens) {
  auto it = index_.find(key);
  if (it == index_.end()) return -1;
  const Entry& e = it->second;
  if (e.parent != parent || !std::equal(tokens.begin(), tokens.end(), e.tokens.begin(), e.tokens.end()))
    return -1;  // a key collision: never serve another prefix's KV
  kv_page_retain(e.page);
  return e.page;
}

size_t KVPool::prefix_evict_unused() {
  size_t n = 0;
  while (evict_one()) ++n;  // a parent becomes evictable once its last child is gone
  return n;
}

bool KVPool::evict_one() {
  if (lru_.empty()) return false;
  Entry* e = lru_.back();
  lru_.pop_back();
  e->in_lru = false;
  const int32_t page = e->page;
  const Hash128 parent = e->parent;
  entry_of_page_[size_t(page)] = nullptr;
  index_.erase(e->key);
  if (!parent.is_zero()) {
    auto pit = index_.find(parent);
    if (pit != index_.end()) {
      --pit->second.children;
      // As old as the child it lost: evicted next if nothing uses it, so chains go leaf to root.
      update_evictable(&pit->second, false);
    }
  }
  kv_page_release(page);  // refcount 1 -> 0: onto the free list
  return true;
}

}  // namespace anvil
