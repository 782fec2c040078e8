// Decode attention on the tensor cores (the default since 2026-12-01, when the H200 measured it:
// qwen3-8b q4g64 decode 311 vs 286 tok/s, the 32-sequence step 8.65 vs 10.86 ms; ANVIL_CUDA_ATTN_TC=0
// goes back to attention.cu): the same split-KV blocks and partials as attention.cu's split kernel (block =
// split s, kv head, token t; the G query heads of that kv head), with the arithmetic on mma.sync.
//
// Why: ncu on the H200 showed the split kernel at 99 us per qwen3-8b layer for a 32-sequence step
// (67 MB of K/V: 0.7 TB/s). Its lanes hold slices of the head dimension, so every position's dot
// product ends in a 5-shuffle warp reduction, per query head: it is bound by instructions and their
// latency. Here the G query heads are the rows of an m16n8k16 A fragment (up to 16; unused rows
// are zeros) and the positions its columns:
// - S = Q K^T: A = Q (built once per block in registers), B = K from shared memory by ldmatrix
//   (a K row is 8 consecutive dims per 16-byte chunk: exactly a B fragment's layout);
// - the online softmax per row in fp32 on the accumulator fragments (a row's 16 positions sit in
//   the 4 lanes of a quad: 2 shuffles for the row max, the sum kept per lane until the end);
// - O += P V: A = P, taken from S's accumulators as in FlashAttention-2 (no data movement), B = V by
//   ldmatrix.trans.
// Each warp walks its own tiles of 16 positions (tiles warp, warp + 4, ...) through a private ring
// of kAS stages filled by cp.async (K and V rows straight from the pages; positions past the split
// are zero rows), so warps never wait for each other until the end, where their (max, sum, acc)
// states merge in shared memory as in the split kernel. The 16-byte chunks of a tile's rows are
// XOR-swizzled by (row & 7), so ldmatrix reads 8 rows without bank conflicts.
//
// The fused decode form (FUSED, rope_attention_tc; opt-in with ANVIL_CUDA_ROPE_ATTN=1) also does
// rope_kv.cu's work and the splits' merge, so a layer's attention is one kernel instead of three.
// Why it was tried: inside the decode graph rope_kv cost ~2.9 us and attention with its combine ~10
// us per layer on the H200 (benchmarks.md, session 9), for a few MB of work. Measured (session 12):
// 72 kernels fewer per qwen3-8b token but decode within 3% either way at 512 tokens of context, and
// 11% slower at 16,384 (16 blocks per kv head where the split kernel has 66), so the three dependent
// kernels' latency was not where the time goes. Here:
// - each block rotates (and RMS-normalizes) its G query heads in registers while building the A
//   fragments (the angles once per block in shared memory, in double as rope_kv.cu forms them);
// - the block whose split holds the new position writes that K/V row to its page (warp 0, before
//   a barrier; the other warps' copies of the row come after it), every older row is copied before
//   the wait for the q/k/v projection, since no kernel of the step writes them;
// - the splits of a (token, kv head) are one thread block cluster: each block leaves its merged
//   (max, sum, acc) in its shared memory, and after a cluster barrier each block writes 1/cluster of
//   the heads' dims from all splits' states (distributed shared memory); a second barrier keeps the
//   states alive until every block has read them. (The last-block merge that was slower, noted in
//   cuda_backend.cpp, ran the merge serially in one block; here all blocks share it.)
#include <cooperative_groups.h>

#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/attention_merge.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/qgemv_tc.cuh"

