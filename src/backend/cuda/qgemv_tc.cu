// The 4-bit mat-vec on the tensor cores: decode's hot loop for q4 weights (MLX affine, bf16 scales).
//
// Why: the CUDA-core mat-vec spends ~4 instructions per 4-bit weight (extract, convert, FMA), about
// what an SM can issue at full memory bandwidth, so it cannot reach the bandwidth limit. Here a
// weight costs ~1.5 instructions: two nibbles at a time become a bf16 pair by bit tricks
// (lop3 into 128 + q, one subtract, one fma with the group's scale and bias), and the dot product
// is an mma.sync m16n8k16 (bf16 x bf16 -> fp32) whose 8 columns are the batch's tokens (T <= 8;
// unused columns are zeros).
//
// Layout: a block owns 16 weight rows; its 8 warps split K in super-steps of 128 (warp w takes
// steps w, w+8, ..., two at a time: both steps' loads are issued before either's mmas, so enough
// bytes are in flight per SM). In a step, lane (g = lane/4, c = lane%4) loads 16 bytes (32
// weights) of rows g and g+8 at k = step*128 + c*32 and token g's 32 matching activations. A dot product is a sum
// over k, so the mma's k order may be any permutation shared by A and B: mma j of the step uses
// 32-bit word j/2 of each lane's 16 bytes, nibble pairs (s, s+4) as the lop3 trick yields them, and
// B is built from the same activation elements. The warps' fp32 accumulators are summed in shared
// memory at the end. Every weight byte is read exactly once.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {
namespace {

// Block shape: kWarps warps split K; each issues kUnroll steps' loads before their mmas.
// ANVIL_QGEMV_TC picks another compiled variant for measuring: for the first kernel below 8x2 (its
// default), 4x4, 16x1, 16x2; for the staged decode kernel (the default for T <= 8) xs1 (one step
// in flight with the up matrix) and x1 (one step in flight everywhere); for the streamed kernel (the
// default for T <= 8) occ (8 warps per tile with shallower rings: see async_ok).

struct TcSeg {
  const uint32_t* w;
  const __nv_bfloat16* scales;
  const __nv_bfloat16* biases;
  const void* bias;
  Elem bias_dtype;
  int64_t rows;
  void* out;
  int64_t tile_begin;  // first 16-row tile (block) of this matrix
};
struct TcParams {
  TcSeg seg[3];
  int n_seg;
  TcSeg up;  // SWIGLU: the up matrix, same shape as seg[0]
  const __nv_bfloat16* x;
  int T;
  int64_t K;
  int group;
  bool out_f32;
  bool prefetch;  // the first steps' weights are loaded before waiting for the previous kernel
  // The streamed kernel's fusions (GemvFuse): RMSNorm of each x row before use, and the residual add.
  const void* norm_w = nullptr;
  Elem norm_dtype = Elem::kBF16;
  float eps = 0.0f;
  bool residual = false;
};

__device__ __forceinline__ uint32_t bf2_as_u32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 u32_as_bf2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }

// Nibbles (s, s+4) of w as the bf16 pair (s*q0 + b, s*q1 + b).
__device__ __forceinline__ uint32_t dq_pair(uint32_t w, int shift, __nv_bfloat162 s2, __nv_bfloat162 b2) {
  const uint32_t p = ((w >> shift) & 0x000F000Fu) | 0x43004300u;  // bf16 pair (128 + q0, 128 + q1), exact
  const __nv_bfloat162 q = __hsub2(u32_as_bf2(p), __floats2bfloat162_rn(128.0f, 128.0f));
  return bf2_as_u32(__hfma2(q, s2, b2));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

struct Step {
  uint4 wa, wb;  // rows g and g+8
  __nv_bfloat162 sa, ba, sb, bb;
};

__device__ __forceinline__ Step load_step(const TcSeg& m, int64_t ra, int64_t rb, int64_t k, int64_t K, int group) {
  Step s;
  s.wa = __ldg(reinterpret_cast<const uint4*>(m.w + (ra * K + k) / 8));
  s.wb = __ldg(reinterpret_cast<const uint4*>(m.w + (rb * K + k) / 8));
  const int64_t ga = ra * (K / group) + k / group, gb = rb * (K / group) + k / group;
  s.sa = __bfloat162bfloat162(m.scales[ga]);
  s.ba = __bfloat162bfloat162(m.biases[ga]);
  s.sb = __bfloat162bfloat162(m.scales[gb]);
  s.bb = __bfloat162bfloat162(m.biases[gb]);
  return s;
}

// The 8 mmas of one step: A from the step's weights, B from xw (token g's 32 activations).
__device__ __forceinline__ void step_mma(float (&d)[4], const Step& s, const uint32_t (&xw)[16]) {
  const uint32_t wa[4] = {s.wa.x, s.wa.y, s.wa.z, s.wa.w}, wb[4] = {s.wb.x, s.wb.y, s.wb.z, s.wb.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int word = j >> 1, sh = (j & 1) * 8;  // pairs (0,4),(1,5) then (2,6),(3,7)
    const uint32_t a0 = dq_pair(wa[word], sh, s.sa, s.ba), a2 = dq_pair(wa[word], sh + 4, s.sa, s.ba);
    const uint32_t a1 = dq_pair(wb[word], sh, s.sb, s.bb), a3 = dq_pair(wb[word], sh + 4, s.sb, s.bb);
    // Elements of the 32: e0 = 8*word + 2*(j&1): a0 holds (e0, e0+4), a2 holds (e0+1, e0+5).
    const int e0 = 8 * word + 2 * (j & 1);
    const uint32_t lo0 = xw[e0 / 2], lo4 = xw[e0 / 2 + 2];
    const uint32_t b0 = __byte_perm(lo0, lo4, 0x5410);  // (x[e0], x[e0+4])
    const uint32_t b1 = __byte_perm(lo0, lo4, 0x7632);  // (x[e0+1], x[e0+5])
    mma_bf16(d, a0, a1, a2, a3, b0, b1);
  }
}

__device__ __forceinline__ float load_bias(const void* p, int64_t i, Elem e) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// NT n8-tiles of tokens: tokens 8*nt + g for nt < NT share each dequantized A fragment (NT > 1:
// batches of 9..32 rows read the weights once; see kTcMaxTokens).
template <bool SWIGLU, int kWarps, int kUnroll, int NT>
__global__ void __launch_bounds__(kWarps * 32) qgemv4_tc_kernel(TcParams p) {
  pdl_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  int si = 0;
  if (p.n_seg > 1 && tile >= p.seg[1].tile_begin) si = 1;
  if (p.n_seg > 2 && tile >= p.seg[2].tile_begin) si = 2;
  const TcSeg& m = p.seg[si];
  const int64_t r0 = (tile - m.tile_begin) * 16;
  const int64_t ra = min(r0 + g, m.rows - 1), rb = min(r0 + g + 8, m.rows - 1);
  const int64_t K = p.K, steps = K / 128;

  float d[NT][4], du[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) d[nt][i] = 0.0f, du[nt][i] = 0.0f;
  Step s[kUnroll], su[kUnroll];
  // With PDL in a decode graph this block may start while the previous kernel still runs: weights
  // are never written by a kernel, so the first steps' weights can be in flight before the wait
  // (only the activations must wait). ANVIL_CUDA_PREFETCH=1 (unmeasured yet: off by default).
  if (p.prefetch) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t st = warp + int64_t(u) * kWarps;
      if (st >= steps) break;
      s[u] = load_step(m, ra, rb, st * 128 + c * 32, K, p.group);
      if constexpr (SWIGLU) su[u] = load_step(p.up, ra, rb, st * 128 + c * 32, K, p.group);
    }
  }
  pdl_wait();
  for (int64_t st0 = warp; st0 < steps; st0 += kWarps * kUnroll) {
    // All loads of kUnroll steps first (2-3 KB per warp in flight), then their mmas.
    uint32_t xw[kUnroll][NT][16];
    const bool have = p.prefetch && st0 == warp;  // this round's weights were prefetched
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t st = st0 + int64_t(u) * kWarps;
      if (st >= steps) break;
      const int64_t k = st * 128 + c * 32;
      if (!have) {
        s[u] = load_step(m, ra, rb, k, K, p.group);
        if constexpr (SWIGLU) su[u] = load_step(p.up, ra, rb, k, K, p.group);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = 8 * nt + g;
        if (tok < p.T) {
          const uint4* xp = reinterpret_cast<const uint4*>(p.x + tok * K + k);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const uint4 v = __ldg(xp + i);
            xw[u][nt][4 * i] = v.x, xw[u][nt][4 * i + 1] = v.y, xw[u][nt][4 * i + 2] = v.z, xw[u][nt][4 * i + 3] = v.w;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) xw[u][nt][i] = 0;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (st0 + int64_t(u) * kWarps >= steps) break;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        step_mma(d[nt], s[u], xw[u][nt]);
        if constexpr (SWIGLU) step_mma(du[nt], su[u], xw[u][nt]);
      }
    }
  }

  // Sum the warps' accumulators; warp 0 writes. d[nt][0..1]: row g, tokens 8nt + 2c, 8nt + 2c + 1;
  // d[nt][2..3]: row g+8.
  __shared__ float red[kWarps][SWIGLU ? 2 : 1][NT][32][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      red[warp][0][nt][lane][i] = d[nt][i];
      if constexpr (SWIGLU) red[warp][SWIGLU ? 1 : 0][nt][lane][i] = du[nt][i];
    }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < 4 * NT; ++j) {
    const int nt = j / 4, i = j % 4;
    float v = 0, u = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      v += red[w][0][nt][lane][i];
      if constexpr (SWIGLU) u += red[w][SWIGLU ? 1 : 0][nt][lane][i];
    }
    const int t = 8 * nt + 2 * c + (i & 1);
    const int64_t row = r0 + g + (i >> 1) * 8;
    if (t >= p.T || row >= m.rows) continue;
    if constexpr (SWIGLU) {
      static_cast<__nv_bfloat16*>(p.seg[0].out)[t * m.rows + row] = __float2bfloat16_rn(v / (1.0f + __expf(-v)) * u);
    } else {
      if (m.bias) v += load_bias(m.bias, row, m.bias_dtype);
      if (p.out_f32) static_cast<float*>(m.out)[t * m.rows + row] = v;
      else static_cast<__nv_bfloat16*>(m.out)[t * m.rows + row] = __float2bfloat16_rn(v);
    }
  }
}

