// Engine properties that matter: chunked prefill, prefix-cache reuse and batched multi-sequence
// decode all give the same logits as one plain sequential computation; the KV pool's refcounts
// return every page.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/warmup.h"

using namespace anvil;

namespace {

struct Fixture {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<Engine> engine;
};

Fixture make(int max_tokens, bool prefix_cache, int page_size = 16, DType kv = DType::kF32,
             const std::string& spec = "tiny:q4g64", int threads = 2, int max_logit_rows = 0) {
  Fixture f;
  auto m = load_synthetic(spec);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  f.model = std::move(m).value();
  f.backend = make_cpu_backend(threads);
  auto w = upload_weights(f.model->weights, *f.backend);
  auto tf = Transformer::create(f.model->config, *w, *f.backend, max_tokens, max_logit_rows);
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

// The CPU backend's rows do not depend on the batch they are computed in (docs/architecture.md,
// "Numerical contract"), so chunked prefill, teacher forcing, prefix reuse and batched decode all
// give the very same bits as the plain computation: compared exactly.
}  // namespace

TEST(Engine, ChunkedPrefillMatchesOneShot) {
  auto ids = random_ids(70, 1);
  Fixture big = make(128, false), small = make(16, false);
  std::vector<float> a, b;
  int s1 = *big.engine->seq_create(), s2 = *small.engine->seq_create();
  ASSERT_TRUE(big.engine->extend(s1, ids, nullptr, &a).is_ok());
  ASSERT_TRUE(small.engine->extend(s2, ids, nullptr, &b).is_ok());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
}

// A transformer that keeps logits for fewer rows than its batch (what a server on CUDA does: 2048
// tokens per forward, logits for its sequences only): every token's logits come in chunks of that
// many rows, bit for bit the same; a forward that asks for more rows is refused, naming the limit.
TEST(Engine, LogitRowsCapChunksEveryTokenLogits) {
  auto ids = random_ids(70, 1);
  Fixture full = make(128, false), capped = make(128, false, 16, DType::kF32, "tiny:q4g64", 2, 8);
  EXPECT_EQ(capped.tf->max_logit_rows(), 8);
  EXPECT_EQ(full.tf->max_logit_rows(), 128);
  std::vector<float> a, b, last_a, last_b;
  int s1 = *full.engine->seq_create(), s2 = *capped.engine->seq_create();
  ASSERT_TRUE(full.engine->extend(s1, ids, &last_a, &a).is_ok());
  ASSERT_TRUE(capped.engine->extend(s2, ids, &last_b, &b).is_ok());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  EXPECT_EQ(0, std::memcmp(last_a.data(), last_b.data(), last_a.size() * 4));
  // Nine rows of logits from one forward: more than the 8 kept.
  std::vector<int32_t> pos(9), seq(9, 0), table(64, 0);
  for (int i = 0; i < 9; ++i) pos[i] = i;
  BatchView bv;
  bv.n_tokens = 9, bv.n_seqs = 1, bv.max_pages = 64;
  bv.pos = bv.pos_host = pos.data(), bv.seq = bv.seq_host = seq.data(), bv.page_table = table.data();
  std::vector<int> rows(9);
  for (int i = 0; i < 9; ++i) rows[i] = i;
  std::vector<float> out(size_t(9) * size_t(capped.model->config.vocab_size));
  KVCacheView kv;  // not reached: the batch is refused first
  Status st = capped.tf->forward(ids.data(), bv, kv, rows, out.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("at most 8"), std::string::npos) << st.message();
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
    EXPECT_EQ(logits, ref) << "position " << i;
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
  EXPECT_EQ(second, first);
  // A prompt diverging inside page 2 reuses pages 0 and 1 only.
  auto other = ids;
  other[40] = (other[40] + 1) % 151936;
  int c = *f.engine->seq_create();
  std::vector<float> third;
  ASSERT_TRUE(f.engine->extend(c, other, &third).is_ok());
  EXPECT_EQ(f.engine->seq_cached_tokens(c), 32);
}

class EngineBatched : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

// A dense model (bf16 weights: the fp32 matmul path) and a quantized one (the int16 kernel), on
// both KV dtypes. This failed on the GPU machine's toolchain while T = 1 took a separate mat-vec.
TEST_P(EngineBatched, BatchedDecodeMatchesSeparateDecode) {
  const auto [spec, kv] = GetParam();
  Fixture f = make(64, false, 16, kv, spec), g = make(64, false, 16, kv, spec);
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
    EXPECT_EQ(ba, la) << "step " << step;
    EXPECT_EQ(bb, lb) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineBatched,
                         ::testing::Combine(::testing::Values("tiny:q4g64", "tiny:bf16", "tiny:q3g32"),
                                            ::testing::Values(DType::kF32, DType::kBF16)));

// 1, 2 and 16 threads (more than this machine's cores) give bit-identical logits for prefill and
// batched decode. The tiny model's output projection (151936 rows) and the prefill's attention
// items split into many thread chunks.
TEST(Engine, ThreadCountDoesNotChangeLogits) {
  for (const char* spec : {"tiny:q4g64", "tiny:bf16"}) {
    std::vector<float> ref_prefill, ref_decode;
    for (int threads : {1, 2, 16}) {
      Fixture f = make(64, false, 16, DType::kBF16, spec, threads);
      int a = *f.engine->seq_create(), b = *f.engine->seq_create();
      std::vector<float> pa, pb, d;
      ASSERT_TRUE(f.engine->extend(a, random_ids(45, 11), nullptr, &pa).is_ok());
      ASSERT_TRUE(f.engine->extend(b, random_ids(23, 12), &pb).is_ok());
      std::vector<int> seqs = {a, b};
      std::vector<int32_t> toks = {17, 99};
      ASSERT_TRUE(f.engine->decode(seqs, toks, &d).is_ok());
      if (ref_prefill.empty()) {
        ref_prefill = pa;
        ref_decode = d;
        continue;
      }
      EXPECT_EQ(pa, ref_prefill) << spec << ", " << threads << " threads";
      EXPECT_EQ(d, ref_decode) << spec << ", " << threads << " threads";
    }
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

// The server's warm-up (runtime/warmup.h) leaves the engine as it found it: every page free again,
// nothing in the prefix index, and the logits of a prompt afterwards bit for bit those of an
// engine that never ran it. A warm-up longer than a forward is cut to one forward's chunk.
TEST(Engine, WarmUpLeavesNoPagesAndChangesNoLogits) {
  auto ids = random_ids(40, 3);
  Fixture warm = make(64, true), cold = make(64, true);
  const int64_t free0 = warm.engine->pool().n_free();
  ASSERT_TRUE(warm_up(*warm.engine, 1000).is_ok());
  EXPECT_EQ(warm.engine->pool().n_free(), free0);
  EXPECT_EQ(warm.engine->pool().prefix_entries(), 0u);
  std::vector<float> a, b;
  const int s1 = *warm.engine->seq_create(), s2 = *cold.engine->seq_create();
  ASSERT_TRUE(warm.engine->extend(s1, ids, nullptr, &a).is_ok());
  ASSERT_TRUE(cold.engine->extend(s2, ids, nullptr, &b).is_ok());
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
  EXPECT_EQ(warm.engine->seq_cached_tokens(s1), 0);  // nothing of the warm-up was reused
}

// An index entry a live sequence still uses is never dropped by prefix_evict_unused.
TEST(KVPool, EvictUnusedKeepsPagesInUse) {
  Fixture f = make(64, true);
  auto ids = random_ids(40, 4);
  const int s = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(s, ids, nullptr).is_ok());
  const size_t entries = f.engine->pool().prefix_entries();
  ASSERT_GT(entries, 0u);
  EXPECT_EQ(f.engine->pool().prefix_evict_unused(), 0u);  // both full pages are the sequence's
  EXPECT_EQ(f.engine->pool().prefix_entries(), entries);
  f.engine->seq_release(s);
  EXPECT_EQ(f.engine->pool().prefix_evict_unused(), entries);
  EXPECT_EQ(f.engine->pool().prefix_entries(), 0u);
}
