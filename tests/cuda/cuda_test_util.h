// Shared by the CUDA tests: a CPU (reference) and a CUDA backend side by side, random inputs that
// are exactly representable in bf16 (so both backends start from identical values), device buffers
// with guard bytes, and the error metric.
//
// Metric: rel_err = ||cuda - cpu||_2 / ||cpu||_2 over the whole output, computed in double.
// Every output is poisoned (bf16 NaN) before the op and checked to be finite after it, so an element
// the kernel never wrote fails; guard bytes on both sides of it are checked to be untouched.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "base/dtype.h"

namespace anvil::cuda_test {

constexpr size_t kGuard = 256;           // bytes on each side of a checked output
constexpr uint8_t kGuardByte = 0xA5;

inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// n prompt ids spread over Qwen3's vocabulary (the same ids in every CUDA model test).
inline std::vector<int32_t> spread_ids(int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back((i * 7919 + 13) % 151936);
  return ids;
}

// ||got - ref||_2 / ||ref||_2 in double (the metric above); infinite where got has a value that is not
// finite, so that a NaN can neither pass a bound nor vanish from a running maximum.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Environment variables saved when made and restored (or unset again) when it goes, so that a test
// may set and unset them while it runs.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<const char*> names) {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      saved_.push_back({n, v ? v : "", v != nullptr});
    }
  }
  ~ScopedEnv() {
    for (const Saved& s : saved_) s.set ? setenv(s.name, s.value.c_str(), 1) : unsetenv(s.name);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  struct Saved {
    const char* name;
    std::string value;
    bool set;
  };
  std::vector<Saved> saved_;
};

// The current device's SM count (0 if it cannot be read).
inline int gpu_sms() {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return v;
}

// One device allocation with guard bytes around `bytes` of payload.
struct Guarded {
  Backend* be = nullptr;
  uint8_t* base = nullptr;
  size_t bytes = 0;
  void* data() const { return base + kGuard; }
};

// Host storage of a random weight matrix in the given format.
struct HostWeight {
  std::vector<uint32_t> q;
  std::vector<uint16_t> dense16, scales, biases, bias;
  std::vector<float> dense32;
  WeightMatrix w;
};

inline HostWeight make_weight(std::mt19937& rng, int64_t rows, int64_t cols, int bits, int group, DType dt, bool with_bias) {
  HostWeight h;
  h.w.rows = rows, h.w.cols = cols, h.w.bits = bits, h.w.group_size = group, h.w.dtype = dt;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float wscale = 1.0f / std::sqrt(float(cols));
  if (bits) {
    h.q.resize(size_t(rows * cols * bits / 32));
    for (auto& x : h.q) x = uint32_t(rng());
    const size_t ng = size_t(rows * (cols / group));
    h.scales.resize(ng), h.biases.resize(ng);
    const float levels = float((1 << bits) - 1);
    for (size_t g = 0; g < ng; ++g) {
      const float s = wscale * (0.5f + std::abs(nd(rng))) * 3.0f / levels;
      h.scales[g] = f32_to_bf16(s);
      h.biases[g] = f32_to_bf16(-s * levels / 2 + 0.1f * wscale * nd(rng));
    }
    h.w.data = h.q.data(), h.w.scales = h.scales.data(), h.w.biases = h.biases.data();
  } else if (dt == DType::kF32) {
    h.dense32.resize(size_t(rows * cols));
    for (auto& x : h.dense32) x = wscale * nd(rng);
    h.w.data = h.dense32.data();
  } else {
    h.dense16.resize(size_t(rows * cols));
    for (auto& x : h.dense16) x = dt == DType::kBF16 ? f32_to_bf16(wscale * nd(rng)) : f32_to_f16(wscale * nd(rng));
    h.w.data = h.dense16.data();
  }
  if (with_bias) {
    h.bias.resize(size_t(rows));
    for (auto& x : h.bias) x = f32_to_bf16(0.1f * nd(rng));
    h.w.bias = h.bias.data(), h.w.bias_dtype = DType::kBF16;
  }
  return h;
}

inline std::string fmt_name(int bits, int group, DType dt) {
  return bits ? "q" + std::to_string(bits) + "g" + std::to_string(group) : std::string(dtype_name(dt));
}

class CudaFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    auto b = make_cuda_backend(0);
    if (!b.is_ok()) GTEST_SKIP() << "no CUDA GPU usable here: " << b.status().message();
    gpu_ = std::move(*b);
    cpu_ = make_cpu_backend(2);
  }
  void TearDown() override {
    for (auto& g : allocs_) gpu_->free(g.base);
    allocs_.clear();
  }

  std::vector<float> randn(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = bf16_round(d(rng_));
    return v;
  }
  // The helpers below fill their buffers by copies on gpu_'s stream and wait for them (settled):
  // tests hand the buffers to other backends (backend_with: other streams), whose kernels would
  // otherwise race the copies still in flight. A poisoned output's 0xFF fill landing after another
  // backend's attention kernel had written it made CudaOps.RopeKvAppendAndAttentionMatchCpu fail
  // once on the H200 (an element "never written"; session 18), when that kernel ran alone (one split).
  // A device buffer of bf16 values (with guards), holding `v`.
  Guarded dev_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    Guarded g = guarded(b.size() * 2, false);
    gpu_->copy_to_device(g.data(), b.data(), b.size() * 2);
    settled();
    return g;
  }
  Guarded dev_bytes(const void* src, size_t bytes) {
    Guarded g = guarded(bytes, false);
    gpu_->copy_to_device(g.data(), src, bytes);
    settled();
    return g;
  }
  // An output buffer poisoned with 0xFF bytes (bf16 and f32 NaN).
  Guarded dev_out(size_t bytes) {
    Guarded g = guarded(bytes, false);
    std::vector<uint8_t> nan(bytes, 0xFF);
    gpu_->copy_to_device(g.data(), nan.data(), bytes);
    settled();
    return g;
  }
  void settled() {
    const Status st = gpu_->synchronize();
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  // settle = false: the caller copies into the buffer next and waits itself (settled()).
  Guarded guarded(size_t bytes, bool settle = true) {
    auto p = gpu_->alloc(bytes + 2 * kGuard);
    EXPECT_TRUE(p.is_ok());
    Guarded g{gpu_.get(), static_cast<uint8_t*>(*p), bytes};
    std::vector<uint8_t> pat(bytes + 2 * kGuard, kGuardByte);
    gpu_->copy_to_device(g.base, pat.data(), pat.size());
    if (settle) settled();
    allocs_.push_back(g);
    return g;
  }
  // Reads a bf16 (or f32) output back as floats after checking its guards.
  std::vector<float> read(const Guarded& g, DType dt, const std::string& what) {
    std::vector<uint8_t> all(g.bytes + 2 * kGuard);
    gpu_->copy_to_host(all.data(), g.base, all.size());
    for (size_t i = 0; i < kGuard; ++i) {
      EXPECT_EQ(all[i], kGuardByte) << what << ": guard byte " << i << " before the output was overwritten";
      EXPECT_EQ(all[kGuard + g.bytes + i], kGuardByte) << what << ": guard byte " << i << " after the output was overwritten";
      if (all[i] != kGuardByte || all[kGuard + g.bytes + i] != kGuardByte) break;
    }
    const size_t n = g.bytes / dtype_size(dt);
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) {
      if (dt == DType::kF32) std::memcpy(&out[i], all.data() + kGuard + 4 * i, 4);
      else {
        uint16_t b;
        std::memcpy(&b, all.data() + kGuard + 2 * i, 2);
        out[i] = bf16_to_f32(b);
      }
    }
    return out;
  }

  static double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
    return cuda_test::rel_err(got, ref);
  }
  // Asserts every value finite and rel_err <= bound; prints the measured error.
  static void expect_close(const std::vector<float>& got, const std::vector<float>& ref, double bound,
                           const std::string& what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i] << " (never written?)";
    const double e = rel_err(got, ref);
    std::printf("[ cuda-err ] %-60s rel_err %.3g (bound %.3g)\n", what.c_str(), e, bound);
    EXPECT_LE(e, bound) << what;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  std::mt19937 rng_{1234};
  std::vector<Guarded> allocs_;
};

}  // namespace anvil::cuda_test