namespace anvil::cuda {
namespace {

using tc::cp_async16;
using tc::cp_async_commit;
using tc::cp_async_wait;
using tc::ldsm_x4;
using tc::ldsm_x4_t;
using tc::mma_bf16;
using tc::pack_bf16;

constexpr int kAW = 4;   // warps per block
constexpr int kAP = 16;  // positions per warp tile
constexpr int kAS = 3;   // ring stages per warp
constexpr int kMaxCluster = 16;  // the most splits one cluster merges (cluster_limit tries 16 down)

// Shared memory of one block: the warps' rings [kAW][kAS][K, V][kAP rows][D] bf16; after the loop the
// same bytes hold the merge: m, l [kAW][16] and acc [kAW][16][D] fp32, then (FUSED) the block's
// merged state m, l [16] and acc [16][D].
__host__ __device__ constexpr size_t tc_attn_ring_bytes(int D) { return size_t(kAW) * kAS * 2 * kAP * D * 2; }
__host__ __device__ constexpr size_t tc_attn_merge_bytes(int D, bool fused) {
  return (size_t(kAW) + (fused ? 1 : 0)) * (32 + 16 * size_t(D)) * 4;
}
__host__ __device__ constexpr size_t tc_attn_smem(int D, bool fused) {
  return tc_attn_ring_bytes(D) > tc_attn_merge_bytes(D, fused) ? tc_attn_ring_bytes(D) : tc_attn_merge_bytes(D, fused);
}

// D: head_dim (64 or 128). ROWS16: G > 8 (the A fragments' rows g + 8 carry heads too). FUSED: the
// decode form described at the top (q is the projection's raw output, r its k/v and norms). CM (with
// FUSED, or alone: attention_tc_cluster): the splits are the block's cluster, n_splits = gridDim.x,
// merged in distributed shared memory; ws unused.
// CHUNK (with CM and ROWS16, G <= 8; attention_tc_chunk, opt-in): the batch is one run of a
// sequence's consecutive positions (a prefill chunk) and a block serves 16 / G of its tokens at once:
// fragment row r is token t0 + r / G, query head r % G, each row masked to its own token's context,
// so a tile of K/V read once serves all of them (the per-token form reads it once per token). The
// splits cover the group's longest context (its last token's); a row with no position in a split
// leaves an empty state (l = 0), which the merges skip.
template <int D, bool ROWS16, bool FUSED, bool CM = FUSED, bool CHUNK = false, bool WIN = false>
__global__ void __launch_bounds__(kAW * 32) attn_tc_kernel(const __nv_bfloat16* q, int n_heads, KVDev kv, int layer,
                                                          BatchDev b, float scale_log2, int n_splits, float* ws,
                                                          __nv_bfloat16* out, RopeDev r) {
  constexpr int CH = D / 8;    // 16-byte chunks per row
  constexpr int KB = D / 16;   // k16 blocks of the head dimension (S = Q K^T)
  constexpr int ND = D / 8;    // n8 tiles of the head dimension (O)
  constexpr int TILE = kAP * D;  // bf16 elements of one K (or V) tile
  constexpr int HALF = D / 2;  // RoPE pairs (i, i + HALF)
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float rope_cs[FUSED ? HALF : 1], rope_sn[FUSED ? HALF : 1], qn_w[FUSED ? D : 1];
  pdl_launch();
  static_assert(!CHUNK || (CM && ROWS16 && !FUSED), "the chunk form merges in its cluster, on 16 rows");
  const int s = blockIdx.x, kh = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int G = n_heads / kv.n_kv_heads;
  // CHUNK: this block's tokens t .. t + ntok - 1 (tokens per block 16 / G), rows = ntok * G fragment
  // rows; row r's token t + r / G, its context the rows g and g + 8 this lane holds: len0, len1.
  const int tpb = CHUNK ? 16 / G : 1;
  const int t = blockIdx.z * tpb;
  const int ntok = CHUNK ? min(tpb, b.n_tokens - t) : 1;
  const int rows = ntok * G;
  const int len = b.pos[t + ntok - 1] + 1;
  const int len0 = CHUNK ? (g / G < ntok ? b.pos[t + g / G] + 1 : 0) : len;
  const int len1 = CHUNK ? ((g + 8) / G < ntok ? b.pos[t + (g + 8) / G] + 1 : 0) : len;
  // WIN: a sliding window (kv.window > 0; its own instances, so that the kernel without one is what
  // it was, instruction for instance: qwen3-0.6b decode measured 2.7% slower with the window's
  // arithmetic in every launch). The block's keys start at its first token's window (lo); CHUNK rows
  // g and g + 8 each start at their own token's (lo0, lo1), masked below.
  const int lo = WIN ? window_lo(CHUNK ? b.pos[t] + 1 : len, kv.window) : 0;
  const int lo0 = CHUNK && WIN ? window_lo(len0, kv.window) : lo, lo1 = CHUNK && WIN ? window_lo(len1, kv.window) : lo;
  // Output row of fragment row hg (th0 + hg without CHUNK).
  auto row_th = [&](int hg) -> int64_t {
    return CHUNK ? int64_t(t + hg / G) * n_heads + kh * G + hg % G : int64_t(t) * n_heads + kh * G + hg;
  };
  const int live = live_splits(len - lo, n_splits);
  // CM: a block without positions still takes part in its cluster's barriers (below).
  if (!CM && s >= live) return;
  const bool active = s < live;
  const int per = (len - lo + live - 1) / live;
  const int p_begin = lo + s * per, p_end = active ? min(len, p_begin + per) : p_begin;
  const int32_t* pages = b.page_table + int64_t(b.seq[t]) * b.max_pages;
  const __nv_bfloat16* kvb = static_cast<const __nv_bfloat16*>(kv.base);
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem) + size_t(warp) * kAS * 2 * TILE;

