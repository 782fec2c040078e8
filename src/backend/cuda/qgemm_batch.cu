// The q4 tensor-core product for batches of 17..64 rows (batched decode: the server's steps, short
// prompts): gemv_tc's path there when the caller gives it scratch memory (GemvScratch). At 16
// sequences the register-fed kernel was faster on the H200 (a qwen3-8b q4g64 step 6.1 against 7.1
// ms), from 32 this one (10.9 against 12.4 ms; 64: 15.2 against 22.5): kBatchMinTokens.
//
// Why: the register-fed kernel (qgemv_tc.cu) gives each warp a 16-row tile and re-reads every
// token's activations from L2 for every tile: T/4 bytes of activations per byte of weights, and a
// 32-sequence qwen3-8b q4g64 step took 12.4 ms on the H200 (2,587 tok/s) where reading the weights
// once takes ~1.5 ms. Here a block of 4 warps owns 64 rows (W warps of R 16-row tiles each: 16WR
// rows, with ANVIL_QGEMM_BATCH's fourth and fifth fields), and the warps walk K together, step
// (128 elements) by step, through a ring of kBS stages in shared memory filled by cp.async. A stage
// holds each warp's weights (every lane copies its own 16 bytes of rows g and g+8, as in the
// streamed decode kernel) and the step's activations for all tokens, copied once per block and
// shared by the 4 warps. By default (PX, GemvScratch::plain_x) a stage copies x as it is and the
// weights are dequantized in the k order that makes 8 consecutive bytes of a token's row one mma's
// B fragment (see PX below); with ANVIL_QGEMM_PLAIN_X=0 (and in 8-warp blocks) the activations are
// first rewritten in mma fragment order by permute_x_kernel, one launch more per batched matrix
// (on an H100 the 32- and 64-sequence qwen3-8b q4g64 steps took 5.91 and 9.40 ms that way, 5.59
// and 9.01 with PX; session 32), and in shared memory a token's 8 fragments are XOR-swizzled by
// (token & 3), so the 16 lanes of a half-warp read 16 different bank pairs.
// The step's A fragments (dequantized weights, qgemv_tc.cuh) are built once and used for all NT
// token tiles of 8 (up to 64 tokens); with R = 2 each B fragment (activations) serves both tiles.
// On the H200 no shape beat the default (R = 1, W = 4) at both 32 and 64 sequences: benchmarks.md.
//
// K is split over gridDim.y blocks when there are fewer than two blocks per SM. A split's
// steps cover a multiple of 8 groups (the block's scales are copied in 16-byte pieces, and
// K/group % 8 == 0): a multiple of group/16 steps (4 at group 64),
// its fp32 partial sums go to GemvScratch::part, and split_sum_kernel (launched next; by default)
// or the last block of a row block to finish (a counter per row block; the block resets it to 0)
// adds the splits in split order, so the result does not depend on which block finishes last, and
// writes the outputs. Where thread block clusters cost no wave (batch_plan), a row block's splits
// are one cluster instead and add the same sums, in the same order, over distributed shared memory
// (the kernel's epilogue). The ring depth and the split come from one of two planners (plan_mode).
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <cooperative_groups.h>

#include "backend/cuda/prefetch_ranges.h"
#include "backend/cuda/qgemv_tc.cuh"

namespace anvil::cuda::tc {
namespace {

namespace cg = cooperative_groups;

constexpr size_t kBSmemMax = 200 * 1024;

// The launch shape: ring stages S (S - 1 in flight while one is used), the shared memory a block
// aims to stay under (113 KB: two blocks per SM), the blocks aimed for per SM (K is split until
// there are that many), the warps per block W and the 16-row tiles per warp R (R = 2 shares each
// activation fragment between two tiles; taken where the accumulators stay at 64 floats, not for
// gate/up at 33..64 tokens). The ring: 6 stages up to 32 tokens, 4 beyond. Measured on the H200
// (session 19, a qwen3-8b q4g64 step, bench-kv, twice each): 32 sequences 6.82 / 6.81 ms with 4
// stages, 6.70 / 6.72 with 6 (6.69 aiming at 75 KB and 3 blocks per SM; 8 stages 7.49); at 64
// sequences, where a stage holds 64 tokens' activations, 6 stages fit one block per SM: 13.5 against
// 11.0 ms. ANVIL_QGEMM_BATCH=S,KB,F[,W[,R]] overrides them (S 3 or 4, or 6 or 8 with
// W = 4; W 4 or 8; R 1 or 2), for measuring: under the wave planner, or with ANVIL_QGEMM_PLAN=2
// under the measured-cost one, S then the deepest ring it may choose.
struct Tune {
  int S = 0;  // 0: 6 stages up to 32 tokens (NT = 4), 4 beyond (3 with PX: batch_plan)
  size_t soft = 113 * 1024;
  int per_sm = 2;
  int W = 4;
  int R = 1;  // the override's; by default batch_plan takes 2 beyond 32 tokens
};
const Tune& tune() {
  static const Tune t = [] {
    Tune v;
    const char* e = std::getenv("ANVIL_QGEMM_BATCH");
    int s = 0, kb = 0, f = 0, w = 4, r = 1;
    const int got = e ? std::sscanf(e, "%d,%d,%d,%d,%d", &s, &kb, &f, &w, &r) : 0;
    if (got >= 3 && (s == 3 || s == 4 || ((s == 6 || s == 8) && w == 4)) && kb >= 16 && kb <= 200 && f >= 1 && f <= 16 &&
        (w == 4 || w == 8) &&
        (r == 1 || r == 2))
      v.S = s, v.soft = size_t(kb) * 1024, v.per_sm = f, v.W = w, v.R = r;
    return v;
  }();
  return t;
}

// The gate/up + SwiGLU launches' own block shape, for measuring (session 23, not yet run on a GPU):
// ANVIL_QGEMM_GATEUP=W,R with W 4 or 8 warps and R 1 or 2 tiles per warp (R = 2 only up to 32
// tokens, where the accumulators stay at 64 floats). gate/up is the largest launch of a batched
// step (qwen3-8b at 64 sequences: 74 of ~176 us per layer), and the shape runs that changed every
// launch at once could not tell its share (benchmarks.md, session 23). {0, 0}: the default shape.
// A third field, ANVIL_QGEMM_GATEUP=W,R,KS, also holds gate/up's K split at KS (session 31, for
// measuring): its split partials are two matrices' fp32 sums, at 64 tokens and 4 splits ~25 MB
// written and read again per qwen3-8b layer, which the planners price like any other launch's.
struct GateUpShape {
  int W = 0, R = 0, ks = 0;
};
const GateUpShape& gateup_shape() {
  static const GateUpShape g = [] {
    GateUpShape v;
    const char* e = std::getenv("ANVIL_QGEMM_GATEUP");
    int w = 0, r = 1, ks = 0;
    const int got = e ? std::sscanf(e, "%d,%d,%d", &w, &r, &ks) : 0;
    if (got >= 1 && (w == 4 || w == 8) && (r == 1 || r == 2)) v.W = w, v.R = r, v.ks = ks >= 1 && ks <= 16 ? ks : 0;
    return v;
  }();
  return g;
}

// A token's 32-element piece at element el0 of its row as 16 words (bf16 pairs); zeros for tokens
// past T (the padding up to TP).
__device__ __forceinline__ void load_piece(const __nv_bfloat16* x, int t, int T, int64_t K, int64_t el0,
                                           uint32_t (&w)[16]) {
  if (t < T) {
    const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(t) * K + el0);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint4 v = __ldg(src + i);
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = 0u;
  }
}
// The activations lane c's A fragments of mma j meet in its piece (as step_mma builds them): .x
// elements (e0, e0 + 4), .y (e0 + 1, e0 + 5), e0 = 8 (j >> 1) + 2 (j & 1).
__device__ __forceinline__ uint2 piece_frag(const uint32_t (&w)[16], int j) {
  const int e0 = 8 * (j >> 1) + 2 * (j & 1);
  const uint32_t lo0 = w[e0 / 2], lo4 = w[e0 / 2 + 2];
  return make_uint2(__byte_perm(lo0, lo4, 0x5410), __byte_perm(lo0, lo4, 0x7632));
}

// x [T][K] bf16 -> out [TP][K/128 steps][8 mmas j][4 lanes c] uint2 (fragment order: mma j's (b0, b1)
// for lane c of token t); tokens T..TP-1 are zeros.
__global__ void permute_x_kernel(const __nv_bfloat16* x, int T, int TP, int K, uint2* out) {
  pdl_launch();
  pdl_wait();
  const int chunks = K / 32;  // per token: step * 4 + c
  const int64_t total = int64_t(TP) * chunks;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < total; q += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(q / chunks), ch = int(q % chunks);
    uint32_t w[16];
    load_piece(x, t, T, K, int64_t(ch) * 32, w);
    uint2* o = out + (int64_t(t) * (K / 128) + (ch >> 2)) * 32 + (ch & 3);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j * 4] = piece_frag(w, j);
  }
}

