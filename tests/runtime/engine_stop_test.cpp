// A prefill stopped between its chunks (Engine::extend's keep_going, GenerateRequest::keep_prefilling:
// Ctrl-C during a long prompt): the chunks computed keep their KV, nothing past them is appended, no
// page leaks, and finishing the prompt later gives exactly the logits of an uninterrupted prefill.
#include "engine_test_util.h"
#include "runtime/generate.h"

using namespace anvil;
using namespace anvil::testing;

TEST(EngineStop, PrefillStoppedBetweenChunksKeepsItsKvAndFinishesExactly) {
  FixtureOptions o;  // 64 tokens per forward: a 300-token prompt is chunks of 64, 64, 64, 64, 44
  o.engine.prefix_cache = false;  // every sequence computes its own KV (and frees its pages)
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  const int V = f.vocab();
  const auto prompt = random_ids(300, 11, V);
  const int64_t free_at_start = f.engine->pool().n_free();

  int a = *f.engine->seq_create();
  std::vector<float> whole;
  ASSERT_TRUE(f.engine->extend(a, prompt, &whole).is_ok());
  ASSERT_EQ(whole.size(), size_t(V));

  int b = *f.engine->seq_create();
  int asked = 0;
  std::vector<float> cut = {1.0f};
  // Asked before chunks 2, 3 and 4: yes, yes, no. So three chunks (192 tokens) are computed.
  ASSERT_TRUE(f.engine->extend(b, prompt, &cut, nullptr, [&] { return ++asked < 3; }).is_ok());
  EXPECT_EQ(asked, 3);
  EXPECT_TRUE(cut.empty()) << "a stopped prefill has no last-token logits";
  EXPECT_EQ(f.engine->seq_tokens(b).size(), 192u);
  EXPECT_EQ(f.engine->seq_kv(b), 192);

  // The rest of the prompt: the same chunks as the uninterrupted prefill, so the same logits, bit
  // for bit (the CPU backend is deterministic for a given chunking).
  std::vector<float> rest;
  ASSERT_TRUE(f.engine->extend(b, std::span<const int32_t>(prompt).subspan(192), &rest).is_ok());
  EXPECT_EQ(f.engine->seq_tokens(b), prompt);
  EXPECT_TRUE(bit_equal(rest, whole)) << "max |diff| " << max_abs_diff(rest.data(), whole.data(), size_t(V));

  // A stop asked for at once still computes the first chunk (every call makes progress).
  int c = *f.engine->seq_create();
  ASSERT_TRUE(f.engine->extend(c, prompt, &cut, nullptr, [] { return false; }).is_ok());
  EXPECT_EQ(f.engine->seq_kv(c), 64);

  f.engine->seq_release(a);
  f.engine->seq_release(b);
  f.engine->seq_release(c);
  EXPECT_EQ(f.engine->pool().n_free(), free_at_start) << "pages leaked by a stopped prefill";
}

TEST(EngineStop, GenerateStoppedInItsPromptGeneratesNothing) {
  FixtureOptions o;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  int s = *f.engine->seq_create();
  GenerateRequest req;
  req.prompt = random_ids(200, 5, f.vocab());
  req.max_new_tokens = 8;
  int asked = 0;
  req.keep_prefilling = [&] { return ++asked < 2; };  // chunks 1 and 2, then stop: 128 tokens
  int tokens_seen = 0;
  auto r = generate(*f.engine, s, req, [&](int32_t) { return ++tokens_seen > 0; });
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ(r->finish_reason, "cancelled");
  EXPECT_TRUE(r->ids.empty());
  EXPECT_EQ(tokens_seen, 0);
  EXPECT_EQ(r->prompt_tokens, 200);
  EXPECT_EQ(r->prompt_done, 128);
  EXPECT_EQ(f.engine->seq_kv(s), 128);

  // Not stopped: the whole prompt is done and tokens come.
  int t = *f.engine->seq_create();
  req.keep_prefilling = [] { return true; };
  auto full = generate(*f.engine, t, req, nullptr);
  ASSERT_TRUE(full.is_ok());
  EXPECT_EQ(full->prompt_done, 200);
  EXPECT_EQ(full->ids.size(), 8u);
}