  // This warp's tiles: positions p_begin + 16 * (warp + kAW * i).
  const int span = max(0, p_end - p_begin);
  const int tiles = (span + kAP - 1) / kAP;
  const int n = tiles > warp ? (tiles - warp + kAW - 1) / kAW : 0;
  auto tile_pos = [&](int i) { return p_begin + kAP * (warp + kAW * i); };
  // Tile i's K and V rows into its ring slot: kAP rows x CH chunks for K, then the same for V; lane
  // takes chunks lane, lane + 32, ... Row `skip` is left out; `only` >= 0: that row alone. The page
  // lookups come first, one per lane (lane r < kAP: row r's K offset, -1 past the split), and reach
  // the copies by shuffles: a copy is asm with a memory clobber, so a page-table load placed between
  // two copies would wait behind the first.
  const int64_t vofs = int64_t(kv.n_kv_heads) * kv.page_size * D;  // a page's V rows after its K rows
  auto issue = [&](int i, int skip, int only) {
    __nv_bfloat16* kt = ring + (i % kAS) * 2 * TILE;
    const int p0 = tile_pos(i);
    const int pl = p0 + (lane & (kAP - 1));
    int64_t rb = -1;
    if (pl < p_end)
      rb = kv_row(pages[pl / kv.page_size], layer, 0, kh, pl % kv.page_size, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
#pragma unroll
    for (int e = lane; e < 2 * kAP * CH; e += 32) {
      const int which = e / (kAP * CH), r = (e / CH) % kAP, ch = e % CH;
      const int64_t base = __shfl_sync(0xffffffffu, rb, r);
      __nv_bfloat16* dst = kt + which * TILE + r * D + ((ch ^ (r & 7)) * 8);
      const int p = p0 + r;
      if (p == skip || (only >= 0 && p != only)) continue;
      if (base >= 0) {
        cp_async16(dst, kvb + base + which * vofs + ch * 8);
      } else {
        *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);  // zero rows: P = 0 times V = 0
      }
    }
  };
  // The first kAS - 1 tiles. In a decode step (one token per sequence) only row len - 1 is written
  // in this step (by rope_kv, the previous kernel; FUSED: by this kernel); every other row, the
  // positions and the page table can be read before the wait for the previous kernel (as in
  // attention.cu's split kernel), so those copies start before the wait and the new row's after it.
  // They form one copy group, followed by kAS - 2 empty ones, so the loop's count of groups holds.
  const bool early = FUSED || b.n_tokens == b.n_seqs;
  const int late = early ? len - 1 : -1;
  if (early)
    for (int i = 0; i < kAS - 1 && i < n; ++i) issue(i, late, -1);
  if constexpr (FUSED) {  // the angles and q's norm weights: inputs no kernel of the step writes
    for (int i = threadIdx.x; i < HALF; i += blockDim.x) {
      double sn, cs;
      sincos(double(len - 1) * double(r.inv_freq[i]), &sn, &cs);
      rope_cs[i] = float(cs), rope_sn[i] = float(sn);
    }
    for (int i = threadIdx.x; i < D; i += blockDim.x) qn_w[i] = r.q_norm ? load_any(r.q_norm, i, r.norm_dtype) : 1.0f;
  }
  pdl_wait();
  if constexpr (FUSED) {
    // The new K row (RMS-normalized with k_norm, rotated) and V row into the token's page, as
    // rope_kv.cu writes them: lane l holds the pairs (i, i + HALF) for i = l, l + 32, ...
    if (active && s == live - 1 && warp == 0) {
      const int pos = len - 1;
      const int64_t page = pages[pos / kv.page_size];
      const int slot = pos % kv.page_size;
      __nv_bfloat16* kd = static_cast<__nv_bfloat16*>(kv.base) +
                          kv_row(page, layer, 0, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
      __nv_bfloat16* vd = static_cast<__nv_bfloat16*>(kv.base) +
                          kv_row(page, layer, 1, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
      const __nv_bfloat16* ks = static_cast<const __nv_bfloat16*>(r.k) + (int64_t(t) * kv.n_kv_heads + kh) * D;
      const __nv_bfloat16* vs = static_cast<const __nv_bfloat16*>(r.v) + (int64_t(t) * kv.n_kv_heads + kh) * D;
      constexpr int PL = (HALF + 31) / 32;
      float a[PL], cc[PL];
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < PL; ++j) {
        const int i = lane + 32 * j;
        a[j] = cc[j] = 0.0f;
        if (i < HALF) {
          a[j] = __bfloat162float(ks[i]);
          cc[j] = __bfloat162float(ks[i + HALF]);
          ss += a[j] * a[j] + cc[j] * cc[j];
        }
      }
      float inv = 1.0f;
      if (r.k_norm) inv = rsqrtf(warp_sum(ss) / float(D) + r.eps);
      for (int i = lane; i < D; i += 32) vd[i] = vs[i];
#pragma unroll
      for (int j = 0; j < PL; ++j) {
        const int i = lane + 32 * j;
        if (i < HALF) {
          float x0 = a[j], x1 = cc[j];
          if (r.k_norm) {
            x0 = x0 * inv * load_any(r.k_norm, i, r.norm_dtype);
            x1 = x1 * inv * load_any(r.k_norm, i + HALF, r.norm_dtype);
          }
          kd[i] = __float2bfloat16_rn(x0 * rope_cs[i] - x1 * rope_sn[i]);
          kd[i + HALF] = __float2bfloat16_rn(x1 * rope_cs[i] + x0 * rope_sn[i]);
        }
      }
      __threadfence();  // the row reaches L2, where the other warps' cp.async (.cg) read it
    }
    __syncthreads();  // the angles; the new row is in its page before any warp copies it
  }
  for (int i = 0; i < kAS - 1 && i < n; ++i) issue(i, -1, early ? late : -1);
  cp_async_commit();
#pragma unroll
  for (int i = 1; i < kAS - 1; ++i) cp_async_commit();

  // Q as A fragments: rows g (and g + 8) are query heads kh*G + row; k = dims kb*16 + {2c, 2c+1} (a0,
  // a1) and kb*16 + 8 + {2c, 2c+1} (a2, a3).
  uint32_t qa[KB][4];
  {
    const __nv_bfloat16* q0 = q + (int64_t(t) * n_heads + kh * G) * D;
    if constexpr (CHUNK) {
      // Rows g and g + 8: (token t + row / G, head row % G); rows past the block's tokens are zeros.
      const bool r0 = g < rows, r1 = g + 8 < rows;
      const __nv_bfloat16* qg = q + row_th(r0 ? g : 0) * D;
      const __nv_bfloat16* qg8 = q + row_th(r1 ? g + 8 : 0) * D;
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        const int d0 = kb * 16 + 2 * c;
        qa[kb][0] = r0 ? *reinterpret_cast<const uint32_t*>(qg + d0) : 0u;
        qa[kb][2] = r0 ? *reinterpret_cast<const uint32_t*>(qg + d0 + 8) : 0u;
        qa[kb][1] = r1 ? *reinterpret_cast<const uint32_t*>(qg8 + d0) : 0u;
        qa[kb][3] = r1 ? *reinterpret_cast<const uint32_t*>(qg8 + d0 + 8) : 0u;
      }
    } else if constexpr (!FUSED) {
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        const int d0 = kb * 16 + 2 * c;
        qa[kb][0] = g < G ? *reinterpret_cast<const uint32_t*>(q0 + g * D + d0) : 0u;
        qa[kb][2] = g < G ? *reinterpret_cast<const uint32_t*>(q0 + g * D + d0 + 8) : 0u;
        qa[kb][1] = ROWS16 && g + 8 < G ? *reinterpret_cast<const uint32_t*>(q0 + (g + 8) * D + d0) : 0u;
        qa[kb][3] = ROWS16 && g + 8 < G ? *reinterpret_cast<const uint32_t*>(q0 + (g + 8) * D + d0 + 8) : 0u;
      }
    } else {
      // Rows g and g + 8 (fragment words 0, 2 and 1, 3): the lane's dims kb*16 + {2c, 2c+1, 2c+8,
      // 2c+9} of each; a head's sum of squares is its quad's (lanes 4g..4g+3). The RoPE partner of
      // dim d < HALF, d + HALF, is the same element of block kb + KB/2, held by the same lane.
#pragma unroll
      for (int h = 0; h < (ROWS16 ? 2 : 1); ++h) {
        const int row = g + 8 * h;
        float x[KB][4];
        float ss = 0.0f;
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
          uint32_t w0 = 0u, w1 = 0u;
          if (row < G) {
            w0 = *reinterpret_cast<const uint32_t*>(q0 + row * D + kb * 16 + 2 * c);
            w1 = *reinterpret_cast<const uint32_t*>(q0 + row * D + kb * 16 + 2 * c + 8);
          }
          x[kb][0] = bf16_lo(w0), x[kb][1] = bf16_hi(w0), x[kb][2] = bf16_lo(w1), x[kb][3] = bf16_hi(w1);
#pragma unroll
          for (int e = 0; e < 4; ++e) ss += x[kb][e] * x[kb][e];
        }
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        const float inv = r.q_norm ? rsqrtf(ss / float(D) + r.eps) : 1.0f;
        float y[KB][4];
#pragma unroll
        for (int kb = 0; kb < KB / 2; ++kb)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int d = kb * 16 + 2 * c + (e & 1) + 8 * (e >> 1);
            float x0 = x[kb][e], x1 = x[kb + KB / 2][e];
            if (r.q_norm) {
              x0 = x0 * inv * qn_w[d];
              x1 = x1 * inv * qn_w[d + HALF];
            }
            y[kb][e] = x0 * rope_cs[d] - x1 * rope_sn[d];
            y[kb + KB / 2][e] = x1 * rope_cs[d] + x0 * rope_sn[d];
          }
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
          qa[kb][h] = pack_bf16(y[kb][0], y[kb][1]);
          qa[kb][h + 2] = pack_bf16(y[kb][2], y[kb][3]);
        }
      }
      if constexpr (!ROWS16)
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) qa[kb][1] = qa[kb][3] = 0u;
    }
  }

  float acc[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 (l: this lane's share)
  for (int i = 0; i < n; ++i) {
    cp_async_wait<kAS - 2>();
    __syncwarp();  // every lane's copies of tile i landed; every lane is done with tile i - 1
    if (i + kAS - 1 < n) issue(i + kAS - 1, -1, -1);
    cp_async_commit();
    const __nv_bfloat16* kt = ring + (i % kAS) * 2 * TILE;
    const __nv_bfloat16* vt = kt + TILE;
    const int p0 = tile_pos(i);

    // S = Q K^T for 16 positions: n-tile 0 = positions 0..7, n-tile 1 = 8..15.
    float sc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    {
      const int mi = lane >> 3, r = (lane & 7) + 8 * (mi >> 1);  // matrices: (pos 0-7 | 8-15) x (k lo | hi)
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) {
        const int ch = kb * 2 + (mi & 1);
        uint32_t bf[4];
        ldsm_x4(bf, kt + r * D + ((ch ^ (r & 7)) * 8));
        mma_bf16(sc[0], qa[kb][0], qa[kb][1], qa[kb][2], qa[kb][3], bf[0], bf[1]);
        mma_bf16(sc[1], qa[kb][0], qa[kb][1], qa[kb][2], qa[kb][3], bf[2], bf[3]);
      }
    }
    // Online softmax. sc[nt][i]: row g (i < 2) or g + 8, position p0 + 8 nt + 2c + (i & 1).
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int p = p0 + 8 * nt + 2 * c + (i & 1);
        const bool valid = p < p_end && (!CHUNK || (p < (i < 2 ? len0 : len1) && (!WIN || p >= (i < 2 ? lo0 : lo1))));
        sc[nt][i] = valid ? sc[nt][i] * scale_log2 : -FLT_MAX;
        if (i < 2) mx0 = fmaxf(mx0, sc[nt][i]);
        else mx1 = fmaxf(mx1, sc[nt][i]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    if constexpr (ROWS16) {
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    }
    const float corr0 = exp2f(m0 - mx0), corr1 = exp2f(m1 - mx1);
    m0 = mx0, m1 = mx1;
    float pr[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float mm = i < 2 ? mx0 : mx1;
        pr[nt][i] = sc[nt][i] > -FLT_MAX ? exp2f(sc[nt][i] - mm) : 0.0f;
      }
    l0 = l0 * corr0 + pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1];
    l1 = l1 * corr1 + pr[0][2] + pr[0][3] + pr[1][2] + pr[1][3];
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) acc[nd][0] *= corr0, acc[nd][1] *= corr0, acc[nd][2] *= corr1, acc[nd][3] *= corr1;

    // O += P V: A = P (rows as S, k = the 16 positions), B = V [positions][dims] by ldmatrix.trans.
    const uint32_t pa0 = pack_bf16(pr[0][0], pr[0][1]), pa1 = pack_bf16(pr[0][2], pr[0][3]);
    const uint32_t pa2 = pack_bf16(pr[1][0], pr[1][1]), pa3 = pack_bf16(pr[1][2], pr[1][3]);
    {
      const int mi = lane >> 3, r = (lane & 7) + 8 * (mi & 1);  // matrices: (pos 0-7 | 8-15) x (dims lo | hi)
#pragma unroll
      for (int nd = 0; nd < ND; nd += 2) {
        const int ch = nd + (mi >> 1);
        uint32_t bf[4];
        ldsm_x4_t(bf, vt + r * D + ((ch ^ (r & 7)) * 8));
        mma_bf16(acc[nd], pa0, pa1, pa2, pa3, bf[0], bf[1]);
        mma_bf16(acc[nd + 1], pa0, pa1, pa2, pa3, bf[2], bf[3]);
      }
    }
  }
  cp_async_wait<0>();
  // The row sums: this lane's share, then the quad's.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  __syncthreads();  // every warp is done with its ring: the merge reuses the bytes
  trace::point(2);  // trace.h: every warp's positions done

  // Merge the warps (as the split kernel): [kAW][16] m and l, then [kAW][16][D] acc.
  float* sm = reinterpret_cast<float*>(smem);
  float* sl = sm + kAW * 16;
  float* sa = sl + kAW * 16;
  if (c == 0) {
    sm[warp * 16 + g] = m0, sl[warp * 16 + g] = l0;
    sm[warp * 16 + g + 8] = m1, sl[warp * 16 + g + 8] = l1;
  }
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    float* row0 = sa + (warp * 16 + g) * D + nd * 8 + 2 * c;
    float* row1 = sa + (warp * 16 + g + 8) * D + nd * 8 + 2 * c;
    row0[0] = acc[nd][0], row0[1] = acc[nd][1], row1[0] = acc[nd][2], row1[1] = acc[nd][3];
  }
  __syncthreads();
  trace::point(3);  // the warps' states in shared memory
  auto wm = [&](int w, int hg) { return sm[w * 16 + hg]; };
  auto wl = [&](int w, int hg) { return sl[w * 16 + hg]; };
  auto wa = [&](int w, int hg, int d) { return sa[(w * 16 + hg) * D + d]; };
  if (CHUNK && live == 1) {  // one live split: this block's rows are the output
    if (active)
      merge_warps<kAW>(rows, D, wm, wl, wa, [&](int hg, int d, float, float L, float A) {
        out[row_th(hg) * D + d] = __float2bfloat16_rn(L > 0.0f ? A / L : 0.0f);
      });
    return;
  }
  if (!CHUNK && (!CM || live == 1)) {  // (CM, one live split: no block reads another's memory)
    if (active)
      merge_warps_store<kAW>(G, D, wm, wl, wa, int64_t(t) * n_heads + kh * G, live == 1 ? out : nullptr, ws, n_splits, s);
    trace::point(9);
    return;
  }
  if constexpr (CM) {
    // This block's state [m, l][16] and acc [16][D] after the warps' own; then each block writes the
    // dims i = rank * blockDim + tid (stride n_splits * blockDim) of the G heads from the live splits'.
    float* cm = sa + kAW * 16 * D;
    float* cl = cm + 16;
    float* ca = cl + 16;
    if (active)
      merge_warps<kAW>(rows, D, wm, wl, wa, [&](int hg, int d, float M, float L, float A) {
        if (d == 0) cm[hg] = M, cl[hg] = L;
        ca[hg * D + d] = A;
      });
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    trace::point(4);  // this block's state merged
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    trace::point(5);  // every split's state in its block
    // Every split's m, l and acc element are loaded at once (kMaxCluster unrolled loads, a rank past
    // `live` reading rank 0's and left out below), then merged in split order: one round trip to the
    // other blocks' shared memory instead of one per split and pass (qwen3-0.6b decode, H100
    // trace: 2.75 us from the barrier to the end with the loads in two loops over `live`).
    for (int i = s * blockDim.x + threadIdx.x; i < rows * D; i += n_splits * blockDim.x) {
      const int hg = i / D, d = i % D;
      float ms[kMaxCluster], ls[kMaxCluster], as[kMaxCluster];
#pragma unroll
      for (int sp = 0; sp < kMaxCluster; ++sp) {
        const float* rm = cluster.map_shared_rank(cm, sp < live ? sp : 0);
        ms[sp] = rm[hg], ls[sp] = rm[16 + hg], as[sp] = rm[32 + hg * D + d];
      }
      float M = -FLT_MAX;
#pragma unroll
      for (int sp = 0; sp < kMaxCluster; ++sp)
        if (sp < live && ls[sp] > 0.0f) M = fmaxf(M, ms[sp]);
      float L = 0.0f, A = 0.0f;
#pragma unroll
      for (int sp = 0; sp < kMaxCluster; ++sp) {
        if (sp >= live) break;
        const float w = ls[sp] > 0.0f ? exp2f(ms[sp] - M) : 0.0f;
        L += ls[sp] * w;
        A += as[sp] * w;
      }
      out[row_th(hg) * D + d] = __float2bfloat16_rn(L > 0.0f ? A / L : 0.0f);
    }
    cluster.sync();  // no block leaves while another may still read its state
    trace::point(9);
#else
    __trap();  // clusters need sm_90; below it the host launches clusters of 1 (live == 1 above)
#endif
  }
}

