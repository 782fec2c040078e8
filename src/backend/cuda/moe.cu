// The mixture-of-experts kernels (see moe.h for the call sequence). Everything a decode step needs is
// on the device: the routing writes the chosen expert ids and weights to device memory and the expert
// kernels read them, so a captured decode graph replays the whole MoE block, routing included.
//
// Decode kernels (moe_gate_up, moe_down) are mat-vecs in the style of qgemv.cu: one warp owns one
// output row of one (token, slot) pair (gate/up) or of one token (down), its lanes stride over
// 32-element chunks of the weight row (one MLX group scale and bias per chunk, applied as
// s * dot(q, x) + b * sum(x)). Each chosen expert's rows are read once per token that chose it — at
// batch 1 that is exactly top_k experts' bytes. moe_down loops over the token's slots in top-k order
// and weights each slot's partial dot products, so the weighted sum costs no extra pass.
//
// Prefill kernels: the assignments are grouped by expert (moe_group), then one launch computes every
// (expert, 64-row tile of its tokens) x (64 output columns) tile on the tensor cores (WMMA bf16 ->
// fp32, weights dequantized into shared memory as gemm.cu does), gate and up together with SwiGLU;
// a second one does the down projection into fp32 rows; moe_combine sums each token's slots in top-k
// order. The grids are sized for the worst case (moe_max_tiles); surplus blocks exit at once.
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <mma.h>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/moe.h"

