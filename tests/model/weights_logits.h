// The CPU logits of a few fixed tokens of one sequence through a model's weights (f32 KV cache, one
// page): what the weight-layout tests compare between two ways of storing the same weights.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "format/model_config.h"
#include "model/transformer.h"
#include "model/weights.h"

namespace anvil {

inline std::vector<float> logits_of(const ModelConfig& cfg, const ModelWeights& w) {
  auto be = make_cpu_backend(2);
  auto tr = Transformer::create(cfg, w, *be, 8);
  EXPECT_TRUE(tr.is_ok()) << tr.status().message();
  const int T = 5;
  std::vector<int32_t> ids = {11, 200, 3000, 40000, 151000}, pos = {0, 1, 2, 3, 4}, seq(T, 0), pages = {0};
  KVCacheView kv;
  kv.dtype = DType::kF32;
  kv.n_layers = cfg.num_hidden_layers;
  kv.n_kv_heads = cfg.num_key_value_heads;
  kv.head_dim = cfg.head_dim;
  kv.page_size = 16;
  kv.n_pages = 1;
  std::vector<float> kvbuf(kv.page_elems());
  kv.base = kvbuf.data();
  BatchView b{T, 1, 1, pos.data(), seq.data(), pages.data()};
  std::vector<float> logits(size_t(T) * cfg.vocab_size);
  Status st = (*tr)->forward(ids.data(), b, kv, {0, 1, 2, 3, 4}, logits.data());
  EXPECT_TRUE(st.is_ok()) << st.message();
  return logits;
}

}  // namespace anvil
