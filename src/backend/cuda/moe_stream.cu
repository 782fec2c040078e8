// The streamed q4 expert kernels of a MoE decode step (moe.h: moe_gate_up / moe_down take them for
// 4-bit MLX experts; moe.cu's warp-per-row kernels take every other format). They are the streamed
// dense mat-vec (qgemv_stream.cu) with the expert chosen on the device:
//
//   gate/up: one block per (pair a = t*k + s, 16 rows of F): e = idx[a], gate_e and up_e rows
//            [r0, r0+16) against token t's x, h[a] = silu(gate) * up.
//   down:    one block per (token t, 16 rows of H): the token's k slots side by side as one long K
//            (k*F: token t's h rows are contiguous), slot s's weights from down_{idx[t*k+s]}, and each
//            slot's dot products multiplied by wt[t*k+s] in fp32 when the warp moves to the next slot
//            (the weighted sum costs no pass; its order differs from the CPU's, as any fp32 sum here).
//
// Each lane copies its own 32 bytes of a step (rows g and g+8, 128 elements of K) into its warp's
// ring in shared memory with cp.async and reads back only what it copied; the tile's scales and
// biases are copied once (4-byte pieces, since an expert's per-row group count need not be a
// multiple of 8); x is staged once in mma fragment order (step_mma_frag). Only column 0 of the mma's
// 8 is a token here (a pair has one): lanes g != 0 feed zeros, lanes c == 0 hold the results.
//
// Unlike the dense kernel, nothing can be copied before griddepcontrol.wait: which experts to read
// is the previous kernel's output (the routing for gate/up; for down, the routing ran two kernels
// before, which the wait on gate/up also covers).
//
// ncu on the H200 (qwen3-30b-a3b, T = 1, before this file): the warp-per-row kernels took 17.6 us
// (gate/up, 14.2 MB, 0.81 TB/s) and 17.0 us (down, 7.1 MB, 0.42 TB/s) per layer.
#include <cstdlib>

#include "backend/cuda/moe.h"
#include "backend/cuda/qgemv_int.cuh"

namespace anvil::cuda {
namespace {

using tc::cp_async16;
using tc::cp_async_commit;
using tc::cp_async_wait;
using tc::Step;

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(a), "l"(src) : "memory");
}

// The staged scales' row stride (bf16 elements): at least ng + 1 and 8 mod 16, so the 8 rows a
// warp reads at once fall on 8 different banks (qgemv_stream.cu measured the conflicts' cost).
__host__ __device__ constexpr int moe_ngp(int ng) { return ((ng + 8) / 16) * 16 + 8; }

__host__ __device__ constexpr size_t ring_bytes(int W, int S, int M) { return size_t(W) * S * M * 2 * 32 * 16; }
// Shared memory: ring | scales and biases [M][2][16][ngp] bf16 | x in fragment order [K] bf16
// (INT: x as int16 byte planes and per-piece floats, tc::int_x_bytes).
size_t stream_smem(int W, int S, int M, int64_t K, int ng, bool INT = false) {
  return ring_bytes(W, S, M) + size_t(M) * 2 * 16 * size_t(moe_ngp(ng)) * 2 + (INT ? tc::int_x_bytes(K) : size_t(K) * 2);
}

// One row of x (K bf16, 16-byte aligned) into shared memory in fragment order (qgemv_stream.cu's
// staging for T = 1): piece q's words (a, b, c, d) become (lo(a)lo(c), hi(a)hi(c), lo(b)lo(d), hi(b)hi(d)).
template <int NT>
__device__ __forceinline__ void stage_row(const __nv_bfloat16* x, int64_t K, uint4* xq) {
  constexpr int V = 8;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const int nq = int(K / 8);
  for (int q0 = threadIdx.x; q0 < nq; q0 += V * NT) {
    uint4 v[V];
#pragma unroll
    for (int i = 0; i < V; ++i)
      if (q0 + i * NT < nq) v[i] = __ldg(xv + q0 + i * NT);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      if (q0 + i * NT >= nq) break;
      const uint4 a = v[i];
      xq[q0 + i * NT] = make_uint4(__byte_perm(a.x, a.z, 0x5410), __byte_perm(a.x, a.z, 0x7632),
                                   __byte_perm(a.y, a.w, 0x5410), __byte_perm(a.y, a.w, 0x7632));
    }
  }
}

