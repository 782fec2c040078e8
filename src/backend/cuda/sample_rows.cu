// Backend::sample_rows on the GPU: the host Sampler's token (runtime/sampler.h), bit for bit, with
// no host round trip. One 1024-thread block per row; the algorithm is the CPU reference's
// (src/backend/cpu/cpu_sample.cpp, which states it), step for step:
//   passes over the row's [vocab] logits in global memory (L2-resident, ~600 KB for Qwen3): count
//   updates, the logit bias and suppression, penalty/temperature in place with the maximum (or the argmax for a
//   greedy row), and the compaction of the candidates (logit - max >= kMinRelLogit) with their fixed-point
//   weights into the row's scratch; then top-k, top-p and the draw as 8-bit radix descents over the
//   candidates only (typically hundreds to a few thousand), each pass one shared-memory histogram.
// Why the ids are exactly the host's: every float op the decision depends on is the same IEEE op
// (__fdiv_rn/__fmul_rn/__fsub_rn: immune to --use_fast_math and contraction), exp is
// sampling::det_exp_impl with __dadd_rn/__dmul_rn (never fused, the host's sequence of roundings),
// masses are integer sums (exact in any order), and the random number is the host sampler's.
// A row flagged kSampleDevSkip (sampled on the host) is left as it is; kSampleDevNoSuppress exempts
// a row from the suppression list.
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "base/sample_math.h"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;

struct Cand {
  float v;
  int32_t id;
  unsigned long long q;  // fixed-point weight; 0 = removed
};

struct DevOps {
  __host__ __device__ static double add(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
  }
  __host__ __device__ static double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
  }
  __host__ __device__ static double rint(double a) { return ::rint(a); }
};

__device__ __forceinline__ double dexp(double x) { return sampling::det_exp_impl<DevOps>(x); }

__device__ __forceinline__ unsigned long long value_id_key(const Cand& c) {
  return (static_cast<unsigned long long>(sampling::order_key(c.v)) << 32) | static_cast<uint32_t>(c.id);
}
__device__ __forceinline__ unsigned long long id_key(const Cand& c) {
  return 0xffffffffull - static_cast<uint32_t>(c.id);
}

// Sum over the block; every thread gets it. `part`: shared [32].
__device__ unsigned long long block_sum_u64(unsigned long long v, unsigned long long* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  __syncthreads();  // part[] may still be read by a previous call
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long s = 0;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) s += part[w];
  return s;
}

__device__ float block_max(float v, float* part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, part[w]);
  return m;
}

// The greedy pick: the largest value, ties to the lower id, NaN and -inf never (-1 if none).
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}
// Reduces each thread's (bv, bi) candidate over the block; every thread gets the winner's id.
__device__ int block_argmax(float bv, int bi, float* pv, int* pi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, bv, o);
    const int oi = __shfl_xor_sync(kFull, bi, o);
    if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) pv[threadIdx.x >> 5] = bv, pi[threadIdx.x >> 5] = bi;
  __syncthreads();
  bv = -FLT_MAX, bi = -1;
  for (int w = 0; w < int(blockDim.x >> 5); ++w)
    if (pi[w] >= 0 && better(pv[w], pi[w], bv, bi)) bv = pv[w], bi = pi[w];
  return bi;
}

