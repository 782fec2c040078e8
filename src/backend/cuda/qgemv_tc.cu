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
//
// Three kernels share this layout (qgemv_tc.cuh): the streamed one (qgemv_stream.cu, the decode
// default: steps copied into shared memory with cp.async), the staged one below (activations in
// shared memory, steps in registers: when the streamed one cannot take the call) and the first,
// register-fed one (9-32 tokens, and the fallback). gemv_tc() at the end picks.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/qgemv_tc.cuh"

namespace anvil::cuda {
using namespace tc;
namespace {

// Block shape: kWarps warps split K; each issues kUnroll steps' loads before their mmas.
// ANVIL_QGEMV_TC picks another compiled variant for measuring: for the first kernel below 8x2 (its
// default), 4x4, 16x1, 16x2; for the staged decode kernel (the default for T <= 8) xs1 (one step
// in flight with the up matrix) and x1 (one step in flight everywhere). The streamed kernel (the
// default for T <= 8, in qgemv_stream.cu) has its own sweep switch, ANVIL_QGEMV_RING (see async_ok).

// NT n8-tiles of tokens: tokens 8*nt + g for nt < NT share each dequantized A fragment (NT > 1:
// batches of 9..32 rows read the weights once; see kTcMaxTokens).
template <bool SWIGLU, int kWarps, int kUnroll, int NT>
__global__ void __launch_bounds__(kWarps * 32) qgemv4_tc_kernel(TcParams p) {
  pdl_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  int64_t r0 = 0;
  const TcSeg& m = tile_seg(p, blockIdx.x, &r0);
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

  finish_tile<SWIGLU, kWarps, NT>(p, m, r0, nullptr, [&](int mi, int nt, int i) { return mi ? du[nt][i] : d[nt][i]; });
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
  int64_t r0 = 0;
  const TcSeg& m = tile_seg(p, blockIdx.x, &r0);
  const int64_t ra = min(r0 + g, m.rows - 1), rb = min(r0 + g + 8, m.rows - 1);
  const int64_t K = p.K;
  const int steps = int(K / 128);
  const int gshift = group_shift(p.group);
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

  finish_tile<SWIGLU, W, 1>(p, m, r0, nullptr, [&](int mi, int, int i) { return mi ? du[i] : d[i]; });
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
    return v == "4x4" ? 1 : v == "16x1" ? 2 : v == "16x2" ? 3 : v == "8x2" ? 4 : v == "xs1" ? 5 : v == "x1" ? 6 : v == "x2" ? 7 : 0;
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

// Whether one launch of the default tensor-core kernels can take these matrices together: 1..3 q4
// matrices of one K and group (and `up` of the same shape as the first).
static bool one_launch(const DevMatrix* ws, int n, const DevMatrix* up) {
  if (n < 1 || n > 3 || tc_shape() != 0) return false;
  for (int i = 0; i < n; ++i)
    if (!gemv_tc_ok(ws[i]) || ws[i].cols != ws[0].cols || ws[i].group != ws[0].group) return false;
  return !up || (gemv_tc_ok(*up) && up->cols == ws[0].cols && up->group == ws[0].group && up->rows == ws[0].rows);
}

bool gemv_tc_fusable(const DevMatrix* ws, int n, const DevMatrix* up, int T) {
  if (!one_launch(ws, n, up)) return false;
  int64_t tiles = 0;
  const TcParams p = make_params(ws, nullptr, n, up, nullptr, T, false, &tiles);
  AsyncShape as;
  return async_ok(p, n, T, up != nullptr, &as);
}

cudaError_t gemv_tc_fused(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                          const GemvFuse& f, cudaStream_t s) {
  int64_t tiles = 0;
  TcParams p = make_params(ws, outs, n, up, x, T, false, &tiles);
  p.norm_w = f.norm_w;
  p.norm_dtype = f.norm_dtype;
  p.eps = f.eps;
  p.residual = f.residual && !up;
  if (T == 1 && !f.norm_w) p.xplanes = f.xplanes;
  AsyncShape as;
  if (!async_ok(p, n, T, up != nullptr, &as)) return cudaErrorInvalidValue;
  if (f.rope) {
    const int D = f.rope->kv.head_dim;
    if (!as.integer || n != 3 || up || f.residual || T != 1 || !f.rope->counters || D % 16 != 0 || D > 256 ||
        p.seg[0].rows % D != 0 || p.seg[1].rows != int64_t(f.rope->kv.n_kv_heads) * D || p.seg[2].rows != p.seg[1].rows ||
        p.seg[0].rows / D != f.rope->n_heads)
      return cudaErrorInvalidValue;
    p.rope = *f.rope;
  }
  return async_launch(up != nullptr, as, tiles, s, p);
}

bool gemv_qkv_rope_ok(const DevMatrix* qkv, int T, int head_dim) {
  if (T != 1 || head_dim % 16 != 0 || head_dim > 256 || !one_launch(qkv, 3, nullptr)) return false;
  int64_t tiles = 0;
  const TcParams p = make_params(qkv, nullptr, 3, nullptr, nullptr, T, false, &tiles);
  AsyncShape as;
  return async_ok(p, 3, T, false, &as) && as.integer && qkv[0].rows % head_dim == 0 &&
         qkv[1].rows % head_dim == 0 && qkv[2].rows == qkv[1].rows;
}

bool gemv_batch_need(const DevMatrix* ws, int n, const DevMatrix* up, int T, GemvScratch* need) {
  if (T < kBatchMinTokens || T > kTcMaxTokens || !one_launch(ws, n, up)) return false;
  int64_t tiles = 0;
  // x is not known here: any 16-byte-aligned pointer stands for it (the backend's activations are).
  alignas(16) static const uint8_t probe[16] = {};
  const TcParams p = make_params(ws, nullptr, n, up, probe, T, false, &tiles);
  BatchPlan b;
  if (!batch_plan(p, n, T, up != nullptr, need->cluster, need->sum_kernel, need->plain_x, &b)) return false;
  const bool cluster = need->cluster, plain_x = need->plain_x;
  const int sum_kernel = need->sum_kernel;
  *need = GemvScratch{};
  need->cluster = cluster, need->sum_kernel = sum_kernel, need->plain_x = plain_x;
  need->xperm_bytes = b.xperm_bytes, need->part_floats = b.part_floats, need->n_done = b.n_done;
  return true;
}

cudaError_t gemv_tc(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                    bool out_f32, cudaStream_t s, const GemvScratch* scratch) {
  int64_t tiles = 0;
  TcParams p = make_params(ws, outs, n, up, x, T, out_f32, &tiles);
  if (scratch && T == 1) p.xplanes = scratch->xplanes;
  const int shape = tc_shape();
  // 17..64 tokens with scratch: the batch kernel (qgemm_batch.cu).
  BatchPlan bp;
  if (T >= kBatchMinTokens && scratch && shape == 0 &&
      batch_plan(p, n, T, up != nullptr, scratch->cluster, scratch->sum_kernel, scratch->plain_x, &bp) &&
      (bp.xperm_bytes == 0 || (scratch->xperm && scratch->xperm_bytes >= bp.xperm_bytes)) && (bp.ksplit == 1 || bp.cluster || (scratch->part && (bp.n_done == 0 || scratch->done) &&
      scratch->part_floats >= bp.part_floats && scratch->n_done >= bp.n_done)))
    return batch_launch(up != nullptr, bp, *scratch, s, p);
  // Without it, more than 32 tokens run 32 at a time through the register-fed kernel below.
  if (T > 32) {
    const size_t ob = out_f32 ? 4 : 2;
    for (int t0 = 0; t0 < T; t0 += 32) {
      void* o[3];
      for (int i = 0; i < n; ++i) o[i] = static_cast<uint8_t*>(outs[i]) + size_t(t0) * size_t(ws[i].rows) * ob;
      const cudaError_t e = gemv_tc(ws, o, n, up, static_cast<const uint8_t*>(x) + size_t(t0) * size_t(p.K) * 2,
                                    std::min(32, T - t0), out_f32, s, nullptr);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  const dim3 grid(static_cast<unsigned>(tiles));
  // Decode (T <= 8): the streamed kernel; the staged one when its activations fit in 48 KB.
  AsyncShape as;
  if (shape == 0 && async_ok(p, n, T, up != nullptr, &as))
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
