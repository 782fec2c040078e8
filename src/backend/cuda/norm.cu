// Embedding lookup, RMSNorm (optionally fused with the residual add), and the element-wise ops.
// These touch O(T * hidden) bytes, so they are latency-bound at decode: one launch each, one block
// per row, fp32 arithmetic, bf16 in memory. The fused residual add rounds the new residual to bf16
// and normalizes that rounded value, so the stream and the norm's input agree.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {
namespace {

__device__ __forceinline__ float load_any(const void* p, int64_t i, Elem e) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

__global__ void embed_kernel(DevMatrix w, const int32_t* ids, __nv_bfloat16* out) {
  pdl_begin();
  const int t = blockIdx.x;
  const int64_t row = ids[t];
  const int64_t cols = w.cols;
  if (row < 0 || row >= w.rows) {  // the transformer validates ids; poison rather than read out of bounds
    for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) out[t * cols + k] = __float2bfloat16_rn(__int_as_float(0x7fc00000));
    return;
  }
  for (int64_t k = threadIdx.x; k < cols; k += blockDim.x) {
    float v;
    if (w.bits) {
      const uint32_t* p = static_cast<const uint32_t*>(w.data) + row * (cols * w.bits / 32);
      const int64_t bit = k * w.bits;
      const int64_t wi = bit >> 5;
      const int sh = int(bit & 31);
      uint32_t q = p[wi] >> sh;
      if (sh + w.bits > 32) q |= p[wi + 1] << (32 - sh);
      q &= (1u << w.bits) - 1u;
      const int64_t g = row * (cols / w.group) + k / w.group;
      v = fmaf(load_any(w.scales, g, w.dtype), float(q), load_any(w.biases, g, w.dtype));
    } else {
      v = load_any(w.data, row * cols + k, w.dtype);
    }
    out[t * cols + k] = __float2bfloat16_rn(v);
  }
}

// Rows of up to kNormRegs * blockDim.x elements keep the row and the norm weight in registers: the
// weight (never written by a kernel) is loaded before the wait for the previous kernel, and the row
// is read once. Same arithmetic as the loop below, so the same bits.
constexpr int kNormRegs = 8;

template <bool RESIDUAL>
__global__ void rmsnorm_kernel(__nv_bfloat16* residual, const __nv_bfloat16* x, const void* w, Elem wd, float eps,
                               int cols, __nv_bfloat16* out) {
  pdl_launch();
  const int64_t r = blockIdx.x;
  if (cols <= kNormRegs * int(blockDim.x)) {
    float wv[kNormRegs], hv[kNormRegs];
#pragma unroll
    for (int k = 0; k < kNormRegs; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      wv[k] = i < cols ? load_any(w, i, wd) : 0.0f;
    }
    pdl_wait();
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kNormRegs; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      hv[k] = 0.0f;
      if (i >= cols) continue;
      if constexpr (RESIDUAL) {
        const __nv_bfloat16 sum = __float2bfloat16_rn(__bfloat162float(residual[r * cols + i]) +
                                                      __bfloat162float(x[r * cols + i]));
        residual[r * cols + i] = sum;
        hv[k] = __bfloat162float(sum);
      } else {
        hv[k] = __bfloat162float(x[r * cols + i]);
      }
      ss += hv[k] * hv[k];
    }
    const float inv = rsqrtf(block_sum(ss) / float(cols) + eps);
#pragma unroll
    for (int k = 0; k < kNormRegs; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < cols) out[r * cols + i] = __float2bfloat16_rn(hv[k] * inv * wv[k]);
    }
    return;
  }
  pdl_wait();
  const __nv_bfloat16* src = RESIDUAL ? residual + r * cols : x + r * cols;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    float v;
    if constexpr (RESIDUAL) {
      const __nv_bfloat16 sum = __float2bfloat16_rn(__bfloat162float(residual[r * cols + i]) +
                                                    __bfloat162float(x[r * cols + i]));
      residual[r * cols + i] = sum;  // read back below by this same thread
      v = __bfloat162float(sum);
    } else {
      v = __bfloat162float(src[i]);
    }
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / float(cols) + eps);
  for (int i = threadIdx.x; i < cols; i += blockDim.x)
    out[r * cols + i] = __float2bfloat16_rn(__bfloat162float(src[i]) * inv * load_any(w, i, wd));
}

__global__ void add_kernel(__nv_bfloat16* a, const __nv_bfloat16* b, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    a[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

__global__ void swiglu_kernel(const __nv_bfloat16* g, const __nv_bfloat16* u, __nv_bfloat16* o, int64_t n) {
  pdl_begin();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gv = __bfloat162float(g[i]);
    o[i] = __float2bfloat16_rn(gv / (1.0f + __expf(-gv)) * __bfloat162float(u[i]));
  }
}

unsigned elem_blocks(int64_t n) { return unsigned(std::min<int64_t>((n + 255) / 256, 132 * 8)); }

}  // namespace

cudaError_t embed(const DevMatrix& table, const int32_t* ids, int T, void* out, cudaStream_t s) {
  launch_k(embed_kernel, dim3(T), dim3(256), 0, s, table, ids, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t rmsnorm(void* residual, const void* x, const void* w, Elem w_dtype, float eps, int rows, int cols,
                    void* out, cudaStream_t s) {
  const int threads = cols >= 1024 ? 1024 : ((cols + 31) / 32) * 32;
  if (residual)
    launch_k(rmsnorm_kernel<true>, dim3(rows), dim3(threads), 0, s, static_cast<__nv_bfloat16*>(residual),
                                                  static_cast<const __nv_bfloat16*>(x), w, w_dtype, eps, cols,
                                                  static_cast<__nv_bfloat16*>(out));
  else
    launch_k(rmsnorm_kernel<false>, dim3(rows), dim3(threads), 0, s, nullptr, static_cast<const __nv_bfloat16*>(x), w, w_dtype, eps,
                                                   cols, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

cudaError_t add(void* a, const void* b, int64_t n, cudaStream_t s) {
  launch_k(add_kernel, dim3(elem_blocks(n)), dim3(256), 0, s, static_cast<__nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), n);
  return cudaGetLastError();
}

cudaError_t swiglu(const void* gate, const void* up, void* out, int64_t n, cudaStream_t s) {
  launch_k(swiglu_kernel, dim3(elem_blocks(n)), dim3(256), 0, s, static_cast<const __nv_bfloat16*>(gate),
                                               static_cast<const __nv_bfloat16*>(up),
                                               static_cast<__nv_bfloat16*>(out), n);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
