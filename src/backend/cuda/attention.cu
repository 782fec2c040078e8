// Paged causal attention with GQA, split-KV ("flash-decoding"): block (split s, kv head, token t)
// covers an equal share of positions 0..pos[t] (a sliding window's last ones: window_lo) for the G = n_heads / n_kv_heads query heads that read
// that kv head, so each K/V row is loaded once for all G heads. Within a block, 4 warps take
// positions round-robin in batches of NB (NB K rows and V rows loaded before any is used, so several
// loads are in flight), each warp keeping an online softmax (max, sum, accumulator) per head in fp32;
// lane l holds dims [l*DL, l*DL + DL). The warps' states merge in shared memory into one partial per
// (token, head, split); a second kernel merges the splits and writes bf16. With one split (prefill,
// large batches, short contexts) the first kernel writes the bf16 output itself.
// Split boundaries are computed on the device from pos[t], so the launch shape depends only on
// (T, n_splits): a captured decode graph replays correctly as the context grows.
#include <algorithm>
#include <cfloat>
#include <cstdlib>

#include "backend/cuda/attention_merge.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {
namespace {

constexpr int kWarps = 4;

template <int DL>
__device__ __forceinline__ void load_row(const __nv_bfloat16* p, float (&f)[DL]) {
  if constexpr (DL == 4) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
  } else if constexpr (DL == 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
    f[4] = bf16_lo(v.z), f[5] = bf16_hi(v.z), f[6] = bf16_lo(v.w), f[7] = bf16_hi(v.w);
  } else {
#pragma unroll
    for (int j = 0; j < DL; ++j) f[j] = __bfloat162float(p[j]);
  }
}

// The merge of one (token, head)'s splits by one block of blockDim.x threads: the split weights
// w_s = exp2(m_s - M) (0 for empty splits) are formed in parallel into shared memory `w`
// ([n_splits]), then thread d sums w_s * acc_s[d] over the splits with independent loads (no
// data-dependent branch in the loop, so they pipeline). Partials are read through L2 (__ldcg): in
// the fused form they were written by other blocks of the same kernel.
__device__ __forceinline__ void combine_splits(const float* part, int D, int n_splits, float* w,
                                               __nv_bfloat16* out) {
  float mx = -FLT_MAX;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x)
    if (__ldcg(part + s * (D + 2) + 1) > 0.0f) mx = fmaxf(mx, __ldcg(part + s * (D + 2)));
  __shared__ float red[32];
  mx = warp_max(mx);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
  __syncthreads();
  mx = -FLT_MAX;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) mx = fmaxf(mx, red[i]);
  float l = 0.0f;
  for (int s = threadIdx.x; s < n_splits; s += blockDim.x) {
    const float ls = __ldcg(part + s * (D + 2) + 1);
    const float c = ls > 0.0f ? exp2f(__ldcg(part + s * (D + 2)) - mx) : 0.0f;
    w[s] = c;
    l += ls * c;
  }
  const float L = block_sum(l);  // its barriers also publish w[]
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float A = 0.0f;
#pragma unroll 8
    for (int s = 0; s < n_splits; ++s) A = fmaf(w[s], __ldcg(part + s * (D + 2) + 2 + d), A);
    out[d] = __float2bfloat16_rn(L > 0.0f ? A / L : 0.0f);
  }
  __syncthreads();  // w[] and red[] are reused by a following call
}

