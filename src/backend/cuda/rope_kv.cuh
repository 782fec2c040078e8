// One (token, head) item of the whole-head q/k RMSNorm + RoPE + KV append, by one warp: shared by
// rope_kv.cu's kernel and the q/k/v mat-vec's rope epilogue (qgemv_stream.cu, ANVIL_CUDA_QKV_ROPE),
// so both compute the same bits. Lane l holds the rotate-half pairs (i, i + D/2) for i = l, l + 32,
// ... (D <= 256, even). Angles pos * inv_freq[i] are formed and turned in double, as the CPU
// reference does (fp32 loses ~1e-3 rad at 40k positions); the rotation itself is fp32.
#pragma once
#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda::rope {

constexpr int kMaxPairsPerLane = 4;  // D <= 256

__device__ __forceinline__ float load_weight(const void* p, int64_t i, Elem e) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// A lane's angles and norm weights: inputs no kernel writes, so a kernel forms them before its PDL wait.
struct Lane {
  float fc[kMaxPairsPerLane], fs[kMaxPairsPerLane], w0[kMaxPairsPerLane], w1[kMaxPairsPerLane];
};
__device__ __forceinline__ void prepare(Lane& r, int lane, int half, int32_t pos, const float* inv_freq, const void* nw,
                                        Elem nd) {
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    r.fc[j] = r.fs[j] = r.w0[j] = r.w1[j] = 0.0f;
    if (i < half) {
      double sn, cs;
      sincos(double(pos) * double(inv_freq[i]), &sn, &cs);
      r.fc[j] = float(cs), r.fs[j] = float(sn);
      if (nw) r.w0[j] = load_weight(nw, i, nd), r.w1[j] = load_weight(nw, i + half, nd);
    }
  }
}

template <bool CG>
__device__ __forceinline__ __nv_bfloat16 ld_raw(const __nv_bfloat16* p) {
  if constexpr (CG) return __ldcg(p);
  else return *p;
}
template <bool CG>
__device__ __forceinline__ float ld(const __nv_bfloat16* p) {
  return __bfloat162float(ld_raw<CG>(p));
}

// The item, by every lane of the warp: src's D values RMS-normalized (norm: r.w0 / r.w1, eps) and
// turned into dst (dst may be src: each lane reads its own pairs before writing them); for a kv head
// (vsrc non-null) the V row copied from vsrc to vdst first. CG: src and vsrc were written by other
// blocks of the running kernel, so they are read from L2.
template <bool CG>
__device__ __forceinline__ void apply(const Lane& r, int lane, int D, const __nv_bfloat16* src, __nv_bfloat16* dst,
                                      const __nv_bfloat16* vsrc, __nv_bfloat16* vdst, bool norm, float eps) {
  const int half = D / 2;
  float a[kMaxPairsPerLane], c[kMaxPairsPerLane];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    a[j] = c[j] = 0.0f;
    if (i < half) {
      a[j] = ld<CG>(src + i);
      c[j] = ld<CG>(src + i + half);
      ss += a[j] * a[j] + c[j] * c[j];
    }
  }
  float inv = 1.0f;
  if (norm) inv = rsqrtf(warp_sum(ss) / float(D) + eps);
  if (vsrc)
    for (int i = lane; i < D; i += 32) vdst[i] = ld_raw<CG>(vsrc + i);
#pragma unroll
  for (int j = 0; j < kMaxPairsPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < half) {
      float x0 = a[j], x1 = c[j];
      if (norm) {
        x0 = x0 * inv * r.w0[j];
        x1 = x1 * inv * r.w1[j];
      }
      dst[i] = __float2bfloat16_rn(x0 * r.fc[j] - x1 * r.fs[j]);
      dst[i + half] = __float2bfloat16_rn(x1 * r.fc[j] + x0 * r.fs[j]);
    }
  }
}

}  // namespace anvil::cuda::rope