namespace anvil::cuda {
namespace {

constexpr int kWarps = 4;     // warps per block of the mat-vec style kernels
constexpr int kRouteTok = 8;  // tokens per routing block: each router row is read once per 8 tokens

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

// dot(weight chunk c of row `row`, xf) with the chunk's affine scale and bias applied.
template <int FMT>
__device__ __forceinline__ float chunk_dot(const ExpertPtrs& p, int64_t row, int64_t cols, int group, Elem dt,
                                           int64_t c, const float (&xf)[32], float sx) {
  constexpr int W = chunk_words<FMT>();
  uint32_t wq[W];
  load_words<W>(static_cast<const uint32_t*>(p.data) + row * row_words<FMT>(cols) + c * W, wq);
  float d = 0.0f;
#pragma unroll
  for (int e = 0; e < 32; ++e) d = fmaf(chunk_elem<FMT, W>(wq, e), xf[e], d);
  if constexpr (FMT <= 8) {
    const int64_t g = row * (cols / group) + c * 32 / group;
    return load_any(p.scales, g, dt) * d + load_any(p.biases, g, dt) * sx;
  } else {
    return d;
  }
}

// Element (row, col) of any weight (MLX affine 2..8 bits or dense): the shared expert's 1-row gate.
__device__ float weight_elem(const DevMatrix& w, int64_t row, int64_t col) {
  if (!w.bits) return load_any(w.data, row * w.cols + col, w.dtype);
  const uint32_t* d = static_cast<const uint32_t*>(w.data) + row * (w.cols * w.bits / 32);
  const int64_t bit = col * w.bits;
  const int sh = int(bit & 31);
  uint32_t q = d[bit >> 5] >> sh;
  if (sh + w.bits > 32) q |= d[(bit >> 5) + 1] << (32 - sh);
  q &= (1u << w.bits) - 1u;
  const int64_t g = row * (w.cols / w.group) + col / w.group;
  return load_any(w.scales, g, w.dtype) * float(q) + load_any(w.biases, g, w.dtype);
}

// ---- routing ----
// Router row r's logits for the tile's nt tokens (t0..t0+nt-1), summed by the calling warp; lane 0
// holds them. The chunk's weights are unpacked once for the tile's tokens (chunk_dot's arithmetic, in
// its order: the same logits bit for bit in both routing kernels; ncu on the H200 measured 74 us per
// qwen3-30b-a3b layer at 512 tokens when each token unpacked them again).
template <int FMT>
__device__ __forceinline__ void router_row(const MoERouteArgs& a, int r, int t0, int nt, float (&acc)[kRouteTok]) {
  const int lane = threadIdx.x & 31;
  const int64_t K = a.H, nchunks = K / 32;
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  const ExpertPtrs w{a.router.data, a.router.scales, a.router.biases};
#pragma unroll
  for (int t = 0; t < kRouteTok; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < nchunks; c += 32) {
    constexpr int W = chunk_words<FMT>();
    uint32_t wq[W];
    load_words<W>(static_cast<const uint32_t*>(w.data) + r * row_words<FMT>(K) + c * W, wq);
    float wf[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) wf[e] = chunk_elem<FMT, W>(wq, e);
    float gs = 1.0f, gb = 0.0f;
    if constexpr (FMT <= 8) {
      const int64_t gi = r * (K / a.router.group) + c * 32 / a.router.group;
      gs = load_any(w.scales, gi, a.router.dtype), gb = load_any(w.biases, gi, a.router.dtype);
    }
#pragma unroll
    for (int t = 0; t < kRouteTok; ++t) {
      if (t < nt) {
        float xf[32];
        const float sx = load_x_chunk(x + (t0 + t) * K, c, xf);
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 32; ++e) d = fmaf(wf[e], xf[e], d);
        if constexpr (FMT <= 8) acc[t] += gs * d + gb * sx;
        else acc[t] += d;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kRouteTok; ++t) acc[t] = warp_sum(acc[t]);
}

// Router row r's words, scales and biases pulled into this SM's L1 by the calling warp, without a
// register: what route_cluster_kernel does before its PDL wait with a.early (the router is a weight,
// never written by the kernels before it), so that after the wait router_row's loads hit L1 and only
// x is a round trip (to L2). Without it each of router_row's chunk iterations waits on DRAM.
template <int FMT>
__device__ __forceinline__ void router_prefetch_l1(const MoERouteArgs& a, int r) {
  if (r >= a.E) return;
  const int lane = threadIdx.x & 31;
  const int64_t K = a.H;
  const char* row = reinterpret_cast<const char*>(static_cast<const uint32_t*>(a.router.data) + r * row_words<FMT>(K));
  const int64_t bytes = row_words<FMT>(K) * 4;
  for (int64_t o = int64_t(lane) * 128; o < bytes; o += 32 * 128) asm volatile("prefetch.global.L1 [%0];" ::"l"(row + o));
  if constexpr (FMT <= 8) {
    const int64_t ng = K / a.router.group, esz = a.router.dtype == Elem::kF32 ? 4 : 2;
    const char* sc = static_cast<const char*>(a.router.scales) + r * ng * esz;
    const char* bi = static_cast<const char*>(a.router.biases) + r * ng * esz;
    for (int64_t o = int64_t(lane) * 128; o < ng * esz; o += 32 * 128) {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(sc + o));
      asm volatile("prefetch.global.L1 [%0];" ::"l"(bi + o));
    }
  }
}

// The shared expert's gate of token tok: sigmoid(x . shared_gate), by one warp.
__device__ __forceinline__ void shared_gate_coef(const MoERouteArgs& a, int tok) {
  const int lane = threadIdx.x & 31;
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  float d = 0.0f;
  for (int64_t c = lane; c < a.H; c += 32)
    d = fmaf(weight_elem(a.shared_gate, 0, c), bf16_bits_to_f32(x[int64_t(tok) * a.H + c]), d);
  d = warp_sum(d);
  if (lane == 0) a.shared_coef[tok] = 1.0f / (1.0f + expf(-d));
}

// Grid (ceil(E / kWarps), ceil(T / kRouteTok)). Warp w of block (bx, by) computes router row
// bx*kWarps + w for the block's 8 tokens into a.logits. The last block of a token tile to finish (a
// counter per tile, reset by that block) then routes the tile's tokens: one warp per token, exactly
// the CPU's rule (cpu_moe.cpp moe_route): p = softmax(logits) in fp32, k passes of an argmax over the
// untaken experts (ties to the lower index), optional renormalization summed in top-k order.
template <int FMT>
__global__ void __launch_bounds__(kWarps * 32) route_kernel(MoERouteArgs a) {
  pdl_begin();
  __shared__ float sp[kWarps][kMoEMaxExperts];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t0 = blockIdx.y * kRouteTok, nt = min(kRouteTok, a.T - t0);
  const int r = blockIdx.x * kWarps + warp;
  if (r < a.E) {
    float acc[kRouteTok];
    router_row<FMT>(a, r, t0, nt, acc);
#pragma unroll
    for (int t = 0; t < kRouteTok; ++t)
      if (lane == 0 && t < nt) a.logits[int64_t(t0 + t) * a.E + r] = acc[t];
  }
  trace::point(2);  // trace.h: the router rows done
  __threadfence();  // this block's logits visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&a.counters[blockIdx.y], 1) == int(gridDim.x) - 1;
  __syncthreads();
  trace::point(3);  // counted
  if (!last) return;
  if (threadIdx.x == 0) a.counters[blockIdx.y] = 0;  // every other block of the tile has counted
  __threadfence();

  float* p = sp[warp];
  for (int t = warp; t < nt; t += kWarps) {
    const int tok = t0 + t;
    float mx = -INFINITY;
    for (int e = lane; e < a.E; e += 32) {
      const float l = __ldcg(a.logits + int64_t(tok) * a.E + e);  // L2: written by other blocks
      p[e] = l;
      mx = fmaxf(mx, l);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < a.E; e += 32) sum += (p[e] = expf(p[e] - mx));
    sum = warp_sum(sum);
    for (int e = lane; e < a.E; e += 32) p[e] /= sum;
    __syncwarp();
    constexpr float kTaken = -2.0f;  // probabilities are >= 0
    int my_e = 0;
    float my_w = 0.0f;
    for (int i = 0; i < a.k; ++i) {
      int be = -1;
      float bv = 0.0f;
      for (int e = lane; e < a.E; e += 32) {  // ascending e: strict > keeps the lowest index of a tie
        const float v = p[e];
        if (v != kTaken && (be < 0 || v > bv)) be = e, bv = v;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int ob = __shfl_xor_sync(0xffffffffu, be, o);
        if (ob >= 0 && (be < 0 || ov > bv || (ov == bv && ob < be))) be = ob, bv = ov;
      }
      if (lane == i) my_e = be, my_w = bv;
      if (be >= 0 && lane == (be & 31)) p[be] = kTaken;
      __syncwarp();
    }
    if (a.norm_topk) {
      float s = 0.0f;  // summed in top-k order, as the CPU does
      for (int i = 0; i < a.k; ++i) s += __shfl_sync(0xffffffffu, my_w, i);
      my_w /= s;
    }
    if (lane < a.k) {
      a.idx[int64_t(tok) * a.k + lane] = my_e;
      a.wt[int64_t(tok) * a.k + lane] = my_w;
    }
    if (a.shared_gate.data) shared_gate_coef(a, tok);
    __syncwarp();
  }
  trace::point(9);  // (thread 0: warp 0, done with its tokens)
}

// The routing as one thread block cluster per token tile (the default since session 16;
// ANVIL_MOE_ROUTE_CLUSTER=0 goes back to route_kernel). Why: inside the decode graph route_kernel
// took ~11 us per qwen3-30b-a3b layer on the H200 (session 15's timeline) for a 256 KB router: after
// the rows, a device-wide fence and counter, then one block reading the logits back from L2 and k
// serial arg-max passes of one warp per token. Measured on the H200 (session 16, interleaved A/B):
// qwen3-30b-a3b-16L q4g64 decode 1,105 and 1,099 against 1,045 and 1,042 tok/s (a first version
// whose rank loop stopped early, a dependent shared-memory load per comparison, was 2% slower than
// route_kernel). Here:
// - grid (C, ceil(T / 8)), clusters of C = min(8, ceil(E / 16)) blocks of 16 warps along x; warp w of
//   block b computes router rows b * 16 + w (+ 16 C, ...) for the tile's tokens (router_row: the
//   same logits bit for bit) and stores them into block 0's shared memory (distributed shared memory);
// - one cluster barrier (release / acquire) instead of the fence, the counter and the L2 round trip;
// - block 0 then routes the tile's tokens one after another with all its threads: thread e holds
//   expert e's logit; the softmax's max and sum are block reductions; expert e's place in the top-k
//   is its rank (how many experts have a larger probability, or an equal one at a lower index: the
//   order of the CPU's k arg-max passes, ties to the lower index) found by one pass over the E
//   probabilities, so the top-k costs E comparisons per thread instead of k dependent warp
//   reductions; the renormalization is summed in top-k order, as the CPU does.
constexpr int kRouteCWarps = 16;      // warps per block: one router row each for E <= 16 C
constexpr int kRouteCMaxCluster = 8;  // the portable cluster size

// p (>= 0, or NaN) ordered as the CPU's arg-max passes take it: NaN below every probability.
[[maybe_unused]] __device__ __forceinline__ float route_key(float p) { return p == p ? p : -1.0f; }

template <int FMT>
__global__ void __launch_bounds__(kRouteCWarps * 32) route_cluster_kernel(MoERouteArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // clusters need sm_90: below it the host takes route_kernel (route_cluster_on)
#else
  namespace cg = cooperative_groups;
  pdl_launch();
  if (a.early) router_prefetch_l1<FMT>(a, int(blockIdx.x) * kRouteCWarps + int(threadIdx.x >> 5));
  pdl_wait();
  __shared__ float s_logit[kRouteTok][kMoEMaxExperts];  // block 0's: the tile's logits
  __shared__ __align__(16) float s_p[kMoEMaxExperts];   // one token's probabilities (-2 past E)
  __shared__ float s_red[kRouteCWarps];
  __shared__ int s_sel_e[kMoEMaxTopK];
  __shared__ float s_sel_w[kMoEMaxTopK];
  cg::cluster_group cluster = cg::this_cluster();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int C = int(gridDim.x), b = int(blockIdx.x);
  const int t0 = blockIdx.y * kRouteTok, nt = min(kRouteTok, a.T - t0);
  float* dst = cluster.map_shared_rank(&s_logit[0][0], 0);
  for (int r = b * kRouteCWarps + warp; r < a.E; r += C * kRouteCWarps) {
    float acc[kRouteTok];
    router_row<FMT>(a, r, t0, nt, acc);
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < kRouteTok; ++t)
        if (t < nt) dst[t * kMoEMaxExperts + r] = acc[t];
    }
  }
  trace::point(2);  // trace.h: the router rows done
  cluster.sync();   // every block's logits are in block 0's shared memory
  trace::point(3);
  if (cluster.block_rank() != 0) return;