// The 4 bf16 pairs of A fragment j (16 k of rows g and g+8) from a step's weights, scales and biases.
__device__ __forceinline__ void step_frags(const Step& q, int j, uint32_t (&af)[4]) {
  const int word = j >> 1, sh = (j & 1) * 8;
  const uint32_t wa = word == 0 ? q.wa.x : word == 1 ? q.wa.y : word == 2 ? q.wa.z : q.wa.w;
  const uint32_t wb = word == 0 ? q.wb.x : word == 1 ? q.wb.y : word == 2 ? q.wb.z : q.wb.w;
  af[0] = dq_pair(wa, sh, q.sa, q.ba);
  af[1] = dq_pair(wb, sh, q.sb, q.bb);
  af[2] = dq_pair(wa, sh + 4, q.sa, q.ba);
  af[3] = dq_pair(wb, sh + 4, q.sb, q.bb);
}

// PX (the default since session 32; ANVIL_QGEMM_PLAIN_X=0 turns it off): the activations copied as they are,
// [T][K] bf16, with no permute_x_kernel launch before each batch launch. The k order inside a
// lane's 32-element chunk is then (e, e + 1) pairs: mma j = 2w + h takes word w's bytes 2h (its
// a0/a1, b0) and 2h + 1 (a2/a3, b1), i.e. elements 8w + 4h .. 8w + 4h + 3 of the chunk, which
// are 8 consecutive bytes of x, so one 16-byte shared load serves mmas 2w and 2w + 1. A pair
// (lo, hi nibble of a byte) is dequantized as dq_pair does (128 + q, one lop3, the bias and scale
// in bf16x2): a byte permute puts byte i of w and of w >> 4 in the two halves first. In shared
// memory token t's 16 pieces (16 bytes each) sit at slot q ^ (2 * (q >> 3 & 1) + (t & 1)), so the
// 8 lanes of each quarter-warp (tokens g, g + 1; chunks c 0..3) read 8 different bank groups.
__device__ __forceinline__ uint32_t dq_byte_pair(uint32_t w, uint32_t w4, int i, __nv_bfloat162 s2, __nv_bfloat162 b2) {
  const uint32_t sel = uint32_t(i) | (uint32_t(i) << 4) | (uint32_t(4 + i) << 8) | (uint32_t(4 + i) << 12);
  uint32_t p;  // bf16 pair (128 + lo nibble of byte i, 128 + its hi nibble)
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(p) : "r"(__byte_perm(w, w4, sel)), "r"(0x000F000Fu), "r"(0x43004300u));
  const __nv_bfloat162 q = __hsub2(u32_as_bf2(p), __floats2bfloat162_rn(128.0f, 128.0f));
  return bf2_as_u32(__hfma2(q, s2, b2));
}
// The A fragments of mmas 2w and 2w + 1 in PX order: af[h] for mma 2w + h.
__device__ __forceinline__ void step_frags_px(const Step& q, int w, uint32_t (&af)[2][4]) {
  const uint32_t wa = w == 0 ? q.wa.x : w == 1 ? q.wa.y : w == 2 ? q.wa.z : q.wa.w;
  const uint32_t wb = w == 0 ? q.wb.x : w == 1 ? q.wb.y : w == 2 ? q.wb.z : q.wb.w;
  const uint32_t wa4 = wa >> 4, wb4 = wb >> 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    af[h][0] = dq_byte_pair(wa, wa4, 2 * h, q.sa, q.ba);
    af[h][1] = dq_byte_pair(wb, wb4, 2 * h, q.sb, q.bb);
    af[h][2] = dq_byte_pair(wa, wa4, 2 * h + 1, q.sa, q.ba);
    af[h][3] = dq_byte_pair(wb, wb4, 2 * h + 1, q.sb, q.bb);
  }
}
__device__ __forceinline__ int px_slot(int t, int q) { return q ^ ((((q >> 3) & 1) << 1) | (t & 1)); }

struct BatchArgs {
  const uint4* xperm;  // permute_x_kernel's output (unused with PX: the kernel reads p.x)
  int sps;             // steps per split (a multiple of group/16 steps unless one split takes all)
  int ngp;             // row stride of the staged scales (the most groups a split spans + 8)
  int64_t part_rows;   // rows of the partial-sum layout: row blocks * 64
  float* part;         // [split][M][TP][part_rows] (gridDim.y > 1)
  unsigned* done;      // [row blocks], zero between launches
  int cluster;         // 1: the splits of a row block are one thread block cluster (BatchPlan::cluster)
  int sum_kernel;      // 1: split_sum_kernel adds the partials (BatchPlan::sum_kernel)
  // The wave-ahead prefetch (ANVIL_QGEMM_WAVE_PF, off by default): block i (x fastest) pulls the
  // weights of block i + pf_wave, which runs in a later wave, into L2 before its PDL wait; pf_keep:
  // with the evict_last priority. 0: off (and always with clusters).
  int64_t pf_wave = 0;
  int pf_keep = 0;
};

