// Internal to src/backend/cuda/: what the q4 tensor-core mat-vec kernels share (qgemv_tc.cu: the
// register-fed and staged kernels and the dispatch; qgemv_stream.cu: the streamed decode kernel).
// The layout of a step, the nibble-pair dequantization and the mma are described at the top of
// qgemv_tc.cu. The attention kernels on the tensor cores take mma_bf16, the cp.async helpers and the
// ldmatrix loads from here too.
#pragma once
#include <map>
#include <tuple>
#include <mutex>
#include <utility>

#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda::tc {

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
  // One token on the integer path: x as int16 planes already (GemvScratch::xplanes), copied instead
  // of staged; or null.
  const void* xplanes = nullptr;
  // One token, 3 segments (q, k, v): rope_kv's work in the launch's tail (RopeEpi; counters null: off).
  RopeEpi rope;
};

// A wave-ahead prefetch switch (ANVIL_QGEMM_WAVE_PF): 0 off, 1 on, 2 on with
// the evict_last priority.
inline int wave_pf_setting(const char* var) {
  const char* e = std::getenv(var);
  return e && (*e == '1' || *e == '2') ? *e - '0' : 0;
}

__device__ __forceinline__ uint32_t bf2_as_u32(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t*>(&v); }
__device__ __forceinline__ __nv_bfloat162 u32_as_bf2(uint32_t v) { return *reinterpret_cast<__nv_bfloat162*>(&v); }

// Nibbles (s, s+4) of w as the bf16 pair (s*q0 + b, s*q1 + b).
// The mask and the or are one lop3 with both constants in registers: given two immediates, ptxas
// emits two LOP3 per pair (SASS of the streamed kernel's step: 68 LOP3, 36 with this; the same bits
// either way; +5% qwen3-8b q4g64 decode on the H200 with the other lean loops, session 13).
__device__ __forceinline__ uint32_t dq_pair(uint32_t w, int shift, __nv_bfloat162 s2, __nv_bfloat162 b2) {
  uint32_t p;  // bf16 pair (128 + q0, 128 + q1), exact: (w >> shift) & 0x000F000F | 0x43004300
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(p) : "r"(w >> shift), "r"(0x000F000Fu), "r"(0x43004300u));
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

// ldmatrix (x4, and transposed) from shared memory and a bf16 pair packed from two floats: the
// fragment loads of the tensor-core attention kernels (attention_decode_tc.cu, attention_prefill.cu).
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

// cp.async: 16 bytes global -> shared without registers; commit closes a group, wait<N> returns
// when at most N of this thread's groups are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

// The 8 mmas of a step for M matrices (gate and up share each B fragment). xb: this lane's token's
// chunk of activations pre-permuted into fragment order (mma j's b0, b1 at xb[j]), never null and
// 16-byte aligned: two mmas' fragments per 16-byte load, no predicated loads or register clears
// (a lane whose mma column no token fills passes a real token's chunk; that column is never stored).
template <int M>
__device__ __forceinline__ void step_mma_frag(float (&d)[M][4], const Step (&s)[M], const uint2* xb) {
  uint4 xq[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) xq[i] = reinterpret_cast<const uint4*>(xb)[i];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int word = j >> 1, sh = (j & 1) * 8;
    const uint2 b = (j & 1) ? make_uint2(xq[j >> 1].z, xq[j >> 1].w) : make_uint2(xq[j >> 1].x, xq[j >> 1].y);
#pragma unroll
    for (int mi = 0; mi < M; ++mi) {
      const uint32_t wa = word == 0 ? s[mi].wa.x : word == 1 ? s[mi].wa.y : word == 2 ? s[mi].wa.z : s[mi].wa.w;
      const uint32_t wb = word == 0 ? s[mi].wb.x : word == 1 ? s[mi].wb.y : word == 2 ? s[mi].wb.z : s[mi].wb.w;
      mma_bf16(d[mi], dq_pair(wa, sh, s[mi].sa, s[mi].ba), dq_pair(wb, sh, s[mi].sb, s[mi].bb),
               dq_pair(wa, sh + 4, s[mi].sa, s[mi].ba), dq_pair(wb, sh + 4, s[mi].sb, s[mi].bb), b.x, b.y);
    }
  }
}

// A streamed step's operands for M matrices from a ring slot (the lane's 16 bytes of rows g and g+8
// of each) and the staged scales and biases ([matrix * 2 + (0 scales, 1 biases)][16 rows][ngp]) of
// group gi: what qgemv_stream.cu's and moe_stream.cu's loops feed to step_mma_frag.
template <int M>
__device__ __forceinline__ void ring_step(Step (&st)[M], const uint4* slot, const __nv_bfloat16* sc, int ngp, int g,
                                          int gi, int lane) {
#pragma unroll
  for (int mi = 0; mi < M; ++mi) {
    st[mi].wa = slot[64 * mi + lane];
    st[mi].wb = slot[64 * mi + 32 + lane];
    st[mi].sa = __bfloat162bfloat162(sc[(2 * mi * 16 + g) * ngp + gi]);
    st[mi].ba = __bfloat162bfloat162(sc[((2 * mi + 1) * 16 + g) * ngp + gi]);
    st[mi].sb = __bfloat162bfloat162(sc[(2 * mi * 16 + g + 8) * ngp + gi]);
    st[mi].bb = __bfloat162bfloat162(sc[((2 * mi + 1) * 16 + g + 8) * ngp + gi]);
  }
}

