// Shared helpers for the backend tests: deterministic random data, weights built from a known
// integer truth (so references never decode the packed format with backend code), guarded output
// buffers, and normalized error measures.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "base/dtype.h"

namespace anvil::test {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Values stored in `dt`, plus their exact decoded values (the reference uses the decoded ones).
struct FloatArray {
  DType dt = DType::kF32;
  std::vector<uint8_t> bytes;
  std::vector<double> value;
  const void* data() const { return bytes.data(); }
};

inline FloatArray make_float_array(const std::vector<float>& src, DType dt) {
  FloatArray a;
  a.dt = dt;
  a.bytes.resize(src.size() * dtype_size(dt));
  a.value.resize(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (dt == DType::kF32) {
      std::memcpy(a.bytes.data() + 4 * i, &src[i], 4);
      a.value[i] = src[i];
    } else if (dt == DType::kBF16) {
      uint16_t h = f32_to_bf16(src[i]);
      std::memcpy(a.bytes.data() + 2 * i, &h, 2);
      uint32_t u = uint32_t(h) << 16;  // bf16 is the top half of an f32
      float f;
      std::memcpy(&f, &u, 4);
      a.value[i] = f;
    } else {
      uint16_t h = f32_to_f16(src[i]);
      std::memcpy(a.bytes.data() + 2 * i, &h, 2);
      a.value[i] = f16_to_f32(h);
    }
  }
  return a;
}

// A weight matrix and its dense double-precision truth ref[r*cols + k] (+ bias_ref[r]).
struct TestWeight {
  WeightMatrix w;
  std::vector<double> ref, bias_ref;
  std::vector<uint32_t> packed;
  FloatArray dense, scales, biases, bias;
};

// MLX affine quantized: integer q drawn uniformly, then packed bit by bit into uint32 words so that
// element k occupies stream bits [k*bits, (k+1)*bits) (bit i of the stream = bit i%32 of word i/32).
inline TestWeight make_quant_weight(int64_t rows, int64_t cols, int bits, int group, DType sdt, bool with_bias,
                                    uint32_t seed) {
  TestWeight t;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> qd(0, (1u << bits) - 1);
  const int64_t ng = cols / group, wpr = cols * bits / 32;
  std::vector<uint32_t> q(size_t(rows * cols));
  for (auto& v : q) v = qd(rng);
  t.packed.assign(size_t(rows * wpr), 0u);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      for (int b = 0; b < bits; ++b)
        if ((q[size_t(r * cols + k)] >> b) & 1u) {
          const int64_t bit = k * bits + b;
          t.packed[size_t(r * wpr + bit / 32)] |= 1u << (bit % 32);
        }
  // Scales of both signs (MLX allows negative scales), biases around zero.
  t.scales = make_float_array(random_floats(size_t(rows * ng), seed + 1, -0.05f, 0.05f), sdt);
  t.biases = make_float_array(random_floats(size_t(rows * ng), seed + 2, -0.1f, 0.1f), sdt);
  t.ref.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      const size_t g = size_t(r * ng + k / group);
      t.ref[size_t(r * cols + k)] = t.scales.value[g] * double(q[size_t(r * cols + k)]) + t.biases.value[g];
    }
  t.w.rows = rows;
  t.w.cols = cols;
  t.w.dtype = sdt;
  t.w.bits = bits;
  t.w.group_size = group;
  t.w.data = t.packed.data();
  t.w.scales = t.scales.data();
  t.w.biases = t.biases.data();
  t.bias_ref.assign(size_t(rows), 0.0);
  if (with_bias) {
    t.bias = make_float_array(random_floats(size_t(rows), seed + 3), DType::kBF16);
    t.bias_ref = t.bias.value;
    t.w.bias = t.bias.data();
    t.w.bias_dtype = DType::kBF16;
  }
  return t;
}

inline TestWeight make_dense_weight(int64_t rows, int64_t cols, DType dt, bool with_bias, uint32_t seed) {
  TestWeight t;
  t.dense = make_float_array(random_floats(size_t(rows * cols), seed), dt);
  t.ref = t.dense.value;
  t.w.rows = rows;
  t.w.cols = cols;
  t.w.dtype = dt;
  t.w.data = t.dense.data();
  t.bias_ref.assign(size_t(rows), 0.0);
  if (with_bias) {
    t.bias = make_float_array(random_floats(size_t(rows), seed + 3), DType::kF32);
    t.bias_ref = t.bias.value;
    t.w.bias = t.bias.data();
    t.w.bias_dtype = DType::kF32;
  }
  return t;
}

// An F32 buffer of n floats with kGuard sentinel floats on both sides, to catch overruns.
class Guarded {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint32_t kSentinel = 0x7fa5a5a5u;  // a NaN no kernel produces by arithmetic
  explicit Guarded(size_t n) : n_(n), buf_(n + 2 * kGuard) {
    for (auto& x : buf_) std::memcpy(&x, &kSentinel, 4);
  }
  float* data() { return buf_.data() + kGuard; }
  const float* data() const { return buf_.data() + kGuard; }
  float operator[](size_t i) const { return data()[i]; }
  size_t size() const { return n_; }
  Act act(int64_t rows, int64_t cols) { return Act{data(), rows, cols, DType::kF32}; }
  // True when no guard float was written.
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      uint32_t a, b;
      std::memcpy(&a, &buf_[i], 4);
      std::memcpy(&b, &buf_[kGuard + n_ + i], 4);
      if (a != kSentinel || b != kSentinel) return false;
    }
    return true;
  }

 private:
  size_t n_;
  std::vector<float> buf_;
};

// max_i |got_i - want_i| / max(max_i scale_i, tiny); also fails on NaN/Inf in got.
inline double normalized_error(const float* got, const std::vector<double>& want, const std::vector<double>& scale) {
  double worst = 0.0, denom = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    denom = std::max(denom, scale[i]);
  }
  return worst / denom;
}

}  // namespace anvil::test