// The segment (matrix) of block-row blk: batch_launch sets tile_begin to count blocks of the
// kernel's rows (16 W R), so the batch kernel and the sum kernels find a row block's matrix alike.
__device__ __forceinline__ const TcSeg& batch_seg(const TcParams& p, int64_t blk) {
  int si = 0;
  if (p.n_seg > 1 && blk >= p.seg[1].tile_begin) si = 1;
  if (p.n_seg > 2 && blk >= p.seg[2].tile_begin) si = 2;
  return p.seg[si];
}

template <bool SWIGLU, int NT, int kBS, int kBW, int RT, bool PX = false>
__global__ void __launch_bounds__(kBW * 32) qgemm4_batch_kernel(TcParams p, BatchArgs a) {
  constexpr int M = SWIGLU ? 2 : 1, TP = 8 * NT;
  constexpr int kThreads = kBW * 32;
  constexpr int kWRows = 16 * RT;       // rows per warp: RT tiles of 16
  constexpr int kBRows = kWRows * kBW;  // rows per block
  constexpr int WW = M * RT * 64;       // uint4 of one warp's weights per stage: [M][RT][2 rows][32 lanes]
  constexpr int WB = kBW * WW;          // every warp's
  constexpr int AB = TP * 16;           // uint4 of activations per stage: [TP][8 j][4 c] uint2
  constexpr int SB = WB + AB;           // a stage
  constexpr int XI = AB / kThreads;     // activation copies per thread per stage
  static_assert(AB % kThreads == 0 && kThreads % 64 == 0, "the activation copy's thread mapping");
  extern __shared__ __align__(16) uint8_t smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(ring + kBS * SB);  // [M*2][kBRows][ngp]
  pdl_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int64_t blk = blockIdx.x;
  const TcSeg& m = batch_seg(p, blk);
  const int64_t rb0 = (blk - m.tile_begin) * kBRows;
  const int K = int(p.K), steps = K / 128;
  const int gshift = group_shift(p.group), ng = K >> gshift;
  const int s_begin = int(blockIdx.y) * a.sps;
  const int n = min(steps, s_begin + a.sps) - s_begin;
  const int g_begin = (s_begin * 128) >> gshift, ngr = (n * 128) >> gshift;

  // The block's scales and biases over its steps (part of cp.async group 0).
  const int pieces = ngr / 8;
  for (int i = threadIdx.x; i < M * 2 * kBRows * pieces; i += kThreads) {
    const int piece = i % pieces, r = (i / pieces) % kBRows, arr = i / (pieces * kBRows);
    const TcSeg& mm = (arr >> 1) ? p.up : m;
    const __nv_bfloat16* src =
        ((arr & 1) ? mm.biases : mm.scales) + min(rb0 + r, m.rows - 1) * int64_t(ng) + g_begin + piece * 8;
    cp_async16(sc + (size_t(arr) * kBRows + r) * a.ngp + piece * 8, src);
  }
  // This lane's weight rows (g and g + 8 of each of the warp's tiles; past the end: the last row,
  // its products never stored) from step s_begin, its 16 bytes of a step's 64 per row at chunk c.
  const int64_t wr = rb0 + warp * kWRows;
  int64_t roff[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int h = 0; h < 2; ++h) roff[rt][h] = min(wr + rt * 16 + g + 8 * h, m.rows - 1) * (K / 32) + s_begin * 4 + c;
  const uint4* wsrc[M];
  wsrc[0] = reinterpret_cast<const uint4*>(m.w);
  if constexpr (SWIGLU) wsrc[M - 1] = reinterpret_cast<const uint4*>(p.up.w);
  // issue_w and issue_x are called for i = 0, 1, 2, ... in order, so each keeps its next source
  // pointers and ring slot and steps them (SASS: the per-step 64-bit address arithmetic of the
  // copies was ~90 of the loop's 343 instructions at 32 rows).
  const uint4* wnext[M][RT][2];
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int h = 0; h < 2; ++h) wnext[mi][rt][h] = wsrc[mi] + roff[rt][h];
  int wslot = 0;
  auto issue_w = [&](int) {
    uint4* st = ring + wslot * SB + warp * WW + lane;
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          cp_async16(st + (mi * RT + rt) * 64 + h * 32, wnext[mi][rt][h]);
          wnext[mi][rt][h] += 4;
        }
    wslot = wslot + 1 == kBS ? 0 : wslot + 1;
  };
  // The activations: thread q copies elements q + k * kThreads of the stage's [TP][8][2] uint4, i.e.
  // token (q >> 4) + k * kThreads / 16, fragment pair (q >> 1) & 7, half q & 1, whose XOR swizzle
  // (token & 3) is the same for every k (kThreads / 16 is a multiple of 4).
  // With PX: token (q >> 4) + k * kThreads / 16, piece q & 15 of its 16 per step, from x itself
  // (tokens past T read token T - 1: their columns are never stored), into its swizzled slot.
  const int xt = threadIdx.x >> 4, xj = (threadIdx.x >> 1) & 7, xh = threadIdx.x & 1;
  const int xdst = PX ? xt * 16 + px_slot(xt, threadIdx.x & 15) : xt * 16 + (xj ^ (xt & 3)) * 2 + xh;
  constexpr int xadv = 16;  // source distance of one step
  const uint4* xnext[XI];
  if constexpr (PX) {
    const uint4* x4 = reinterpret_cast<const uint4*>(p.x);
#pragma unroll
    for (int k = 0; k < XI; ++k)
      xnext[k] = x4 + int64_t(min(xt + k * (kThreads / 16), p.T - 1)) * (K / 8) + int64_t(s_begin) * 16 + (threadIdx.x & 15);
  } else {
    const uint4* xsrc = a.xperm + int64_t(s_begin) * 16 + int64_t(xt) * steps * 16 + xj * 2 + xh;
    const int64_t xstep_t = int64_t(kThreads / 16) * steps * 16;  // source distance of k -> k + 1
#pragma unroll
    for (int k = 0; k < XI; ++k) xnext[k] = xsrc + k * xstep_t;
  }
  int xslot = 0;
  auto issue_x = [&](int) {
    uint4* st = ring + xslot * SB + WB + xdst;
#pragma unroll
    for (int k = 0; k < XI; ++k) {
      cp_async16(st + k * kThreads, xnext[k]);
      xnext[k] += xadv;
    }
    xslot = xslot + 1 == kBS ? 0 : xslot + 1;
  };
  // Weights (never written by a kernel) before the wait for the previous kernel, activations after.
  // Groups: W0 .. W(kBS-2), X0 .. X(kBS-2), then one per step; at step i, wait<kBS-2> leaves only
  // the newest kBS-2 groups in flight, so stage i (W and X) has landed.