template <int D, bool R16, bool WIN>
cudaError_t launch_tc(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                      int n_splits, float* ws, void* out, cudaStream_t s) {
  constexpr size_t smem = tc_attn_smem(D, false);
  auto* k = attn_tc_kernel<D, R16, false, false, false, WIN>;
  static const cudaError_t attr = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(unsigned(n_splits), unsigned(kv.n_kv_heads), unsigned(b.n_tokens));
  launch_k(k, grid, dim3(kAW * 32), smem, s, static_cast<const __nv_bfloat16*>(q), n_heads,
           kv, layer, b, scale * 1.4426950408889634f, n_splits, ws, static_cast<__nv_bfloat16*>(out), RopeDev{});
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || n_splits == 1) return e;
  return attention_combine(ws, b.pos, b.n_tokens, n_heads, D, n_splits, kv.window, out, s);
}

// The cluster kernels' attributes, set once per instance: their shared memory, and clusters of 16
// (beyond the portable 8) where the device allows them. The largest cluster size this device
// schedules for it (0: none). FUSED: rope_attention_tc's kernel, else attention_tc_cluster's.
template <int D, bool R16, bool FUSED = true, bool CHUNK = false, bool WIN = false>
int cluster_limit() {
  static const int v = [] {
    auto* k = attn_tc_kernel<D, R16, FUSED, true, CHUNK, WIN>;
    if (cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(tc_attn_smem(D, true))) != cudaSuccess)
      return 0;
    const bool np = cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess;
    (void)cudaGetLastError();
    for (int cs = np ? kMaxCluster : 8; cs >= 2; cs /= 2) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(unsigned(cs), 1, 1);
      cfg.blockDim = dim3(kAW * 32);
      cfg.dynamicSmemBytes = tc_attn_smem(D, true);
      cudaLaunchAttribute at[1];
      at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = unsigned(cs);
      at[0].val.clusterDim.y = at[0].val.clusterDim.z = 1;
      cfg.attrs = at;
      cfg.numAttrs = 1;
      int n = 0;
      if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) == cudaSuccess && n > 0) return cs;
      (void)cudaGetLastError();
    }
    return 1;
  }();
  return v;
}

