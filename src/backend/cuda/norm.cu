// Embedding lookup, RMSNorm (optionally fused with the residual add), and the element-wise ops.
// These touch O(T * hidden) bytes, so they are latency-bound at decode: one launch each, one block
// per row, fp32 arithmetic, bf16 in memory. The fused residual add rounds the new residual to bf16
// and normalizes that rounded value, so the stream and the norm's input agree.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemv_int.cuh"

namespace anvil::cuda {
namespace {

__device__ __forceinline__ float load_any(const void* p, int64_t i, Elem e) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// The 16-byte pieces of the decode norms: bf16 elements of a 16-byte chunk, the residual add, and
// one row's RMSNorm by one block with a thread per 8 elements.
__device__ __forceinline__ float bf16_at(const uint4& v, int e) {
  const uint32_t w = e < 2 ? v.x : e < 4 ? v.y : e < 6 ? v.z : v.w;
  return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
}
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// a + b for 8 bf16 pairs in 16 bytes, each sum rounded to bf16 (the residual add of the norms).
__device__ __forceinline__ uint4 add8(const uint4& a, const uint4& b) {
  return make_uint4(bf16_pair(bf16_at(a, 0) + bf16_at(b, 0), bf16_at(a, 1) + bf16_at(b, 1)),
                    bf16_pair(bf16_at(a, 2) + bf16_at(b, 2), bf16_at(a, 3) + bf16_at(b, 3)),
                    bf16_pair(bf16_at(a, 4) + bf16_at(b, 4), bf16_at(a, 5) + bf16_at(b, 5)),
                    bf16_pair(bf16_at(a, 6) + bf16_at(b, 6), bf16_at(a, 7) + bf16_at(b, 7)));
}

// One row of `cols` elements by one block, thread ch holding chunk v = elements 8ch..8ch+7 (zeros
// past the row): 1 / rms of the row. Every thread of the block calls it (a block reduction).
__device__ __forceinline__ float vec_norm_inv(const uint4& v, float eps, int cols) {
  float ss = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss += bf16_at(v, e) * bf16_at(v, e);
  return rsqrtf(block_sum(ss) / float(cols) + eps);
}
// The chunk normalized: v * inv * w (the chunk's 8 weights), rounded to bf16.
__device__ __forceinline__ uint4 vec_norm_apply(const uint4& v, float inv, const float (&wv)[8]) {
  float y[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) y[e] = bf16_at(v, e) * inv * wv[e];
  return make_uint4(bf16_pair(y[0], y[1]), bf16_pair(y[2], y[3]), bf16_pair(y[4], y[5]), bf16_pair(y[6], y[7]));
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
    trace::point(9);
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
  trace::point(9);
}

// Every launch with cols a multiple of 8 up to 8,192 (ANVIL_CUDA_NORM_VEC=0 falls back to
// rmsnorm_kernel): one block per row, one thread per 16-byte chunk of 8 elements
// (cols / 8 threads: 512 for qwen3-8b's 4,096), the weights loaded before the PDL wait. The
// timeline of the decode graph (trace.h, session 15) had rmsnorm_kernel's 1,024 threads of 2-byte
// loads at 4.7-6.0 us per norm on qwen3-8b against 1.2-1.7 us on qwen3-0.6b, while the next
// mat-vec's weight prefetch fills the memory system; this kernel issues a sixteenth of the load
// requests. Measured on the H200 (one call, A/B): qwen3-8b q4g64 decode 427-429 -> 444 tok/s,
// qwen3-0.6b 1,166 -> 1,200, qwen3-30b-a3b-16L 950 -> 960.
// late: the next kernel is let in (griddepcontrol.launch_dependents) only once this block has its
// row and its sum, so the next kernels' blocks, and their weight copies, start after these loads.
// The backend sets it once the model has run an MoE block (cuda_backend.cpp): qwen3-30b-a3b-16L
// 960 -> 1,019 tok/s, while dense models lost 1.3-1.5% with it (qwen3-8b 438, qwen3-0.6b 1,182).
// Prefill norms take it too (session 33). They used a warp per row (4 rows per block, 16-byte
// loads, the row in registers; 17 us for 512 rows of qwen3-8b's 4,096 with rmsnorm_kernel's 2-byte
// loads, session 13), but a warp walks its row's chunks one after another (each residual store is
// ordered before the next chunk's loads), a chain of L2 round trips: 16.2-16.9 us per norm at 64
// rows in a batched qwen3-8b step's timeline (H100, session 32) against ~2 us here. pp512 on an
// H100 (session 33, two rounds, interleaved): qwen3-0.6b q4g64 112,005 / 113,269 -> 116,759 /
// 118,644 tok/s, qwen3-8b q4g64 23,253 / 23,265 -> 24,211 / 24,055. The sum of squares is taken in
// another order than rmsnorm_kernel's, so the last bit of a norm can differ between the two.
template <bool RESIDUAL>
__global__ void rmsnorm_vec_kernel(__nv_bfloat16* residual, const __nv_bfloat16* x, const void* w, Elem wd, float eps,
                                   int cols, __nv_bfloat16* out, bool late, uint4* planes) {
  if (!late) pdl_launch();
  const int64_t r = blockIdx.x;
  const int ch = threadIdx.x, nch = cols / 8;
  const bool act = ch < nch;
  float wv[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) wv[e] = act ? load_any(w, int64_t(ch) * 8 + e, wd) : 0.0f;
  pdl_wait();
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (act) {
    v = reinterpret_cast<const uint4*>(x + r * cols)[ch];
    if constexpr (RESIDUAL) {
      uint4* rs = reinterpret_cast<uint4*>(residual + r * cols);
      v = add8(rs[ch], v);
      rs[ch] = v;
    }
  }
  const float inv = vec_norm_inv(v, eps, cols);
  if (late) pdl_launch();
  trace::point(2);
  if (act) {
    v = vec_norm_apply(v, inv, wv);
    reinterpret_cast<uint4*>(out + r * cols)[ch] = v;
  }
  // The one row also as int16 planes (every lane of the block: the pieces' quads shuffle), from the
  // bf16 values just written, as the one-token mat-vec would stage them (ANVIL_CUDA_NORM_PLANES).
  if (planes)
    tc::int_stage_piece(act ? v : make_uint4(0u, 0u, 0u, 0u), act, ch >> 2, ch & 3, planes,
                        reinterpret_cast<float2*>(reinterpret_cast<uint8_t*>(planes) + size_t(cols) * 2));
  trace::point(9);
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

size_t rmsnorm_planes_bytes(int cols) { return tc::int_x_bytes(cols); }

cudaError_t rmsnorm(void* residual, const void* x, const void* w, Elem w_dtype, float eps, int rows, int cols,
                    void* out, cudaStream_t s, bool late, void* planes, bool* planes_written) {
  if (planes_written) *planes_written = false;
  auto a16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  static const bool vec = [] {
    const char* e = std::getenv("ANVIL_CUDA_NORM_VEC");
    return !(e && *e == '0');
  }();
  if (vec && cols % 8 == 0 && cols / 8 <= 1024 && a16(x) && a16(out) && (!residual || a16(residual))) {
    const int threads = ((cols / 8 + 31) / 32) * 32;
    uint4* pl = planes && rows == 1 && cols % 32 == 0 && a16(planes) ? static_cast<uint4*>(planes) : nullptr;
    if (residual)
      launch_k(rmsnorm_vec_kernel<true>, dim3(rows), dim3(threads), 0, s, static_cast<__nv_bfloat16*>(residual),
               static_cast<const __nv_bfloat16*>(x), w, w_dtype, eps, cols, static_cast<__nv_bfloat16*>(out), late, pl);
    else
      launch_k(rmsnorm_vec_kernel<false>, dim3(rows), dim3(threads), 0, s, nullptr, static_cast<const __nv_bfloat16*>(x),
               w, w_dtype, eps, cols, static_cast<__nv_bfloat16*>(out), late, pl);
    const cudaError_t e = cudaGetLastError();
    if (planes_written) *planes_written = pl && e == cudaSuccess;
    return e;
  }
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