// Decode's variant (T <= 8 and the activations fit in 48 KB of shared memory): the same steps and
// mmas, laid out for bandwidth. Measured on the H200 (ncu, qwen3-8b q4g64), the kernel above held
// 92-127 registers per thread (16 warps per SM) and moved 0.8-1.7 TB/s. Here:
// - the activations are staged once per block in shared memory and read just before each step's
//   mmas, so no registers hold them across the loads' latency;
// - the warps per 16-row tile (W) are picked per matrix so that the grid has ~32 warps per SM of
//   work (narrow matrices split K over 16 warps), and the register cap allows that occupancy;
// - the first U steps' weights are loaded before griddepcontrol.wait (weights are never written
//   by a kernel), so in a decode graph they are in flight while the previous kernel drains.
// step_mma with the lane's 32 activations read from shared memory mma by mma (two words each), so
// they occupy no registers across the step; `xp` null: this lane's token is padding (zeros).
__device__ __forceinline__ void step_mma_smem(float (&d)[4], const Step& s, const uint32_t* xp) {
  const uint32_t wa[4] = {s.wa.x, s.wa.y, s.wa.z, s.wa.w}, wb[4] = {s.wb.x, s.wb.y, s.wb.z, s.wb.w};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int word = j >> 1, sh = (j & 1) * 8;
    const uint32_t a0 = dq_pair(wa[word], sh, s.sa, s.ba), a2 = dq_pair(wa[word], sh + 4, s.sa, s.ba);
    const uint32_t a1 = dq_pair(wb[word], sh, s.sb, s.bb), a3 = dq_pair(wb[word], sh + 4, s.sb, s.bb);
    const int e0 = 8 * word + 2 * (j & 1);
    const uint32_t lo0 = xp ? xp[e0 / 2] : 0u, lo4 = xp ? xp[e0 / 2 + 2] : 0u;
    mma_bf16(d, a0, a1, a2, a3, __byte_perm(lo0, lo4, 0x5410), __byte_perm(lo0, lo4, 0x7632));
  }
}

// The 8 mmas of a step for M matrices (gate and up share each B fragment). xb: this lane's token's
// chunk of activations pre-permuted into fragment order (mma j's b0, b1 at xb[j]); null: padding.
template <int M>
__device__ __forceinline__ void step_mma_frag(float (&d)[M][4], const Step (&s)[M], const uint2* xb) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int word = j >> 1, sh = (j & 1) * 8;
    const uint2 b = xb ? xb[j] : make_uint2(0u, 0u);
#pragma unroll
    for (int mi = 0; mi < M; ++mi) {
      const uint32_t wa = word == 0 ? s[mi].wa.x : word == 1 ? s[mi].wa.y : word == 2 ? s[mi].wa.z : s[mi].wa.w;
      const uint32_t wb = word == 0 ? s[mi].wb.x : word == 1 ? s[mi].wb.y : word == 2 ? s[mi].wb.z : s[mi].wb.w;
      mma_bf16(d[mi], dq_pair(wa, sh, s[mi].sa, s[mi].ba), dq_pair(wb, sh, s[mi].sb, s[mi].bb),
               dq_pair(wa, sh + 4, s[mi].sa, s[mi].ba), dq_pair(wb, sh + 4, s[mi].sb, s[mi].bb), b.x, b.y);
    }
  }
}

// One step's loads with the rows' offsets computed once per warp (32-bit indices inside a row keep
// the register count down).
struct RowOff {
  int64_t wa, wb, ga, gb;  // uint4 index of rows ra/rb; group index of their first groups
};
__device__ __forceinline__ Step load_step_off(const TcSeg& m, const RowOff& o, int k, int gshift) {
  Step s;
  const uint4* w = reinterpret_cast<const uint4*>(m.w);
  s.wa = __ldg(w + o.wa + (k >> 5));
  s.wb = __ldg(w + o.wb + (k >> 5));
  const int gi = k >> gshift;
  s.sa = __bfloat162bfloat162(m.scales[o.ga + gi]);
  s.ba = __bfloat162bfloat162(m.biases[o.ga + gi]);
  s.sb = __bfloat162bfloat162(m.scales[o.gb + gi]);
  s.bb = __bfloat162bfloat162(m.biases[o.gb + gi]);
  return s;
}

