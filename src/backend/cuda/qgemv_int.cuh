// Internal to src/backend/cuda/: the integer dot products of the streamed q4 mat-vec at one token
// (qgemv_stream.cu, INT = true): activations as int16 per 32-element piece, the 4-bit weights
// multiplied with dp4a on the CUDA cores instead of dequantized to bf16 for the tensor cores.
//
// Why: at one token the tensor-core step wastes 7 of the mma's 8 columns, and every weight pair is
// dequantized to bf16 first (lop3, subtract, fma with scale and bias: ~160 of the step's 196
// instructions; ncu, session 12: the mat-vecs take about issue time + DRAM time). Here a lane
// multiplies the raw nibbles of its own 32 weights of rows g and g+8 (the same ring, the same
// 16 bytes per row a lane copies) with the piece's int16 activations, split into a signed high
// byte and an unsigned low byte, four dp4a per 32-bit word of weights:
//   lo = w & 0x0F0F0F0F (elements 0, 2, 4, 6), hi = w & 0xF0F0F0F0 (16 x elements 1, 3, 5, 7)
//   16 * sum(q * x16) = 4096 A(lo, xh_even) + 256 A(hi, xh_odd) + 16 A(lo, xl_even) + A(hi, xl_odd)
// and the affine weights w = s q + b give the piece's dot product as
//   s * (d / 16) * (16 * sum(q * x16)) + b * sum(x)
// with d the piece's activation step (max |x| / 32767) and sum(x) its exact sum: per 32 weights of
// a row 8 lop3, 16 dp4a, 3 imad, a conversion and 3 float ops (~1 instruction per weight and lane,
// against ~2.5 for the bf16 dequantization).
//
// Measured (H200, session 14): 129 SASS instructions per streamed step against 196 (gate/up 220
// against 343); qwen3-8b q4g64 decode 393 -> 405-410 tok/s. Since session 15's leaner staging it
// takes every one-token launch (int_rule in qgemv_stream.cu; ANVIL_QGEMV_INT=0: the tensor cores).
//
// Precision: x is rounded to 15 bits of its piece's largest magnitude (the bf16 path keeps 8 bits
// of each element's own), and the weights are used exactly (the bf16 path rounds s q + b to bf16).
// The integers stay exact: |16 sum(q x16)| <= 16 * 32 * 15 * 32767 < 2^28.
//
// Shared memory per piece P of 32 activations: 64 bytes of byte planes, word j (of the piece's 4
// words of weights) at [P][j] as a uint4 (low bytes of the even elements, of the odd ones, high
// bytes of the even, of the odd: each 4 elements in the order the weight word's bytes hold them),
// and a float2 (d / 16, sum of x).
#pragma once
#include "backend/cuda/qgemv_tc.cuh"