template <int D, bool R16, bool WIN>
cudaError_t launch_fused(const void* q, int n_heads, const RopeDev& r, const KVDev& kv, int layer, const BatchDev& b,
                         float scale, int cluster, void* out, cudaStream_t s) {
  if (cluster_limit<D, R16, true, false, WIN>() < cluster) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(cluster), unsigned(kv.n_kv_heads), unsigned(b.n_tokens));
  launch_kc(attn_tc_kernel<D, R16, true, true, false, WIN>, grid, dim3(kAW * 32), tc_attn_smem(D, true), s, cluster,
            static_cast<const __nv_bfloat16*>(q), n_heads, kv, layer, b, scale * 1.4426950408889634f, cluster,
            static_cast<float*>(nullptr), static_cast<__nv_bfloat16*>(out), r);
  return cudaGetLastError();
}

template <int D, bool R16, bool WIN>
cudaError_t launch_tc_cluster(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                              int cluster, void* out, cudaStream_t s) {
  if (cluster_limit<D, R16, false, false, WIN>() < cluster) return cudaErrorInvalidValue;
  const dim3 grid(unsigned(cluster), unsigned(kv.n_kv_heads), unsigned(b.n_tokens));
  launch_kc(attn_tc_kernel<D, R16, false, true, false, WIN>, grid, dim3(kAW * 32), tc_attn_smem(D, true), s, cluster,
            static_cast<const __nv_bfloat16*>(q), n_heads, kv, layer, b, scale * 1.4426950408889634f, cluster,
            static_cast<float*>(nullptr), static_cast<__nv_bfloat16*>(out), RopeDev{});
  return cudaGetLastError();
}