template <bool SWIGLU, int W, int U, int REGS>
__global__ void __maxnreg__(REGS) qgemv4_tcx_kernel(TcParams p) {
  extern __shared__ __align__(16) uint32_t xs[];  // [T][K/2] bf16 pairs
  pdl_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  int si = 0;
  if (p.n_seg > 1 && tile >= p.seg[1].tile_begin) si = 1;
  if (p.n_seg > 2 && tile >= p.seg[2].tile_begin) si = 2;
  const TcSeg& m = p.seg[si];
  const int64_t r0 = (tile - m.tile_begin) * 16;
  const int64_t ra = min(r0 + g, m.rows - 1), rb = min(r0 + g + 8, m.rows - 1);
  const int64_t K = p.K;
  const int steps = int(K / 128);
  const int gshift = p.group == 32 ? 5 : p.group == 64 ? 6 : 7;
  const RowOff off{ra * (K / 32), rb * (K / 32), ra * (K >> gshift), rb * (K >> gshift)};

  Step s[U], su[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int st = warp + u * W;
    if (st < steps) {
      s[u] = load_step_off(m, off, st * 128 + c * 32, gshift);
      if constexpr (SWIGLU) su[u] = load_step_off(p.up, off, st * 128 + c * 32, gshift);
    }
  }
  pdl_wait();
  const int64_t nvec = int64_t(p.T) * K / 8;
  for (int64_t i = threadIdx.x; i < nvec; i += W * 32)
    reinterpret_cast<uint4*>(xs)[i] = __ldg(reinterpret_cast<const uint4*>(p.x) + i);
  __syncthreads();

  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f}, du[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const bool has_tok = g < p.T;
  const uint32_t* xrow = xs + (has_tok ? g : 0) * int(K / 2);
  for (int st0 = warp; st0 < steps; st0 += W * U) {
    if (st0 != warp) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int st = st0 + u * W;
        if (st >= steps) break;
        s[u] = load_step_off(m, off, st * 128 + c * 32, gshift);
        if constexpr (SWIGLU) su[u] = load_step_off(p.up, off, st * 128 + c * 32, gshift);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int st = st0 + u * W;
      if (st >= steps) break;
      const uint32_t* xp = has_tok ? xrow + (st * 128 + c * 32) / 2 : nullptr;
      step_mma_smem(d, s[u], xp);
      if constexpr (SWIGLU) step_mma_smem(du, su[u], xp);
    }
  }

  __shared__ float red[W][SWIGLU ? 2 : 1][32][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    red[warp][0][lane][i] = d[i];
    if constexpr (SWIGLU) red[warp][SWIGLU ? 1 : 0][lane][i] = du[i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v = 0, u = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      v += red[w][0][lane][i];
      if constexpr (SWIGLU) u += red[w][SWIGLU ? 1 : 0][lane][i];
    }
    const int t = 2 * c + (i & 1);
    const int64_t row = r0 + g + (i >> 1) * 8;
    if (t >= p.T || row >= m.rows) continue;
    if constexpr (SWIGLU) {
      static_cast<__nv_bfloat16*>(p.seg[0].out)[t * m.rows + row] = __float2bfloat16_rn(v / (1.0f + __expf(-v)) * u);
    } else {
      if (m.bias) v += load_bias(m.bias, row, m.bias_dtype);
      if (p.out_f32) static_cast<float*>(m.out)[t * m.rows + row] = v;
      else static_cast<__nv_bfloat16*>(m.out)[t * m.rows + row] = __float2bfloat16_rn(v);
    }
  }
}

// The decode default (T <= 8): weights streamed through shared memory with cp.async.
//
// ncu on the H200 showed the register-fed kernels above at 16-24 warps per SM with 1-2 KB of loads in
// flight per warp: 0.8-1.7 TB/s, bounded by the bytes in flight (Little's law: ~4 TB/s at ~1 us of
// latency needs ~30 KB in flight per SM, all the time). Here each lane copies its own 32 bytes per
// step (rows g and g+8) into a per-warp ring of S steps in shared memory, so S steps per warp are
// in flight without holding registers; a lane reads back only what it copied itself, so waiting
// for its own copy groups is enough (no barrier). The tile's scales and biases (16 rows) are
// copied once, the activations staged once per block; the steps' mmas are those of step_mma_smem.
// The weights and scales are copied before griddepcontrol.wait (no kernel writes them).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared memory of one block: ring [W][S][M][2 rows][32 lanes] x 16 B | scales and biases
// [M][2][16 rows][ng] bf16 | activations [T][K] bf16.
__host__ __device__ constexpr size_t async_ring_bytes(int W, int S, int M) { return size_t(W) * S * M * 2 * 32 * 16; }
inline size_t async_smem_bytes(int W, int S, int M, int T, int64_t K, int group) {
  return async_ring_bytes(W, S, M) + size_t(M) * 2 * 16 * size_t(K / group) * 2 + size_t(T) * size_t(K) * 2;
}