namespace anvil::cuda::tc {

// Bytes of shared memory the int16 activations of a K-element row take.
__host__ __device__ constexpr size_t int_x_bytes(int64_t K) { return size_t(K) * 2 + size_t(K / 32) * 8; }

// A row's planes and per-piece floats as a producer wrote them (rmsnorm with planes, same layout)
// into the block's shared memory: int_x_bytes(K) bytes by the block's NT threads.
template <int NT>
__device__ __forceinline__ void int_copy_planes(const void* planes, int64_t K, void* xs) {
  const uint4* src = static_cast<const uint4*>(planes);
  uint4* dst = static_cast<uint4*>(xs);
  const int n16 = int(int_x_bytes(K) / 16);
  for (int i = threadIdx.x; i < n16; i += NT) dst[i] = __ldcg(src + i);  // L2: written by the kernel just before (PDL)
}

__device__ __forceinline__ uint32_t dp4a_uu(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int32_t dp4a_us(uint32_t a, uint32_t b, int32_t c) {  // a unsigned, b signed bytes
  int32_t d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The quantization of 8 consecutive activations f (elements 8j..8j+7 of a piece, j = lane & 3 of
// the 4 lanes that share the piece, which must all call this together, valid or not: the quad's
// max and sum are warp shuffles): the piece's planes word j into *w and, from the quad's first
// lane, (d / 16, sum of the piece) into *d; invalid lanes store nothing. Shared by
// int_stage_piece and the persistent decode kernel (persist_decode.cu), whose planes have layouts
// of their own.
__device__ __forceinline__ void int_quantize_piece(const float (&f)[8], bool valid, int j, uint4* w, float2* d) {
  float mx = 0.0f, sum = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) mx = fmaxf(mx, fabsf(f[e])), sum += f[e];
#pragma unroll
  for (int o = 1; o <= 2; o <<= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  }
  // rint(f * inv) is the low 16 bits (two's complement) of f * inv + 1.5 * 2^23 (one fma: where
  // the ulp is 1, the sum rounds to the nearest integer), so the planes are byte permutations of
  // the fma results: no conversions, shifts or masks. inv from the fast reciprocal (2 ulp): |f *
  // inv| stays below 32767.5, so no value leaves int16. The timeline of the decode graph (trace.h,
  // session 15) had the staging with an IEEE division, float-to-int conversions and shift-and-mask
  // packing at 2.5 us per block after the PDL wait against 0.7 us for the bf16 staging; this form:
  // qwen3-8b q4g64 decode 412 -> 430 tok/s on the H200, golden and the op tests passing.
  // The fast reciprocal holds for 2^-126 < mx < 2^126: pieces beyond 1e37 take the exact division,
  // pieces whose largest magnitude is below 1e-30 (all zero, or negligible) contribute 0 through q.
  const float inv = mx > 1e-30f ? (mx < 1e37f ? __fdividef(32767.0f, mx) : 32767.0f / mx) : 0.0f;
  uint32_t q[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) q[e] = __float_as_uint(fmaf(f[e], inv, 12582912.0f));
  if (!valid) return;
  const uint32_t e01 = __byte_perm(q[0], q[2], 0x5140), e23 = __byte_perm(q[4], q[6], 0x5140);  // lo, hi bytes
  const uint32_t o01 = __byte_perm(q[1], q[3], 0x5140), o23 = __byte_perm(q[5], q[7], 0x5140);
  *w = make_uint4(__byte_perm(e01, e23, 0x5410), __byte_perm(o01, o23, 0x5410), __byte_perm(e01, e23, 0x7632),
                  __byte_perm(o01, o23, 0x7632));
  if (j == 0) *d = make_float2(mx * (1.0f / (32767.0f * 16.0f)), sum);
}

// Quantizes 8 consecutive activations (bf16 pairs in a: elements 8j..8j+7 of piece P, j = lane & 3
// of the 4 lanes that share the piece, which must all call this together, valid or not) into the
// piece's planes xi[P * 4 + j] and, from the quad's first lane, xf[P] = (d / 16, sum). Every lane of
// the warp calls it (the quad's max and sum are warp shuffles); invalid lanes pass zeros and store
// nothing.
__device__ __forceinline__ void int_stage_piece(uint4 a, bool valid, int64_t P, int j, uint4* xi, float2* xf) {
  const float f[8] = {bf16_lo(a.x), bf16_hi(a.x), bf16_lo(a.y), bf16_hi(a.y),
                      bf16_lo(a.z), bf16_hi(a.z), bf16_lo(a.w), bf16_hi(a.w)};
  int_quantize_piece(f, valid, j, xi + P * 4 + j, xf + P);
}

// 16 * sum(q * x16) over one piece: the 4 words of weights against the piece's planes.
__device__ __forceinline__ int32_t int_piece_isum16(const uint4& w, const uint4 (&x)[4]) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
  uint32_t el = 0, ol = 0;
  int32_t eh = 0, oh = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = ws[j] & 0x0F0F0F0Fu, hi = ws[j] & 0xF0F0F0F0u;
    el = dp4a_uu(lo, x[j].x, el);
    ol = dp4a_uu(hi, x[j].y, ol);
    eh = dp4a_us(lo, x[j].z, eh);
    oh = dp4a_us(hi, x[j].w, oh);
  }
  return ((eh * 16 + oh) * 16 + int32_t(el)) * 16 + int32_t(ol);
}

// One streamed step on the integer path for M matrices (qgemv_stream.cu's one-token kernel,
// moe_stream.cu's expert gate/up): lane (g, c)'s 16 bytes of rows g and g+8 of each matrix from the
// ring slot, the staged scales and biases of group gi ([matrix * 2 + (0 scales, 1 biases)][16 rows]
// [ngp] bf16), piece P's planes (xi) and (d / 16, sum) (xpf); acc[m][0] row g, acc[m][1] row g+8.
template <int M>
__device__ __forceinline__ void int_ring_step(float (&acc)[M][2], const uint4* slot, const __nv_bfloat16* sc, int ngp,
                                              int g, int gi, int lane, const uint4* xi, const float2* xpf, int P) {
  uint4 x[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) x[j] = xi[P * 4 + j];
  const float2 xd = xpf[P];
#pragma unroll
  for (int mi = 0; mi < M; ++mi) {
    const uint4 wa = slot[64 * mi + lane], wb = slot[64 * mi + 32 + lane];
    const float sa = __bfloat162float(sc[(2 * mi * 16 + g) * ngp + gi]);
    const float ba = __bfloat162float(sc[((2 * mi + 1) * 16 + g) * ngp + gi]);
    const float sb = __bfloat162float(sc[(2 * mi * 16 + g + 8) * ngp + gi]);
    const float bb = __bfloat162float(sc[((2 * mi + 1) * 16 + g + 8) * ngp + gi]);
    acc[mi][0] = fmaf(ba, xd.y, fmaf(sa, xd.x * float(int_piece_isum16(wa, x)), acc[mi][0]));
    acc[mi][1] = fmaf(bb, xd.y, fmaf(sb, xd.x * float(int_piece_isum16(wb, x)), acc[mi][1]));
  }
}

// A quad's four pieces per step are one row's: after this every lane holds its rows' sums (lane
// c = 0 is where the kernels' epilogues read them).
template <int M>
__device__ __forceinline__ void int_quad_sum(float (&acc)[M][2]) {
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      acc[mi][r] += __shfl_xor_sync(0xffffffffu, acc[mi][r], 1);
      acc[mi][r] += __shfl_xor_sync(0xffffffffu, acc[mi][r], 2);
    }
}

}  // namespace anvil::cuda::tc
