// A first forward pass before serving: loads what a GPU backend loads lazily (kernel modules,
// cuBLAS handles and heuristics, the decode graph), so the first request does not pay for it.
// On the H200 a fresh server's first 4,096-token request took 234.9 ms against 145.6 ms once
// warmed (docs/benchmarks.md, session 14).
#pragma once
#include "base/status.h"

namespace anvil {

class Engine;

// Runs one prefill chunk of `prefill_tokens` tokens (at most the model's tokens per forward) and
// one decode step sampled on the backend on a scratch sequence, then releases it and drops the
// pages it left in the prefix index: the engine's pool ends as it began (n_free, prefix entries).
// Call it before a durable store is attached, so nothing of it is persisted.
Status warm_up(Engine& engine, int prefill_tokens);

}  // namespace anvil
