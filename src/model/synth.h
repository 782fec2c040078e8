// Synthetic models: random weights in the MLX layout for the benchmark shapes (docs/bench-protocol.md)
// and a tiny one. Speed does not depend on weight values, so benchmarks run without downloads.
// Values are drawn so activations stay finite and well scaled: every weight is uniform in
// [-a, a] with a = sqrt(3 / fan_in) (unit output variance), norms are 1.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "format/safetensors.h"
#include "base/status.h"

namespace anvil {

struct SynthShape {
  std::string name;
  int layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  bool tied;
  // Mixture of experts (qwen3_moe): 0 experts = dense. Experts are written stacked, MLX style:
  // mlp.switch_mlp.{gate,up,down}_proj with a leading expert dimension, plus the router mlp.gate
  // (8-bit in a quantized model, through a per-module override, as mlx-community checkpoints have it).
  int experts = 0, top_k = 0, moe_ffn = 0;
  bool moe() const { return experts > 0; }
};

// The named shapes: tiny, qwen3-0.6b, qwen3-1.7b, qwen3-8b, gqa-2kv (dense Qwen3) and tiny-moe, qwen3-30b-a3b,
// qwen3-30b-a3b-16L (qwen3_moe).
const std::vector<SynthShape>& synth_shapes();
Result<SynthShape> synth_shape(const std::string& name);

struct SynthQuant {
  int bits = 0;  // 0 = bf16
  int group_size = 0;
  std::string name() const;
};
// "q4g64", "q8g64", "q4g32", "bf16", ...
Result<SynthQuant> parse_synth_quant(const std::string& s);

// Whether the quantization fits the shape (each matrix's input width a multiple of the group).
Status synth_check(const SynthShape& shape, const SynthQuant& q);

// config.json text for the shape (model_type qwen3, MLX quantization block when quantized).
std::string synth_config_json(const SynthShape& shape, const SynthQuant& q);

// A synthetic model held in memory: tensors named as in a checkpoint.
struct SynthModel {
  SynthShape shape;
  SynthQuant quant;
  std::string config_json;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<TensorView> tensors;
  const TensorView* find(const std::string& name) const;
  size_t total_bytes() const;
};

// Builds the model in memory (deterministic for a seed).
Result<std::unique_ptr<SynthModel>> synth_build(const SynthShape& shape, const SynthQuant& q, uint64_t seed = 0);

// Writes config.json (the given text), generation_config.json and, when tokenizer_dir is non-empty,
// the tokenizer files found there into `dir`: a checkpoint without its weights, for tools that
// generate the weights themselves (scripts/bench_llamacpp_moe.sh).
Status synth_write_config(const std::string& config_json, const std::string& dir, const std::string& tokenizer_dir);

// Writes config.json, generation_config.json and safetensors shards (at most shard_bytes each, with
// model.safetensors.index.json when there is more than one) into `dir`, plus the tokenizer files
// found in tokenizer_dir when it is non-empty.
Status synth_write(const SynthModel& m, const std::string& dir, const std::string& tokenizer_dir,
                   size_t shard_bytes = size_t(2) << 30);

}  // namespace anvil
