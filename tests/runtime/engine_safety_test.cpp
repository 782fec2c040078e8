// Engine misuse and failure paths: every one returns a clean Status and leaves the sequences and
// the KV pool exactly as they were (no page leaked, no n_kv ahead of the KV actually computed).
#include "engine_test_util.h"

using namespace anvil;
using namespace anvil::testing;

// A sequence listed twice in one decode call would put two tokens in one KV slot and (with more
// copies than max_seqs) write past the page table.
TEST(EngineSafety, DecodeRejectsRepeatedSequence) {
  FixtureOptions o;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  int a = *f.engine->seq_create();
  std::vector<float> l;
  ASSERT_TRUE(f.engine->extend(a, random_ids(490, 1), &l).is_ok());
  const int64_t free_before = f.engine->pool().n_free();
  for (int copies : {2, 6}) {
    std::vector<int> seqs(size_t(copies), a);
    std::vector<int32_t> toks(size_t(copies), 7);
    Status st = f.engine->decode(seqs, toks, &l);
    EXPECT_FALSE(st.is_ok()) << copies << " copies";
    EXPECT_NE(st.message().find("twice"), std::string::npos) << st.message();
    EXPECT_EQ(f.engine->seq_tokens(a).size(), 490u);
  }
  EXPECT_EQ(f.engine->pool().n_free(), free_before);
  // The sequence still decodes normally afterwards.
  int32_t t = 7;
  EXPECT_TRUE(f.engine->decode(std::span<const int>(&a, 1), std::span<const int32_t>(&t, 1), &l).is_ok());
}

// A prompt whose start is served from the prefix index but whose rest does not fit (context limit,
// or a full pool) must fail without keeping the reused pages or the advanced n_kv: a later, shorter
// extend of the same sequence must compute its logits, not return stale ones.
TEST(EngineSafety, FailedExtendAfterPrefixReuseLeavesSequenceUnchanged) {
  FixtureOptions o;
  o.engine.prefix_cache = true;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  const int V = f.vocab();
  auto ids = random_ids(50, 3);
  std::vector<float> ref;
  int a = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(a, ids, &ref).is_ok());
  f.engine->seq_release(a);
  const int64_t free_before = f.engine->pool().n_free();

  // Context overflow after a 48-token prefix hit.
  auto too_long = ids;
  auto tail = random_ids(600, 4);
  too_long.insert(too_long.end(), tail.begin(), tail.end());
  int b = *f.engine->seq_create();
  std::vector<float> l;
  Status st = f.engine->extend(b, too_long, &l);
  ASSERT_FALSE(st.is_ok());
  EXPECT_TRUE(f.engine->seq_tokens(b).empty());
  EXPECT_EQ(f.engine->seq_cached_tokens(b), 0);
  EXPECT_EQ(f.engine->pool().n_free(), free_before);

  // A shorter extend now computes real logits: equal to a fresh sequence's.
  auto head = std::vector<int32_t>(ids.begin(), ids.begin() + 20);
  std::vector<float> got(size_t(V), -1.0f), want;
  ASSERT_TRUE(f.engine->extend(b, head, &got).is_ok());
  auto g = make_engine(o);
  int c = *g.engine->seq_create();
  ASSERT_TRUE(g.engine->extend(c, head, &want).is_ok());
  EXPECT_TRUE(bit_equal(got, want));
  // And decode works (it fails when n_kv and the tokens disagree).
  int32_t t = 5;
  EXPECT_TRUE(f.engine->decode(std::span<const int>(&b, 1), std::span<const int32_t>(&t, 1), &l).is_ok());
}

TEST(EngineSafety, FailedExtendOnFullPoolAfterPrefixReuseReturnsPages) {
  FixtureOptions o;
  o.engine.prefix_cache = true;
  o.engine.kv_pages = 6;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  auto ids = random_ids(50, 5);  // 4 pages: 3 full (published) + 1
  std::vector<float> l;
  int a = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(a, ids, &l).is_ok());
  // A second live sequence holding the two remaining pages.
  int h = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(h, random_ids(20, 6), &l).is_ok());
  ASSERT_EQ(f.engine->pool().n_free(), 0);
  // Reuses a's 3 full pages, then needs 2 more for 70 tokens: none free, none evictable.
  auto longer = ids;
  auto more = random_ids(20, 7);
  longer.insert(longer.end(), more.begin(), more.end());
  auto refs = [&] {
    std::vector<int32_t> r;
    for (int32_t p = 0; p < 6; ++p) r.push_back(f.engine->pool().refcount(p));
    return r;
  };
  const auto refs_before = refs();
  int b = *f.engine->seq_create();
  Status st = f.engine->extend(b, longer, &l);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory) << st.message();
  EXPECT_TRUE(f.engine->seq_tokens(b).empty());
  EXPECT_EQ(refs(), refs_before) << "the failed extend kept references to reused pages";
  f.engine->seq_release(a);
  f.engine->seq_release(b);
  f.engine->seq_release(h);
  // Only the prefix index holds pages now (a's 3 full pages + h's 1 full page).
  for (int32_t p = 0; p < 6; ++p) EXPECT_LE(f.engine->pool().refcount(p), 1) << "page " << p;
}
