// Internal to src/backend/cuda/: reading MLX affine-quantized and dense weights inside kernels.
// Shared by the mat-vec (qgemv.cu), the prefill GEMM (gemm.cu) and the MoE kernels (moe.cu), so one
// dequantizer is the one every CUDA op test exercises.
//
// A chunk is 32 consecutive elements of one weight row. MLX groups are >= 32 elements and aligned, so a
// chunk has one scale and one bias. Format codes (FMT): 2..8 = MLX affine bits (w = s*q + b);
// 16 = dense bf16; 17 = dense f16; 32 = dense f32. A chunk is chunk_words<FMT>() 32-bit words.
#pragma once
#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {

__device__ __forceinline__ float load_any(const void* p, int64_t i, Elem e) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

template <int FMT>
__host__ __device__ constexpr int chunk_words() {
  return FMT <= 8 ? FMT : (FMT == 32 ? 32 : 16);
}

// 32-bit words of one weight row of K elements (K % 32 == 0).
template <int FMT>
__device__ __forceinline__ int64_t row_words(int64_t K) {
  return K / 32 * chunk_words<FMT>();
}

template <int W>
__device__ __forceinline__ void load_words(const uint32_t* p, uint32_t (&w)[W]) {
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int i = 0; i < W / 4; ++i) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else if constexpr (W % 2 == 0) {
#pragma unroll
    for (int i = 0; i < W / 2; ++i) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
      w[2 * i] = v.x, w[2 * i + 1] = v.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = __ldg(p + i);
  }
}

// Activation chunk c (32 elements) of a bf16 row as floats, and their sum (the affine bias term
// multiplies it): shared by the mat-vec and the MoE kernels.
__device__ __forceinline__ float load_x_chunk(const uint16_t* row, int64_t c, float (&xf)[32]) {
  uint32_t xw[16];
  load_words<16>(reinterpret_cast<const uint32_t*>(row + c * 32), xw);
  float sx = 0.0f;
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    xf[2 * e] = bf16_lo(xw[e]);
    xf[2 * e + 1] = bf16_hi(xw[e]);
    sx += xf[2 * e] + xf[2 * e + 1];
  }
  return sx;
}

// Element e (0..31, a compile-time constant after unrolling) of a chunk: q for quantized formats,
// the value itself for dense ones.
template <int FMT, int W>
__device__ __forceinline__ float chunk_elem(const uint32_t (&w)[W], int e) {
  if constexpr (FMT <= 8) {
    const int bit = e * FMT, wi = bit >> 5, sh = bit & 31;
    uint32_t q = w[wi] >> sh;
    if (sh + FMT > 32) q |= w[wi + 1] << (32 - sh);
    return float(q & ((1u << FMT) - 1u));
  } else if constexpr (FMT == 16) {
    return (e & 1) ? bf16_hi(w[e >> 1]) : bf16_lo(w[e >> 1]);
  } else if constexpr (FMT == 17) {
    const __half2 h = *reinterpret_cast<const __half2*>(&w[e >> 1]);
    return __half2float((e & 1) ? __high2half(h) : __low2half(h));
  } else {
    return __uint_as_float(w[e]);
  }
}

// A 32-element chunk's BITS words (already loaded) with its group's scale s and bias b, as bf16:
// s * q + b in fp32, rounded once. dequant_chunk_bf16 and the MoE grouped GEMM's prefetching loop
// share it, so both give the same bits.
template <int BITS>
__device__ __forceinline__ void dequant_words_bf16(const uint32_t (&wd)[BITS], float s, float b, __nv_bfloat16* dst) {
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const int bit = e * BITS, wi = bit >> 5, sh = bit & 31;
    uint32_t q = wd[wi] >> sh;
    if (sh + BITS > 32) q |= wd[wi + 1] << (32 - sh);
    q &= (1u << BITS) - 1u;
    dst[e] = __float2bfloat16_rn(fmaf(s, float(q), b));
  }
}

// The same 32 values as dequant_words_bf16, as 16 packed bf16 pairs in registers (element 2i in the
// low half of o[i]): for stores of 16 bytes without a staging array in local memory.
template <int BITS>
__device__ __forceinline__ void dequant_words_packed(const uint32_t (&wd)[BITS], float s, float b, uint32_t (&o)[16]) {
#pragma unroll
  for (int e = 0; e < 32; e += 2) {
    uint32_t q[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int bit = (e + h) * BITS, wi = bit >> 5, sh = bit & 31;
      q[h] = wd[wi] >> sh;
      if (sh + BITS > 32) q[h] |= wd[wi + 1] << (32 - sh);
      q[h] &= (1u << BITS) - 1u;
    }
    const __nv_bfloat162 v =
        __halves2bfloat162(__float2bfloat16_rn(fmaf(s, float(q[0]), b)), __float2bfloat16_rn(fmaf(s, float(q[1]), b)));
    o[e / 2] = *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Dequantizes elements [k0, k0+32) of row `row` of a [rows, cols] weight into dst[0..32) (bf16).
// BITS 2..8: MLX affine with `scales`/`biases` [rows, cols/group] of `dtype`; BITS 0: dense `dtype`.
template <int BITS>
__device__ __forceinline__ void dequant_chunk_bf16(const void* data, const void* scales, const void* biases, Elem dtype,
                                              int64_t cols, int group, int64_t row, int64_t k0, __nv_bfloat16* dst) {
  if constexpr (BITS > 0) {
    const uint32_t* p = static_cast<const uint32_t*>(data) + (row * cols + k0) / 32 * BITS;
    uint32_t wd[BITS];
#pragma unroll
    for (int i = 0; i < BITS; ++i) wd[i] = __ldg(p + i);
    const int64_t g = row * (cols / group) + k0 / group;
    const float s = load_any(scales, g, dtype), b = load_any(biases, g, dtype);
    dequant_words_bf16<BITS>(wd, s, b, dst);
  } else {
#pragma unroll 8
    for (int e = 0; e < 32; ++e) dst[e] = __float2bfloat16_rn(load_any(data, row * cols + k0 + e, dtype));
  }
}

}  // namespace anvil::cuda
