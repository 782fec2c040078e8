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
#include <cfloat>

#include "backend/cuda/attention_merge.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/qgemv_tc.cuh"

namespace anvil::cuda {
namespace {

using tc::cp_async16;
using tc::cp_async_commit;
using tc::cp_async_wait;
using tc::mma_bf16;

constexpr int kAW = 4;   // warps per block
constexpr int kAP = 16;  // positions per warp tile
constexpr int kAS = 3;   // ring stages per warp

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Shared memory of one block: the warps' rings [kAW][kAS][K, V][kAP rows][D] bf16; after the loop the
// same bytes hold the merge: m, l [kAW][16] and acc [kAW][16][D] fp32.
__host__ __device__ constexpr size_t tc_attn_smem(int D) {
  return size_t(kAW) * kAS * 2 * kAP * D * 2 > size_t(kAW) * (32 + 16 * D) * 4
             ? size_t(kAW) * kAS * 2 * kAP * D * 2
             : size_t(kAW) * (32 + 16 * D) * 4;
}

// D: head_dim (64 or 128). ROWS16: G > 8 (the A fragments' rows g + 8 carry heads too).
template <int D, bool ROWS16>
__global__ void __launch_bounds__(kAW * 32) attn_tc_kernel(const __nv_bfloat16* q, int n_heads, KVDev kv, int layer,
                                                          BatchDev b, float scale_log2, int n_splits, float* ws,
                                                          __nv_bfloat16* out) {
  constexpr int CH = D / 8;    // 16-byte chunks per row
  constexpr int KB = D / 16;   // k16 blocks of the head dimension (S = Q K^T)
  constexpr int ND = D / 8;    // n8 tiles of the head dimension (O)
  constexpr int TILE = kAP * D;  // bf16 elements of one K (or V) tile
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch();
  const int s = blockIdx.x, kh = blockIdx.y, t = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  const int G = n_heads / kv.n_kv_heads;
  const int len = b.pos[t] + 1;
  const int live = live_splits(len, n_splits);
  if (s >= live) return;
  const int per = (len + live - 1) / live;
  const int p_begin = s * per, p_end = min(len, p_begin + per);
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
  // by this step (by rope_kv, the previous kernel); every other row, the positions and the page
  // table can be read before the wait for it (as in attention.cu's split kernel), so those copies
  // start before the wait and the new row's after it. They form one copy group, followed by
  // kAS - 2 empty ones, so the loop's count of groups holds.
  const bool early = b.n_tokens == b.n_seqs;
  const int late = early ? len - 1 : -1;
  if (early)
    for (int i = 0; i < kAS - 1 && i < n; ++i) issue(i, late, -1);
  pdl_wait();
  for (int i = 0; i < kAS - 1 && i < n; ++i) issue(i, -1, early ? late : -1);
  cp_async_commit();
#pragma unroll
  for (int i = 1; i < kAS - 1; ++i) cp_async_commit();

  // Q as A fragments: rows g (and g + 8) are query heads kh*G + row; k = dims kb*16 + {2c, 2c+1} (a0,
  // a1) and kb*16 + 8 + {2c, 2c+1} (a2, a3).
  uint32_t qa[KB][4];
  {
    const __nv_bfloat16* q0 = q + (int64_t(t) * n_heads + kh * G) * D;
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) {
      const int d0 = kb * 16 + 2 * c;
      qa[kb][0] = g < G ? *reinterpret_cast<const uint32_t*>(q0 + g * D + d0) : 0u;
      qa[kb][2] = g < G ? *reinterpret_cast<const uint32_t*>(q0 + g * D + d0 + 8) : 0u;
      qa[kb][1] = ROWS16 && g + 8 < G ? *reinterpret_cast<const uint32_t*>(q0 + (g + 8) * D + d0) : 0u;
      qa[kb][3] = ROWS16 && g + 8 < G ? *reinterpret_cast<const uint32_t*>(q0 + (g + 8) * D + d0 + 8) : 0u;
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
        const bool valid = p0 + 8 * nt + 2 * c + (i & 1) < p_end;
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
  merge_warps_store<kAW>(
      G, D, [&](int w, int hg) { return sm[w * 16 + hg]; }, [&](int w, int hg) { return sl[w * 16 + hg]; },
      [&](int w, int hg, int d) { return sa[(w * 16 + hg) * D + d]; }, int64_t(t) * n_heads + kh * G,
      live == 1 ? out : nullptr, ws, n_splits, s);
}

template <int D, bool R16>
cudaError_t launch_tc(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                      int n_splits, float* ws, void* out, cudaStream_t s) {
  constexpr size_t smem = tc_attn_smem(D);
  static const cudaError_t attr =
      cudaFuncSetAttribute(attn_tc_kernel<D, R16>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(unsigned(n_splits), unsigned(kv.n_kv_heads), unsigned(b.n_tokens));
  launch_k(attn_tc_kernel<D, R16>, grid, dim3(kAW * 32), smem, s, static_cast<const __nv_bfloat16*>(q), n_heads, kv,
           layer, b, scale * 1.4426950408889634f, n_splits, ws, static_cast<__nv_bfloat16*>(out));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || n_splits == 1) return e;
  return attention_combine(ws, b.pos, b.n_tokens, n_heads, D, n_splits, out, s);
}

}  // namespace

bool attention_tc_ok(int n_heads, int n_kv_heads, int head_dim) {
  const int G = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
  return G >= 1 && G <= 16 && n_heads % n_kv_heads == 0 && (head_dim == 64 || head_dim == 128);
}

cudaError_t attention_tc(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                         int n_splits, float* ws, void* out, cudaStream_t s) {
  if (!attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim)) return cudaErrorInvalidValue;
  const bool r16 = n_heads / kv.n_kv_heads > 8;
  if (kv.head_dim == 64)
    return r16 ? launch_tc<64, true>(q, n_heads, kv, layer, b, scale, n_splits, ws, out, s)
               : launch_tc<64, false>(q, n_heads, kv, layer, b, scale, n_splits, ws, out, s);
  return r16 ? launch_tc<128, true>(q, n_heads, kv, layer, b, scale, n_splits, ws, out, s)
             : launch_tc<128, false>(q, n_heads, kv, layer, b, scale, n_splits, ws, out, s);
}

}  // namespace anvil::cuda
