// The CPU backend: F32 activations, host memory, weights read in place from the mmapped checkpoint.
// This file holds the class, memory and the small element-wise ops; linear lives in cpu_linear.cpp,
// the SIMD kernels in cpu_qdot_avx2.cpp, attention in cpu_attention.cpp.
#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "base/sample_math.h"

namespace anvil {

namespace {

std::atomic<int> g_force_scalar{-1};  // -1: not yet read from ANVIL_CPU_SCALAR

bool env_force_scalar() {
  const char* e = std::getenv("ANVIL_CPU_SCALAR");
  return e && *e && std::strcmp(e, "0") != 0;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "anvil: cpu backend: %s\n", what.c_str());
  std::abort();
}

void check_f32(const Act& a, const char* op, const char* name) {
  if (a.dtype != DType::kF32)
    die(std::string(op) + ": activation '" + name + "' must be F32 (the CPU backend's act_dtype), got " +
        std::string(dtype_name(a.dtype)));
}

// Elements per parallel chunk of the element-wise ops: big enough that a chunk outweighs a wake-up.
constexpr int64_t kElemGrain = 1 << 15;

float row_rmsnorm_scale(const float* x, int64_t n, float eps) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j] * x[i + j];
  float ss = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) ss += x[i] * x[i];
  return 1.0f / std::sqrt(ss / float(n) + eps);
}

