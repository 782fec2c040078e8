// Model weights: tensor names (Hugging Face and MLX layouts share them; MLX adds .scales/.biases to
// quantized modules) -> WeightMatrix / WeightVector views, validated against the config.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "format/model_config.h"
#include "format/safetensors.h"

namespace anvil {

// Where tensors come from: a Checkpoint on disk, or a synthetic model built in memory.
using TensorLookup = std::function<const TensorView*(const std::string& name)>;

struct LayerWeights {
  WeightVector attn_norm, ffn_norm;
  WeightVector q_norm, k_norm;  // qwen3: [head_dim]; olmoe: [heads*head_dim] / [kv_heads*head_dim]; else data == nullptr
  WeightMatrix q, k, v, o;      // q: [heads*head_dim, hidden], k/v: [kv_heads*head_dim, hidden], o: [hidden, heads*head_dim]
  WeightMatrix gate, up, down;  // gate/up: [ffn, hidden], down: [hidden, ffn]; unused when moe
  bool moe = false;             // the FFN is the routed experts in `experts` (ModelConfig::is_moe_layer)
  MoEWeights experts;
};

struct ModelWeights {
  WeightMatrix embed;    // [vocab, hidden]
  WeightMatrix lm_head;  // [vocab, hidden]; the embedding itself when tied
  WeightVector final_norm;
  std::vector<LayerWeights> layers;
  bool tied = false;

  // Bytes of weights read to decode one token: every layer, the final norm and the lm_head once,
  // plus one embedding row; of an MoE layer the router, top_k experts (the mean expert size) and the
  // shared expert.
  size_t bytes_per_token() const;
  size_t total_bytes() const;
  int64_t parameter_count() const;  // logical parameters (quantized elements count once)
  // Parameters one token uses: parameter_count() with only top_k of each MoE layer's experts (embedding
  // and lm_head count whole, as model cards count "active" parameters).
  int64_t active_parameter_count() const;
};

// Resolves and validates every tensor the config calls for. Errors name the tensor and what was
// expected (shape, dtype, quantization).
Result<ModelWeights> bind_weights(const ModelConfig& cfg, const TensorLookup& lookup, const std::string& label);

// Uploads every weight to the backend (CPU: no copy).
Result<ModelWeights> upload_weights(const ModelWeights& host, Backend& backend);

}  // namespace anvil