template <bool SWIGLU, int W, int S, int MINB>
__global__ void __launch_bounds__(W * 32, MINB) qgemv4_async_kernel(TcParams p) {
  constexpr int M = SWIGLU ? 2 : 1;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t tile = blockIdx.x;
  int si = 0;
  if (p.n_seg > 1 && tile >= p.seg[1].tile_begin) si = 1;
  if (p.n_seg > 2 && tile >= p.seg[2].tile_begin) si = 2;
  const TcSeg& m = p.seg[si];
  const int64_t r0 = (tile - m.tile_begin) * 16;
  const int K = int(p.K), steps = K / 128;
  const int gshift = p.group == 32 ? 5 : p.group == 64 ? 6 : 7;
  const int ng = K >> gshift;  // groups per row (a multiple of 8: the host checks)
  uint4* ring = reinterpret_cast<uint4*>(smem);
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem + async_ring_bytes(W, S, M));
  uint32_t* xs = reinterpret_cast<uint32_t*>(sc + size_t(M) * 2 * 16 * ng);

  // The tile's scales and biases: [array = matrix*2 + (0 scales, 1 biases)][row][ng].
  const int pieces = ng / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < M * 2 * 16 * pieces; i += W * 32) {
    const int piece = i % pieces, r = (i / pieces) % 16, arr = i / (pieces * 16);
    const TcSeg& mm = (arr >> 1) ? p.up : m;
    const __nv_bfloat16* src = ((arr & 1) ? mm.biases : mm.scales) + min(r0 + r, m.rows - 1) * int64_t(ng);
    cp_async16(sc + (size_t(arr) * 16 + r) * ng + piece * 8, src + piece * 8);
  }
  const int64_t oa = min(r0 + g, m.rows - 1) * (K / 32), ob = min(r0 + g + 8, m.rows - 1) * (K / 32);
  // This warp's steps: warp, warp + W, ... (a measured variant that gave each warp a run of
  // consecutive steps instead made no difference: 284.6 against 285.1 tok/s on qwen3-8b q4g64).
  const int n = steps > warp ? (steps - warp + W - 1) / W : 0;
  auto step_of = [&](int i) { return warp + i * W; };
  uint4* my = ring + size_t(warp) * S * M * 2 * 32;
  auto issue = [&](int i) {
    const int kq = (step_of(i) * 128 + c * 32) >> 5;  // 16-byte piece within a row
    uint4* slot = my + (i % S) * M * 2 * 32;
    cp_async16(slot + lane, reinterpret_cast<const uint4*>(m.w) + oa + kq);
    cp_async16(slot + 32 + lane, reinterpret_cast<const uint4*>(m.w) + ob + kq);
    if constexpr (SWIGLU) {
      cp_async16(slot + 64 + lane, reinterpret_cast<const uint4*>(p.up.w) + oa + kq);
      cp_async16(slot + 96 + lane, reinterpret_cast<const uint4*>(p.up.w) + ob + kq);
    }
  };
#pragma unroll
  for (int i = 0; i < S; ++i) {
    if (i < n) issue(i);
    cp_async_commit();  // group i (group 0 also holds the scales)
  }
  __shared__ float tok_ss[8];  // fused norm: per-row sum of h^2
  if (threadIdx.x < 8) tok_ss[threadIdx.x] = 0.0f;
  __syncthreads();
  pdl_wait();
  // Activations in fragment order: for each 32-element chunk, mma j's (b0, b1) =
  // ((x[e0], x[e0+4]), (x[e0+1], x[e0+5])) with e0 = 8*(j/2) + 2*(j%2), as step_mma builds them.
  // With a fused norm (p.norm_w), x is the residual stream h. RMSNorm is a per-row scalar, so
  // W (h * inv * w) = inv * W (h * w): the fragments hold bf16(h * w), the same pass sums h^2 per
  // row, and the epilogue multiplies each dot product by its row's inv = rsqrt(mean(h^2) + eps).
  // One pass over h and no barrier before the steps (a first version normalized first, as
  // rmsnorm() writes x: two passes and two more barriers per block, and slower on qwen3-8b).
  uint2* xf = reinterpret_cast<uint2*>(xs);
  const uint32_t* xw = reinterpret_cast<const uint32_t*>(p.x);
  for (int t = 0; t < p.T; ++t) {
    float ss = 0.0f;
    for (int f = threadIdx.x; f < K / 4; f += W * 32) {
      const int i = t * (K / 4) + f;
      const int j = i & 7, chunk = i >> 3, e0 = 8 * (j >> 1) + 2 * (j & 1);
      uint32_t lo0 = __ldg(xw + chunk * 16 + e0 / 2), lo4 = __ldg(xw + chunk * 16 + e0 / 2 + 2);
      if (p.norm_w) {
        const int k0 = (chunk % (K / 32)) * 32 + e0;
        const float h0 = bf16_lo(lo0), h1 = bf16_hi(lo0), h4 = bf16_lo(lo4), h5 = bf16_hi(lo4);
        ss += h0 * h0 + h1 * h1 + h4 * h4 + h5 * h5;
        auto nw = [&](float v, int k) { return __float2bfloat16_rn(v * load_bias(p.norm_w, k, p.norm_dtype)); };
        lo0 = bf2_as_u32(__halves2bfloat162(nw(h0, k0), nw(h1, k0 + 1)));
        lo4 = bf2_as_u32(__halves2bfloat162(nw(h4, k0 + 4), nw(h5, k0 + 5)));
      }
      xf[i] = make_uint2(__byte_perm(lo0, lo4, 0x5410), __byte_perm(lo0, lo4, 0x7632));
    }
    if (p.norm_w) {
      ss = warp_sum(ss);
      if (lane == 0) atomicAdd(&tok_ss[t], ss);
    }
  }
  cp_async_wait<S - 1>();  // this thread's group 0; the barrier makes every thread's visible
  __syncthreads();

  float d[M][4] = {};
  const uint2* xrow = g < p.T ? xf + g * (K / 4) : nullptr;
  for (int i = 0; i < n; ++i) {
    cp_async_wait<S - 1>();  // S + i groups committed: group i is complete
    const int k = step_of(i) * 128 + c * 32, gi = k >> gshift;
    const uint4* slot = my + (i % S) * M * 2 * 32;
    const uint2* xb = xrow ? xrow + (k / 32) * 8 : nullptr;
    Step st[M];
#pragma unroll
    for (int mi = 0; mi < M; ++mi) {
      st[mi].wa = slot[64 * mi + lane];
      st[mi].wb = slot[64 * mi + 32 + lane];
      st[mi].sa = __bfloat162bfloat162(sc[(2 * mi * 16 + g) * ng + gi]);
      st[mi].ba = __bfloat162bfloat162(sc[((2 * mi + 1) * 16 + g) * ng + gi]);
      st[mi].sb = __bfloat162bfloat162(sc[(2 * mi * 16 + g + 8) * ng + gi]);
      st[mi].bb = __bfloat162bfloat162(sc[((2 * mi + 1) * 16 + g + 8) * ng + gi]);
    }
    step_mma_frag<M>(d, st, xb);
    // The slot just read is refilled only after its words were consumed by the mmas above.
    if (i + S < n) issue(i + S);
    cp_async_commit();
  }

  __shared__ float red[W][M][32][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    red[warp][0][lane][i] = d[0][i];
    if constexpr (SWIGLU) red[warp][M - 1][lane][i] = d[M - 1][i];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float v = 0, u = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      v += red[w][0][lane][i];
      if constexpr (SWIGLU) u += red[w][M - 1][lane][i];
    }
    const int t = 2 * c + (i & 1);
    const int64_t row = r0 + g + (i >> 1) * 8;
    if (t >= p.T || row >= m.rows) continue;
    if (p.norm_w) {
      const float inv = rsqrtf(tok_ss[t] / float(K) + p.eps);
      v *= inv, u *= inv;
    }
    if constexpr (SWIGLU) {
      static_cast<__nv_bfloat16*>(p.seg[0].out)[t * m.rows + row] = __float2bfloat16_rn(v / (1.0f + __expf(-v)) * u);
    } else {
      if (m.bias) v += load_bias(m.bias, row, m.bias_dtype);
      __nv_bfloat16* ob = static_cast<__nv_bfloat16*>(m.out) + t * m.rows + row;
      if (p.residual) *ob = __float2bfloat16_rn(__bfloat162float(*ob) + __bfloat162float(__float2bfloat16_rn(v)));
      else if (p.out_f32) static_cast<float*>(m.out)[t * m.rows + row] = v;
      else *ob = __float2bfloat16_rn(v);
    }
  }
}

