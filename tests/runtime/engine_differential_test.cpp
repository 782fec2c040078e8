// Randomized differential test of the engine: seeded random interleavings of create, extend (with
// shared and diverging prefixes, so the prefix index serves pages), batched decode, release, pool
// exhaustion, context overflow and bad input, checked after every step against a fresh
// single-sequence engine (no prefix cache, roomy pool) computing the same token sequence at once:
//  - logits bit-identical (the numerical contract: a row does not depend on its batch, its chunk or
//    on which pages were reused), hence the same greedy token;
//  - a failed call returns a clean Status (kInvalidArgument / kOutOfMemory) and changes nothing;
//  - no page is leaked: at the end only the prefix index holds pages, one reference each.
// Seeds: ANVIL_DIFF_SEEDS (default 4) starting at ANVIL_DIFF_SEED (default 1), ANVIL_DIFF_STEPS
// steps each (default 60; the sliding-window variant runs half the seeds). CI runs the defaults (also under AddressSanitizer);
// scripts/engine_fuzz.sh runs many more.
#include <algorithm>
#include <cstdlib>
#include <set>

#include "engine_test_util.h"

using namespace anvil;
using namespace anvil::testing;

namespace {

constexpr int kPageSize = 4;  // small: many pages, partial-page prefixes, eviction

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

struct Reference {
  SharedEngineFixture f;
  explicit Reference(DType kv, int window = -1) {
    FixtureOptions o;
    o.sliding_window = window;
    o.engine.kv_dtype = kv;
    o.engine.prefix_cache = false;
    o.engine.page_size = kPageSize;  // the online softmax rescales per page: same pages, same bits
    o.engine.max_context = 256;
    o.engine.max_seqs = 1;
    o.max_tokens = 64;
    f = make_engine(o);
  }
  // Logits of the last token of `tokens`, computed in one fresh sequence.
  std::vector<float> last_logits(const std::vector<int32_t>& tokens) {
    int s = *f.engine->seq_create();
    std::vector<float> l;
    Status st = f.engine->extend(s, tokens, &l);
    EXPECT_TRUE(st.is_ok()) << st.message();
    f.engine->seq_release(s);
    return l;
  }
};

void run_seed(uint64_t seed, int steps, Reference& ref, DType kv, int window = -1) {
  SCOPED_TRACE("seed " + std::to_string(seed) + (kv == DType::kF32 ? " f32 KV" : " bf16 KV") +
               (window > 0 ? " window " + std::to_string(window) : ""));
  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return lo + int(rng() % uint64_t(hi - lo + 1)); };
  FixtureOptions o;
  o.sliding_window = window;
  o.engine.kv_dtype = kv;
  o.engine.prefix_cache = true;
  o.engine.page_size = kPageSize;
  o.engine.max_context = 96;
  o.engine.max_seqs = 4;
  o.engine.kv_pages = uni(12, 40);  // small: exhaustion and eviction happen
  o.max_tokens = uni(3, 24);        // prefill chunking
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  Engine& e = *f.engine;
  const int V = f.vocab();
  // A small token alphabet for prompts, so random prompts share prefixes with earlier ones.
  std::vector<std::vector<int32_t>> seen;
  std::set<int> live;
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng() % 50);
    return t;
  };
  auto check = [&](int s, const float* got, const char* what) {
    const std::vector<float> want = ref.last_logits(e.seq_tokens(s));
    ASSERT_EQ(want.size(), size_t(V));
    const double d = max_abs_diff(got, want.data(), size_t(V));
    EXPECT_EQ(d, 0.0) << what << " of seq " << s << " (" << e.seq_tokens(s).size() << " tokens)";
    EXPECT_EQ(argmax(got, V), argmax(want.data(), V)) << what;
  };
  auto expect_clean_error = [&](const Status& st) {
    EXPECT_TRUE(st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kOutOfMemory)
        << st.to_string();
    EXPECT_FALSE(st.message().empty());
  };
  std::vector<float> logits;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const int op = uni(0, 9);
    if (op <= 2 || live.empty()) {  // create + first extend
      auto r = e.seq_create();
      if (!r.is_ok()) {
        EXPECT_GE(int(live.size()), o.engine.max_seqs);
        continue;
      }
      const int s = *r;
      live.insert(s);
      std::vector<int32_t> prompt;
      if (!seen.empty() && uni(0, 2) != 0) {  // a shared prefix, whole pages or not
        const auto& src = seen[size_t(uni(0, int(seen.size()) - 1))];
        prompt.assign(src.begin(), src.begin() + uni(1, int(src.size())));
      }
      auto tail = tokens(uni(uni(0, 1), 30));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      if (prompt.empty()) prompt = tokens(1);
      if (uni(0, 15) == 0) prompt.resize(size_t(o.engine.max_context + uni(1, 10)), 3);  // context overflow
      Status st = e.extend(s, prompt, &logits);
      if (st.is_ok()) {
        check(s, logits.data(), "extend");
        seen.push_back(prompt);
      } else {
        expect_clean_error(st);
        EXPECT_TRUE(e.seq_tokens(s).empty());
      }
    } else if (op <= 4) {  // extend a live sequence
      const int s = *std::next(live.begin(), uni(0, int(live.size()) - 1));
      const size_t before = e.seq_tokens(s).size();
      auto more = tokens(uni(1, 20));
      if (uni(0, 20) == 0) more.back() = int32_t(V);  // out of the vocabulary
      Status st = e.extend(s, more, &logits);
      if (st.is_ok()) {
        check(s, logits.data(), "extend");
        seen.push_back(e.seq_tokens(s));
      } else {
        expect_clean_error(st);
        EXPECT_EQ(e.seq_tokens(s).size(), before);
      }
    } else if (op <= 7) {  // batched decode of a random subset, each fed its own greedy token
      std::vector<int> seqs;
      for (int s : live)
        if (uni(0, 3) != 0 && !e.seq_tokens(s).empty()) seqs.push_back(s);
      if (seqs.empty()) continue;
      std::shuffle(seqs.begin(), seqs.end(), rng);
      const bool dup = uni(0, 10) == 0;
      if (dup) seqs.push_back(seqs[0]);
      std::vector<int32_t> toks;
      std::vector<size_t> before;
      for (int s : seqs) {
        toks.push_back(argmax(ref.last_logits(e.seq_tokens(s)).data(), V));
        before.push_back(e.seq_tokens(s).size());
      }
      Status st = e.decode(seqs, toks, &logits);
      if (dup) EXPECT_FALSE(st.is_ok());
      if (st.is_ok()) {
        for (size_t i = 0; i < seqs.size(); ++i) check(seqs[i], logits.data() + i * size_t(V), "decode");
      } else {
        expect_clean_error(st);
        for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(e.seq_tokens(seqs[i]).size(), before[i]);
      }
    } else {  // release
      const int s = *std::next(live.begin(), uni(0, int(live.size()) - 1));
      e.seq_release(s);
      live.erase(s);
    }
  }
  for (int s : live) e.seq_release(s);
  // Only the prefix index holds pages now, one reference each.
  int64_t held = 0;
  for (int32_t p = 0; p < int32_t(e.pool().n_pages()); ++p) {
    EXPECT_LE(e.pool().refcount(p), 1) << "page " << p << " leaked";
    held += e.pool().refcount(p);
  }
  EXPECT_EQ(held, int64_t(e.pool().prefix_entries()));
  EXPECT_EQ(e.pool().n_free() + held, e.pool().n_pages());
}

}  // namespace

