// config.json -> ModelConfig for the qwen3, qwen2, llama, mistral and phi3 families and the mixture-of-experts
// families qwen3_moe, qwen2_moe, olmoe and mixtral, every required field checked.
// Errors name the file and the field: "config.json: field 'num_attention_heads': expected a positive integer".
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace anvil {

// kMistral computes what kLlama does (no biases anywhere); it differs in its config (sliding_window).
// kPhi3 (Phi-3, Phi-3.5-mini, Phi-4) computes it too; its checkpoints fuse q/k/v into one qkv_proj and
// gate/up into one gate_up_proj, which model/weights.cpp splits into row views at load.
enum class Arch { kQwen3, kQwen2, kLlama, kQwen3Moe, kQwen2Moe, kOlmoe, kMixtral, kMistral, kPhi3 };
const char* arch_name(Arch a);

// MLX affine quantization of one module: w = scales * q + biases, per group of `group_size` inputs.
struct QuantSpec {
  int bits = 0;        // 0 = not quantized; else 2, 3, 4, 5, 6 or 8
  int group_size = 0;  // 32, 64 or 128
  bool quantized() const { return bits != 0; }
};

// The `quantization` / `quantization_config` block: a default plus per-module overrides keyed by
// module path without the ".weight" suffix ("model.layers.0.mlp.gate_proj"); an override is either a
// params dict or `false` (not quantized).
struct QuantConfig {
  QuantSpec default_spec;                     // bits == 0 when the checkpoint is not quantized
  std::map<std::string, QuantSpec> overrides; // QuantSpec{} for `false`
  QuantSpec for_module(const std::string& module_path) const;
};

struct RopeScaling {
  std::string type;  // "" (none), "llama3", "linear", "yarn", "longrope", "default"
  double factor = 1.0;  // longrope: max_position_embeddings / original_max_position_embeddings
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3 (required) and yarn (default: max_position_embeddings): the context length trained on.
  int original_max_position_embeddings = 8192;
  // yarn, as transformers' _compute_yarn_parameters reads them (0 / absent: its defaults).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double attention_factor = 0.0;  // 0: derived from factor (and mscale / mscale_all_dim)
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;  // round the correction range outwards to whole dimensions
  // longrope (transformers' _compute_longrope_parameters; attention_factor above, 0: derived from
  // factor and original_max_position_embeddings): a divisor per rotary frequency (head_dim / 2 each)
  // for contexts up to original_max_position_embeddings (short) and beyond (long).
  std::vector<double> short_factor, long_factor;
  // Which of the two the engine rotates with: not in config.json but chosen for the context a model
  // is run with (cli/common.cpp: long when it exceeds original_max_position_embeddings), for every
  // position alike, so that a position's K never depends on how the prompt was chunked.
  bool longrope_long = false;
};

struct ModelConfig {
  Arch arch = Arch::kQwen3;
  std::string model_type;  // as written in config.json
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;  // defaults to hidden_size / num_attention_heads when absent
  // The dims of a head RoPE turns: head_dim * partial_rotary_factor (Phi-3's config: Phi-4-mini's 0.75),
  // even; 0 when it turns all of them (every other model).
  int rotary_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int max_position_embeddings = 0;
  // Mistral's, Mixtral's and Phi-3's sliding_window: attention over the last W positions (0: none), in
  // every layer (KVCacheView::window; the backends' attention applies it).
  int sliding_window = 0;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections have a bias (qwen2: true)
  bool qk_norm = false;         // per-head RMSNorm on q and k before RoPE (qwen3)
  bool qk_norm_full = false;    // RMSNorm over the whole q (k) projection before RoPE (olmoe)
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;
  DType torch_dtype = DType::kBF16;
  QuantConfig quant;

  // Mixture of experts; num_experts == 0 means dense. Values as transformers' config classes give them.
  int num_experts = 0;           // num_experts (qwen*_moe, olmoe) or num_local_experts (mixtral)
  int num_experts_per_tok = 0;   // top-k
  int moe_intermediate_size = 0; // per-expert FFN width (olmoe, mixtral: intermediate_size)
  int shared_expert_intermediate_size = 0;  // qwen2_moe's always-on shared expert (0 = none)
  // Renormalize the top-k probabilities to sum to 1 (mixtral's softmax over the top-k logits is the same).
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;   // layer l is MoE when (l + 1) % step == 0 and l not in mlp_only_layers
  std::vector<int> mlp_only_layers;
  bool is_moe() const { return num_experts > 0; }
  bool is_moe_layer(int layer) const;
};

// Parses config.json text; `label` names the file in errors.
Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& label = "config.json");
// Reads DIR/config.json, and merges eos ids from DIR/generation_config.json when present.
Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace anvil