#pragma unroll
  for (int i = 0; i < kBS - 1; ++i) {
    if (i < n) issue_w(i);
    cp_async_commit();
  }
  if (a.pf_wave > 0) {
    // Block i + pf_wave's rows over its steps: one contiguous range per (matrix, row), a thread each.
    int64_t nbx = 0, nby = 0;
    if (batch_block_after(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, a.pf_wave, &nbx, &nby)) {
      const TcSeg& nm = batch_seg(p, nbx);
      const int64_t nrb0 = (nbx - nm.tile_begin) * kBRows;
      const int ns0 = int(nby) * a.sps, nn = min(steps, ns0 + a.sps) - ns0;
      for (int t = threadIdx.x; t < M * kBRows && nn > 0; t += kThreads) {
        const int64_t row = nrb0 + t % kBRows;
        if (row >= nm.rows) continue;
        const ByteRange r = batch_row_range(row, K, ns0, nn);
        const uint8_t* w = reinterpret_cast<const uint8_t*>(t >= kBRows ? p.up.w : nm.w);
        prefetch_l2_bulk(w + r.off, uint32_t(r.bytes), a.pf_keep != 0);
      }
    }
  }
  pdl_wait();
#pragma unroll
  for (int i = 0; i < kBS - 1; ++i) {
    if (i < n) issue_x(i);
    cp_async_commit();
  }

  float d[M][RT][NT][4] = {};
  // Lane (g, c)'s B fragment of mma j, token tile nt: uint2 ((8 nt + g) * 8 + (j ^ (g & 3))) * 4 + c
  // of the stage's activations = xo[j & 3] + (j & 4) * 4 + nt * 256.
  int xo[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) xo[q] = g * 32 + (q ^ (g & 3)) * 4 + c;
  // PX: lane (g, c)'s 16 bytes for mmas 2w, 2w + 1 of token g (+ 8 nt): piece 4c + w, swizzled.
  int xo4[4];
#pragma unroll
  for (int w = 0; w < 4; ++w) xo4[w] = g * 16 + px_slot(g, 4 * c + w);
  const int wrow = warp * kWRows + g;
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kBS - 2>();
    __syncthreads();  // every thread's copies of stage i landed; every warp is done with stage i-1
    if (i + kBS - 1 < n) {
      issue_w(i + kBS - 1);  // into stage i-1's slot
      issue_x(i + kBS - 1);
    }
    cp_async_commit();
    const uint4* st = ring + (i % kBS) * SB;
    const uint4* wsl = st + warp * WW + lane;
    const int gi = (((s_begin + i) * 128 + c * 32) >> gshift) - g_begin;
    Step s[M][RT];
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const __nv_bfloat16* sca = sc + (size_t(2 * mi) * kBRows + wrow + rt * 16) * a.ngp + gi;
        const __nv_bfloat16* bia = sca + size_t(kBRows) * a.ngp;
        s[mi][rt].wa = wsl[(mi * RT + rt) * 64];
        s[mi][rt].wb = wsl[(mi * RT + rt) * 64 + 32];
        s[mi][rt].sa = __bfloat162bfloat162(sca[0]);
        s[mi][rt].ba = __bfloat162bfloat162(bia[0]);
        s[mi][rt].sb = __bfloat162bfloat162(sca[8 * a.ngp]);
        s[mi][rt].bb = __bfloat162bfloat162(bia[8 * a.ngp]);
      }
    if constexpr (PX) {
      const uint4* xs4 = st + WB;
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t af[M][RT][2][4];
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) step_frags_px(s[mi][rt], w, af[mi][rt]);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 b = xs4[xo4[w] + nt * 128];  // token 8 nt + g: mmas 2w (.x, .y) and 2w + 1 (.z, .w)
#pragma unroll
          for (int mi = 0; mi < M; ++mi)
#pragma unroll
            for (int rt = 0; rt < RT; ++rt) {
              const uint32_t(&f0)[4] = af[mi][rt][0];
              const uint32_t(&f1)[4] = af[mi][rt][1];
              mma_bf16(d[mi][rt][nt], f0[0], f0[1], f0[2], f0[3], b.x, b.y);
              mma_bf16(d[mi][rt][nt], f1[0], f1[1], f1[2], f1[3], b.z, b.w);
            }
        }
      }
    } else {
      const uint2* xs = reinterpret_cast<const uint2*>(st + WB);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t af[M][RT][4];
#pragma unroll
        for (int mi = 0; mi < M; ++mi)
#pragma unroll
          for (int rt = 0; rt < RT; ++rt) step_frags(s[mi][rt], j, af[mi][rt]);
        const uint2* xj = xs + xo[j & 3] + (j & 4) * 4;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 b = xj[nt * 256];
#pragma unroll
          for (int mi = 0; mi < M; ++mi)
#pragma unroll
            for (int rt = 0; rt < RT; ++rt)
              mma_bf16(d[mi][rt][nt], af[mi][rt][0], af[mi][rt][1], af[mi][rt][2], af[mi][rt][3], b.x, b.y);
        }
      }
    }
  }

  // acc element i of tile (rt, nt): row 16 rt + g (+8 for i >= 2) of this warp's rows, token
  // 8*nt + 2c + (i & 1).
  if (gridDim.y == 1) {
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int t = 8 * nt + 2 * c + (i & 1);
          const int64_t row = wr + rt * 16 + g + (i >> 1) * 8;
          if (t < p.T && row < m.rows) store_out<SWIGLU>(p, m, row, t, d[0][rt][nt][i], d[M - 1][rt][nt][i]);
        }
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (a.cluster) {
    // The splits of a row block are one cluster along y: each block leaves its partial sums in its
    // own shared memory (over the ring, which it is done with), and after a cluster barrier block y
    // sums its 1/gridDim.y of the row block's (token, row) outputs over the splits in split order,
    // reading its peers' shared memory, and writes them: the same sums as the path below, without
    // the round trip through global memory and the one block that adds them all.
    constexpr int LD = kBRows + 4;  // row stride: the 4 lanes c (tokens 2c) on different banks
    static_assert(size_t(kBS) * SB * 16 >= size_t(M) * TP * LD * 4, "the partial sums fit in the ring");
    float* red = reinterpret_cast<float*>(smem);  // [M][TP][LD]
    __syncthreads();                              // every warp is done with the ring
#pragma unroll
    for (int mi = 0; mi < M; ++mi)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            red[(mi * TP + 8 * nt + 2 * c + (i & 1)) * LD + wrow + rt * 16 + (i >> 1) * 8] = d[mi][rt][nt][i];
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int ks = int(gridDim.y), E = kBRows * p.T;
    const int e_end = int(int64_t(E) * (blockIdx.y + 1) / ks);
    for (int e = int(int64_t(E) * blockIdx.y / ks) + int(threadIdx.x); e < e_end; e += kThreads) {
      const int lr = e % kBRows, t = e / kBRows;
      float v = 0.0f, u = 0.0f;
      for (int sp = 0; sp < ks; ++sp) {
        const float* r = cl.map_shared_rank(red, sp);
        v += r[t * LD + lr];
        if constexpr (SWIGLU) u += r[(TP + t) * LD + lr];
      }
      if (rb0 + lr < m.rows) store_out<SWIGLU>(p, m, rb0 + lr, t, v, u);
    }
    cl.sync();  // no block leaves while a peer may still read its partial sums
    return;
  }
