// RoPE inverse frequencies, incl. the llama3, linear, yarn and longrope scalings (Hugging Face semantics).
#pragma once
#include <vector>

#include "format/model_config.h"

namespace anvil {

// inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2, then scaled per cfg.rope_scaling.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

// YaRN's and LongRoPE's attention factor (transformers' attention_scaling: cos and sin are multiplied
// by it, so q and k are); 1 for every other RoPE type.
double rope_attention_factor(const ModelConfig& cfg);

// The attention's softmax scale: 1/sqrt(head_dim), times the square of rope_attention_factor (the
// engine rotates q and k without it and scales the scores instead, the same product).
float attention_softmax_scale(const ModelConfig& cfg);

}  // namespace anvil