  constexpr int NT = kRouteCWarps * 32;
  const int tid = threadIdx.x;
  for (int t = 0; t < nt; ++t) {
    const int tok = t0 + t;
    float l[kMoEMaxExperts / NT];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMoEMaxExperts / NT; ++j) {
      const int e = tid + j * NT;
      l[j] = e < a.E ? s_logit[t][e] : -INFINITY;
      mx = fmaxf(mx, l[j]);
    }
    mx = warp_max(mx);
    if (lane == 0) s_red[warp] = mx;
    __syncthreads();
    mx = s_red[0];
#pragma unroll
    for (int w = 1; w < kRouteCWarps; ++w) mx = fmaxf(mx, s_red[w]);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMoEMaxExperts / NT; ++j) {
      const int e = tid + j * NT;
      l[j] = e < a.E ? expf(l[j] - mx) : 0.0f;
      sum += l[j];
    }
    sum = warp_sum(sum);
    __syncthreads();  // every thread has read s_red's maxima
    if (lane == 0) s_red[warp] = sum;
    __syncthreads();
    sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kRouteCWarps; ++w) sum += s_red[w];
    const int E4 = (a.E + 3) / 4;  // s_p in float4s; the padding (-2) ranks below every expert
#pragma unroll
    for (int j = 0; j < kMoEMaxExperts / NT; ++j) {
      const int e = tid + j * NT;
      if (e < a.E) s_p[e] = route_key(l[j] = l[j] / sum);
      else if (e < 4 * E4) s_p[e] = -2.0f;
    }
    __syncthreads();
    const float4* p4 = reinterpret_cast<const float4*>(s_p);