// Partial layout per (token, head, split): [m, l, acc[D]] (acc unnormalized, scores in log2 units).
// out non-null (only with n_splits == 1: prefill, large batches, short contexts): the merged state
// is the answer, written as bf16 exactly as attn_combine_kernel would (acc / l), and no partial.
// done non-null (ANVIL_CUDA_ATTN_FUSED=1, n_splits > 1): the last block to finish among the splits
// of a (token, kv head) merges them for its G heads (combine_splits, the same arithmetic as the
// combine kernel) into out_final, then resets its counter to 0 for the next launch; no second
// kernel. done[T * n_kv_heads] must be zero before the first launch.
template <int DL, int GMAX>
__global__ void __launch_bounds__(kWarps * 32) attn_split_kernel(const __nv_bfloat16* q, int n_heads, KVDev kv,
                                                                 int layer, BatchDev b, float scale_log2,
                                                                 int n_splits, float* ws, __nv_bfloat16* out,
                                                                 unsigned* done, __nv_bfloat16* out_final) {
  pdl_launch();
  // NB positions per warp per iteration (2*NB K/V row loads in flight). 8 measured slower on the
  // H200 (more registers, no gain in loads in flight).
  constexpr int NB = 4;
  const int s = blockIdx.x, kh = blockIdx.y, t = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = kv.head_dim, G = n_heads / kv.n_kv_heads;
  const bool active = lane * DL < D;  // D < 32 * DL: the high lanes hold no dims (zeros)
  const int len = b.pos[t] + 1;
  const int lo = window_lo(len, kv.window);  // the first key (a sliding window's), 0 without one
  const int live = live_splits(len - lo, n_splits);
  if (s >= live) return;
  if (live == 1) out = out_final, done = nullptr;  // one live split: the answer, written here
  const int per = (len - lo + live - 1) / live;
  const int p_begin = lo + s * per, p_end = min(len, p_begin + per);
  const int32_t* pages = b.page_table + int64_t(b.seq[t]) * b.max_pages;
  const __nv_bfloat16* kvb = static_cast<const __nv_bfloat16*>(kv.base);

  // K/V rows of positions p .. p + NB - 1 into kf, vf (zeros past p_end). In a decode step (one
  // token per sequence: n_tokens == n_seqs) only row len - 1 was written by this step (by the
  // previous kernel, rope_kv); every other row, like the positions and the page table (written by
  // the host before the step), can be read before the wait for that kernel, so the first batch of
  // each warp is loaded before it and only the new row after.
  float kf[NB][DL], vf[NB][DL];
  auto load_kv = [&](int base, int skip) {
#pragma unroll
    for (int u = 0; u < NB; ++u) {
      const int p = base + u;
      if (p == skip) continue;
#pragma unroll
      for (int j = 0; j < DL; ++j) kf[u][j] = vf[u][j] = 0.0f;
      if (p < p_end && active) {
        const int64_t page = pages[p / kv.page_size];
        const int slot = p % kv.page_size;
        load_row<DL>(kvb + kv_row(page, layer, 0, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D) + lane * DL,
                     kf[u]);
        load_row<DL>(kvb + kv_row(page, layer, 1, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D) + lane * DL,
                     vf[u]);
      }
    }
  };
  const int base0 = p_begin + warp * NB;
  const bool early = b.n_tokens == b.n_seqs;
  if (early) {
#pragma unroll
    for (int u = 0; u < NB; ++u)
#pragma unroll
      for (int j = 0; j < DL; ++j) kf[u][j] = vf[u][j] = 0.0f;
    load_kv(base0, len - 1);
  }
  pdl_wait();
  if (early) {
    const int u = len - 1 - base0;  // the new row, if it is in this warp's first batch
    if (u >= 0 && u < NB && len - 1 < p_end && active) {
      const int64_t page = pages[(len - 1) / kv.page_size];
      const int slot = (len - 1) % kv.page_size;
#pragma unroll
      for (int uu = 0; uu < NB; ++uu)
        if (uu == u) {
          load_row<DL>(kvb + kv_row(page, layer, 0, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D) + lane * DL,
                       kf[uu]);
          load_row<DL>(kvb + kv_row(page, layer, 1, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D) + lane * DL,
                       vf[uu]);
        }
    }
  }

  float qf[GMAX][DL], acc[GMAX][DL], m[GMAX], l[GMAX];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    m[g] = -FLT_MAX, l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < DL; ++j) acc[g][j] = 0.0f, qf[g][j] = 0.0f;
    if (g < G && active) load_row<DL>(q + (int64_t(t) * n_heads + kh * G + g) * D + lane * DL, qf[g]);
  }

  for (int base = base0; base < p_end; base += kWarps * NB) {
    if (!early || base != base0) load_kv(base, -1);
#pragma unroll
    for (int g = 0; g < GMAX; ++g) {
      if (g >= G) break;
      float sc[NB];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < NB; ++u) {
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < DL; ++j) d = fmaf(qf[g][j], kf[u][j], d);
        d = warp_sum(d) * scale_log2;
        sc[u] = base + u < p_end ? d : -FLT_MAX;
        mx = fmaxf(mx, sc[u]);
      }
      const float corr = exp2f(m[g] - mx);
      l[g] *= corr;
#pragma unroll
      for (int j = 0; j < DL; ++j) acc[g][j] *= corr;