#endif
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int rt = 0; rt < RT; ++rt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int t = 8 * nt + 2 * c + (i & 1);
          if (t >= p.T) continue;
          const int64_t prow = blk * kBRows + wrow + rt * 16 + (i >> 1) * 8;
          a.part[((int64_t(blockIdx.y) * M + mi) * TP + t) * a.part_rows + prow] = d[mi][rt][nt][i];
        }
  if (a.sum_kernel) return;  // split_sum_kernel, launched next, adds them
  __threadfence();  // this block's partials are visible device-wide before it counts itself
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(a.done + blk, 1u) == gridDim.y - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // (Loading 8 outputs' partials of every split before adding them, instead of this one-output
  // loop, measured slower on the H200: a 32-sequence step 7.46 against 6.80 ms, session 21.)
  for (int e = threadIdx.x; e < kBRows * p.T; e += kThreads) {
    const int lr = e % kBRows, t = e / kBRows;
    const int64_t row = rb0 + lr;
    if (row >= m.rows) continue;
    float v = 0.0f, u = 0.0f;
    for (int sp = 0; sp < int(gridDim.y); ++sp) {
      v += __ldcg(a.part + ((int64_t(sp) * M) * TP + t) * a.part_rows + blk * kBRows + lr);
      if constexpr (SWIGLU) u += __ldcg(a.part + ((int64_t(sp) * M + 1) * TP + t) * a.part_rows + blk * kBRows + lr);
    }
    store_out<SWIGLU>(p, m, row, t, v, u);
  }
  if (threadIdx.x == 0) a.done[blk] = 0u;
}

// The split partials of every row block added by a kernel of its own (the default; see
// GemvScratch::sum_kernel), one thread per (token, row) across the whole GPU, instead of by the last block
// of each row block (a fence, a counter, then one block's serial loop: ~6-16 us of a launch on the
// H200, session 21). The same sums in the same order as that block's, so the same outputs bit for
// bit; partial row prow = row block * kBRows + local row, as the batch kernel writes them.
template <bool SWIGLU, int TP, int kBRows>
__global__ void split_sum_kernel(TcParams p, BatchArgs a, int ks) {
  pdl_launch();
  pdl_wait();  // the batch kernel's partials are complete and visible
  constexpr int M = SWIGLU ? 2 : 1;
  const int64_t total = a.part_rows * p.T;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < total; q += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(q / a.part_rows);
    const int64_t prow = q % a.part_rows, blk = prow / kBRows;
    const TcSeg& m = batch_seg(p, blk);
    const int64_t row = (blk - m.tile_begin) * kBRows + prow % kBRows;
    if (row >= m.rows) continue;
    float v = 0.0f, u = 0.0f;
#pragma unroll 4
    for (int sp = 0; sp < ks; ++sp) {
      v += __ldcg(a.part + ((int64_t(sp) * M) * TP + t) * a.part_rows + prow);
      if constexpr (SWIGLU) u += __ldcg(a.part + ((int64_t(sp) * M + 1) * TP + t) * a.part_rows + prow);
    }
    store_out<SWIGLU>(p, m, row, t, v, u);
  }
}
// rows: the batch kernel's rows per block, 16 W R (64, 128 or 256).
template <bool SW, int TP>
cudaError_t sum_launch(int rows, cudaStream_t s, const TcParams& p, const BatchArgs& a, int ks) {
  const int64_t total = a.part_rows * p.T;
  const unsigned grid = unsigned(std::min<int64_t>((total + 255) / 256, 8 * sm_count()));
  if (rows == 128) launch_k(split_sum_kernel<SW, TP, 128>, dim3(grid), dim3(256), 0, s, p, a, ks);
  else if (rows == 256) launch_k(split_sum_kernel<SW, TP, 256>, dim3(grid), dim3(256), 0, s, p, a, ks);
  else launch_k(split_sum_kernel<SW, TP, 64>, dim3(grid), dim3(256), 0, s, p, a, ks);
  return cudaGetLastError();
}

size_t plan_smem(int S, int W, int R, int M, int TP, int sps, int group, int* ngp) {
  *ngp = sps * 128 / group + 8;
  return size_t(S) * (size_t(M) * W * R * 64 + size_t(TP) * 16) * 16 + size_t(M) * 2 * 16 * W * R * size_t(*ngp) * 2;
}

// ANVIL_QGEMM_WAVE_PF=1 (off by default; for measuring): launches without clusters and with more
// blocks than the device holds at once have each block pull a later wave's weights into L2
// (BatchArgs::pf_wave), so that a later block's ring fill, a large share of its short life
// (benchmarks.md, sessions 20-21), reads L2; =2: with the evict_last priority.
int batch_wave_pf_mode() {
  static const int v = wave_pf_setting("ANVIL_QGEMM_WAVE_PF");
  return v;
}

template <bool SW, int NT, int S, int W, int R, bool PX>
cudaError_t batch_launch_px(const BatchPlan& b, cudaStream_t s, const TcParams& p, const BatchArgs& a) {
  static const cudaError_t attr = cudaFuncSetAttribute(qgemm4_batch_kernel<SW, NT, S, W, R, PX>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kBSmemMax));
  if (attr != cudaSuccess) return attr;
  BatchArgs q = a;
  if (batch_wave_pf_mode() > 0 && !a.cluster) {
    const int64_t wave = int64_t(resident_blocks(qgemm4_batch_kernel<SW, NT, S, W, R, PX>, W * 32, b.smem, kBSmemMax)) *
                         sm_count();
    if (wave > 0 && int64_t(b.nblk) * b.ksplit > wave) q.pf_wave = wave, q.pf_keep = batch_wave_pf_mode() == 2;
  }
  launch_kc(qgemm4_batch_kernel<SW, NT, S, W, R, PX>, dim3(unsigned(b.nblk), unsigned(b.ksplit)), dim3(W * 32), b.smem, s,
            dim3(1, a.cluster ? unsigned(b.ksplit) : 1u), p, q);
  return cudaGetLastError();
}
template <bool SW, int NT, int S, int W, int R>
cudaError_t batch_launch_r(const BatchPlan& b, cudaStream_t s, const TcParams& p, const BatchArgs& a) {
  if constexpr (W == 4)
    if (b.px) return batch_launch_px<SW, NT, S, W, R, true>(b, s, p, a);
  return batch_launch_px<SW, NT, S, W, R, false>(b, s, p, a);
}
template <bool SW, int NT, int S, int W>
cudaError_t batch_launch_s(const BatchPlan& b, cudaStream_t s, const TcParams& p, const BatchArgs& a) {
  if constexpr (!(SW && NT == 8))  // R = 2 there would hold 128 accumulators per thread
    if (b.R == 2) return batch_launch_r<SW, NT, S, W, 2>(b, s, p, a);
  return batch_launch_r<SW, NT, S, W, 1>(b, s, p, a);
}
template <bool SW, int NT, int W>
cudaError_t batch_launch_w(const BatchPlan& b, cudaStream_t s, const TcParams& p, const BatchArgs& a) {
  if constexpr (W == 4) {  // deeper rings (ANVIL_QGEMM_BATCH=6|8,...; measuring) only with 4 warps
    if (b.S == 6) return batch_launch_s<SW, NT, 6, W>(b, s, p, a);
    if (b.S == 8) return batch_launch_s<SW, NT, 8, W>(b, s, p, a);
  }
  return b.S == 3 ? batch_launch_s<SW, NT, 3, W>(b, s, p, a) : batch_launch_s<SW, NT, 4, W>(b, s, p, a);
}
template <bool SW, int NT>
cudaError_t batch_launch_nt(const BatchPlan& b, cudaStream_t s, const TcParams& p, const BatchArgs& a) {
  return b.W == 8 ? batch_launch_w<SW, NT, 8>(b, s, p, a) : batch_launch_w<SW, NT, 4>(b, s, p, a);
}

