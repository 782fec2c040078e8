// See warmup.h.
#include "runtime/warmup.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/engine.h"

namespace anvil {

Status warm_up(Engine& engine, int prefill_tokens) {
  if (engine.page_store()) return internal_error("warm_up: call it before a store is attached");
  const int vocab = engine.model().config().vocab_size;
  const int n = std::max(1, std::min(prefill_tokens, engine.model().max_tokens()));
  auto seq = engine.seq_create();
  if (!seq.is_ok()) return seq.status();
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = int32_t((int64_t(i) * 7919 + 13) % vocab);  // any valid ids
  Status st = engine.seq_append(*seq, tokens);
  if (st.is_ok()) st = engine.seq_reserve(*seq, n + 1);
  std::vector<float> logits;
  if (st.is_ok()) {
    const Engine::StepItem prefill{*seq, n, true};
    st = engine.step(std::span<const Engine::StepItem>(&prefill, 1), &logits);
  }
  if (st.is_ok()) {
    const int32_t next = 0;
    st = engine.seq_append(*seq, std::span<const int32_t>(&next, 1));
  }
  if (st.is_ok()) {
    const Engine::StepItem decode{*seq, 1, true};
    const SamplingParams greedy{};
    const uint64_t random = 0;
    std::vector<int32_t> out;
    st = engine.step_sample(std::span<const Engine::StepItem>(&decode, 1), std::span<const SamplingParams>(&greedy, 1),
                            std::span<const uint64_t>(&random, 1), {}, &out);
  }
  engine.seq_release(*seq);
  engine.pool().prefix_evict_unused();
  return st.with_context("warm-up");
}

}  // namespace anvil
