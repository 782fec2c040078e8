// On-device sampling and row gathers, so a decode step returns token ids instead of logits.
// argmax_rows: ~2,048 ids per block, up to 128 blocks per row; each thread scans a strided slice, keeping
// the largest value (ties to the lower id, NaN and -inf never chosen, suppressed ids skipped), then a
// warp and a block reduction, and the row's last block reduces the blocks' results. Same result as the
// CPU reference (an exact max, no rounding involved).
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {
namespace {

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// Blocks of kArgmaxThreads per row; each thread keeps its best over kArgmaxUnroll loads in flight at
// a time. A single 1024-thread block per row (until 2026-12-01) left each load's latency exposed:
// 75 us per qwen3 token on the H200 (ncu), against a few us for 600 KB spread over ~75 blocks.
constexpr int kArgmaxThreads = 256, kArgmaxUnroll = 8;

__device__ __forceinline__ void argmax_consider(float v, int64_t i, const int32_t* suppress, int n_suppress,
                                                float& bv, int& bi) {
  if (!(v > -INFINITY)) return;  // NaN and -inf
  if (!better(v, int(i), bv, bi)) return;
  bool skip = false;
  for (int j = 0; j < n_suppress; ++j) skip |= suppress[j] == i;
  if (!skip) bv = v, bi = int(i);
}

// The block's best (value, id) into lane 0 of warp 0 (other threads: unspecified).
__device__ __forceinline__ void argmax_block_reduce(float& bv, int& bi) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // sv/si may still be read by a previous call's warp 0
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (warp == 0) {
    bv = lane < int(blockDim.x >> 5) ? sv[lane] : -FLT_MAX;
    bi = lane < int(blockDim.x >> 5) ? si[lane] : -1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
  }
}

// Grid (B, rows): block b scans the row's b-th slice of `per` ids and writes its best to
// part[row * B + b]; the row's last block to finish (a counter per row, reset by that block) reduces
// the B partial results in order and writes ids[row]. Ties go to the lower id at every level, so the
// result is the one-pass scan's exactly.
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int64_t vocab, int64_t per,
                                                                const int32_t* suppress, int n_suppress,
                                                                ArgmaxScratch ws, int32_t* ids) {
  pdl_begin();
  const int row_i = blockIdx.y, B = gridDim.x;
  const float* row = logits + int64_t(row_i) * vocab;
  const int64_t lo = int64_t(blockIdx.x) * per, hi = min(vocab, lo + per);
  float bv = -FLT_MAX;
  int bi = -1;
  for (int64_t i0 = lo + threadIdx.x; i0 < hi; i0 += int64_t(kArgmaxThreads) * kArgmaxUnroll) {
    float v[kArgmaxUnroll];
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u) {
      const int64_t i = i0 + int64_t(u) * kArgmaxThreads;
      v[u] = i < hi ? __ldg(row + i) : -INFINITY;
    }
#pragma unroll
    for (int u = 0; u < kArgmaxUnroll; ++u)  // ascending ids per thread: strict > keeps the lower id
      argmax_consider(v[u], i0 + int64_t(u) * kArgmaxThreads, suppress, n_suppress, bv, bi);
  }
  argmax_block_reduce(bv, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    ws.val[int64_t(row_i) * B + blockIdx.x] = bv;
    ws.idx[int64_t(row_i) * B + blockIdx.x] = bi;
    __threadfence();  // the partial result visible device-wide before it is counted
    last = atomicAdd(&ws.counters[row_i], 1u) == unsigned(B) - 1u;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  bv = -FLT_MAX, bi = -1;
  for (int b = threadIdx.x; b < B; b += kArgmaxThreads) {
    const int oi = __ldcg(ws.idx + int64_t(row_i) * B + b);  // L2: written by other blocks
    const float ov = __ldcg(ws.val + int64_t(row_i) * B + b);
    if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  argmax_block_reduce(bv, bi);
  if (threadIdx.x == 0) {
    ids[row_i] = bi;
    ws.counters[row_i] = 0u;  // every other block of the row has counted
  }
}

__global__ void gather_kernel(const uint8_t* src, int64_t src_rows, const int32_t* rows, int64_t row_bytes,
                              uint8_t* dst) {
  pdl_begin();
  const int i = blockIdx.x;
  const int32_t r = rows[i];
  if (r < 0 || r >= src_rows) return;  // checked on the host; never read out of bounds
  for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) dst[i * row_bytes + b] = src[r * row_bytes + b];
}

}  // namespace

void set_pdl_capture(bool on) { pdl_in_capture() = on; }

cudaError_t gather_rows(const void* src, int64_t src_rows, const int32_t* rows, int n, int64_t cols, size_t elem,
                        void* dst, cudaStream_t s) {
  launch_k(gather_kernel, dim3(n), dim3(256), 0, s, static_cast<const uint8_t*>(src), src_rows, rows, cols * int64_t(elem),
                                  static_cast<uint8_t*>(dst));
  return cudaGetLastError();
}

int argmax_blocks(int64_t vocab) {
  const int64_t b = (vocab + 2047) / 2048;  // ~2,048 ids per block: 8 loads per thread
  return int(b < 1 ? 1 : b > 128 ? 128 : b);
}

size_t argmax_partial_bytes(int rows, int64_t vocab) { return size_t(rows) * size_t(argmax_blocks(vocab)) * 8; }

ArgmaxScratch argmax_scratch(unsigned* counters, void* partials, int rows, int64_t vocab) {
  ArgmaxScratch w;
  w.counters = counters;
  w.val = static_cast<float*>(partials);
  w.idx = reinterpret_cast<int*>(w.val + size_t(rows) * size_t(argmax_blocks(vocab)));
  return w;
}

cudaError_t argmax_rows(const float* logits, int rows, int64_t vocab, const int32_t* suppress, int n_suppress,
                        const ArgmaxScratch& ws, int32_t* ids, cudaStream_t s) {
  const int B = argmax_blocks(vocab);
  const int64_t per = (vocab + B - 1) / B;
  launch_k(argmax_kernel, dim3(unsigned(B), unsigned(rows)), dim3(kArgmaxThreads), 0, s, logits, vocab, per, suppress,
           n_suppress, ws, ids);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
