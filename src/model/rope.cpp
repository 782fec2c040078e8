#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace anvil {

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  // The rotated dims' frequencies, as transformers computes them for dim = the rotary dims; the
  // entries past them (partial rotary) stay 0: no rotation.
  const int rot = rotary_dims(cfg);
  const int half = rot / 2;
  std::vector<float> inv(size_t(cfg.head_dim / 2), 0.0f);
  for (int i = 0; i < half; ++i) inv[i] = float(1.0 / std::pow(cfg.rope_theta, double(2 * i) / rot));
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
  } else if (rs.type == "yarn") {
    // YaRN (transformers' _compute_yarn_parameters): dimensions that turn fewer than beta_slow times over
    // the original context are interpolated (inv_freq / factor), those turning more than beta_fast times
    // are kept, and a linear ramp over the dimensions between blends the two.
    const double D = rot, base = cfg.rope_theta;
    const double old_len = rs.original_max_position_embeddings;
    auto correction_dim = [&](double rotations) {
      return D * std::log(old_len / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
    };
    double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
    if (rs.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, D - 1);
    if (low == high) high += 0.001;  // as transformers: no division by zero
    for (int i = 0; i < half; ++i) {
      const double extrapolated = 1.0 / std::pow(base, double(2 * i) / D);
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      // ramp 0: keep the frequency (extrapolate); ramp 1: divide it by the factor (interpolate).
      inv[i] = float(extrapolated / rs.factor * ramp + extrapolated * (1.0 - ramp));
    }
  } else if (rs.type == "longrope") {
    // Each frequency divided by its factor: the short ones, or the long ones for a context past the
    // original (RopeScaling::longrope_long).
    const std::vector<double>& ext = rs.longrope_long ? rs.long_factor : rs.short_factor;
    for (int i = 0; i < half && i < int(ext.size()); ++i)
      inv[i] = float(1.0 / (ext[size_t(i)] * std::pow(cfg.rope_theta, double(2 * i) / rot)));
  }
  return inv;
}

double rope_attention_factor(const ModelConfig& cfg) {
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.type == "longrope") {
    if (rs.attention_factor > 0) return rs.attention_factor;
    if (rs.factor <= 1.0) return 1.0;
    return std::sqrt(1.0 + std::log(rs.factor) / std::log(double(rs.original_max_position_embeddings)));
  }
  if (rs.type != "yarn") return 1.0;
  if (rs.attention_factor > 0) return rs.attention_factor;
  auto mscale = [](double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  if (rs.mscale != 0 && rs.mscale_all_dim != 0)
    return mscale(rs.factor, rs.mscale) / mscale(rs.factor, rs.mscale_all_dim);
  return mscale(rs.factor, 1.0);
}

int rotary_dims(const ModelConfig& cfg) {
  return cfg.rotary_dim > 0 && cfg.rotary_dim < cfg.head_dim ? cfg.rotary_dim : cfg.head_dim;
}

float rope_scale_in_rotation(const ModelConfig& cfg) {
  return rotary_dims(cfg) < cfg.head_dim ? float(rope_attention_factor(cfg)) : 1.0f;
}

float attention_softmax_scale(const ModelConfig& cfg) {
  // YaRN multiplies cos and sin, so both q and k, by the attention factor: the scores by its square.
  // With partial rotary only the rotated dims carry it: the rotation applies it (rope_scale_in_rotation).
  const double af = rotary_dims(cfg) < cfg.head_dim ? 1.0 : rope_attention_factor(cfg);
  if (af == 1.0) return 1.0f / std::sqrt(float(cfg.head_dim));
  return float(af * af / std::sqrt(double(cfg.head_dim)));
}

}  // namespace anvil