__device__ __forceinline__ float load_bias(const void* p, int64_t i, Elem e) {
  switch (e) {
    case Elem::kF32: return static_cast<const float*>(p)[i];
    case Elem::kF16: return __half2float(static_cast<const __half*>(p)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
}

// Block `tile`'s matrix (the launch's segments are consecutive runs of 16-row tiles) and the first
// of its 16 rows there.
__device__ __forceinline__ const TcSeg& tile_seg(const TcParams& p, int64_t tile, int64_t* r0) {
  int si = 0;
  if (p.n_seg > 1 && tile >= p.seg[1].tile_begin) si = 1;
  if (p.n_seg > 2 && tile >= p.seg[2].tile_begin) si = 2;
  *r0 = (tile - p.seg[si].tile_begin) * 16;
  return p.seg[si];
}

// Whether the launch's weights, scales and biases (and up's, with SWIGLU) are 16-byte aligned, as
// the cp.async kernels copy them.
inline bool weights_aligned16(const TcParams& p, int n_mats, bool swiglu) {
  auto a = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  for (int i = 0; i < n_mats; ++i)
    if (!a(p.seg[i].w) || !a(p.seg[i].scales) || !a(p.seg[i].biases)) return false;
  return !swiglu || (a(p.up.w) && a(p.up.scales) && a(p.up.biases));
}

// One output element of a q4 tensor-core launch, from its fp32 dot product(s): silu(gate) * up with
// SWIGLU (into seg[0].out); else the product (+ bias) as F32 or bf16, or with p.residual added to the
// bf16 residual it overwrites.
template <bool SWIGLU, bool FU = true>
__device__ __forceinline__ void store_out(const TcParams& p, const TcSeg& m, int64_t row, int t, float v, float u,
                                          const float* hpre = nullptr, int hi = 0) {
  if constexpr (SWIGLU) {
    static_cast<__nv_bfloat16*>(p.seg[0].out)[t * m.rows + row] = __float2bfloat16_rn(v / (1.0f + __expf(-v)) * u);
  } else {
    if (m.bias) v += load_bias(m.bias, row, m.bias_dtype);
    __nv_bfloat16* ob = static_cast<__nv_bfloat16*>(m.out) + t * m.rows + row;
    if (FU && p.residual)
      *ob = __float2bfloat16_rn((hpre ? hpre[hi] : __bfloat162float(*ob)) + __bfloat162float(__float2bfloat16_rn(v)));
    else if (p.out_f32) static_cast<float*>(m.out)[t * m.rows + row] = v;
    else *ob = __float2bfloat16_rn(v);
  }
}

// log2 of an MLX group size (32, 64 or 128).
__device__ __forceinline__ int group_shift(int group) { return group == 32 ? 5 : group == 64 ? 6 : 7; }

// The end of every q4 tensor-core kernel: the W warps' fp32 accumulators, acc(matrix, tile, i) for
// the NT token tiles (matrix 1: the up matrix with SWIGLU), are summed through shared memory and
// warp 0 writes the block's outputs. acc's element i of tile nt is row g (+8 for i >= 2) and token
// 8*nt + 2c + (i & 1); store_out writes each. tok_ss (the streamed kernel's fused norm, p.norm_w set): per-token sums of h^2; each dot product
// is then scaled by that token's 1/rms first. hpre (one token, p.residual): the residual's old rows g
// and g + 8 as this lane loaded them before the loop, so the epilogue does not wait on that load.
// FU = false: an instance without the fused forms' code (p.norm_w and p.residual unset).
template <bool SWIGLU, int W, int NT, bool FU = true, class Acc>
__device__ __forceinline__ void finish_tile(const TcParams& p, const TcSeg& m, int64_t r0, const float* tok_ss,
                                            Acc&& acc, const float* hpre = nullptr) {
  constexpr int M = SWIGLU ? 2 : 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  __shared__ float red[W][M][NT][32][4];
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][mi][nt][lane][i] = acc(mi, nt, i);
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int j = 0; j < 4 * NT; ++j) {
    const int nt = j / 4, i = j % 4;
    float v = 0, u = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      v += red[w][0][nt][lane][i];
      if constexpr (SWIGLU) u += red[w][M - 1][nt][lane][i];
    }
    const int t = 8 * nt + 2 * c + (i & 1);
    const int64_t row = r0 + g + (i >> 1) * 8;
    if (t >= p.T || row >= m.rows) continue;
    if (FU && tok_ss && p.norm_w) {
      const float inv = rsqrtf(tok_ss[t] / float(p.K) + p.eps);
      v *= inv, u *= inv;
    }
    store_out<SWIGLU, FU>(p, m, row, t, v, u, hpre, i >> 1);
  }
}