constexpr size_t kAsyncMaxSmem = 160 * 1024;

template <bool SW, int W, int S, int MINB>
cudaError_t async_launch_one(int64_t tiles, size_t smem, cudaStream_t s, const TcParams& p) {
  static const cudaError_t attr = cudaFuncSetAttribute(qgemv4_async_kernel<SW, W, S, MINB>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kAsyncMaxSmem));
  if (attr != cudaSuccess) return attr;
  launch_k(qgemv4_async_kernel<SW, W, S, MINB>, dim3(unsigned(tiles)), dim3(W * 32), smem, s, p);
  return cudaGetLastError();
}

// Whether the streamed kernel takes this call, and how (AsyncShape). Two shapes, picked by
// ANVIL_QGEMV_TC for measuring:
// - deep (default): 4 warps per tile (8 when there are fewer tiles than two per SM, so narrow
//   matrices still have enough in flight), rings of 8 steps (4 with the up matrix, whose steps are
//   twice the bytes);
// - wide ("occ"): 8 warps per tile, rings of 4 steps (2 with the up matrix), registers capped for 4
//   blocks per SM: the same bytes in flight per block, twice the warps to issue the dequantization.
// ANVIL_QGEMV_RING=W,S (for measuring, not yet measured): every streamed launch uses W warps per tile
// (4 or 8) and rings of S steps (4, 6 or 8; half that with the up matrix), no register cap.
struct AsyncShape {
  int W = 4, S = 8;
  bool wide = false, forced = false;
  size_t smem = 0;
};
bool ring_override(int* W, int* S) {
  static const std::pair<int, int> v = [] {
    const char* e = std::getenv("ANVIL_QGEMV_RING");
    int w = 0, st = 0;
    if (e && std::sscanf(e, "%d,%d", &w, &st) == 2 && (w == 4 || w == 8) && (st == 4 || st == 6 || st == 8))
      return std::make_pair(w, st);
    return std::make_pair(0, 0);
  }();
  if (v.first == 0) return false;
  *W = v.first, *S = v.second;
  return true;
}
bool async_ok(const TcParams& p, int n_mats, int T, bool swiglu, bool wide, AsyncShape* a) {
  const int64_t K = p.K;
  if (T > 8 || K > (int64_t(1) << 30) || (K / p.group) % 8 != 0) return false;
  auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  for (int i = 0; i < n_mats; ++i)
    if (!aligned(p.seg[i].w) || !aligned(p.seg[i].scales) || !aligned(p.seg[i].biases)) return false;
  if (swiglu && (!aligned(p.up.w) || !aligned(p.up.scales) || !aligned(p.up.biases))) return false;
  int64_t tiles = 0;
  for (int i = 0; i < n_mats; ++i) tiles += (p.seg[i].rows + 15) / 16;
  const int M = swiglu ? 2 : 1;
  a->wide = wide;
  if (!wide && ring_override(&a->W, &a->S)) {
    a->forced = true;
    if (swiglu) a->S /= 2;
    a->smem = async_smem_bytes(a->W, a->S, M, T, K, p.group);
    return a->smem <= kAsyncMaxSmem;
  }
  if (wide) {
    a->W = 8, a->S = swiglu ? 2 : 4;
  } else {
    a->W = tiles < 2 * 132 ? 8 : 4, a->S = swiglu ? 4 : 8;
  }
  a->smem = async_smem_bytes(a->W, a->S, M, T, K, p.group);
  if (a->smem > kAsyncMaxSmem && !wide && a->W == 8) {
    a->W = 4;
    a->smem = async_smem_bytes(a->W, a->S, M, T, K, p.group);
  }
  return a->smem <= kAsyncMaxSmem;
}