// The chunk form (CHUNK above): clusters of `cluster` splits, (16 / G)-token groups of the run.
template <int D, bool WIN>
cudaError_t launch_tc_chunk(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                            int cluster, void* out, cudaStream_t s) {
  if (cluster_limit<D, true, false, true, WIN>() < cluster) return cudaErrorInvalidValue;
  const int tpb = 16 / (n_heads / kv.n_kv_heads);
  const dim3 grid(unsigned(cluster), unsigned(kv.n_kv_heads), unsigned((b.n_tokens + tpb - 1) / tpb));
  launch_kc(attn_tc_kernel<D, true, false, true, true, WIN>, grid, dim3(kAW * 32), tc_attn_smem(D, true), s, cluster,
            static_cast<const __nv_bfloat16*>(q), n_heads, kv, layer, b, scale * 1.4426950408889634f, cluster,
            static_cast<float*>(nullptr), static_cast<__nv_bfloat16*>(out), RopeDev{});
  return cudaGetLastError();
}

// The limits below are the least over the instances with and without a window (WIN), so that a
// cluster size chosen from them launches either.
int max_cluster_any() {
  return std::min({cluster_limit<64, false>(), cluster_limit<64, true>(), cluster_limit<128, false>(),
                   cluster_limit<128, true>(), cluster_limit<64, false, true, false, true>(),
                   cluster_limit<64, true, true, false, true>(), cluster_limit<128, false, true, false, true>(),
                   cluster_limit<128, true, true, false, true>()});
}

}  // namespace

