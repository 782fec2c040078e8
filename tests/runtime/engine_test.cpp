// Engine properties that matter: chunked prefill, prefix-cache reuse and batched multi-sequence
// decode all give the same logits as one plain sequential computation; the KV pool's refcounts
// return every page.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "model/loader.h"
#include "runtime/engine.h"

using namespace anvil;

namespace {

struct Fixture {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<Engine> engine;
};

Fixture make(int max_tokens, bool prefix_cache, int page_size = 16, DType kv = DType::kF32) {
  Fixture f;
  auto m = load_synthetic("tiny:q4g64");
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  f.model = std::move(m).value();
  f.backend = make_cpu_backend(2);
  auto w = upload_weights(f.model->weights, *f.backend);
  auto tf = Transformer::create(f.model->config, *w, *f.backend, max_tokens);
  EXPECT_TRUE(tf.is_ok());
  f.tf = std::move(tf).value();
  EngineOptions o;
  o.page_size = page_size;
  o.max_context = 512;
  o.max_seqs = 4;
  o.prefix_cache = prefix_cache;
  o.kv_dtype = kv;
  auto e = Engine::create(*f.tf, f.model->fingerprint, o);
  EXPECT_TRUE(e.is_ok());
  f.engine = std::move(e).value();
  return f;
}

std::vector<int32_t> random_ids(int n, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = int32_t(r() % 151936);
  return v;
}

// Two computations of the same logits may take different CPU kernels: up to 8 activation rows use
// the int16-activation mat-vec (<= 1.6e-5 relative error per term), more rows the fp32 matmul. Over
// the tiny model that is ~1e-4 relative on the logits; a wrong page, position or mask gives O(1).
constexpr double kPathTolerance = 1e-3;

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

TEST(Engine, ChunkedPrefillMatchesOneShot) {
  auto ids = random_ids(70, 1);
  Fixture big = make(128, false), small = make(16, false);
  std::vector<float> a, b;
  int s1 = *big.engine->seq_create(), s2 = *small.engine->seq_create();
  ASSERT_TRUE(big.engine->extend(s1, ids, nullptr, &a).is_ok());
  ASSERT_TRUE(small.engine->extend(s2, ids, nullptr, &b).is_ok());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_LT(rel_err(b, a), kPathTolerance);
}

TEST(Engine, DecodeMatchesTeacherForcing) {
  auto ids = random_ids(40, 2);
  Fixture f = make(64, false);
  std::vector<float> all;
  int s = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(s, ids, nullptr, &all).is_ok());
  const int V = f.model->config.vocab_size;
  Fixture g = make(64, false);
  int t = *g.engine->seq_create();
  std::vector<float> last;
  ASSERT_TRUE(g.engine->extend(t, std::span<const int32_t>(ids).first(30), &last).is_ok());
  for (int i = 30; i < 40; ++i) {
    std::vector<float> logits;
    int32_t id = ids[i];
    ASSERT_TRUE(g.engine->decode(std::span<const int>(&t, 1), std::span<const int32_t>(&id, 1), &logits).is_ok());
    std::vector<float> ref(all.begin() + size_t(i) * V, all.begin() + size_t(i + 1) * V);
    EXPECT_LT(rel_err(logits, ref), kPathTolerance) << "position " << i;
  }
}

TEST(Engine, PrefixCacheReusesPagesAndGivesSameLogits) {
  auto ids = random_ids(50, 3);  // 3 full pages of 16 + 2
  Fixture f = make(64, true);
  std::vector<float> first, second;
  int a = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(a, ids, &first).is_ok());
  EXPECT_EQ(f.engine->seq_cached_tokens(a), 0);
  f.engine->seq_release(a);
  int b = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(b, ids, &second).is_ok());
  EXPECT_EQ(f.engine->seq_cached_tokens(b), 48);
  EXPECT_LT(rel_err(second, first), kPathTolerance);
  // A prompt diverging inside page 2 reuses pages 0 and 1 only.
  auto other = ids;
  other[40] = (other[40] + 1) % 151936;
  int c = *f.engine->seq_create();
  std::vector<float> third;
  ASSERT_TRUE(f.engine->extend(c, other, &third).is_ok());
  EXPECT_EQ(f.engine->seq_cached_tokens(c), 32);
}