template <bool SW, int W>
cudaError_t async_launch_forced(int S, int64_t tiles, size_t smem, cudaStream_t s, const TcParams& p) {
  constexpr int m = SW ? 2 : 1;  // the up matrix halves the ring
  switch (S * m) {
    case 4: return async_launch_one<SW, W, 4 / m, 1>(tiles, smem, s, p);
    case 6: return async_launch_one<SW, W, 6 / m, 1>(tiles, smem, s, p);
    default: return async_launch_one<SW, W, 8 / m, 1>(tiles, smem, s, p);
  }
}

cudaError_t async_launch(bool swiglu, const AsyncShape& a, int64_t tiles, cudaStream_t s, const TcParams& p) {
  if (a.forced) {
    if (swiglu)
      return a.W == 8 ? async_launch_forced<true, 8>(a.S, tiles, a.smem, s, p)
                      : async_launch_forced<true, 4>(a.S, tiles, a.smem, s, p);
    return a.W == 8 ? async_launch_forced<false, 8>(a.S, tiles, a.smem, s, p)
                    : async_launch_forced<false, 4>(a.S, tiles, a.smem, s, p);
  }
  if (a.wide)
    return swiglu ? async_launch_one<true, 8, 2, 4>(tiles, a.smem, s, p) : async_launch_one<false, 8, 4, 4>(tiles, a.smem, s, p);
  if (swiglu)
    return a.W == 8 ? async_launch_one<true, 8, 4, 1>(tiles, a.smem, s, p) : async_launch_one<true, 4, 4, 1>(tiles, a.smem, s, p);
  return a.W == 8 ? async_launch_one<false, 8, 8, 1>(tiles, a.smem, s, p) : async_launch_one<false, 4, 8, 1>(tiles, a.smem, s, p);
}

// Warps per tile for the staged kernel: enough (tile, warp) pairs for ~32 warps per SM, at most one
// warp per step of K.
template <int UN, int US>
cudaError_t tcx_launch(bool swiglu, int64_t tiles, int64_t steps, size_t smem, cudaStream_t s, const TcParams& p) {
  const dim3 grid(static_cast<unsigned>(tiles));
  const int64_t want = 132 * 32;
  int W = tiles * 8 >= want ? 8 : 16;
  while (W > 4 && W > steps) W /= 2;
  // Register caps: the most that compiles without spills for U = 2 (80, and 96 with the up matrix).
  if (swiglu) {
    switch (W) {
      case 4: launch_k(qgemv4_tcx_kernel<true, 4, US, 96>, grid, dim3(128), smem, s, p); break;
      case 8: launch_k(qgemv4_tcx_kernel<true, 8, US, 96>, grid, dim3(256), smem, s, p); break;
      default: launch_k(qgemv4_tcx_kernel<true, 16, US, 96>, grid, dim3(512), smem, s, p); break;
    }
  } else {
    switch (W) {
      case 4: launch_k(qgemv4_tcx_kernel<false, 4, UN, 80>, grid, dim3(128), smem, s, p); break;
      case 8: launch_k(qgemv4_tcx_kernel<false, 8, UN, 80>, grid, dim3(256), smem, s, p); break;
      default: launch_k(qgemv4_tcx_kernel<false, 16, UN, 80>, grid, dim3(512), smem, s, p); break;
    }
  }
  return cudaGetLastError();
}

template <int W, int U, int NT = 1>
cudaError_t tc_launch(bool swiglu, dim3 grid, cudaStream_t s, const TcParams& p) {
  if (swiglu) launch_k(qgemv4_tc_kernel<true, W, U, NT>, grid, dim3(W * 32), 0, s, p);
  else launch_k(qgemv4_tc_kernel<false, W, U, NT>, grid, dim3(W * 32), 0, s, p);
  return cudaGetLastError();
}

TcSeg seg_of(const DevMatrix& w, void* out) {
  TcSeg s;
  s.w = static_cast<const uint32_t*>(w.data);
  s.scales = static_cast<const __nv_bfloat16*>(w.scales);
  s.biases = static_cast<const __nv_bfloat16*>(w.biases);
  s.bias = w.bias;
  s.bias_dtype = w.bias_dtype;
  s.rows = w.rows;
  s.out = out;
  s.tile_begin = 0;
  return s;
}

}  // namespace

