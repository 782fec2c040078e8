// RoPE inverse frequencies, incl. the llama3 and linear scalings (Hugging Face semantics).
#pragma once
#include <vector>

#include "format/model_config.h"

namespace anvil {

// inv_freq[i] = theta^(-2i/head_dim), i < head_dim/2, then scaled per cfg.rope_scaling.
std::vector<float> rope_inv_freq(const ModelConfig& cfg);

}  // namespace anvil
