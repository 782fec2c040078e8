// On-device sampling and row gathers, so a decode step returns token ids instead of logits.
// argmax_rows: one 1024-thread block per row; each thread scans a strided slice, keeping the largest
// value (ties to the lower id, NaN and -inf never chosen, suppressed ids skipped), then a warp and a
// block reduction. Same result as the CPU reference (an exact max, no rounding involved).
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {
namespace {

__device__ __forceinline__ bool better(float v, int i, float bv, int bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

__global__ void argmax_kernel(const float* logits, int64_t vocab, const int32_t* suppress, int n_suppress,
                              int32_t* ids) {
  pdl_begin();
  const float* row = logits + int64_t(blockIdx.x) * vocab;
  float bv = -FLT_MAX;
  int bi = -1;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (!(v > -INFINITY)) continue;  // NaN and -inf
    if (!better(v, int(i), bv, bi)) continue;
    bool skip = false;
    for (int j = 0; j < n_suppress; ++j) skip |= suppress[j] == i;
    if (!skip) bv = v, bi = int(i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (oi >= 0 && better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
    if (lane == 0) ids[blockIdx.x] = bi;
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

cudaError_t argmax_rows(const float* logits, int rows, int64_t vocab, const int32_t* suppress, int n_suppress,
                        int32_t* ids, cudaStream_t s) {
  launch_k(argmax_kernel, dim3(rows), dim3(1024), 0, s, logits, vocab, suppress, n_suppress, ids);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