bool gemv_tc_ok(const DevMatrix& w) {
  return w.bits == 4 && w.cols % 128 == 0 && w.dtype == Elem::kBF16 && (w.group == 32 || w.group == 64 || w.group == 128);
}

namespace {

// ANVIL_QGEMV_TC, read once (see the top of this file).
int tc_shape() {
  static const int shape = [] {
    const char* e = std::getenv("ANVIL_QGEMV_TC");
    const std::string v = e ? e : "";
    return v == "4x4" ? 1 : v == "16x1" ? 2 : v == "16x2" ? 3 : v == "8x2" ? 4 : v == "xs1" ? 5 : v == "x1" ? 6 : v == "x2" ? 7 : v == "occ" ? 8 : 0;
  }();
  return shape;
}

TcParams make_params(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                     bool out_f32, int64_t* tiles) {
  TcParams p;
  p.n_seg = n;
  *tiles = 0;
  for (int i = 0; i < n; ++i) {
    p.seg[i] = seg_of(ws[i], outs ? outs[i] : nullptr);
    p.seg[i].tile_begin = *tiles;
    *tiles += (ws[i].rows + 15) / 16;
  }
  p.x = static_cast<const __nv_bfloat16*>(x);
  p.T = T;
  p.K = ws[0].cols;
  p.group = ws[0].group;
  p.out_f32 = out_f32;
  static const bool prefetch = [] {
    const char* e = std::getenv("ANVIL_CUDA_PREFETCH");
    return e && *e == '1';
  }();
  p.prefetch = prefetch;
  if (up) p.up = seg_of(*up, nullptr);
  return p;
}

}  // namespace

bool gemv_tc_fusable(const DevMatrix* ws, int n, const DevMatrix* up, int T) {
  if (n < 1 || n > 3 || (tc_shape() != 0 && tc_shape() != 8)) return false;
  for (int i = 0; i < n; ++i)
    if (!gemv_tc_ok(ws[i]) || ws[i].cols != ws[0].cols || ws[i].group != ws[0].group) return false;
  if (up && (!gemv_tc_ok(*up) || up->cols != ws[0].cols || up->group != ws[0].group || up->rows != ws[0].rows))
    return false;
  int64_t tiles = 0;
  const TcParams p = make_params(ws, nullptr, n, up, nullptr, T, false, &tiles);
  AsyncShape as;
  return async_ok(p, n, T, up != nullptr, tc_shape() == 8, &as);
}

cudaError_t gemv_tc_fused(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                          const GemvFuse& f, cudaStream_t s) {
  int64_t tiles = 0;
  TcParams p = make_params(ws, outs, n, up, x, T, false, &tiles);
  p.norm_w = f.norm_w;
  p.norm_dtype = f.norm_dtype;
  p.eps = f.eps;
  p.residual = f.residual && !up;
  AsyncShape as;
  if (!async_ok(p, n, T, up != nullptr, tc_shape() == 8, &as)) return cudaErrorInvalidValue;
  return async_launch(up != nullptr, as, tiles, s, p);
}

cudaError_t gemv_tc(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                    bool out_f32, cudaStream_t s) {
  int64_t tiles = 0;
  TcParams p = make_params(ws, outs, n, up, x, T, out_f32, &tiles);
  const int shape = tc_shape();
  const dim3 grid(static_cast<unsigned>(tiles));
  // Decode (T <= 8): the streamed kernel; the staged one when its activations fit in 48 KB.
  AsyncShape as;
  if ((shape == 0 || shape == 8) && async_ok(p, n, T, up != nullptr, shape == 8, &as))
    return async_launch(up != nullptr, as, tiles, s, p);
  const size_t smem = size_t(T) * size_t(p.K) * 2;
  if (T <= 8 && smem <= 48 * 1024 && (shape == 0 || shape >= 5 && shape <= 7)) {
    const int64_t steps = p.K / 128;
    if (shape == 5) return tcx_launch<2, 1>(up != nullptr, tiles, steps, smem, s, p);
    if (shape == 6) return tcx_launch<1, 1>(up != nullptr, tiles, steps, smem, s, p);
    return tcx_launch<2, 2>(up != nullptr, tiles, steps, smem, s, p);  // x2, or no streamed launch
  }
  // 9..32 tokens: one pass over the weights, 2 or 4 token tiles per A fragment (one step in flight
  // per warp: the activations of 4 tiles take 64 registers).
  if (T > 16) return tc_launch<8, 1, 4>(up != nullptr, grid, s, p);
  if (T > 8) return tc_launch<8, 1, 2>(up != nullptr, grid, s, p);
  switch (shape) {
    case 1: return tc_launch<4, 4>(up != nullptr, grid, s, p);
    case 2: return tc_launch<16, 1>(up != nullptr, grid, s, p);
    case 3: return tc_launch<16, 2>(up != nullptr, grid, s, p);
    default: return tc_launch<8, 2>(up != nullptr, grid, s, p);
  }
}

}  // namespace anvil::cuda