// The block version of cpu_sample.cpp's descend(): the largest `bits`-bit key at which
// pred(weight of the candidates with key >= it) first holds, 8 bits per pass. Zero-weight
// candidates are not counted.
template <class KeyFn, class WFn, class Pred>
__device__ unsigned long long descend(const Cand* c, int n, int bits, KeyFn key, WFn weight, Pred pred) {
  __shared__ unsigned long long bins[256];
  __shared__ unsigned long long s_prefix, s_above;
  unsigned long long prefix = 0;
  uint64_t above = 0;
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) bins[b] = 0;
    __syncthreads();
    const unsigned long long hi_mask = shift + 8 >= 64 ? 0ull : ~0ull << (shift + 8);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const Cand e = c[i];
      const unsigned long long k = key(e);
      if ((k & hi_mask) != prefix) continue;
      const unsigned long long w = weight(e);
      if (w) atomicAdd(&bins[(k >> shift) & 255], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int b = sampling::pick_bin(bins, &above, pred);
      s_prefix = prefix | (static_cast<unsigned long long>(b < 0 ? 0 : b) << shift);
      s_above = above;
    }
    __syncthreads();
    prefix = s_prefix;
    above = s_above;
  }
  return prefix;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(float* logits, int64_t V, const SampleRowDev* params,
                                                          const int32_t* suppress, int n_suppress, int32_t* counts,
                                                          const int32_t* updates, const int32_t* offsets,
                                                          const int32_t* bias_offsets, const int32_t* bias_ids,
                                                          const float* bias_values, Cand* scratch, int32_t* ids) {
  pdl_begin();
  __shared__ float part_f[32];
  __shared__ int part_i[32];
  __shared__ unsigned long long part_u[32];
  __shared__ int s_n;
  const int r = blockIdx.x, tid = threadIdx.x;
  const SampleRowDev p = params[r];
  if (p.flags & kSampleDevSkip) {  // sampled on the host: its logits (copied out later) and counts stay
    if (tid == 0) ids[r] = -1;
    return;
  }
  if (p.flags & kSampleDevNoSuppress) n_suppress = 0;
  float* l = logits + int64_t(r) * V;
  Cand* c = scratch + int64_t(r) * V;
  int32_t* cnt = p.count_row >= 0 && counts ? counts + int64_t(p.count_row) * V : nullptr;

  // 1. The row's count updates, then suppression and the processors (penalty, temperature) in one
  // pass that also finds the maximum.
  if (cnt && offsets) {
    for (int u = offsets[r] + tid; u < offsets[r + 1]; u += blockDim.x) {
      const int32_t e = updates[u], id = (e > 0 ? e : -e) - 1;
      if (e != 0 && id < V) atomicAdd(&cnt[id], e > 0 ? 1 : -1);
    }
    __syncthreads();
  }
  // The logit bias before everything, as the Sampler adds it (__fadd_rn: the host's one rounding).
  // A row's ids are distinct, so the threads never touch the same logit.
  if (bias_offsets) {
    for (int j = bias_offsets[r] + tid; j < bias_offsets[r + 1]; j += blockDim.x)
      if (bias_ids[j] >= 0 && bias_ids[j] < V) l[bias_ids[j]] = __fadd_rn(l[bias_ids[j]], bias_values[j]);
    __syncthreads();
  }
  // Suppression next: -inf stays -inf under the penalty (a finite positive factor) and the
  // temperature, so this equals the Sampler's penalty -> suppression -> temperature, and the pass
  // below can take the maximum (or, greedy, the argmax) as it goes.
  for (int j = tid; j < n_suppress; j += blockDim.x)
    if (suppress[j] >= 0 && suppress[j] < V) l[suppress[j]] = -INFINITY;
  __syncthreads();
  const bool pen = cnt && p.repetition_penalty != 1.0f, greedy = p.temperature == 0.0f;
  float m = -INFINITY, bv = -FLT_MAX;
  int bi = -1;
  for (int64_t i = tid; i < V; i += blockDim.x) {
    float v = l[i];
    if (pen && cnt[i] > 0) v = v < 0.0f ? __fmul_rn(v, p.repetition_penalty) : __fdiv_rn(v, p.repetition_penalty);
    if (greedy) {  // the first maximum; NaN and -inf never
      if (v > -INFINITY && better(v, int(i), bv, bi)) bv = v, bi = int(i);
    } else {
      if (p.temperature != 1.0f) v = __fdiv_rn(v, p.temperature);
      if (isnan(v)) v = -INFINITY;
      m = fmaxf(m, v);
    }
    l[i] = v;
  }
  if (greedy) {
    const int best = block_argmax(bv, bi, part_f, part_i);
    if (tid == 0) ids[r] = best;
    return;
  }

  // 2. The maximum; +inf logits share the mass equally.
  m = block_max(m, part_f);
  if (m == -INFINITY) {
    if (tid == 0) ids[r] = -1;
    return;
  }
  if (m == INFINITY) {
    for (int64_t i = tid; i < V; i += blockDim.x) l[i] = l[i] == INFINITY ? 0.0f : -INFINITY;
    m = 0.0f;
    __syncthreads();
  }

  // 3. Compaction (warp-aggregated: one shared atomic per warp and pass).
  if (tid == 0) s_n = 0;
  __syncthreads();
  for (int64_t base = 0; base < V; base += blockDim.x) {
    const int64_t i = base + tid;
    const float v = i < V ? l[i] : -INFINITY;
    const float d = __fsub_rn(v, m);
    const bool ok = d >= sampling::kMinRelLogit;
    const unsigned mask = __ballot_sync(kFull, ok);
    int slot = 0;
    if ((tid & 31) == 0 && mask) slot = atomicAdd(&s_n, __popc(mask));
    slot = __shfl_sync(kFull, slot, 0) + __popc(mask & ((1u << (tid & 31)) - 1u));
    if (ok) c[slot] = Cand{v, int32_t(i), sampling::weight_fixed(dexp(double(d)))};
  }
  __syncthreads();
  const int n = s_n;
  __syncthreads();  // s_n is read by everyone before anything else touches shared memory

  // 4. top-k: the k-th largest value, ties counted.
  if (p.top_k > 0 && p.top_k < V && n > p.top_k) {
    const unsigned long long k = static_cast<unsigned long long>(p.top_k);
    const uint32_t kth = uint32_t(descend(
        c, n, 32, [](const Cand& e) { return static_cast<unsigned long long>(sampling::order_key(e.v)); },
        [](const Cand&) { return 1ull; }, [k](uint64_t cum) { return cum >= k; }));
    for (int i = tid; i < n; i += blockDim.x)
      if (sampling::order_key(c[i].v) < kth) c[i].q = 0;
    __syncthreads();
  }
  // 5. top-p: the last kept token in descending (value, id) order.
  const bool top_p = p.top_p < 1.0f;
  if (top_p) {
    unsigned long long t = 0;
    for (int i = tid; i < n; i += blockDim.x) t += c[i].q;
    const uint64_t total = block_sum_u64(t, part_u);
    const float thr = sampling::top_p_threshold(p.top_p);
    const unsigned long long last = descend(
        c, n, 64, [](const Cand& e) { return value_id_key(e); }, [](const Cand& e) { return e.q; },
        [total, thr](uint64_t mass) { return sampling::top_p_reached(total, mass, thr); });
    for (int i = tid; i < n; i += blockDim.x)
      if (value_id_key(c[i]) < last) c[i].q = 0;
    __syncthreads();
  }
  // 6. min-p.
  if (p.min_p > 0.0f) {
    for (int i = tid; i < n; i += blockDim.x)
      if (dexp(double(__fsub_rn(c[i].v, m))) < double(p.min_p)) c[i].q = 0;
    __syncthreads();
  }
  // 7. The draw: the first token in draw order whose cumulative weight exceeds the target.
  unsigned long long t = 0;
  for (int i = tid; i < n; i += blockDim.x) t += c[i].q;
  const uint64_t total = block_sum_u64(t, part_u);
  if (total == 0) {
    if (tid == 0) ids[r] = -1;
    return;
  }
  const uint64_t target = sampling::draw_target(p.random, total);
  auto exceeds = [target](uint64_t mass) { return mass > target; };
  auto weight = [](const Cand& e) { return e.q; };
  if (top_p) {
    const unsigned long long key = descend(
        c, n, 64, [](const Cand& e) { return value_id_key(e); }, weight, exceeds);
    if (tid == 0) ids[r] = int32_t(uint32_t(key));
  } else {
    const unsigned long long key = descend(c, n, 32, [](const Cand& e) { return id_key(e); }, weight, exceeds);
    if (tid == 0) ids[r] = int32_t(0xffffffffu - uint32_t(key));
  }
}

}  // namespace

size_t sample_scratch_bytes(int rows, int64_t vocab) { return size_t(rows) * size_t(vocab) * sizeof(Cand); }

cudaError_t sample_rows(float* logits, int rows, int64_t vocab, const SampleRowDev* params, const int32_t* suppress,
                        int n_suppress, int32_t* counts, const int32_t* updates, const int32_t* update_offsets,
                        const int32_t* bias_offsets, const int32_t* bias_ids, const float* bias_values,
                        void* scratch, int32_t* ids, cudaStream_t s) {
  launch_k(sample_kernel, dim3(rows), dim3(kThreads), 0, s, logits, vocab, params, suppress, n_suppress, counts,
           updates, update_offsets, bias_offsets, bias_ids, bias_values, static_cast<Cand*>(scratch), ids);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