// ---- qgemv_stream.cu ----
// Whether the streamed kernel takes this call, and how (AsyncShape): 4 warps per tile (8 when there
// are fewer tiles than two per SM, so narrow matrices still have enough in flight), rings of 8 steps
// (4 with the up matrix, whose steps are twice the bytes). ANVIL_QGEMV_RING=W,S (for measuring, not
// yet measured) makes every streamed launch use W warps per tile (4 or 8) and rings of S steps (4, 6
// or 8; half that with the up matrix). A variant with 8 warps, half-depth rings and a 64-register cap
// measured 285 against 299 tok/s (docs/benchmarks.md) and was removed.
struct AsyncShape {
  int W = 4, S = 8;  // S: ring depth in steps (already halved with the up matrix)
  bool integer = false;  // one token through the integer dot products (qgemv_int.cuh; large launches)
  size_t smem = 0;
};
bool async_ok(const TcParams& p, int n_mats, int T, bool swiglu, AsyncShape* a);
cudaError_t async_launch(bool swiglu, const AsyncShape& a, int64_t tiles, cudaStream_t s, const TcParams& p);

// The device's SM count (132 on the H200 if it cannot be read), once per process.
inline int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 132;
    return v;
  }();
  return n;
}

// Blocks of `kernel` resident on an SM at once with `threads` threads and `smem` bytes of dynamic
// shared memory (registers, shared memory, threads: the occupancy calculator), after raising its
// dynamic shared memory limit to max_smem; cached per (kernel, smem); 0 where it cannot tell. For
// the batch kernel's K split, which counts waves (qgemm_batch.cu).
template <class Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem, size_t max_smem) {
  static std::mutex mu;
  static std::map<std::pair<const void*, size_t>, int> cache;
  const auto fn = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lk(mu);
  const auto it = cache.find({fn, smem});
  if (it != cache.end()) return it->second;
  int n = 0;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_smem)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  cache.emplace(std::make_pair(fn, smem), n);
  return n;
}
// Clusters of `cluster_y` blocks along y (threads, smem each) of the kernel that the device holds at
// once (cudaOccupancyMaxActiveClusters; 0 if none or on error), cached like resident_blocks.
template <class Kernel>
int resident_clusters_y(Kernel kernel, int threads, size_t smem, size_t max_smem, int cluster_y) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int>, int> cache;
  const auto fn = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> lk(mu);
  const auto it = cache.find({fn, smem, cluster_y});
  if (it != cache.end()) return it->second;
  int n = 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, unsigned(cluster_y));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = 1;
  at[0].val.clusterDim.y = unsigned(cluster_y);
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(max_smem)) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  cache.emplace(std::make_tuple(fn, smem, cluster_y), n);
  return n;
}

// ---- qgemm_batch.cu ----
// Batches of kBatchMinTokens..64 rows: blocks of 4 (or 8) warps, 16 (or 32) rows each, walking K together through a shared ring, K split
// over blocks when there are few rows (see the top of qgemm_batch.cu). batch_plan says whether it
// takes the call and how, with the scratch it needs (GemvScratch's sizes).
struct BatchPlan {
  int NT = 2;       // token tiles of 8
  int S = 4;        // ring stages
  int W = 4;        // warps per block
  int R = 1;        // 16-row tiles per warp
  int sps = 0;      // steps (128 elements of K) per split
  int ksplit = 1;   // splits of K (gridDim.y)
  int ngp = 0;      // staged scales' row stride
  int64_t nblk = 0; // blocks (16 W R rows) over the segments
  size_t smem = 0;
  size_t xperm_bytes = 0, part_floats = 0, n_done = 0;
  bool cluster = false;     // the splits of a row block are one thread block cluster (GemvScratch::cluster)
  bool sum_kernel = false;  // the splits' partials are added by split_sum_kernel (GemvScratch::sum_kernel's policy)
  bool px = false;          // x read as it is, no permute_x_kernel (GemvScratch::plain_x; 4-warp blocks only)
};
// cluster: a split row block may add its partial sums in a thread block cluster (GemvScratch::cluster);
// sum_kernel: whether split launches not in clusters add them in a second kernel (GemvScratch::sum_kernel:
// kSumKernelNever, kSumKernelAlways, or kSumKernelWavePlanner: only where the wave planner plans).
// plain_x: the kernel may read x as it is instead of after permute_x_kernel (GemvScratch::plain_x).
bool batch_plan(const TcParams& p, int n_mats, int T, bool swiglu, bool cluster, int sum_kernel, bool plain_x,
                BatchPlan* b);
cudaError_t batch_launch(bool swiglu, const BatchPlan& b, const GemvScratch& sc, cudaStream_t s, TcParams p);

}  // namespace anvil::cuda::tc