// The W warps' column-0 results (d[m][0]: row g, d[m][2]: row g+8) summed through shared memory;
// out(row, v0, v1) is called by the lanes of warp 0 with c == 0 for each of their two rows.
template <int W, int M, class Out>
__device__ __forceinline__ void finish_col0(const float (&d)[M][4], Out&& out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float red[W][M][2][8];
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mi = 0; mi < M; ++mi) red[warp][mi][0][lane >> 2] = d[mi][0], red[warp][mi][1][lane >> 2] = d[mi][2];
  }
  __syncthreads();
  if (warp != 0 || lane >= 16) return;
  const int half = lane >> 3, g = lane & 7;  // lane -> (row g + 8*half)
  float v[M];
#pragma unroll
  for (int mi = 0; mi < M; ++mi) {
    v[mi] = 0.0f;
#pragma unroll
    for (int w = 0; w < W; ++w) v[mi] += red[w][mi][half][g];
  }
  out(g + 8 * half, v[0], v[M - 1]);
}

// gate/up. Grid: T*k*ceil(F/16) blocks of W warps; S: ring depth in steps of both matrices.
// INT (the default since session 16; ANVIL_MOE_INT=0 goes back to the tensor cores): the dense
// one-token kernel's integer dot products (qgemv_int.cuh; every block here multiplies one token's
// row): x staged as int16 planes, dp4a on the raw nibbles, scale and bias per 32-element piece in
// fp32. Measured on the H200 (session 16, interleaved A/B): qwen3-30b-a3b-16L q4g64 decode 1,049 and
// 1,045 tok/s against 1,029 and 1,030 on the tensor cores.
template <int W, int S, bool INT>
__global__ void __launch_bounds__(W * 32, 1) gate_up_stream_kernel(MoEGateUpArgs a) {
  constexpr int M = 2;
  extern __shared__ __align__(16) uint8_t smem[];
  // The expert ids are the routing's output. late_trigger: the down kernel after this one starts
  // only once every block here has passed its wait (moe_down's early copies).
  if (a.late_trigger) pdl_begin_late();
  else pdl_begin();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t F = a.gate.rows, K = a.gate.cols, tpp = (F + 15) / 16;
  const int64_t pair = blockIdx.x / tpp, r0 = (blockIdx.x % tpp) * 16;
  const int t = int(pair / a.k);
  const int e = a.idx[pair];
  const ExpertPtrs gp = a.gate.ptrs[e], upp = a.up.ptrs[e];
  const int steps = int(K / 128), gshift = tc::group_shift(a.gate.group), ng = int(K >> gshift), ngp = moe_ngp(ng);
  uint4* ring = reinterpret_cast<uint4*>(smem);
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem + ring_bytes(W, S, M));
  uint4* xq = reinterpret_cast<uint4*>(sc + size_t(M) * 2 * 16 * ngp);

  const int64_t oa = min(r0 + g, F - 1) * (K / 32), ob = min(r0 + g + 8, F - 1) * (K / 32);
  const int n = steps > warp ? (steps - warp + W - 1) / W : 0;
  uint4* my = ring + size_t(warp) * S * M * 2 * 32;
  auto issue = [&](int i) {
    const int kq = ((warp + i * W) * 128 + c * 32) >> 5;
    uint4* slot = my + (i % S) * M * 2 * 32;
    cp_async16(slot + lane, static_cast<const uint4*>(gp.data) + oa + kq);
    cp_async16(slot + 32 + lane, static_cast<const uint4*>(gp.data) + ob + kq);
    cp_async16(slot + 64 + lane, static_cast<const uint4*>(upp.data) + oa + kq);
    cp_async16(slot + 96 + lane, static_cast<const uint4*>(upp.data) + ob + kq);
  };
  // Scales and biases, in 4-byte pieces: [matrix*2 + (0 scales, 1 biases)][row][ngp].
  const int pieces = ng / 2;
  for (int i = threadIdx.x; i < M * 2 * 16 * pieces; i += W * 32) {
    const int piece = i % pieces, r = (i / pieces) % 16, arr = i / (pieces * 16);
    const void* base = (arr >> 1) ? ((arr & 1) ? upp.biases : upp.scales) : ((arr & 1) ? gp.biases : gp.scales);
    const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(base) + min(r0 + r, F - 1) * int64_t(ng);
    cp_async4(sc + (size_t(arr) * 16 + r) * ngp + piece * 2, src + piece * 2);
  }