#pragma unroll
    for (int j = 0; j < kMoEMaxExperts / NT; ++j) {
      const int e = tid + j * NT;
      if (e >= a.E) continue;
      const float v = s_p[e];
      int rank = 0;  // independent comparisons, no early exit: the loads pipeline
#pragma unroll 4
      for (int o = 0; o < E4; ++o) {
        const float4 u = p4[o];
        const int b4 = 4 * o;
        rank += (u.x > v) + (u.y > v) + (u.z > v) + (u.w > v) +
                ((u.x == v) & (b4 < e)) + ((u.y == v) & (b4 + 1 < e)) + ((u.z == v) & (b4 + 2 < e)) + ((u.w == v) & (b4 + 3 < e));
      }
      if (rank < a.k) s_sel_e[rank] = e, s_sel_w[rank] = l[j];
    }
    __syncthreads();
    if (warp == 0) {
      float w = lane < a.k ? s_sel_w[lane] : 0.0f;
      if (a.norm_topk) {
        float ss = 0.0f;  // summed in top-k order, as the CPU does
        for (int i = 0; i < a.k; ++i) ss += __shfl_sync(0xffffffffu, w, i);
        w /= ss;
      }
      if (lane < a.k) {
        a.idx[int64_t(tok) * a.k + lane] = s_sel_e[lane];
        a.wt[int64_t(tok) * a.k + lane] = w;
      }
    }
    __syncthreads();  // s_p, s_red and the selection are free for the next token
  }
  if (a.shared_gate.data)
    for (int t = warp; t < nt; t += kRouteCWarps) shared_gate_coef(a, t0 + t);
  trace::point(9);
#endif
}

// ---- decode experts ----
// One warp per output row: warps [0, T*k*F) are (pair a = t*k + s, row) of the routed experts,
// then [.., + T*S) (token, row) of the shared expert (ptrs[E]).
template <int FMT>
__global__ void __launch_bounds__(kWarps * 32) gate_up_kernel(MoEGateUpArgs a) {
  if (a.late_trigger) pdl_begin_late();
  else pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t F = a.gate.rows, K = a.gate.cols, S = a.shared_rows;
  const int64_t routed = a.routed ? int64_t(a.T) * a.k * F : 0;
  int64_t row, t, out_row, rows;
  int e;
  __nv_bfloat16* out;
  if (gw < routed) {
    const int64_t pair = gw / F;
    row = gw % F, t = pair / a.k, e = a.idx[pair];
    out = static_cast<__nv_bfloat16*>(a.h), out_row = pair, rows = F;
  } else {
    const int64_t j = gw - routed;
    if (S == 0 || j >= int64_t(a.T) * S) return;
    row = j % S, t = j / S, e = a.E;
    out = static_cast<__nv_bfloat16*>(a.hs), out_row = t, rows = S;
  }
  const ExpertPtrs g = a.gate.ptrs[e], u = a.up.ptrs[e];
  const uint16_t* xt = static_cast<const uint16_t*>(a.x) + t * K;
  float ag = 0.0f, au = 0.0f;
  for (int64_t c = lane; c < K / 32; c += 32) {
    float xf[32];
    const float sx = load_x_chunk(xt, c, xf);
    ag += chunk_dot<FMT>(g, row, K, a.gate.group, a.gate.dtype, c, xf, sx);
    au += chunk_dot<FMT>(u, row, K, a.up.group, a.up.dtype, c, xf, sx);
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) out[out_row * rows + row] = __float2bfloat16_rn(silu_mul(ag, au));
}

