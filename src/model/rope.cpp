#include "model/rope.h"

#include <cmath>

namespace anvil {

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int half = cfg.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = float(1.0 / std::pow(cfg.rope_theta, double(2 * i) / cfg.head_dim));
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "linear") {
    for (auto& f : inv) f = float(f / rs.factor);
  } else if (rs.type == "llama3") {
    // Wavelengths longer than old_len/low_freq_factor are divided by `factor`; shorter than
    // old_len/high_freq_factor are kept; in between they are interpolated smoothly.
    const double old_len = rs.original_max_position_embeddings;
    const double low_wavelen = old_len / rs.low_freq_factor;
    const double high_wavelen = old_len / rs.high_freq_factor;
    for (auto& f : inv) {
      double freq = f;
      double wavelen = 2.0 * M_PI / freq;
      if (wavelen > low_wavelen) {
        freq = freq / rs.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        freq = (1.0 - smooth) * freq / rs.factor + smooth * freq;
      }
      f = float(freq);
    }
  }
  return inv;
}

}  // namespace anvil