TEST(Engine, BatchedDecodeMatchesSeparateDecode) {
  Fixture f = make(64, false), g = make(64, false);
  auto p1 = random_ids(21, 4), p2 = random_ids(37, 5);
  int a = *f.engine->seq_create(), b = *f.engine->seq_create();
  int a2 = *g.engine->seq_create(), b2 = *g.engine->seq_create();
  std::vector<float> tmp;
  for (auto [e, s, p] : {std::tuple{f.engine.get(), a, &p1}, {f.engine.get(), b, &p2}, {g.engine.get(), a2, &p1},
                         {g.engine.get(), b2, &p2}})
    ASSERT_TRUE(e->extend(s, *p, &tmp).is_ok());
  const int V = f.model->config.vocab_size;
  for (int step = 0; step < 5; ++step) {
    int32_t ta = 100 + step, tb = 200 + step;
    std::vector<int> seqs = {a, b};
    std::vector<int32_t> toks = {ta, tb};
    std::vector<float> batched, la, lb;
    ASSERT_TRUE(f.engine->decode(seqs, toks, &batched).is_ok());
    ASSERT_TRUE(g.engine->decode(std::span<const int>(&a2, 1), std::span<const int32_t>(&ta, 1), &la).is_ok());
    ASSERT_TRUE(g.engine->decode(std::span<const int>(&b2, 1), std::span<const int32_t>(&tb, 1), &lb).is_ok());
    std::vector<float> ba(batched.begin(), batched.begin() + V), bb(batched.begin() + V, batched.end());
    EXPECT_LT(rel_err(ba, la), 1e-5);
    EXPECT_LT(rel_err(bb, lb), 1e-5);
  }
}

TEST(Engine, PagesAreReturnedAndLimitsEnforced) {
  Fixture f = make(64, true);
  const int64_t total = f.engine->pool().n_pages();
  int a = *f.engine->seq_create();
  std::vector<float> l;
  ASSERT_TRUE(f.engine->extend(a, random_ids(100, 6), &l).is_ok());
  f.engine->seq_release(a);
  // The prefix index still holds the 6 full pages; everything else is free.
  EXPECT_EQ(f.engine->pool().n_free(), total - 6);
  // Over the context limit: a clear error, and the sequence is unchanged.
  int b = *f.engine->seq_create();
  Status st = f.engine->extend(b, random_ids(600, 7), &l);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("context"), std::string::npos) << st.message();
  EXPECT_TRUE(f.engine->seq_tokens(b).empty());
  // Out-of-vocabulary id.
  std::vector<int32_t> bad = {1, 2, 151936};
  st = f.engine->extend(b, bad, &l);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("151936"), std::string::npos);
}

TEST(KVPool, PageKeyDependsOnRootParentAndTokens) {
  std::vector<int32_t> t = {1, 2, 3, 4};
  const Hash128 fp = hash128("model", 5), root = kv_cache_root(fp, DType::kBF16, 16);
  const Hash128 parent = hash128("p", 1);
  Hash128 h = kv_page_key(root, parent, t);
  EXPECT_EQ(h, kv_page_key(root, parent, t));
  EXPECT_NE(h, kv_page_key(kv_cache_root(hash128("model", 4), DType::kBF16, 16), parent, t));
  EXPECT_NE(h, kv_page_key(kv_cache_root(fp, DType::kF32, 16), parent, t));   // KV dtype
  EXPECT_NE(h, kv_page_key(kv_cache_root(fp, DType::kBF16, 32), parent, t));  // page size
  EXPECT_NE(h, kv_page_key(root, Hash128{}, t));
  t[3] = 5;
  EXPECT_NE(h, kv_page_key(root, parent, t));
}