#pragma unroll
      for (int u = 0; u < NB; ++u) {
        if (base + u < p_end) {
          const float pu = exp2f(sc[u] - mx);
          l[g] += pu;
#pragma unroll
          for (int j = 0; j < DL; ++j) acc[g][j] = fmaf(pu, vf[u][j], acc[g][j]);
        }
      }
      m[g] = mx;
    }
  }

  // Merge the 4 warps: each publishes (m, l, acc) per head; warp 0 combines.
  __shared__ float sm[kWarps][GMAX][2];
  __shared__ float sacc[kWarps][GMAX][DL * 32];
#pragma unroll
  for (int g = 0; g < GMAX; ++g) {
    if (g >= G) break;
    if (lane == 0) sm[warp][g][0] = m[g], sm[warp][g][1] = l[g];
    if (active)
#pragma unroll
      for (int j = 0; j < DL; ++j) sacc[warp][g][lane * DL + j] = acc[g][j];
  }
  __syncthreads();
  merge_warps_store<kWarps>(
      G, D, [&](int w, int g) { return sm[w][g][0]; }, [&](int w, int g) { return sm[w][g][1]; },
      [&](int w, int g, int d) { return sacc[w][g][d]; }, int64_t(t) * n_heads + kh * G, out, ws, n_splits, s);
  if (!done) return;
  __threadfence();  // this block's partials are visible device-wide before it counts itself
  __syncthreads();
  __shared__ bool last;
  unsigned* counter = done + int64_t(t) * kv.n_kv_heads + kh;
  if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == unsigned(live - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  extern __shared__ float wsplit[];  // [n_splits]
  for (int g = 0; g < G; ++g) {
    const int64_t th = int64_t(t) * n_heads + kh * G + g;
    combine_splits(ws + th * n_splits * (D + 2), D, live, wsplit, out_final + th * D);
  }
  if (threadIdx.x == 0) *counter = 0u;
}

// One block per (token, head): the live splits' partials (live_splits of the token's context; one
// live split wrote the output itself).
__global__ void attn_combine_kernel(const float* ws, const int32_t* pos, int n_heads, int D, int n_splits,
                                    int window, __nv_bfloat16* out) {
  pdl_begin();
  extern __shared__ float w[];  // [n_splits]
  const int64_t th = blockIdx.x;  // token * n_heads + head
  const int len = pos[th / n_heads] + 1;
  const int live = live_splits(len - window_lo(len, window), n_splits);
  if (live == 1) return;
  combine_splits(ws + th * n_splits * (D + 2), D, live, w, out + th * D);
  trace::point(9);
}

template <int DL, int GMAX>
cudaError_t launch(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                   int n_splits, float* ws, unsigned* done, void* out, cudaStream_t s) {
  const dim3 grid(unsigned(n_splits), unsigned(kv.n_kv_heads), unsigned(b.n_tokens));
  // One split: the split kernel writes the output itself (no workspace round trip, one launch).
  __nv_bfloat16* direct = n_splits == 1 ? static_cast<__nv_bfloat16*>(out) : nullptr;
  unsigned* fused = n_splits > 1 ? done : nullptr;
  launch_k(attn_split_kernel<DL, GMAX>, dim3(grid), dim3(kWarps * 32), fused ? size_t(n_splits) * sizeof(float) : 0,
           s, static_cast<const __nv_bfloat16*>(q), n_heads, kv, layer, b, scale * 1.4426950408889634f, n_splits, ws,
           direct, fused, static_cast<__nv_bfloat16*>(out));
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || direct || fused) return e;
  return attention_combine(ws, b.pos, b.n_tokens, n_heads, kv.head_dim, n_splits, kv.window, out, s);
}

}  // namespace