#pragma unroll
  for (int i = 0; i < S; ++i) {
    if (i < n) issue(i);
    cp_async_commit();  // group i (group 0 also holds the scales)
  }
  float2* xpf = reinterpret_cast<float2*>(reinterpret_cast<uint8_t*>(xq) + size_t(K) * 2);
  if (INT && a.xplanes) {
    tc::int_copy_planes<W * 32>(a.xplanes, K, xq);  // the norm staged x already (one token)
  } else if constexpr (INT) {
    // Whole warps (the quads' shuffles in int_stage_piece); K / 8 pieces, a multiple of 16.
    constexpr int V = 4;
    const uint4* xv = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.x) + int64_t(t) * K);
    const int nq = int(K / 8);
    for (int q0 = threadIdx.x - lane; q0 < nq; q0 += V * W * 32) {
      uint4 v[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int q = q0 + lane + i * W * 32;
        v[i] = q < nq ? __ldg(xv + q) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const int q = q0 + lane + i * W * 32;
        if (q0 + i * W * 32 >= nq) break;  // the whole warp past the end
        tc::int_stage_piece(v[i], q < nq, q >> 2, q & 3, xq, xpf);
      }
    }
  } else {
    stage_row<W * 32>(static_cast<const __nv_bfloat16*>(a.x) + int64_t(t) * K, K, xq);
  }
  const uint2* xf = reinterpret_cast<const uint2*>(xq);
  cp_async_wait<S - 1>();
  __syncthreads();
  trace::point(2);  // trace.h: staged

  float d[M][4] = {};
  if constexpr (INT) {
    float acc[M][2] = {};
    for (int i = 0; i < n; ++i) {
      cp_async_wait<S - 1>();
      const int k = (warp + i * W) * 128 + c * 32;
      tc::int_ring_step<M>(acc, my + (i % S) * M * 2 * 32, sc, ngp, g, k >> gshift, lane, xq, xpf, k >> 5);
      if (i + S < n) issue(i + S);
      cp_async_commit();
    }
    // Lane c = 0 holds rows g, g+8, where finish_col0 reads d[.][0] and d[.][2].
    tc::int_quad_sum<M>(acc);
#pragma unroll
    for (int mi = 0; mi < M; ++mi) d[mi][0] = acc[mi][0], d[mi][2] = acc[mi][1];
  }
  for (int i = 0; i < (INT ? 0 : n); ++i) {
    cp_async_wait<S - 1>();
    const int k = (warp + i * W) * 128 + c * 32, gi = k >> gshift;
    const uint4* slot = my + (i % S) * M * 2 * 32;
    Step st[M];
    tc::ring_step<M>(st, slot, sc, ngp, g, gi, lane);
    tc::step_mma_frag<M>(d, st, xf + (k / 32) * 8);  // every column the token (only column 0 is read)
    if (i + S < n) issue(i + S);
    cp_async_commit();
  }
  trace::point(3);
  finish_col0<W, M>(d, [&](int r, float gv, float uv) {
    const int64_t row = r0 + r;
    if (row < F)
      static_cast<__nv_bfloat16*>(a.h)[pair * F + row] = __float2bfloat16_rn(gv / (1.0f + __expf(-gv)) * uv);
  });
  trace::point(9);
}

