// KV pool and prefix index: a key match alone never serves a page (token ids and parent are
// compared), eviction takes leaves before their parents (no unreachable entries left holding
// memory), and refcount misuse stops the process in every build type.
#include <gtest/gtest.h>

#include "runtime/kv_pool.h"

using namespace anvil;

namespace {

struct Pool {
  std::unique_ptr<Backend> be = make_cpu_backend(1);
  std::unique_ptr<KVPool> pool;
  explicit Pool(int pages) {
    KVCacheView v;
    v.dtype = DType::kF32;
    v.n_layers = 1;
    v.n_kv_heads = 1;
    v.head_dim = 8;
    v.page_size = 4;
    v.n_pages = pages;
    pool = std::make_unique<KVPool>(*be, v);
    EXPECT_TRUE(pool->init().is_ok());
  }
};

const Hash128 kRoot = hash128("root", 4);

}  // namespace

TEST(KVPool, KeyMatchWithOtherTokensOrParentIsAMiss) {
  Pool p(4);
  std::vector<int32_t> toks = {1, 2, 3, 4}, other = {1, 2, 3, 5};
  const Hash128 key = kv_page_key(kRoot, Hash128{}, toks);
  int32_t page = p.pool->kv_page_alloc();
  ASSERT_TRUE(p.pool->prefix_insert(key, Hash128{}, toks, page));
  // A colliding key (forged, or an accident) with other token ids or another parent: not served.
  EXPECT_EQ(p.pool->prefix_lookup(key, Hash128{}, other), -1);
  EXPECT_EQ(p.pool->prefix_lookup(key, hash128("x", 1), toks), -1);
  EXPECT_EQ(p.pool->refcount(page), 2);
  EXPECT_EQ(p.pool->prefix_lookup(key, Hash128{}, toks), page);
  EXPECT_EQ(p.pool->refcount(page), 3);
  // A child whose parent is not indexed would be unreachable: not indexed.
  int32_t orphan = p.pool->kv_page_alloc();
  EXPECT_FALSE(p.pool->prefix_insert(kv_page_key(kRoot, hash128("y", 1), toks), hash128("y", 1), toks, orphan));
  EXPECT_EQ(p.pool->refcount(orphan), 1);
}

// prefix_tokens_of (the engine's check before offering a dropped page to the store again) answers
// only for the key the page is indexed under now: after the page is evicted and reused for other
// tokens, the old key gets nothing, so the old key is never written with the new KV.
TEST(KVPool, TokensOfAPageOnlyUnderItsCurrentKey) {
  Pool p(1);
  std::vector<int32_t> t0 = {1, 2, 3, 4}, t1 = {5, 6, 7, 8};
  const Hash128 k0 = kv_page_key(kRoot, Hash128{}, t0), k1 = kv_page_key(kRoot, Hash128{}, t1);
  Hash128 parent = hash128("unset", 5);
  int32_t page = p.pool->kv_page_alloc();
  EXPECT_EQ(p.pool->prefix_tokens_of(page, k0, &parent), nullptr) << "not indexed yet";
  ASSERT_TRUE(p.pool->prefix_insert(k0, Hash128{}, t0, page));
  const std::vector<int32_t>* got = p.pool->prefix_tokens_of(page, k0, &parent);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(*got, t0);
  EXPECT_TRUE(parent.is_zero());
  EXPECT_EQ(p.pool->prefix_tokens_of(page, k1, &parent), nullptr) << "another key";
  EXPECT_EQ(p.pool->prefix_tokens_of(-1, k0, &parent), nullptr);
  EXPECT_EQ(p.pool->prefix_tokens_of(1, k0, &parent), nullptr) << "past the pool";
  // The only page is evicted for a new allocation and indexed under other tokens.
  p.pool->kv_page_release(page);
  int32_t again = p.pool->kv_page_alloc();
  ASSERT_EQ(again, page);
  EXPECT_EQ(p.pool->prefix_tokens_of(page, k0, &parent), nullptr) << "evicted";
  ASSERT_TRUE(p.pool->prefix_insert(k1, Hash128{}, t1, again));
  EXPECT_EQ(p.pool->prefix_tokens_of(page, k0, &parent), nullptr) << "the old key, the page reused";
  ASSERT_NE(p.pool->prefix_tokens_of(page, k1, &parent), nullptr);
  EXPECT_EQ(*p.pool->prefix_tokens_of(page, k1, &parent), t1);
}

TEST(KVPool, EvictsLeavesBeforeParents) {
  Pool p(3);
  std::vector<int32_t> t0 = {1, 2, 3, 4}, t1 = {5, 6, 7, 8};
  const Hash128 k0 = kv_page_key(kRoot, Hash128{}, t0), k1 = kv_page_key(kRoot, k0, t1);
  int32_t p0 = p.pool->kv_page_alloc(), p1 = p.pool->kv_page_alloc();
  ASSERT_TRUE(p.pool->prefix_insert(k0, Hash128{}, t0, p0));
  ASSERT_TRUE(p.pool->prefix_insert(k1, k0, t1, p1));
  // The sequence releases its pages root first; the root is then the least recently used.
  p.pool->kv_page_release(p0);
  p.pool->kv_page_release(p1);
  EXPECT_EQ(p.pool->n_free(), 1);
  int32_t a = p.pool->kv_page_alloc(), b = p.pool->kv_page_alloc();  // the second needs an eviction
  ASSERT_GE(b, 0);
  EXPECT_EQ(b, p1) << "the leaf goes first";
  EXPECT_EQ(p.pool->prefix_entries(), 1u);
  const int32_t again = p.pool->prefix_lookup(k0, Hash128{}, t0);
  EXPECT_EQ(again, p0);  // the parent is still reachable
  p.pool->kv_page_release(again);
  EXPECT_EQ(p.pool->kv_page_alloc(), p0);  // and goes next
  EXPECT_EQ(p.pool->prefix_entries(), 0u);
  EXPECT_EQ(p.pool->kv_page_alloc(), -1);  // nothing left to evict
  (void)a;
}

