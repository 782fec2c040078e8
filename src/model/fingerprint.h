// The model fingerprint: the identity of everything in a checkpoint that changes what the model
// computes, and so the root of every KV page key (runtime/kv_pool.h) and the model key of the
// durable store.
//
// fingerprint = H("anvil.model_fingerprint", v1, config.json bytes, for every tensor in name order:
//                 name, dtype, shape, byte count, H(chunk 0), H(chunk 1), ...)
// where the chunks are the tensor's bytes cut every kChunkBytes. Every weight byte is hashed (any
// changed byte changes its chunk's hash and so the fingerprint); the chunks are hashed in parallel
// over a thread pool, once per load. Cost measured in docs/architecture.md ("Model fingerprint").
#pragma once
#include <string>
#include <vector>

#include "base/hash128.h"
#include "base/thread_pool.h"
#include "format/safetensors.h"

namespace anvil {

inline constexpr size_t kFingerprintChunkBytes = size_t(8) << 20;

// tensors: every tensor of the checkpoint (any order; they are sorted by name here).
Hash128 model_fingerprint(const std::string& config_json, std::vector<const TensorView*> tensors, ThreadPool& pool);

}  // namespace anvil