void row_scale_weight(const float* x, float inv, const WeightVector& w, int64_t n, float* out) {
  switch (w.dtype) {
    case DType::kF32: {
      const float* p = static_cast<const float*>(w.data);
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * p[i];
      break;
    }
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(w.data);
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * bf16_to_f32(p[i]);
      break;
    }
    default:
      for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * load_float(w.data, w.dtype, size_t(i));
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads > 0 ? n_threads : ThreadPool::default_threads()) {
    // ANVIL_CPU_FUSED_FLOW=1 (for tests): the transformer takes its fused layer flow (the one the
    // CUDA backend runs at one token on narrow models, or with ANVIL_CUDA_FUSE=1) on the CPU, through the fused ops' reference
    // compositions; the result must equal the plain flow's bit for bit.
    const char* e = std::getenv("ANVIL_CPU_FUSED_FLOW");
    fused_flow_ = e && *e == '1';
  }
  bool fuses_norm_linear(int64_t, std::span<const WeightMatrix* const>) const override { return fused_flow_; }

  std::string name() const override {
    return std::string("cpu (") + (cpu_use_avx512() ? "avx2+avx512vnni" : cpu_use_avx2() ? "avx2" : "scalar") + ", " +
           std::to_string(pool_.size()) + " threads)";
  }
  DType act_dtype() const override { return DType::kF32; }

  Result<void*> alloc(size_t bytes) override {
    const size_t n = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = std::aligned_alloc(64, n);
    if (!p) return Status(StatusCode::kOutOfMemory, "cpu alloc: could not allocate " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free(void* p) override { std::free(p); }
  void copy_to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_device(void* dst, const void* src, size_t bytes) override { std::memmove(dst, src, bytes); }
  // The store's writer thread copies an immutable page while decode runs: a plain memcpy per row.
  void copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                             size_t rows, uint64_t) override {
    if (dst_pitch == width && src_pitch == width) {
      std::memcpy(dst, src, width * rows);
      return;
    }
    for (size_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<uint8_t*>(dst) + r * dst_pitch, static_cast<const uint8_t*>(src) + r * src_pitch, width);
  }

  bool device_memory_is_host() const override { return true; }
  Status wait_device_copies() override { return Status::ok(); }

  Result<WeightMatrix> upload_weight(const WeightMatrix& w) override {
    if (w.rows <= 0 || w.cols <= 0 || !w.data)
      return invalid_argument("weight: expected rows > 0, cols > 0 and data, got [" + std::to_string(w.rows) + ", " +
                              std::to_string(w.cols) + "]");
    if (!is_float_dtype(w.dtype))
      return invalid_argument("weight: dtype must be F32, F16 or BF16, got " + std::string(dtype_name(w.dtype)));
    if (w.bias && !is_float_dtype(w.bias_dtype))
      return invalid_argument("weight bias: dtype must be F32, F16 or BF16, got " + std::string(dtype_name(w.bias_dtype)));
    if (w.quantized()) {
      if (w.bits != 2 && w.bits != 3 && w.bits != 4 && w.bits != 5 && w.bits != 6 && w.bits != 8)
        return unsupported("quantized weight: bits must be 2, 3, 4, 5, 6 or 8, got " + std::to_string(w.bits));
      if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
        return unsupported("quantized weight: group_size must be 32, 64 or 128, got " + std::to_string(w.group_size));
      if (w.cols % w.group_size != 0)
        return invalid_argument("quantized weight: cols " + std::to_string(w.cols) + " is not a multiple of group_size " +
                                std::to_string(w.group_size));
      if (!w.scales || !w.biases) return invalid_argument("quantized weight: scales and biases are required");
    }
    return w;
  }
  Result<WeightVector> upload_vector(const WeightVector& v) override {
    if (v.n <= 0 || !v.data || !is_float_dtype(v.dtype))
      return invalid_argument("vector weight: expected n > 0, data and a F32/F16/BF16 dtype");
    return v;
  }
  void free_weight(const WeightMatrix&) override {}  // weights are read in place: nothing was copied
  void free_vector(const WeightVector&) override {}
  Status synchronize() override { return Status::ok(); }

  void embed(const WeightMatrix& table, const int32_t* ids, Act out) override {
    check_f32(out, "embed", "out");
    if (out.cols != table.cols) die("embed: out.cols must equal the table's cols");
    pool_.parallel_for(out.rows, std::max<int64_t>(1, kElemGrain / table.cols), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int32_t id = ids[t];
        if (id < 0 || id >= table.rows)
          die("embed: token id " + std::to_string(id) + " outside the table's " + std::to_string(table.rows) + " rows");
        cpu::weight_row_to_f32(table, id, static_cast<float*>(out.data) + t * out.cols);
      }
    });
  }

  void rmsnorm(Act x, const WeightVector& w, float eps, Act out) override {
    check_f32(x, "rmsnorm", "x");
    check_f32(out, "rmsnorm", "out");
    const int64_t n = x.cols;
    pool_.parallel_for(x.rows, std::max<int64_t>(1, kElemGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* xr = static_cast<const float*>(x.data) + r * n;
        row_scale_weight(xr, row_rmsnorm_scale(xr, n, eps), w, n, static_cast<float*>(out.data) + r * n);
      }
    });
  }

  void add_rmsnorm(Act residual, Act x, const WeightVector& w, float eps, Act out) override {
    check_f32(residual, "add_rmsnorm", "residual");
    check_f32(x, "add_rmsnorm", "x");
    check_f32(out, "add_rmsnorm", "out");
    const int64_t n = x.cols;
    pool_.parallel_for(x.rows, std::max<int64_t>(1, kElemGrain / n), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        float* rr = static_cast<float*>(residual.data) + r * n;
        const float* xr = static_cast<const float*>(x.data) + r * n;
        for (int64_t i = 0; i < n; ++i) rr[i] += xr[i];
        row_scale_weight(rr, row_rmsnorm_scale(rr, n, eps), w, n, static_cast<float*>(out.data) + r * n);
      }
    });
  }

  void linear(Act x, const WeightMatrix& w, Act out) override {
    check_f32(x, "linear", "x");
    check_f32(out, "linear", "out");
    if (x.cols != w.cols || out.cols != w.rows || out.rows != x.rows)
      die("linear: expected x [T, " + std::to_string(w.cols) + "] and out [T, " + std::to_string(w.rows) +
          "], got x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "], out [" +
          std::to_string(out.rows) + ", " + std::to_string(out.cols) + "]");
    cpu::linear_f32(pool_, static_cast<const float*>(x.data), x.rows, w, static_cast<float*>(out.data));
  }

  void linear_swiglu(Act x, const WeightMatrix& gate, const WeightMatrix& up, Act out) override {
    check_f32(out, "linear_swiglu", "out");
    // The reference composition: gate into out, up into scratch, then swiglu in place.
    swiglu_scratch_.resize(size_t(out.rows * out.cols));
    Act u{swiglu_scratch_.data(), out.rows, out.cols, DType::kF32};
    linear(x, gate, out);
    linear(x, up, u);
    swiglu(out, u, out);
  }

  void gather_rows(Act src, const int32_t* rows, Act dst) override {
    check_f32(src, "gather_rows", "src");
    check_f32(dst, "gather_rows", "dst");
    if (src.cols != dst.cols) die("gather_rows: src and dst must have the same cols");
    for (int64_t i = 0; i < dst.rows; ++i) {
      if (rows[i] < 0 || rows[i] >= src.rows)
        die("gather_rows: row " + std::to_string(rows[i]) + " outside [0, " + std::to_string(src.rows) + ")");
      std::memmove(static_cast<float*>(dst.data) + i * dst.cols,
                   static_cast<const float*>(src.data) + int64_t(rows[i]) * src.cols, size_t(src.cols) * 4);
    }
  }

  bool has_sample_rows() const override { return true; }
  void sample_rows(Act logits, const SampleArgs& a, int32_t* ids) override {
    check_f32(logits, "sample_rows", "logits");
    if (logits.cols > sampling::kMaxVocab) die("sample_rows: vocab " + std::to_string(logits.cols) + " above the limit");
    cpu::sample_rows(logits, a, ids);
  }
  void argmax_rows(Act logits, const int32_t* suppress, int n_suppress, int32_t* ids) override {
    check_f32(logits, "argmax_rows", "logits");
    for (int64_t r = 0; r < logits.rows; ++r) {
      const float* l = static_cast<const float*>(logits.data) + r * logits.cols;
      int32_t best = -1;
      float bv = 0;
      for (int64_t i = 0; i < logits.cols; ++i) {
        const float v = l[i];
        if (std::isnan(v) || v == -INFINITY || (best >= 0 && !(v > bv))) continue;
        bool skip = false;
        for (int j = 0; j < n_suppress && !skip; ++j) skip = suppress[j] == i;
        if (skip) continue;
        best = int32_t(i);
        bv = v;
      }
      ids[r] = best;
    }
  }

  void swiglu(Act gate, Act up, Act out) override {
    check_f32(gate, "swiglu", "gate");
    check_f32(up, "swiglu", "up");
    check_f32(out, "swiglu", "out");
    const float* g = static_cast<const float*>(gate.data);
    const float* u = static_cast<const float*>(up.data);
    float* o = static_cast<float*>(out.data);
    pool_.parallel_for(gate.rows * gate.cols, kElemGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    });
  }

  void add(Act a, Act b) override {
    check_f32(a, "add", "a");
    check_f32(b, "add", "b");
    float* pa = static_cast<float*>(a.data);
    const float* pb = static_cast<const float*>(b.data);
    pool_.parallel_for(a.rows * a.cols, kElemGrain, [&](int64_t b0, int64_t e) {
      for (int64_t i = b0; i < e; ++i) pa[i] += pb[i];
    });
  }

  void qk_norm_rope_kv_append(Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                              const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch) override {
    check_f32(q, "qk_norm_rope_kv_append", "q");
    check_f32(k, "qk_norm_rope_kv_append", "k");
    check_f32(v, "qk_norm_rope_kv_append", "v");
    check_kv(kv, "qk_norm_rope_kv_append");
    if (k.cols != int64_t(kv.n_kv_heads) * kv.head_dim || q.cols % kv.head_dim != 0)
      die("qk_norm_rope_kv_append: k/v must be [T, n_kv_heads*head_dim] and q [T, n_heads*head_dim]");
    cpu::qk_norm_rope_kv_append_f32(pool_, static_cast<float*>(q.data), static_cast<const float*>(k.data),
                                    static_cast<const float*>(v.data), int(q.cols / kv.head_dim), q_norm, k_norm, eps,
                                    inv_freq, kv, layer, batch);
  }

  void attention(Act q, const KVCacheView& kv, int layer, const BatchView& batch, float scale, Act out) override {
    check_f32(q, "attention", "q");
    check_f32(out, "attention", "out");
    check_kv(kv, "attention");
    const int n_heads = int(q.cols / kv.head_dim);
    if (q.cols % kv.head_dim != 0 || n_heads % kv.n_kv_heads != 0)
      die("attention: q must be [T, n_heads*head_dim] with n_heads a multiple of n_kv_heads");
    cpu::attention_f32(pool_, static_cast<const float*>(q.data), n_heads, kv, layer, batch, scale,
                       static_cast<float*>(out.data));
  }

  bool has_moe_ffn() const override { return true; }
  void moe_ffn(Act x, const MoEWeights& w, Act out) override {
    check_f32(x, "moe_ffn", "x");
    check_f32(out, "moe_ffn", "out");
    if (w.num_experts <= 0 || w.top_k <= 0 || w.top_k > w.num_experts ||
        w.gate.size() != size_t(w.num_experts) || w.up.size() != size_t(w.num_experts) ||
        w.down.size() != size_t(w.num_experts))
      die("moe_ffn: expected num_experts gate/up/down matrices and 0 < top_k <= num_experts");
    if (x.cols != w.router.cols || w.router.rows != w.num_experts || out.cols != x.cols || out.rows != x.rows ||
        x.data == out.data)
      die("moe_ffn: expected x and out [T, hidden] (distinct) and a router [num_experts, hidden]");
    cpu::moe_ffn_f32(pool_, static_cast<const float*>(x.data), x.rows, w, static_cast<float*>(out.data));
  }

  void to_host_f32(Act x, float* dst) override {
    check_f32(x, "to_host_f32", "x");
    std::memcpy(dst, x.data, size_t(x.rows * x.cols) * 4);
  }

 private:
  static void check_kv(const KVCacheView& kv, const char* op) {
    if (kv.dtype != DType::kF32 && kv.dtype != DType::kBF16)
      die(std::string(op) + ": the CPU KV cache dtype must be F32 or BF16, got " + std::string(dtype_name(kv.dtype)));
  }
  ThreadPool pool_;
  bool fused_flow_ = false;
  std::vector<float> swiglu_scratch_;  // linear_swiglu's up projection
};

}  // namespace

bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  }();
  return has;
}

void cpu_set_force_scalar(bool on) { g_force_scalar.store(on ? 1 : 0); }

bool cpu_use_avx2() {
  int f = g_force_scalar.load(std::memory_order_relaxed);
  if (f < 0) {
    int expected = -1;
    g_force_scalar.compare_exchange_strong(expected, env_force_scalar() ? 1 : 0);
    f = g_force_scalar.load();
  }
  return f == 0 && cpu_has_avx2();
}

namespace {
std::atomic<int> g_avx512{-1};  // -1: not yet read from ANVIL_CPU_AVX512
}

void cpu_set_avx512(bool on) { g_avx512.store(on ? 1 : 0); }

bool cpu_use_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }();
  int f = g_avx512.load(std::memory_order_relaxed);
  if (f < 0) {
    const char* e = std::getenv("ANVIL_CPU_AVX512");
    int expected = -1;
    g_avx512.compare_exchange_strong(expected, (e && std::strcmp(e, "0") == 0) ? 0 : 1);
    f = g_avx512.load();
  }
  return f == 1 && has && cpu_use_avx2();
}

std::unique_ptr<Backend> make_cpu_backend(int n_threads) { return std::make_unique<CpuBackend>(n_threads); }

}  // namespace anvil