// One warp per (token t, output row): its lanes stride over the (slot, chunk) items of the token's
// n_slots experts and then the shared expert's chunks, each partial dot product scaled by its slot's
// weight, so the warp's one reduction is the weighted sum.
template <int FMT>
__global__ void __launch_bounds__(kWarps * 32) down_kernel(MoEDownArgs a) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int64_t H = a.down.rows, F = a.down.cols, S = a.shared_cols;
  const int64_t t = gw / H, row = gw % H;
  if (t >= a.T) return;
  const int64_t nF = F / 32, nS = S / 32, routed = int64_t(a.n_slots) * nF;
  const uint16_t* h = static_cast<const uint16_t*>(a.h);
  float acc = 0.0f;
  for (int64_t it = lane; it < routed + nS; it += 32) {
    int64_t c, cols;
    int e;
    float coef;
    const uint16_t* hv;
    if (it < routed) {
      const int64_t pair = t * a.k + it / nF;
      c = it % nF, cols = F, e = a.idx[pair], coef = a.wt[pair], hv = h + pair * F;
    } else {
      c = it - routed, cols = S, e = a.E, coef = a.shared_coef[t];
      hv = static_cast<const uint16_t*>(a.hs) + t * S;
    }
    float xf[32];
    const float sx = load_x_chunk(hv, c, xf);
    acc += coef * chunk_dot<FMT>(a.down.ptrs[e], row, cols, a.down.group, a.down.dtype, c, xf, sx);
  }
  acc = warp_sum(acc);
  if (lane == 0) {
    if (a.shared_out)
      acc += a.shared_coef[t] * __bfloat162float(static_cast<const __nv_bfloat16*>(a.shared_out)[t * H + row]);
    static_cast<__nv_bfloat16*>(a.out)[t * H + row] = __float2bfloat16_rn(acc);
  }
}