// A chain only the index holds (a server's prefixes loaded from the store before any request) and
// a sequence that computes the same pages again: the index takes the sequence's pages and frees its
// own, so the pool holds the chain once. Before, the stored chain stayed pinned under the
// sequence's next page (a parent with an indexed child is never evicted), and a request sized to
// the pool ran out of pages (a server with 128 pages failed at 1,921 of 2,009 tokens).
TEST(KVPool, ASequenceRecomputingAnUnusedChainTakesItsPlace) {
  Pool p(4);
  std::vector<int32_t> t0 = {1, 2, 3, 4}, t1 = {5, 6, 7, 8}, t2 = {9, 10, 11, 12};
  const Hash128 k0 = kv_page_key(kRoot, Hash128{}, t0), k1 = kv_page_key(kRoot, k0, t1), k2 = kv_page_key(kRoot, k1, t2);
  int32_t w0 = p.pool->kv_page_alloc(), w1 = p.pool->kv_page_alloc();  // the loaded chain
  ASSERT_TRUE(p.pool->prefix_insert(k0, Hash128{}, t0, w0));
  ASSERT_TRUE(p.pool->prefix_insert(k1, k0, t1, w1));
  p.pool->kv_page_release(w0);
  p.pool->kv_page_release(w1);
  // The sequence computes page 0 (a free page), then page 0's twin is freed when it is published.
  int32_t s0 = p.pool->kv_page_alloc();
  ASSERT_TRUE(p.pool->prefix_insert(k0, Hash128{}, t0, s0)) << "the index takes the sequence's page";
  EXPECT_EQ(p.pool->n_free(), 2) << "the loaded twin is free again";
  EXPECT_EQ(p.pool->refcount(s0), 2);
  int32_t s1 = p.pool->kv_page_alloc();
  ASSERT_TRUE(p.pool->prefix_insert(k1, k0, t1, s1));
  int32_t s2 = p.pool->kv_page_alloc();
  ASSERT_TRUE(p.pool->prefix_insert(k2, k1, t2, s2));
  // The sequence holds 3 pages, the index nothing else: the 4th page is there to take.
  EXPECT_EQ(p.pool->prefix_entries(), 3u);
  EXPECT_GE(p.pool->kv_page_alloc(), 0);
  Hash128 parent;
  ASSERT_NE(p.pool->prefix_tokens_of(s1, k1, &parent), nullptr);
  EXPECT_EQ(parent, k0);
  // A twin another holder uses stays; so does one under another parent or with other tokens.
  Pool q(4);
  int32_t u0 = q.pool->kv_page_alloc(), v0 = q.pool->kv_page_alloc();
  ASSERT_TRUE(q.pool->prefix_insert(k0, Hash128{}, t0, u0));  // u0 held by its sequence and the index
  EXPECT_FALSE(q.pool->prefix_insert(k0, Hash128{}, t0, v0));
  EXPECT_EQ(q.pool->prefix_lookup(k0, Hash128{}, t0), u0);
  q.pool->kv_page_release(u0);
  q.pool->kv_page_release(u0);  // u0: only the index now
  EXPECT_FALSE(q.pool->prefix_insert(k0, Hash128{}, t1, v0)) << "a colliding key is never replaced";
  EXPECT_EQ(q.pool->prefix_lookup(k0, Hash128{}, t0), u0);
  q.pool->kv_page_release(u0);
}

TEST(KVPool, PagesInUseAreNeverEvicted) {
  Pool p(2);
  std::vector<int32_t> t0 = {1, 2, 3, 4};
  const Hash128 k0 = kv_page_key(kRoot, Hash128{}, t0);
  int32_t p0 = p.pool->kv_page_alloc();
  ASSERT_TRUE(p.pool->prefix_insert(k0, Hash128{}, t0, p0));
  int32_t p1 = p.pool->kv_page_alloc();
  EXPECT_EQ(p.pool->kv_page_alloc(), -1);  // p0 is held by its sequence and the index
  p.pool->kv_page_release(p0);
  EXPECT_EQ(p.pool->kv_page_alloc(), p0);
  (void)p1;
}

TEST(KVPoolDeathTest, RefcountMisuseAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Pool p(2);
  int32_t a = p.pool->kv_page_alloc();
  p.pool->kv_page_release(a);
  EXPECT_DEATH(p.pool->kv_page_release(a), "release of page 0, which is free");
  EXPECT_DEATH(p.pool->kv_page_retain(1), "retain of page 1, which is free");
  EXPECT_DEATH(p.pool->kv_page_retain(7), "out of range");
}