// Blocks of one batch-kernel instantiation resident on an SM at once (resident_blocks).
template <bool SW, int NT, int S, int W, int R>
int batch_bps(bool px, size_t smem) {
  if constexpr (W == 4)
    if (px) return resident_blocks(qgemm4_batch_kernel<SW, NT, S, W, R, true>, W * 32, smem, kBSmemMax);
  return resident_blocks(qgemm4_batch_kernel<SW, NT, S, W, R>, W * 32, smem, kBSmemMax);
}
template <bool SW, int NT, int S, int W>
int batch_bps_r(int R, bool px, size_t smem) {
  if constexpr (!(SW && NT == 8))
    if (R == 2) return batch_bps<SW, NT, S, W, 2>(px, smem);
  return batch_bps<SW, NT, S, W, 1>(px, smem);
}
template <bool SW, int NT>
int batch_bps_nt(int S, int W, int R, bool px, size_t smem) {
  if (W == 8) return S == 3 ? batch_bps_r<SW, NT, 3, 8>(R, px, smem) : batch_bps_r<SW, NT, 4, 8>(R, px, smem);
  if (S == 6) return batch_bps_r<SW, NT, 6, 4>(R, px, smem);
  if (S == 8) return batch_bps_r<SW, NT, 8, 4>(R, px, smem);
  return S == 3 ? batch_bps_r<SW, NT, 3, 4>(R, px, smem) : batch_bps_r<SW, NT, 4, 4>(R, px, smem);
}
template <bool SW, int NT, int S, int W, int R>
int batch_cl(bool px, size_t smem, int ks) {
  if constexpr (W == 4)
    if (px) return resident_clusters_y(qgemm4_batch_kernel<SW, NT, S, W, R, true>, W * 32, smem, kBSmemMax, ks);
  return resident_clusters_y(qgemm4_batch_kernel<SW, NT, S, W, R>, W * 32, smem, kBSmemMax, ks);
}
template <bool SW, int NT, int S, int W>
int batch_cl_r(int R, bool px, size_t smem, int ks) {
  if constexpr (!(SW && NT == 8))
    if (R == 2) return batch_cl<SW, NT, S, W, 2>(px, smem, ks);
  return batch_cl<SW, NT, S, W, 1>(px, smem, ks);
}
template <bool SW, int NT>
int batch_cl_nt(int S, int W, int R, bool px, size_t smem, int ks) {
  if (W == 8) return S == 3 ? batch_cl_r<SW, NT, 3, 8>(R, px, smem, ks) : batch_cl_r<SW, NT, 4, 8>(R, px, smem, ks);
  if (S == 6) return batch_cl_r<SW, NT, 6, 4>(R, px, smem, ks);
  if (S == 8) return batch_cl_r<SW, NT, 8, 4>(R, px, smem, ks);
  return S == 3 ? batch_cl_r<SW, NT, 3, 4>(R, px, smem, ks) : batch_cl_r<SW, NT, 4, 4>(R, px, smem, ks);
}
// Clusters of ks split blocks the device holds at once (0: none); px: the plain-x kernel (BatchPlan::px).
int batch_clusters(bool sw, int NT, int S, int W, int R, bool px, size_t smem, int ks) {
  if (NT == 4) return sw ? batch_cl_nt<true, 4>(S, W, R, px, smem, ks) : batch_cl_nt<false, 4>(S, W, R, px, smem, ks);
  return sw ? batch_cl_nt<true, 8>(S, W, R, px, smem, ks) : batch_cl_nt<false, 8>(S, W, R, px, smem, ks);
}
int batch_blocks_per_sm(bool sw, int NT, int S, int W, int R, bool px, size_t smem) {
  if (NT == 4) return sw ? batch_bps_nt<true, 4>(S, W, R, px, smem) : batch_bps_nt<false, 4>(S, W, R, px, smem);
  return sw ? batch_bps_nt<true, 8>(S, W, R, px, smem) : batch_bps_nt<false, 8>(S, W, R, px, smem);
}

// The K split is chosen by a cost of waves x (steps per split + kWaveFixedSteps) + kWaveSplitSteps
// per split, the waves from the blocks the occupancy calculator says fit. The earlier rule ("enough
// blocks for tune().per_sm per SM") left the last wave of several qwen3-8b matrices at 32 rows
// mostly empty (q/k/v: 96 row blocks x 3 splits), where a block's time is close to proportional to
// its steps (latency-bound). Measured on the H200 (session 14, interleaved A/B twice): the qwen3-8b
// q4g64 step at 32 sequences 7.54 -> 7.41 ms, at 64 sequences 12.50 -> 11.22 ms.
constexpr int kWaveFixedSteps = 3;         // the ring's fill and the epilogue, in steps
constexpr double kWaveSplitSteps = 0.5;    // per split: the partial sums written, read and added

// A split row block's blocks as one thread block cluster, its partial sums added through
// distributed shared memory (the kernel's epilogue), where the caller allows it
// (GemvScratch::cluster: the backend's default, ANVIL_QGEMM_CLUSTER=0 turns it off), the device has
// clusters (compute capability 9.0), there are at most 8 splits (the portable cluster size) and
// the clusters cost no wave (batch_plan). On the H200, a 32-sequence qwen3-8b q4g64 step took 6.65
// against 6.85 ms, and a 64-sequence one 10.95 against 11.38 (session 21).
bool clusters_available() {
  static const bool on = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major >= 9;
  }();
  return on;
}
constexpr int kMaxClusterSplits = 8;