// down. Grid: T*ceil(H/16) blocks of W warps; S: ring depth in steps.
template <int W, int S>
__global__ void __launch_bounds__(W * 32, 1) down_stream_kernel(MoEDownArgs a) {
  constexpr int M = 1;
  extern __shared__ __align__(16) uint8_t smem[];
  // h is the previous kernel's output. early (the gate/up kernel before this one let it start only
  // after its own wait, pdl_begin_late): the routing's idx and wt are final, so the experts'
  // weights and scales are copied before the wait; only h is staged after it.
  pdl_launch();
  if (!a.early) pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t H = a.down.rows, F = a.down.cols, tpr = (H + 15) / 16;
  const int t = int(blockIdx.x / tpr);
  const int64_t r0 = (blockIdx.x % tpr) * 16;
  const int k = a.k, sps = int(F / 128), steps = k * sps;
  const int gshift = tc::group_shift(a.down.group), ngs = int(F >> gshift), ng = k * ngs, ngp = moe_ngp(ng);
  __shared__ const void* ew[kMoEMaxTopK];  // slot s's expert: weights, scales, biases
  __shared__ const void* es[kMoEMaxTopK];
  __shared__ const void* eb[kMoEMaxTopK];
  __shared__ float wts[kMoEMaxTopK];
  if (threadIdx.x < k) {
    const ExpertPtrs p = a.down.ptrs[__ldcg(a.idx + t * k + threadIdx.x)];  // L2: see pdl_begin_late
    ew[threadIdx.x] = p.data, es[threadIdx.x] = p.scales, eb[threadIdx.x] = p.biases;
    wts[threadIdx.x] = __ldcg(a.wt + t * k + threadIdx.x);
  }
  __syncthreads();
  uint4* ring = reinterpret_cast<uint4*>(smem);
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem + ring_bytes(W, S, M));
  uint4* xq = reinterpret_cast<uint4*>(sc + size_t(M) * 2 * 16 * ngp);

  const int64_t oa = min(r0 + g, H - 1) * (F / 32), ob = min(r0 + g + 8, H - 1) * (F / 32);
  const int n = steps > warp ? (steps - warp + W - 1) / W : 0;
  uint4* my = ring + size_t(warp) * S * M * 2 * 32;
  // issue(i) is called for i = 0, 1, 2, ... in order and the loop walks i the same way, so each keeps
  // its step's slot and offset as a running count instead of dividing by sps (a run-time division:
  // ~50 instructions of a step, SASS).
  int is = warp / sps, ir = warp % sps;  // issue's next step: slot, step within the slot
  auto issue = [&](int i) {
    const int s = is, kq = (ir * 128 + c * 32) >> 5;
    for (ir += W; ir >= sps; ir -= sps) ++is;
    const uint4* w = static_cast<const uint4*>(ew[s]);
    uint4* slot = my + (i % S) * M * 2 * 32;
    cp_async16(slot + lane, w + oa + kq);
    cp_async16(slot + 32 + lane, w + ob + kq);
  };
  // Scales and biases of the k slots side by side: [0 scales, 1 biases][row][s * ngs + group].
  const int pieces = ngs / 2, per_row = k * pieces;
  for (int i = threadIdx.x; i < 2 * 16 * per_row; i += W * 32) {
    const int j = i % per_row, r = (i / per_row) % 16, arr = i / (per_row * 16);
    const int s = j / pieces, piece = j % pieces;
    const __nv_bfloat16* src =
        static_cast<const __nv_bfloat16*>(arr ? eb[s] : es[s]) + min(r0 + r, H - 1) * int64_t(ngs);
    cp_async4(sc + (size_t(arr) * 16 + r) * ngp + s * ngs + piece * 2, src + piece * 2);
  }
#pragma unroll
  for (int i = 0; i < S; ++i) {
    if (i < n) issue(i);
    cp_async_commit();
  }
  if (a.early) pdl_wait();
  stage_row<W * 32>(static_cast<const __nv_bfloat16*>(a.h) + int64_t(t) * k * F, int64_t(k) * F, xq);
  const uint2* xf = reinterpret_cast<const uint2*>(xq);
  cp_async_wait<S - 1>();
  __syncthreads();
  trace::point(2);  // trace.h: staged

  float d[M][4] = {}, acc[M][4] = {};
  int cur = -1;  // the slot d holds
  int ls = warp / sps, lr = warp % sps;  // the loop's step: slot, step within the slot
  for (int i = 0; i < n; ++i) {
    cp_async_wait<S - 1>();
    const int step = warp + i * W, s = ls;
    for (lr += W; lr >= sps; lr -= sps) ++ls;
    if (s != cur) {  // the warp's steps ascend: each slot's sum is complete when it moves on
      if (cur >= 0) {
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[0][j] = fmaf(wts[cur], d[0][j], acc[0][j]), d[0][j] = 0.0f;
      }
      cur = s;
    }
    const int kk = step * 128 + c * 32, gi = s * ngs + ((kk - s * int(F)) >> gshift);
    const uint4* slot = my + (i % S) * M * 2 * 32;
    Step st[M];
    st[0].wa = slot[lane];
    st[0].wb = slot[32 + lane];
    st[0].sa = __bfloat162bfloat162(sc[g * ngp + gi]);
    st[0].ba = __bfloat162bfloat162(sc[(16 + g) * ngp + gi]);
    st[0].sb = __bfloat162bfloat162(sc[(g + 8) * ngp + gi]);
    st[0].bb = __bfloat162bfloat162(sc[(16 + g + 8) * ngp + gi]);
    tc::step_mma_frag<M>(d, st, xf + (kk / 32) * 8);  // every column the token (only column 0 is read)
    if (i + S < n) issue(i + S);
    cp_async_commit();
  }
  if (cur >= 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[0][j] = fmaf(wts[cur], d[0][j], acc[0][j]);
  }
  finish_col0<W, M>(acc, [&](int r, float v, float) {
    const int64_t row = r0 + r;
    if (row >= H) return;
    if (a.shared_out)
      v += a.shared_coef[t] * __bfloat162float(static_cast<const __nv_bfloat16*>(a.shared_out)[t * H + row]);
    static_cast<__nv_bfloat16*>(a.out)[t * H + row] = __float2bfloat16_rn(v);
  });
  trace::point(9);
}

