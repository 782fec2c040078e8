// Internal to src/backend/cuda/: the 16-byte pieces of the decode norms (norm.cu) — bf16 elements of
// a 16-byte chunk, the residual add, and one row's RMSNorm by one block with a thread per 8 elements.
#pragma once
#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {

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

}  // namespace anvil::cuda