// Which planner: ANVIL_QGEMM_PLAN=1 the wave planner at every batch size, =2 the measured-cost
// planner (below) at every size, =3 the measured-cost planner with the ring depth held at the
// default (for measuring); unset: the measured-cost planner up to 32 tokens and the wave planner
// beyond. Why (session 22, H200, qwen3-8b q4g64, split sums in their own kernel): the 32-sequence
// step took 5.37-5.44 ms under the measured-cost plan against 5.71-5.73 under the wave plan, the
// 64-sequence step 9.67 against 9.33; re-measured in session 23: 5.43-5.47 against 5.74-5.75, and
// 9.71-9.74 against 9.41-9.44 (the default 5.45 and 9.40-9.45).
int plan_mode() {
  static const int m = [] {
    const char* e = std::getenv("ANVIL_QGEMM_PLAN");
    if (e && (e[0] == '1' || e[0] == '2' || e[0] == '3') && e[1] == 0) return e[0] - '0';
    return 0;
  }();
  return m;
}
bool plan_by_measured_costs(int NT) {
  const int m = plan_mode();
  return m == 0 ? NT == 4 : m >= 2;
}
// The sum kernel's cost in the measured-cost plan, in ring steps (~1.1 us each at 32 tokens): ncu
// timed it at 3.5 us after a plain launch and 6.3 after a SwiGLU one (session 22); launching it
// costs about a step more. ANVIL_QGEMM_SUMK_STEPS=X overrides (for measuring).
double sum_kernel_steps(bool swiglu) {
  static const double v = [] {
    const char* e = std::getenv("ANVIL_QGEMM_SUMK_STEPS");
    const double x = e ? std::atof(e) : 0.0;
    return x > 0.0 && x < 100.0 ? x : 0.0;
  }();
  return v > 0.0 ? v : swiglu ? 7.0 : 4.0;
}

}  // namespace

bool batch_plan(const TcParams& p, int n_mats, int T, bool swiglu, bool cluster, int sum_kernel_policy, bool plain_x,
                BatchPlan* b) {
  const int64_t K = p.K;
  if (T < kBatchMinTokens || T > 64 || K % 128 != 0 || K > (int64_t(1) << 28) || (K / p.group) % 8 != 0) return false;
  if (!weights_aligned16(p, n_mats, swiglu) || reinterpret_cast<uintptr_t>(p.x) % 16 != 0) return false;
  const int M = swiglu ? 2 : 1;
  cluster = cluster && clusters_available();
  b->NT = T <= 32 ? 4 : 8;
  const int TP = 8 * b->NT;
  b->nblk = 0;
  const Tune& tn = tune();
  b->S = tn.S ? tn.S : b->NT == 4 ? 6 : 4, b->W = tn.W;
  // Two 16-row tiles per warp beyond 32 tokens (each activation fragment serves both): the
  // 64-sequence qwen3-8b q4g64 step 9.35 / 9.37 -> 8.85 ms on the H200 (session 23; at 32 sequences
  // it lost, 5.42 -> 5.57). An ANVIL_QGEMM_BATCH override keeps its own R.
  b->R = tn.S ? tn.R : b->NT == 8 ? 2 : 1;
  const int gu_ks = swiglu ? gateup_shape().ks : 0;  // (0: the planner's)
  if (const GateUpShape& gu = gateup_shape(); swiglu && gu.W) {
    b->W = gu.W, b->R = gu.R;
    if (b->W == 8) b->S = std::min(b->S, 4);  // 8-warp blocks are built with 3 or 4 stages
  }
  if (swiglu && b->NT == 8) b->R = 1;  // gate/up's accumulators would double to 128 per thread
  // x read as it is (PX; the backend's default, GemvScratch::plain_x) by 4-warp blocks; 8-warp ones
  // (ANVIL_QGEMM_BATCH/GATEUP overrides, for measuring) keep permute_x_kernel. With it, beyond 32
  // tokens, a ring of 3 stages instead of 4 (an ANVIL_QGEMM_BATCH override keeps its own): on an
  // H100 (session 32, qwen3-8b q4g64, bench-kv, two rounds) the 64-sequence step took 9.00 / 9.01 ms
  // with 4 stages and 8.79 / 8.85 with 3, and the server's 64 streams 7,578 / 7,579 against 7,760 /
  // 7,761 tok/s.
  b->px = plain_x && b->W == 4;
  if (!tn.S && b->px && b->NT == 8) b->S = 3;
  const int rows = 16 * b->W * b->R;  // per block
  for (int i = 0; i < n_mats; ++i) b->nblk += (p.seg[i].rows + rows - 1) / rows;
  const int steps = int(K / 128);
  // Splits: enough blocks for per_sm per SM; a split's steps span a multiple of 8 groups (its scales
  // are copied 8 at a time from a 16-byte boundary): `unit` steps, unless one split takes all.
  const int unit = std::max(1, p.group / 16);
  const int64_t want = std::max<int64_t>(1, (int64_t(tn.per_sm) * sm_count() + b->nblk - 1) / b->nblk);
  int sps = int((steps + want - 1) / want);
  if (sps < steps) sps = std::min(steps, (sps + unit - 1) / unit * unit);
  b->smem = plan_smem(b->S, b->W, b->R, M, TP, sps, p.group, &b->ngp);
  while (b->smem > tn.soft && sps > unit) {
    sps = (sps - 1) / unit * unit;  // the next lower multiple of unit
    b->smem = plan_smem(b->S, b->W, b->R, M, TP, sps, p.group, &b->ngp);
  }
  if (b->smem > kBSmemMax) return false;
  // Splits up to the default's or 4, whichever is more; each costs the last block's sum over the
  // splits' partials (kWaveSplitSteps).
  const int64_t sms = sm_count();
  const int ks_max = std::min(steps, std::max(4, (steps + sps - 1) / sps));
  const bool wave_planner = !plan_by_measured_costs(b->NT) || (tn.S && plan_mode() != 2);
  // The sum kernel by default only where the wave planner plans (beyond 32 tokens): under the
  // measured-cost planner the last blocks' sums were faster on the H200, the 32-sequence qwen3-8b
  // q4g64 step 5.42 -> 5.36-5.38 ms in three rounds (session 25; session 23: 5.45 -> 5.39), while at
  // 64 sequences the sum kernel is the faster by far (11.08 -> 9.40, session 23).
  const bool sum_kernel = sum_kernel_policy == kSumKernelAlways || (sum_kernel_policy == kSumKernelWavePlanner && wave_planner);
  if (wave_planner) {
    double best = 0.0;
    for (int ks = 1; ks <= ks_max; ++ks) {
      int sk = (steps + ks - 1) / ks;
      if (sk < steps) sk = std::min(steps, (sk + unit - 1) / unit * unit);
      if ((steps + sk - 1) / sk != ks) continue;  // the same split as a smaller ks
      if (gu_ks && ks != gu_ks) continue;
      int ngk = 0;
      const size_t smk = plan_smem(b->S, b->W, b->R, M, TP, sk, p.group, &ngk);
      if (smk > kBSmemMax) continue;
      const int bps = batch_blocks_per_sm(swiglu, b->NT, b->S, b->W, b->R, b->px, smk);
      if (bps <= 0) continue;
      const int64_t blocks = b->nblk * ks, slots = int64_t(bps) * sms;
      const double cost = double((blocks + slots - 1) / slots) * double(sk + kWaveFixedSteps) + kWaveSplitSteps * ks;
      if (best == 0.0 || cost < best) best = cost, sps = sk, b->smem = smk, b->ngp = ngk;
    }
  } else {
    // The measured-cost planner (plan_mode): the ring depth chosen with the split, and the split
    // sums charged what ncu measured them to cost (sessions 21-22, 32 sequences, a step ~1.1 us):
    // the last block's sum through global memory ~6 steps per wave of blocks, a cluster's ~2, the
    // sum kernel once (sum_kernel_steps). A shallower ring fits more blocks per SM; its slower
    // steps are not modelled (ANVIL_QGEMM_PLAN=3 holds the depth at the default).
    // For the qwen3-8b shapes at 32 tokens, with shared memory as the only limit and clusters of 2
    // fitting, it would pick: q/k/v 4 stages x 4 splits (4 blocks per SM), o as now (6 x 4), gate/up
    // 3 x 2 in clusters (3 per SM, one wave instead of 3), down 4 x 5 (3 per SM).
    constexpr double kFlatSumSteps = 6.0, kClusterSumSteps = 2.0;
    const double sumk_steps = sum_kernel_steps(swiglu);
    double best = 0.0;
    const int depths[3] = {b->S, 4, 3};
    int best_S = b->S;
    for (const int S : depths) {
      if (S > b->S || (plan_mode() == 3 && S != b->S)) continue;  // (at a default of 4 stages, 4 is evaluated twice: harmless)
      for (int ks = 1; ks <= ks_max; ++ks) {
        int sk = (steps + ks - 1) / ks;
        if (sk < steps) sk = std::min(steps, (sk + unit - 1) / unit * unit);
        if ((steps + sk - 1) / sk != ks) continue;
        if (gu_ks && ks != gu_ks) continue;
        int ngk = 0;
        const size_t smk = plan_smem(S, b->W, b->R, M, TP, sk, p.group, &ngk);
        if (smk > kBSmemMax) continue;
        const int bps = batch_blocks_per_sm(swiglu, b->NT, S, b->W, b->R, b->px, smk);
        if (bps <= 0) continue;
        const int64_t blocks = b->nblk * ks, slots = int64_t(bps) * sms;
        const int64_t waves = (blocks + slots - 1) / slots;
        double sum_cost = 0.0;
        if (ks > 1) {
          bool cl = false;
          if (cluster && ks <= kMaxClusterSplits) {
            const int64_t held = int64_t(batch_clusters(swiglu, b->NT, S, b->W, b->R, b->px, smk, ks)) * ks;
            cl = held > 0 && (blocks + held - 1) / held <= waves;
          }
          sum_cost = cl ? kClusterSumSteps * double(waves) : sum_kernel ? sumk_steps : kFlatSumSteps * double(waves);
        }
        const double cost = double(waves) * double(sk + kWaveFixedSteps) + sum_cost;
        if (best == 0.0 || cost < best) best = cost, sps = sk, b->smem = smk, b->ngp = ngk, best_S = S;
      }
    }
    b->S = best_S;
  }
  b->sps = sps;
  b->ksplit = (steps + sps - 1) / sps;
  b->xperm_bytes = b->px ? 0 : size_t(TP) * size_t(K) * 2;
  // Clusters where they cost no wave: the device holds as many of the launch's blocks at once in
  // clusters as without (on the H200, clusters of 4 of these blocks held fewer: a 64 x 4 launch
  // took 1.5x as long even without the sums, session 21).
  b->cluster = false;
  if (cluster && b->ksplit > 1 && b->ksplit <= kMaxClusterSplits) {
    const int64_t blocks = b->nblk * b->ksplit;
    const int64_t flat = int64_t(batch_blocks_per_sm(swiglu, b->NT, b->S, b->W, b->R, b->px, b->smem)) * sm_count();
    const int64_t clustered = int64_t(batch_clusters(swiglu, b->NT, b->S, b->W, b->R, b->px, b->smem, b->ksplit)) * b->ksplit;
    b->cluster = clustered > 0 && (blocks + clustered - 1) / clustered <= (blocks + flat - 1) / std::max<int64_t>(1, flat);
  }
  b->sum_kernel = b->ksplit > 1 && !b->cluster && sum_kernel;
  b->part_floats = b->ksplit > 1 && !b->cluster ? size_t(b->ksplit) * M * TP * size_t(b->nblk) * rows : 0;
  b->n_done = b->ksplit > 1 && !b->cluster && !b->sum_kernel ? size_t(b->nblk) : 0;
  return true;
}