bool attention_tc_ok(int n_heads, int n_kv_heads, int head_dim) {
  const int G = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
  return G >= 1 && G <= 16 && n_heads % n_kv_heads == 0 && (head_dim == 64 || head_dim == 128);
}

namespace {
template <int D>
using HeadDim = std::integral_constant<int, D>;
// f(HeadDim<D>{}, std::bool_constant<R16>{}, std::bool_constant<WIN>{}) for the launch's head_dim (64
// or 128), whether G > 8 and whether the layer has a sliding window.
template <class F>
cudaError_t by_shape(int n_heads, const KVDev& kv, F&& f) {
  auto win = [&](auto d, auto r16) {
    return kv.window > 0 ? f(d, r16, std::true_type{}) : f(d, r16, std::false_type{});
  };
  const bool r16 = n_heads / kv.n_kv_heads > 8;
  if (kv.head_dim == 64) return r16 ? win(HeadDim<64>{}, std::true_type{}) : win(HeadDim<64>{}, std::false_type{});
  return r16 ? win(HeadDim<128>{}, std::true_type{}) : win(HeadDim<128>{}, std::false_type{});
}
}  // namespace

cudaError_t attention_tc(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                         int n_splits, float* ws, void* out, cudaStream_t s) {
  if (!attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim)) return cudaErrorInvalidValue;
  return by_shape(n_heads, kv, [&](auto d, auto r16, auto win) {
    return launch_tc<decltype(d)::value, decltype(r16)::value, decltype(win)::value>(q, n_heads, kv, layer, b, scale,
                                                                                     n_splits, ws, out, s);
  });
}

