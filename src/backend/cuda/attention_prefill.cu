// Causal prefill attention on the tensor cores (FlashAttention-2 style), for a chunk of one
// sequence's consecutive positions p0 .. p0 + T - 1. Block (head, query tile of 64 tokens): each of
// its 4 warps owns 16 query rows and keeps everything of them in registers —
// - Q as m16n8k16 A fragments (rows g and g + 8 of the warp's 16, loaded once);
// - S = Q K^T for 64 keys at a time (8 n-tiles of fp32 accumulators), K from shared memory by
//   ldmatrix (a K row's 8 consecutive dims per 16-byte chunk are a B fragment's layout);
// - the online softmax on those accumulators in fp32, scores in log2 units: a row's 64 scores sit in
//   the 4 lanes of a quad, so its max is 2 shuffles, and its sum stays per lane until the end;
// - O += P V with P taken from S's accumulators (the accumulator layout of two n-tiles is an A
//   fragment's: no data movement), rounded to bf16, and V by ldmatrix.trans;
// - the fp32 output rows as accumulators, divided by the row sums and written as bf16 at the end.
// The 4 warps share the key tiles: 64 keys of K and V per stage, straight from the pages by cp.async
// into a two-stage ring (the next tile is copied while this one is multiplied); rows past the
// tile's last query position are zeros. The 16-byte chunks of each row are XOR-swizzled by row, so
// the 8 rows an ldmatrix reads hit 8 different bank groups. Causal masking is applied only on the
// key tiles that reach past the block's first query position (and, with a sliding window, on those
// before its last query's window; tiles before its first query's window are skipped). Query tiles are launched heaviest
// (latest positions, most keys) first.
//
// Why (ncu on the H200, session 13): the WMMA version before it kept S and O in shared memory
// (fp32 O rescaled row by row in shared memory per key tile, 16 serial row softmaxes per warp with
// 5-shuffle reductions, key tiles copied with plain loads between barriers) and took 248 us per
// qwen3-8b layer at 512 tokens: 26% of the 8b's pp512 and the largest kernel of the MoE model's.
// This one takes 31.5 us there (qwen3-8b q4g64 pp512 15.9k -> 23.8k tok/s with session 13's other
// prefill changes).
//
// The default for prefill chunks (cuda_backend.cpp; ANVIL_CUDA_FA=0 sends them to the split
// kernels). tests/cuda/cuda_ops_test.cpp compares it with the CPU on every chunk.
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
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

constexpr int kQ = 64;  // query rows per block
constexpr int kK = 64;  // keys per tile
constexpr int kFaWarps = 4;
constexpr int kFaThreads = kFaWarps * 32;

template <int D>
constexpr size_t fa_smem_bytes() {
  return size_t(2) * 2 * kK * D * 2;  // two stages of [K, V][kK rows][D] bf16
}

// Where logical 16-byte chunk ch of row r of a tile lives: rows of 8+ chunks (D >= 64) XOR the low
// 3 bits with r & 7; rows of 4 chunks (D = 32, two rows per 128 bytes) with (r >> 1) & 3. Either way
// 8 consecutive rows' chunk ch fall in 8 different 16-byte bank groups.
template <int CH>
__device__ __forceinline__ int swz(int r, int ch) {
  if constexpr (CH >= 8) return ch ^ (r & 7);
  else return ch ^ ((r >> 1) & 3);
}