cudaError_t batch_launch(bool swiglu, const BatchPlan& b, const GemvScratch& sc, cudaStream_t s, TcParams p) {
  // Segments by blocks (16 W R rows) instead of 16-row tiles.
  const int rows = 16 * b.W * b.R;
  int64_t blocks = 0;
  for (int i = 0; i < p.n_seg; ++i) {
    p.seg[i].tile_begin = blocks;
    blocks += (p.seg[i].rows + rows - 1) / rows;
  }
  const int TP = 8 * b.NT;
  const int64_t chunks = int64_t(TP) * (p.K / 32);
  cudaError_t e = cudaSuccess;
  if (!b.px) {
    launch_k(permute_x_kernel, dim3(unsigned(std::min<int64_t>((chunks + 255) / 256, 4 * sm_count()))), dim3(256), 0,
             s, p.x, p.T, TP, int(p.K), static_cast<uint2*>(sc.xperm));
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  BatchArgs a;
  a.xperm = static_cast<const uint4*>(sc.xperm);
  a.sps = b.sps;
  a.ngp = b.ngp;
  a.part_rows = b.nblk * rows;
  a.part = sc.part;
  a.done = sc.done;
  a.cluster = b.cluster ? 1 : 0;
  a.sum_kernel = b.sum_kernel ? 1 : 0;
  switch (b.NT) {
    case 4: e = swiglu ? batch_launch_nt<true, 4>(b, s, p, a) : batch_launch_nt<false, 4>(b, s, p, a); break;
    default: e = swiglu ? batch_launch_nt<true, 8>(b, s, p, a) : batch_launch_nt<false, 8>(b, s, p, a);
  }
  if (e != cudaSuccess || !b.sum_kernel) return e;
  if (b.NT == 4) return swiglu ? sum_launch<true, 32>(rows, s, p, a, b.ksplit) : sum_launch<false, 32>(rows, s, p, a, b.ksplit);
  return swiglu ? sum_launch<true, 64>(rows, s, p, a, b.ksplit) : sum_launch<false, 64>(rows, s, p, a, b.ksplit);
}

}  // namespace anvil::cuda::tc