int rope_attention_cluster(int T, int n_kv_heads, int max_positions, int n_sms) {
  // As many splits as attention_splits gives (blocks to fill the GPU, >= 64 positions each at full
  // context), as a power of two no larger than the device's cluster limit (16 on the H200);
  // ANVIL_CUDA_ROPE_ATTN_CLUSTER=N caps it (for measuring).
  static const int cap = [] {
    const char* e = std::getenv("ANVIL_CUDA_ROPE_ATTN_CLUSTER");
    const int v = e && *e ? std::atoi(e) : 16;
    return v >= 1 ? v : 1;
  }();
  const int limit = std::min(cap, max_cluster_any());
  if (limit < 1) return 0;
  const int want = attention_splits(T, n_kv_heads, max_positions, n_sms, true);
  int cs = 1;
  while (cs * 2 <= want && cs * 2 <= limit) cs *= 2;
  return cs;
}

int attention_tc_cluster_limit() {
  static const int v = std::min({cluster_limit<64, false, false>(), cluster_limit<64, true, false>(),
                                 cluster_limit<128, false, false>(), cluster_limit<128, true, false>(),
                                 cluster_limit<64, false, false, false, true>(),
                                 cluster_limit<64, true, false, false, true>(),
                                 cluster_limit<128, false, false, false, true>(),
                                 cluster_limit<128, true, false, false, true>()});
  return v;
}

cudaError_t attention_tc_cluster(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                                 int cluster, void* out, cudaStream_t s) {
  if (!attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim) || cluster < 2 || cluster > attention_tc_cluster_limit())
    return cudaErrorInvalidValue;
  return by_shape(n_heads, kv, [&](auto d, auto r16, auto win) {
    return launch_tc_cluster<decltype(d)::value, decltype(r16)::value, decltype(win)::value>(q, n_heads, kv, layer, b,
                                                                                             scale, cluster, out, s);
  });
}

int attention_tc_chunk_limit() {
  static const int v = std::min({cluster_limit<64, true, false, true>(), cluster_limit<128, true, false, true>(),
                                 cluster_limit<64, true, false, true, true>(), cluster_limit<128, true, false, true, true>()});
  return v;
}

cudaError_t attention_tc_chunk(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                               int cluster, void* out, cudaStream_t s) {
  const int G = kv.n_kv_heads > 0 ? n_heads / kv.n_kv_heads : 0;
  if (!attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim) || G > 8 || b.n_tokens < 1 || cluster < 1 ||
      cluster > attention_tc_chunk_limit())
    return cudaErrorInvalidValue;
  if (kv.window > 0)
    return kv.head_dim == 64 ? launch_tc_chunk<64, true>(q, n_heads, kv, layer, b, scale, cluster, out, s)
                             : launch_tc_chunk<128, true>(q, n_heads, kv, layer, b, scale, cluster, out, s);
  return kv.head_dim == 64 ? launch_tc_chunk<64, false>(q, n_heads, kv, layer, b, scale, cluster, out, s)
                           : launch_tc_chunk<128, false>(q, n_heads, kv, layer, b, scale, cluster, out, s);
}

cudaError_t rope_attention_tc(const void* q, int n_heads, const RopeDev& r, const KVDev& kv, int layer,
                              const BatchDev& b, float scale, int cluster, void* out, cudaStream_t s) {
  if (!attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim) || b.n_tokens != b.n_seqs || cluster < 1 ||
      cluster > 16 || (cluster & (cluster - 1)) != 0)
    return cudaErrorInvalidValue;
  return by_shape(n_heads, kv, [&](auto d, auto r16, auto win) {
    return launch_fused<decltype(d)::value, decltype(r16)::value, decltype(win)::value>(q, n_heads, r, kv, layer, b,
                                                                                        scale, cluster, out, s);
  });
}

}  // namespace anvil::cuda
