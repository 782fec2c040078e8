// RoPE inverse frequencies, incl. the llama3, linear, yarn and longrope scalings (Hugging Face semantics).
#pragma once
#include <vector>

#include "format/model_config.h"

namespace anvil {

// inv_freq[i] = theta^(-2i/R), i < R/2 (R: the rotary dims, rotary_dims), then scaled per
// cfg.rope_scaling; head_dim/2 entries, 0 past R/2.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

// YaRN's and LongRoPE's attention factor (transformers' attention_scaling: cos and sin are multiplied
// by it, so q and k are); 1 for every other RoPE type.
double rope_attention_factor(const ModelConfig& cfg);

// The attention's softmax scale: 1/sqrt(head_dim), times the square of rope_attention_factor (the
// engine rotates q and k without it and scales the scores instead, the same product) when RoPE turns
// whole heads.
float attention_softmax_scale(const ModelConfig& cfg);

// The dims of a head RoPE turns (cfg.rotary_dim, or head_dim).
int rotary_dims(const ModelConfig& cfg);
// What the rotation multiplies the turned dims by (KVCacheView::rope_scale): with partial rotary the
// attention factor, which only those dims carry, so it cannot go into the softmax scale; else 1.
float rope_scale_in_rotation(const ModelConfig& cfg);

}  // namespace anvil
