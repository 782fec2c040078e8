// The decode step does not allocate: its per-step index vectors are engine members reused across
// calls (issue 7, item 7). Counted with a replaced global operator new in this test binary.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "engine_test_util.h"

namespace {
std::atomic<long> g_allocs{0};
std::atomic<bool> g_counting{false};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace anvil::testing {
namespace {

TEST(EngineAlloc, DecodeStepsInsideAPageDoNotAllocate) {
  for (const char* spec : {"tiny:q4g64", "tiny:bf16"}) {
    FixtureOptions o;
    o.spec = spec;
    o.threads = 2;
    auto f = make_engine(o);
    ASSERT_TRUE(f.engine) << spec;
    const int V = f.vocab();
    int seqs[2];
    std::vector<float> logits;
    for (int k = 0; k < 2; ++k) {
      auto s = f.engine->seq_create();
      ASSERT_TRUE(s.is_ok());
      seqs[k] = *s;
      // 17 tokens: the second page is open with room for 15 more, so no decode below needs a page.
      ASSERT_TRUE(f.engine->extend(seqs[k], random_ids(17, 7 + k, V), &logits).is_ok());
    }
    std::vector<int32_t> toks = {1, 2};
    // Warm-up steps size every reused buffer (and the sequences' token vectors, whose amortised
    // growth is the only other allocation a step could make).
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(f.engine->decode(seqs, toks, &logits).is_ok());
    // Three windows of 4 steps (the page has room for 12 more tokens). A pool thread's per-thread
    // scratch grows the first time that thread runs a given op, and which thread claims which chunk
    // is dynamic, so on a busy machine a worker may first run an op inside a window: such growth is
    // bounded and happens once. An allocation per step shows in every window; require one window
    // without any.
    std::string windows;
    bool clean = false;
    for (int w = 0; w < 3; ++w) {
      long grow = 0;
      for (int k = 0; k < 2; ++k) {
        const auto& t = f.engine->seq_tokens(seqs[k]);
        if (t.capacity() < t.size() + 4) ++grow;  // the next 4 push_backs may reallocate once
      }
      g_allocs = 0;
      g_counting = true;
      for (int i = 0; i < 4; ++i) {
        toks[0] = 3 + w * 4 + i;
        toks[1] = 40 + w * 4 + i;
        Status st = f.engine->decode(seqs, toks, &logits);
        if (!st.is_ok()) {
          g_counting = false;
          FAIL() << st.message();
        }
      }
      g_counting = false;
      windows += " " + std::to_string(g_allocs.load());
      clean = clean || g_allocs.load() <= grow;
    }
    EXPECT_TRUE(clean) << spec << ": every window of 4 batched decode steps allocated; allocations per window:"
                       << windows;
  }
}

}  // namespace
}  // namespace anvil::testing