TEST(EngineDifferential, RandomInterleavingsMatchSingleSequenceEngine) {
  const int seeds = env_int("ANVIL_DIFF_SEEDS", 4), first = env_int("ANVIL_DIFF_SEED", 1),
            steps = env_int("ANVIL_DIFF_STEPS", 60);
  for (DType kv : {DType::kF32, DType::kBF16}) {
    Reference ref(kv);
    ASSERT_TRUE(ref.f.engine);
    for (int i = 0; i < seeds; ++i) {
      run_seed(uint64_t(first + i), steps, ref, kv);
      if (HasFailure()) return;  // the first failing seed is the one to reproduce
    }
  }
}

// The same with a sliding window of 9 positions (KVCacheView::window; pages of 4, so windows start
// mid-page and prefill chunks of 3-24 tokens straddle them): a windowed row is as independent of its
// batch, chunk and reused pages as a full-context one, bit for bit, and the contexts here (up to 96)
// run far past the window.
TEST(EngineDifferential, RandomInterleavingsWithASlidingWindow) {
  const int seeds = std::max(1, env_int("ANVIL_DIFF_SEEDS", 4) / 2), first = env_int("ANVIL_DIFF_SEED", 1),
            steps = env_int("ANVIL_DIFF_STEPS", 60);
  for (DType kv : {DType::kF32, DType::kBF16}) {
    Reference ref(kv, 9);
    ASSERT_TRUE(ref.f.engine);
    for (int i = 0; i < seeds; ++i) {
      run_seed(uint64_t(first + i), steps, ref, kv, 9);
      if (HasFailure()) return;
    }
  }
}