constexpr size_t kMaxSmem = 160 * 1024;

template <class Kernel, class Args>
cudaError_t launch_stream(Kernel* kern, int64_t blocks, int W, size_t smem, cudaStream_t s, const Args& a) {
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  launch_k(kern, dim3(unsigned(blocks)), dim3(unsigned(W * 32)), smem, s, a);
  return cudaGetLastError();
}

// Warps per block: 4 when there are at least two tiles per SM (132 on the H200), else 8 so that a
// narrow launch still has enough copies in flight (the dense kernel's rule), and 4 if 8 would not
// fit in shared memory.
int pick_warps(int64_t tiles, int S, int M, int64_t K, int ng) {
  const int W = tiles < 2 * 132 ? 8 : 4;
  if (W == 8 && stream_smem(8, S, M, K, ng) > kMaxSmem) return 4;
  return W;
}

constexpr int kGateUpS = 4, kDownS = 8;

}  // namespace

bool moe_stream_shape_ok(const MoEMats& m, int64_t slots) {
  if (m.fmt != 4 || (m.group != 32 && m.group != 64 && m.group != 128)) return false;
  if (m.cols % 128 != 0 || (m.cols / m.group) % 2 != 0 || m.rows < 1) return false;
  const int M = slots == 0 ? 2 : 1;  // 0: gate/up (one x row of cols), else down over slots * cols
  const int64_t K = slots == 0 ? m.cols : slots * m.cols;
  const int ng = int(K / m.group);
  return stream_smem(4, M == 2 ? kGateUpS : kDownS, M, K, ng) <= kMaxSmem;
}

cudaError_t moe_stream_gate_up(const MoEGateUpArgs& args, cudaStream_t s) {
  MoEGateUpArgs a = args;
  const int64_t tiles = int64_t(a.T) * a.k * ((a.gate.rows + 15) / 16);
  const int ng = int(a.gate.cols / a.gate.group);
  const int W = pick_warps(tiles, kGateUpS, 2, a.gate.cols, ng);
  static const bool int_on = [] {
    const char* e = std::getenv("ANVIL_MOE_INT");
    return !(e && *e == '0');
  }();
  const size_t smem_int = stream_smem(W, kGateUpS, 2, a.gate.cols, ng, true);
  if (int_on && smem_int <= kMaxSmem) {
    if (W == 8) return launch_stream(gate_up_stream_kernel<8, kGateUpS, true>, tiles, 8, smem_int, s, a);
    return launch_stream(gate_up_stream_kernel<4, kGateUpS, true>, tiles, 4, smem_int, s, a);
  }
  const size_t smem = stream_smem(W, kGateUpS, 2, a.gate.cols, ng);
  if (W == 8) return launch_stream(gate_up_stream_kernel<8, kGateUpS, false>, tiles, 8, smem, s, a);
  return launch_stream(gate_up_stream_kernel<4, kGateUpS, false>, tiles, 4, smem, s, a);
}

cudaError_t moe_stream_down(const MoEDownArgs& a, cudaStream_t s) {
  const int64_t tiles = int64_t(a.T) * ((a.down.rows + 15) / 16);
  const int64_t K = int64_t(a.k) * a.down.cols;
  const int ng = int(K / a.down.group);
  const int W = pick_warps(tiles, kDownS, 1, K, ng);
  const size_t smem = stream_smem(W, kDownS, 1, K, ng);
  if (W == 8) return launch_stream(down_stream_kernel<8, kDownS>, tiles, 8, smem, s, a);
  return launch_stream(down_stream_kernel<4, kDownS>, tiles, 4, smem, s, a);
}

}  // namespace anvil::cuda