cudaError_t attention_combine(const float* ws, const int32_t* pos, int T, int n_heads, int head_dim, int n_splits,
                              int window, void* out, cudaStream_t s) {
  launch_k(attn_combine_kernel, dim3(unsigned(int64_t(T) * n_heads)), dim3(128), size_t(n_splits) * sizeof(float), s, ws,
           pos, n_heads, head_dim, n_splits, window, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

size_t attention_workspace_floats(int T, int n_heads, int head_dim, int n_splits) {
  return size_t(T) * n_heads * n_splits * (head_dim + 2);
}

int attention_splits(int T, int n_kv_heads, int max_positions, int n_sms, bool tc_decode) {
  // ~4 blocks of 4 warps per SM keep enough K/V loads in flight to approach the copy bandwidth, with
  // >= 64 positions per split at full context: the rule for prefill batches and the split kernels.
  // At batch 1 (fewer blocks than a wave; what was measured, on the H200, session 16, qwen3-8b
  // q4g64): ~256 positions per split, but no fewer splits than fill one wave of blocks nor more than
  // the 4 blocks per SM. At 4,096 tokens of context that is 17 splits instead of 66 (392.6 against
  // 380.7 tok/s: each of the 66 had one tile of 16 positions per warp, and the merge reads them all);
  // at 512 the 64-position floor caps both rules alike; at 16,384, 64 instead of 66.
  // Decode batches of 2..32 sequences on the tensor cores (tc_decode): just enough splits for one
  // block per SM (one split from 17 sequences of 8 kv heads on). A block's fixed cost (Q fragments,
  // the warps' merge, its partials) outweighs the loads in flight more splits add: ncu had the
  // 32-sequence qwen3-8b step's attention (3 splits) at 58.7 us per layer for 67 MB, ~4,100
  // instructions per warp. Measured on the H200 (session 18, qwen3-8b q4g64 after 512-token
  // prompts, ms per step, bench-kv): 32 sequences 7.93 (3 splits, the 4-wave rule) -> 6.79 (1),
  // 7.12 (2); 16 sequences 5.36 (5) -> 4.82 (2), 4.95 (1); 8 sequences 4.66 (9) -> 4.24 (2), 4.37 (4).
  // Not yet measured: few sequences at long contexts (thousands of positions each), where one block
  // per SM holds fewer loads in flight than the 4-wave rule's four. max_positions is the engine's
  // context (the page table's fixed stride), not the batch's, so it cannot tell the two apart here.
  // ANVIL_CUDA_ATTN_SPLIT_RULE=0: the 4-wave rule for every batch (for measuring).
  static const bool rule = [] {
    const char* e = std::getenv("ANVIL_CUDA_ATTN_SPLIT_RULE");
    return !(e && *e == '0');
  }();
  // ANVIL_CUDA_ATTN_BATCH_SPLITS=N (for measuring): N splits for every batch of more than one
  // token, fewer where the context has fewer than 64 positions per split.
  static const int batch_splits = [] {
    const char* e = std::getenv("ANVIL_CUDA_ATTN_BATCH_SPLITS");
    return e ? std::max(0, std::atoi(e)) : 0;
  }();
  if (T > 1 && batch_splits > 0) return std::max(1, std::min(batch_splits, max_positions / 64));
  // ANVIL_CUDA_ATTN_SPLITS=N (for measuring, session 43): N splits at batch 1, fewer where the
  // context has fewer than 64 positions per split (live_splits). At 512 tokens of context the rule
  // below gives 8 live splits of 64 positions (one 16-position tile per warp, merged across a
  // cluster of 8): whether fewer, longer splits (more tiles per warp's ring, a smaller merge) cut
  // the ~8-11 us decode attention takes after its release (session 42's timeline) is what it tests.
  static const int one_splits = [] {
    const char* e = std::getenv("ANVIL_CUDA_ATTN_SPLITS");
    return e ? std::max(0, std::atoi(e)) : 0;
  }();
  if (T == 1 && one_splits > 0) return std::max(1, std::min(one_splits, max_positions / 64));
  const int blocks = T * n_kv_heads;
  if (blocks >= 2 * n_sms) return 1;
  const int most = std::max(1, std::min((4 * n_sms + blocks - 1) / blocks, max_positions / 64));
  if (!rule) return most;
  const int least = (n_sms + blocks - 1) / blocks;
  if (T > 1) return tc_decode ? std::min(most, least) : most;
  if (blocks >= n_sms) return most;
  return std::min(most, std::max(least, max_positions / 256));
}

cudaError_t attention(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                      int n_splits, float* ws, unsigned* done, void* out, cudaStream_t s) {
  const int G = n_heads / kv.n_kv_heads;
  const int D = kv.head_dim;
  const int DL = D <= 32 ? 1 : D <= 64 ? 2 : D <= 128 ? 4 : 8;
  if (G > 8 || D > 256 || D % DL != 0) return cudaErrorInvalidValue;
  if (DL == 1) return G <= 4 ? launch<1, 4>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s)
                             : launch<1, 8>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s);
  if (DL == 2) return G <= 4 ? launch<2, 4>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s)
                             : launch<2, 8>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s);
  if (DL == 4) return G <= 4 ? launch<4, 4>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s)
                             : launch<4, 8>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s);
  if (DL == 8) return G <= 4 ? launch<8, 4>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s)
                             : launch<8, 8>(q, n_heads, kv, layer, b, scale, n_splits, ws, done, out, s);
  return cudaErrorInvalidValue;
}

}  // namespace anvil::cuda