template <int D>
__global__ void __launch_bounds__(kFaThreads) fa_prefill_kernel(const __nv_bfloat16* q, int n_heads, KVDev kv,
                                                                int layer, BatchDev b, int p0, float scale_log2,
                                                                __nv_bfloat16* out) {
  constexpr int CH = D / 8;    // 16-byte chunks per row
  constexpr int KB = D / 16;   // k16 blocks of the head dimension (S = Q K^T)
  constexpr int ND = D / 8;    // n8 tiles of the head dimension (O)
  constexpr int TILE = kK * D;  // bf16 elements of one K (or V) tile
  constexpr int RPP = kFaThreads / CH;  // rows one copy pass covers
  static_assert(kK % RPP == 0, "a tile's rows split evenly over the copy passes");
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(smem);

  const int h = blockIdx.x, tile = gridDim.y - 1 - blockIdx.y;  // heaviest query tiles first
  const int T = b.n_tokens, G = n_heads / kv.n_kv_heads, kh = h / G;
  const int t0 = tile * kQ;
  const int rows = min(kQ, T - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int32_t* pages = b.page_table + int64_t(b.seq[0]) * b.max_pages;
  const __nv_bfloat16* kvb = static_cast<const __nv_bfloat16*>(kv.base);
  const int64_t vofs = int64_t(kv.n_kv_heads) * kv.page_size * D;  // a page's V rows after its K rows
  const int last_pos = p0 + t0 + rows - 1;  // the tile's last query position: keys 0 .. last_pos
  const int n_kb = last_pos / kK + 1;
  // A sliding window (kv.window): the block's first query sees keys from first_lo on, its last from
  // last_lo on; key tiles before first_lo's are not read at all.
  const int first_lo = window_lo(p0 + t0 + 1, kv.window), last_lo = window_lo(last_pos + 1, kv.window);
  const int kb0 = first_lo / kK;

  // Key tile kb's K and V rows into ring stage kb & 1: thread copies chunk tid % CH of rows
  // tid / CH + RPP * j, K and V (zeros past last_pos: P is 0 there, and 0 * V must not be NaN).
  // The page lookups come first, all of them: a copy is asm with a memory clobber, so a lookup
  // placed between two copies would wait for the first.
  const int my_ch = threadIdx.x % CH, my_r = threadIdx.x / CH;
  auto issue = [&](int kb) {
    __nv_bfloat16* kt = ring + (kb & 1) * 2 * TILE;
    int64_t base[kK / RPP];
#pragma unroll
    for (int j = 0; j < kK / RPP; ++j) {
      const int p = kb * kK + my_r + RPP * j;
      base[j] = p <= last_pos ? kv_row(pages[p / kv.page_size], layer, 0, kh, p % kv.page_size, kv.n_layers,
                                       kv.n_kv_heads, kv.page_size, D) + my_ch * 8
                              : -1;
    }
#pragma unroll
    for (int j = 0; j < kK / RPP; ++j) {
      const int r = my_r + RPP * j;
      const int off = r * D + swz<CH>(r, my_ch) * 8;
      if (base[j] >= 0) {
        cp_async16(kt + off, kvb + base[j]);
        cp_async16(kt + TILE + off, kvb + base[j] + vofs);
      } else {
        *reinterpret_cast<uint4*>(kt + off) = make_uint4(0u, 0u, 0u, 0u);
        *reinterpret_cast<uint4*>(kt + TILE + off) = make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
  issue(kb0);
  cp_async_commit();

  // Q as A fragments: rows r0 = warp*16 + g and r0 + 8 of the tile (zeros past T); k = dims
  // kb*16 + {2c, 2c+1} (a0 row g, a1 row g+8) and kb*16 + 8 + {2c, 2c+1} (a2, a3).
  const int r0 = warp * 16 + g;
  uint32_t qa[KB][4];
  {
    const __nv_bfloat16* qg = q + (int64_t(t0 + r0) * n_heads + h) * D;
    const __nv_bfloat16* qg8 = qg + int64_t(8) * n_heads * D;
    const bool ok0 = r0 < rows, ok1 = r0 + 8 < rows;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      const int d0 = kb * 16 + 2 * c;
      qa[kb][0] = ok0 ? *reinterpret_cast<const uint32_t*>(qg + d0) : 0u;
      qa[kb][2] = ok0 ? *reinterpret_cast<const uint32_t*>(qg + d0 + 8) : 0u;
      qa[kb][1] = ok1 ? *reinterpret_cast<const uint32_t*>(qg8 + d0) : 0u;
      qa[kb][3] = ok1 ? *reinterpret_cast<const uint32_t*>(qg8 + d0 + 8) : 0u;
    }
  }
  const int qpos0 = p0 + t0 + r0, qpos1 = qpos0 + 8;  // the positions of rows g and g + 8
  const int first_q = p0 + t0;                        // the block's first query position

  float acc[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;
  float m0 = -FLT_MAX, m1 = -FLT_MAX, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 (l: this lane's share)

  for (int kb = kb0; kb < n_kb; ++kb) {
    if (kb + 1 < n_kb) issue(kb + 1);  // its stage was last read in iteration kb - 1 (barrier below)
    cp_async_commit();
    cp_async_wait<1>();  // tile kb's group is complete for this thread
    __syncthreads();     // ... and for every thread
    const __nv_bfloat16* kt = ring + (kb & 1) * 2 * TILE;
    const __nv_bfloat16* vt = kt + TILE;

    // S = Q K^T: n-tile nt = keys kb*64 + 8nt .. +7. Per 16 keys and k16 block one ldmatrix.x4:
    // matrices (keys 0-7 | 8-15) x (k lo | hi).
    float sc[kK / 8][4];
#pragma unroll
    for (int nt = 0; nt < kK / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
    {
      const int mi = lane >> 3, rr = (lane & 7) + 8 * (mi >> 1);
#pragma unroll
      for (int kg = 0; kg < kK / 16; ++kg) {
        const int r = kg * 16 + rr;
#pragma unroll
        for (int kc = 0; kc < KB; ++kc) {
          uint32_t bf[4];
          ldsm_x4(bf, kt + r * D + swz<CH>(r, kc * 2 + (mi & 1)) * 8);
          mma_bf16(sc[2 * kg], qa[kc][0], qa[kc][1], qa[kc][2], qa[kc][3], bf[0], bf[1]);
          mma_bf16(sc[2 * kg + 1], qa[kc][0], qa[kc][1], qa[kc][2], qa[kc][3], bf[2], bf[3]);
        }
      }
    }
    // Online softmax. sc[nt][i]: row g (i < 2) or g + 8, key kb*64 + 8nt + 2c + (i & 1).
    // Some key of the tile lies after some query row, or before some row's window.
    const bool masked = kb * kK + kK - 1 > first_q || kb * kK < last_lo;
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < kK / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int kp = kb * kK + 8 * nt + 2 * c + (i & 1);
        const int qp = i < 2 ? qpos0 : qpos1;
        const bool valid = !masked || (kp <= qp && kp >= window_lo(qp + 1, kv.window));
        sc[nt][i] = valid ? sc[nt][i] * scale_log2 : -FLT_MAX;
        if (i < 2) mx0 = fmaxf(mx0, sc[nt][i]);
        else mx1 = fmaxf(mx1, sc[nt][i]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // A row with no valid key yet (a window starting past this tile) keeps m = -FLT_MAX, l = 0, acc = 0:
    // corr = exp2(0) = 1 now, and exp2(-FLT_MAX - mx) = 0 at its first valid tile.
    const float corr0 = exp2f(m0 - mx0), corr1 = exp2f(m1 - mx1);
    m0 = mx0, m1 = mx1;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kK / 8; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pe = sc[nt][i] > -FLT_MAX ? exp2f(sc[nt][i] - (i < 2 ? mx0 : mx1)) : 0.0f;
        sc[nt][i] = pe;
        if (i < 2) s0 += pe;
        else s1 += pe;
      }
    l0 = l0 * corr0 + s0;
    l1 = l1 * corr1 + s1;
#pragma unroll
    for (int nd = 0; nd < ND; ++nd) acc[nd][0] *= corr0, acc[nd][1] *= corr0, acc[nd][2] *= corr1, acc[nd][3] *= corr1;

    // O += P V per 16 keys kg: A = P (n-tiles 2kg, 2kg+1 of S), B = V [keys][dims] by ldmatrix.trans:
    // matrices (keys 0-7 | 8-15) x (dims lo | hi of an nd pair).
    {
      const int mi = lane >> 3, rr = (lane & 7) + 8 * (mi & 1);
#pragma unroll
      for (int kg = 0; kg < kK / 16; ++kg) {
        const uint32_t pa0 = pack_bf16(sc[2 * kg][0], sc[2 * kg][1]), pa1 = pack_bf16(sc[2 * kg][2], sc[2 * kg][3]);
        const uint32_t pa2 = pack_bf16(sc[2 * kg + 1][0], sc[2 * kg + 1][1]);
        const uint32_t pa3 = pack_bf16(sc[2 * kg + 1][2], sc[2 * kg + 1][3]);
        const int r = kg * 16 + rr;
#pragma unroll
        for (int nd = 0; nd < ND; nd += 2) {
          uint32_t bf[4];
          ldsm_x4_t(bf, vt + r * D + swz<CH>(r, nd + (mi >> 1)) * 8);
          mma_bf16(acc[nd], pa0, pa1, pa2, pa3, bf[0], bf[1]);
          mma_bf16(acc[nd + 1], pa0, pa1, pa2, pa3, bf[2], bf[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before iteration kb + 1 refills it
  }
  cp_async_wait<0>();

  // The row sums: this lane's share, then the quad's; then the rows, as bf16 pairs.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  __nv_bfloat16* o0 = out + (int64_t(t0 + r0) * n_heads + h) * D + 2 * c;
  __nv_bfloat16* o1 = o0 + int64_t(8) * n_heads * D;
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    if (r0 < rows) *reinterpret_cast<uint32_t*>(o0 + nd * 8) = pack_bf16(acc[nd][0] * inv0, acc[nd][1] * inv0);
    if (r0 + 8 < rows) *reinterpret_cast<uint32_t*>(o1 + nd * 8) = pack_bf16(acc[nd][2] * inv1, acc[nd][3] * inv1);
  }
}

template <int D>
cudaError_t fa_launch(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, int p0, float scale,
                      void* out, cudaStream_t s) {
  constexpr size_t smem = fa_smem_bytes<D>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(fa_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(unsigned(n_heads), unsigned((b.n_tokens + kQ - 1) / kQ));
  launch_k(fa_prefill_kernel<D>, grid, dim3(kFaThreads), smem, s, static_cast<const __nv_bfloat16*>(q), n_heads, kv,
           layer, b, p0, scale * 1.4426950408889634f, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace

bool attention_prefill_ok(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

cudaError_t attention_prefill(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, int p0,
                              float scale, void* out, cudaStream_t s) {
  switch (kv.head_dim) {
    case 32: return fa_launch<32>(q, n_heads, kv, layer, b, p0, scale, out, s);
    case 64: return fa_launch<64>(q, n_heads, kv, layer, b, p0, scale, out, s);
    case 128: return fa_launch<128>(q, n_heads, kv, layer, b, p0, scale, out, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace anvil::cuda