// ---- prefill ----
// One block: a histogram of the assignments per expert, a scan into row offsets and tile starts, then
// a scatter. Positions within an expert follow the atomics' order; that changes nothing a token gets,
// since every row of a GEMM tile is computed independently of the others.
__global__ void __launch_bounds__(1024) group_kernel(MoEGroupArgs a) {
  pdl_begin();
  __shared__ int cnt[kMoEMaxExperts], fill[kMoEMaxExperts];
  for (int e = threadIdx.x; e < a.E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < a.A; i += blockDim.x) atomicAdd(&cnt[a.idx[i]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, ts = 0;
    for (int e = 0; e < a.E; ++e) {
      a.offsets[e] = off, a.tile_start[e] = ts, fill[e] = off;
      off += cnt[e];
      ts += (cnt[e] + kMoETileRows - 1) / kMoETileRows;
    }
    a.offsets[a.E] = off, a.tile_start[a.E] = ts;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < a.A; i += blockDim.x) {
    const int pos = atomicAdd(&fill[a.idx[i]], 1);
    a.order[pos] = i;
    a.pos_of[i] = pos;
  }
}

constexpr int BM = kMoETileRows, BN = 64, BK = 64, LDS = BK + 8, LDC = BN + 4;

// Block (bx, by): output columns [bx*64, +64) of grid tile `by`, i.e. of the by - tile_start[e]'th
// 64-row tile of expert e's positions. 4 warps, each a 32x32 quarter as 2x2 WMMA fragments per
// matrix (gate and up for SWIGLU). Per K step of 64: threads dequantize two 32-element chunks of a
// weight row each (gate rows by threads 0..63, up rows by 64..127) and copy the 64 x 64 x tile.
// The next step's weight words, scales and x pieces are loaded into registers while the current
// step multiplies (ncu on the H200, session 13: with loads, barrier and compute in series, steps
// of 32 took 450-680 us per qwen3-30b-a3b gate/up at 512 tokens, latency-bound). A K that is not a
// multiple of 64 ends with a half step whose other half is zeros.
template <int BITS, bool SWIGLU>
__global__ void __launch_bounds__(128) grouped_kernel(MoEGroupedArgs a) {
  pdl_begin();
  using namespace nvcuda;
  constexpr int M = SWIGLU ? 2 : 1;
  constexpr int CPS = BK / 32;   // weight chunks per thread and step
  constexpr int QPR = BK / 8;    // 16-byte pieces of an x row per step
  constexpr int RP = 128 / QPR;  // x rows per copy pass
  constexpr int XN = BM / RP;    // copy passes
  constexpr int WB = BITS > 0 ? BITS : 1;
  constexpr size_t kEpi = size_t(M) * BM * LDC * 4, kLoop = size_t(BM + M * BN) * LDS * 2;
  __shared__ __align__(128) unsigned char smem[kEpi > kLoop ? kEpi : kLoop];
  __nv_bfloat16* Xs = reinterpret_cast<__nv_bfloat16*>(smem);  // [BM][LDS]
  __nv_bfloat16* Ws = Xs + BM * LDS;                            // [M][BN][LDS]
  float* Cs = reinterpret_cast<float*>(smem);                   // [M][BM][LDC], after the K loop
  const int tile = blockIdx.y;
  if (tile >= a.tile_start[a.E]) return;
  int lo = 0, hi = a.E;  // the expert owning this tile: the last e with tile_start[e] <= tile
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (a.tile_start[mid] <= tile) lo = mid;
    else hi = mid;
  }
  const int e = lo;
  const int p0 = a.offsets[e] + (tile - a.tile_start[e]) * BM;
  const int np = min(BM, a.offsets[e + 1] - p0);
  const int tid = threadIdx.x, warp = tid >> 5;
  const int64_t n0 = int64_t(blockIdx.x) * BN, K = a.w.cols, N = a.w.rows;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
  // The x rows (of the tile's 64) whose 16-byte piece xq this thread copies: tid / QPR + RP * j.
  const int xq = tid % QPR;
  const uint16_t* xsrc[XN];
#pragma unroll
  for (int j = 0; j < XN; ++j) {
    const int r = tid / QPR + RP * j;
    xsrc[j] = nullptr;
    if (r < np) {
      const int64_t src = SWIGLU ? a.order[p0 + r] / a.k : p0 + r;
      xsrc[j] = static_cast<const uint16_t*>(a.x) + src * K;
    }
  }
  // The weight row this thread dequantizes (threads < 64 * M): row n0 + tid % 64 of matrix tid / 64.
  const bool wthread = tid < 64 * M;
  const int wmat = tid / 64, wrr = tid % 64;
  const int64_t wrow = n0 + wrr;
  const bool wrow_ok = wthread && wrow < N;
  const ExpertPtrs wpp = wmat == 0 ? a.w.ptrs[e] : (SWIGLU ? a.up.ptrs[e] : ExpertPtrs{});
  const MoEMats& wmm = wmat == 0 ? a.w : a.up;

  uint32_t wd[CPS][WB];
  float wsc[CPS], wbi[CPS];
  uint4 xv[XN];
  auto fetch = [&](int64_t k0) {  // step k0's global data into registers
    if constexpr (BITS > 0) {
      if (wrow_ok) {
#pragma unroll
        for (int cc = 0; cc < CPS; ++cc) {
          const int64_t kc = k0 + cc * 32;
          if (kc >= K) break;
          const uint32_t* pw = static_cast<const uint32_t*>(wpp.data) + (wrow * K + kc) / 32 * BITS;
#pragma unroll
          for (int i = 0; i < BITS; ++i) wd[cc][i] = __ldg(pw + i);
          const int64_t g = wrow * (K / wmm.group) + kc / wmm.group;
          wsc[cc] = load_any(wpp.scales, g, wmm.dtype);
          wbi[cc] = load_any(wpp.biases, g, wmm.dtype);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < XN; ++j) {
      xv[j] = make_uint4(0, 0, 0, 0);
      if (xsrc[j] && k0 + xq * 8 < K) xv[j] = __ldg(reinterpret_cast<const uint4*>(xsrc[j] + k0) + xq);
    }
  };
  auto store = [&](int64_t k0) {  // registers (dequantized) into the shared tiles
    if (wthread) {
#pragma unroll
      for (int cc = 0; cc < CPS; ++cc) {
        const int64_t kc = k0 + cc * 32;
        uint4* dst = reinterpret_cast<uint4*>(Ws + (wmat * BN + wrr) * LDS + cc * 32);
        if constexpr (BITS > 0) {
          uint32_t o[16];
          if (wrow_ok && kc < K) {
            dequant_words_packed<BITS>(wd[cc], wsc[cc], wbi[cc], o);
          } else {
#pragma unroll
            for (int q = 0; q < 16; ++q) o[q] = 0u;
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) dst[q] = make_uint4(o[4 * q], o[4 * q + 1], o[4 * q + 2], o[4 * q + 3]);
        } else {
          __nv_bfloat16 tmp[32];
          if (wrow_ok && kc < K) {
            dequant_chunk_bf16<0>(wpp.data, wpp.scales, wpp.biases, wmm.dtype, K, wmm.group, wrow, kc, tmp);
          } else {
#pragma unroll
            for (int q = 0; q < 32; ++q) tmp[q] = __float2bfloat16_rn(0.0f);
          }
#pragma unroll
          for (int q = 0; q < 4; ++q) dst[q] = *reinterpret_cast<const uint4*>(tmp + q * 8);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < XN; ++j) *reinterpret_cast<uint4*>(Xs + (tid / QPR + RP * j) * LDS + xq * 8) = xv[j];
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[M][2][2];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[m][i][j], 0.0f);

  fetch(0);
  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    store(k0);  // the barrier that ended the previous step freed the tiles
    __syncthreads();
    if (k0 + BK < K) fetch(k0 + BK);  // in flight during this step's mmas
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(fa[i], Xs + (wm + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(fb[j], Ws + (m * BN + wn + j * 16) * LDS + kk, LDS);
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[m][i][j], fa[i], fb[j], acc[m][i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(Cs + m * BM * LDC + (wm + i * 16) * LDC + wn + j * 16, acc[m][i][j], LDC,
                                wmma::mem_row_major);
  __syncthreads();
  for (int i = tid; i < BM * BN; i += 128) {
    const int r = i / BN, c = i % BN;
    const int64_t n = n0 + c;
    if (r >= np || n >= N) continue;
    const int64_t pos = p0 + r;
    if constexpr (SWIGLU) {
      static_cast<__nv_bfloat16*>(a.out)[pos * N + n] =
          __float2bfloat16_rn(silu_mul(Cs[r * LDC + c], Cs[BM * LDC + r * LDC + c]));
    } else {
      static_cast<float*>(a.out)[pos * N + n] = Cs[r * LDC + c];
    }
  }
}

// out[t, n] = sum over the token's slots in top-k order of wt * y[pos_of[slot], n] (+ shared), bf16.
__global__ void combine_kernel(MoECombineArgs a) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(a.T) * a.H) return;
  const int64_t t = i / a.H, n = i % a.H;
  float acc = 0.0f;
  for (int s = 0; s < a.n_slots; ++s) {
    const int64_t pair = t * a.k + s;
    acc += a.wt[pair] * a.y[int64_t(a.pos_of[pair]) * a.H + n];
  }
  if (a.shared_out) acc += a.shared_coef[t] * __bfloat162float(static_cast<const __nv_bfloat16*>(a.shared_out)[i]);
  static_cast<__nv_bfloat16*>(a.out)[i] = __float2bfloat16_rn(acc);
}

// route_cluster_kernel unless ANVIL_MOE_ROUTE_CLUSTER=0 (route_kernel: the device-wide counter).
bool route_cluster_on() {
  static const bool on = [] {
    const char* e = std::getenv("ANVIL_MOE_ROUTE_CLUSTER");
    if (e && *e == '0') return false;
    int dev = 0, major = 0;  // thread block clusters: compute capability 9.0 and later
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}

unsigned blocks_for(int64_t warps) { return unsigned((warps + kWarps - 1) / kWarps); }

// f(std::integral_constant<int, FMT>{}) for the router's format (moe_fmt).
template <class F>
cudaError_t by_router_fmt(const DevMatrix& m, F&& f) {
  switch (moe_fmt(m.bits, m.dtype)) {
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 16: return f(std::integral_constant<int, 16>{});
    case 17: return f(std::integral_constant<int, 17>{});
    case 32: return f(std::integral_constant<int, 32>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t moe_route(const MoERouteArgs& args, cudaStream_t s) {
  if (args.E < 1 || args.E > kMoEMaxExperts || args.k < 1 || args.k > args.E || args.k > kMoEMaxTopK ||
      args.H % 32 != 0)
    return cudaErrorInvalidValue;
  // The cluster kernel pulls its router rows into L1 before its PDL wait (session 43; the default since
  // session 44: qwen3-30b-a3b q4g64 +1.2% on an H100 over four rounds). ANVIL_MOE_ROUTE_EARLY=0: after it.
  static const bool early = [] {
    const char* e = std::getenv("ANVIL_MOE_ROUTE_EARLY");
    return !(e && *e == '0');
  }();
  MoERouteArgs a = args;
  a.early = early;
  const unsigned tiles = unsigned((a.T + kRouteTok - 1) / kRouteTok);
  // One tile (decode, up to 8 tokens) in a cluster; longer batches (prefill: many tiles, where the
  // counter's latency is amortized and block 0 would route 8 tokens one after another) as before.
  if (route_cluster_on() && a.T <= kRouteTok) {
    const int C = std::min(kRouteCMaxCluster, (a.E + kRouteCWarps - 1) / kRouteCWarps);
    const dim3 grid(unsigned(C), tiles), block(kRouteCWarps * 32);
    return by_router_fmt(a.router, [&](auto fmt) {
      return launch_kc(route_cluster_kernel<decltype(fmt)::value>, grid, block, 0, s, C, a);
    });
  }
  const dim3 grid(unsigned((a.E + kWarps - 1) / kWarps), tiles), block(kWarps * 32);
  return by_router_fmt(a.router, [&](auto fmt) {
    launch_k(route_kernel<decltype(fmt)::value>, grid, block, 0, s, a);
    return cudaGetLastError();
  });
}

cudaError_t moe_gate_up(const MoEGateUpArgs& a, cudaStream_t s) {
  const int64_t warps = (a.routed ? int64_t(a.T) * a.k * a.gate.rows : 0) + int64_t(a.T) * a.shared_rows;
  if (warps == 0) return cudaSuccess;
  if (a.stream && a.routed && a.shared_rows == 0 && a.gate.fmt == 4) return moe_stream_gate_up(a, s);
  const dim3 grid(blocks_for(warps)), block(kWarps * 32);
  switch (a.gate.fmt) {
    case 2: launch_k(gate_up_kernel<2>, grid, block, 0, s, a); break;
    case 3: launch_k(gate_up_kernel<3>, grid, block, 0, s, a); break;
    case 4: launch_k(gate_up_kernel<4>, grid, block, 0, s, a); break;
    case 5: launch_k(gate_up_kernel<5>, grid, block, 0, s, a); break;
    case 6: launch_k(gate_up_kernel<6>, grid, block, 0, s, a); break;
    case 8: launch_k(gate_up_kernel<8>, grid, block, 0, s, a); break;
    case 16: launch_k(gate_up_kernel<16>, grid, block, 0, s, a); break;
    case 17: launch_k(gate_up_kernel<17>, grid, block, 0, s, a); break;
    case 32: launch_k(gate_up_kernel<32>, grid, block, 0, s, a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t moe_down(const MoEDownArgs& a, cudaStream_t s) {
  if (a.stream && a.n_slots == a.k && a.shared_cols == 0 && a.down.fmt == 4) return moe_stream_down(a, s);
  const dim3 grid(blocks_for(int64_t(a.T) * a.down.rows)), block(kWarps * 32);
  switch (a.down.fmt) {
    case 2: launch_k(down_kernel<2>, grid, block, 0, s, a); break;
    case 3: launch_k(down_kernel<3>, grid, block, 0, s, a); break;
    case 4: launch_k(down_kernel<4>, grid, block, 0, s, a); break;
    case 5: launch_k(down_kernel<5>, grid, block, 0, s, a); break;
    case 6: launch_k(down_kernel<6>, grid, block, 0, s, a); break;
    case 8: launch_k(down_kernel<8>, grid, block, 0, s, a); break;
    case 16: launch_k(down_kernel<16>, grid, block, 0, s, a); break;
    case 17: launch_k(down_kernel<17>, grid, block, 0, s, a); break;
    case 32: launch_k(down_kernel<32>, grid, block, 0, s, a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t moe_group(const MoEGroupArgs& a, cudaStream_t s) {
  if (a.E < 1 || a.E > kMoEMaxExperts) return cudaErrorInvalidValue;
  launch_k(group_kernel, dim3(1), dim3(1024), 0, s, a);
  return cudaGetLastError();
}

namespace {
template <bool SWIGLU>
cudaError_t grouped(const MoEGroupedArgs& a, cudaStream_t s) {
  const dim3 grid(unsigned((a.w.rows + BN - 1) / BN), unsigned(moe_max_tiles(a.A, a.E))), block(128);
  // Dense weights of any dtype go through BITS 0 (converted element by element).
  switch (a.w.fmt) {
    case 2: launch_k(grouped_kernel<2, SWIGLU>, grid, block, 0, s, a); break;
    case 3: launch_k(grouped_kernel<3, SWIGLU>, grid, block, 0, s, a); break;
    case 4: launch_k(grouped_kernel<4, SWIGLU>, grid, block, 0, s, a); break;
    case 5: launch_k(grouped_kernel<5, SWIGLU>, grid, block, 0, s, a); break;
    case 6: launch_k(grouped_kernel<6, SWIGLU>, grid, block, 0, s, a); break;
    case 8: launch_k(grouped_kernel<8, SWIGLU>, grid, block, 0, s, a); break;
    case 16:
    case 17:
    case 32: launch_k(grouped_kernel<0, SWIGLU>, grid, block, 0, s, a); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}
}  // namespace

cudaError_t moe_grouped_gate_up(const MoEGroupedArgs& a, cudaStream_t s) { return grouped<true>(a, s); }
cudaError_t moe_grouped_down(const MoEGroupedArgs& a, cudaStream_t s) { return grouped<false>(a, s); }

cudaError_t moe_combine(const MoECombineArgs& a, cudaStream_t s) {
  const int64_t n = int64_t(a.T) * a.H;
  launch_k(combine_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, s, a);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
