// Prefill GEMM: out[T, N] = x[T, K] W^T on the tensor cores (WMMA bf16 x bf16 -> fp32), with the
// weights dequantized (MLX affine, any bits) or converted (dense) to bf16 in shared memory, one
// 64 x 32 tile at a time, so no dequantized copy of W ever exists in device memory.
//
// Block: 128 threads (4 warps) own a 64 (tokens) x 64 (weight rows) tile of out; each warp a 32 x 32
// quarter as 2 x 2 16x16 fragments. Per K step of 32: threads 0..63 dequantize one 32-element chunk
// of one weight row each (a chunk lies in one MLX group), threads 64..127 copy the 64 x 32 x tile.
// Needs K % 32 == 0 (quantized matrices always satisfy it; the backend routes other dense shapes
// to the mat-vec kernels).
//
// For larger batches (T >= kCublasMinTokens) the weights are instead dequantized into a bf16 scratch
// matrix once per call and multiplied by cuBLAS (bf16 in, fp32 accumulate): the dequantization costs
// one extra write and read of the bf16 matrix, which the far faster library GEMM repays from ~64
// tokens on (docs/benchmarks.md).
#include <cublas_v2.h>
#include <mma.h>

#include "backend/cuda/dequant.cuh"

namespace anvil::cuda {
namespace {

constexpr int BM = 64, BN = 64, BK = 32, LDS = BK + 8;  // +8 bf16: rows 80 bytes apart, fewer conflicts
constexpr int LDC = BN + 4;

// Dequantizes elements [k0, k0+32) of weight row `row` into dst[0..32) (bf16).
template <int BITS>
__device__ __forceinline__ void dequant_chunk(const DevMatrix& w, int64_t row, int64_t k0, __nv_bfloat16* dst) {
  dequant_chunk_bf16<BITS>(w.data, w.scales, w.biases, w.dtype, w.cols, w.group, row, k0, dst);
}

template <int BITS>
__global__ void __launch_bounds__(128) gemm_kernel(DevMatrix w, const __nv_bfloat16* x, int T, void* out,
                                                   bool out_f32) {
  pdl_begin();
  using namespace nvcuda;
  __shared__ __align__(128) unsigned char smem[BM * LDC * sizeof(float)];
  __nv_bfloat16* Xs = reinterpret_cast<__nv_bfloat16*>(smem);  // [BM][LDS]
  __nv_bfloat16* Ws = Xs + BM * LDS;                            // [BN][LDS]
  float* Cs = reinterpret_cast<float*>(smem);                   // [BM][LDC], after the K loop
  const int tid = threadIdx.x, warp = tid >> 5;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int t0 = blockIdx.y * BM;
  const int64_t K = w.cols, N = w.rows;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int64_t k0 = 0; k0 < K; k0 += BK) {
    if (tid < 64) {
      const int64_t row = n0 + tid;
      __nv_bfloat16 tmp[32];
      if (row < N) {
        dequant_chunk<BITS>(w, row, k0, tmp);
      } else {
#pragma unroll
        for (int e = 0; e < 32; ++e) tmp[e] = __float2bfloat16_rn(0.0f);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint4*>(Ws + tid * LDS + i * 8) = *reinterpret_cast<const uint4*>(tmp + i * 8);
    } else {
      const int r = tid - 64;  // one x row of the tile, 32 bf16 = 4 uint4
      const int t = t0 + r;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t < T) v = __ldg(reinterpret_cast<const uint4*>(x + int64_t(t) * K + k0) + i);
        *reinterpret_cast<uint4*>(Xs + r * LDS + i * 8) = v;
      }
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], Xs + (wm + i * 16) * LDS + kk, LDS);
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], Ws + (wn + j * 16) * LDS + kk, LDS);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 2; ++j)
      wmma::store_matrix_sync(Cs + (wm + i * 16) * LDC + wn + j * 16, acc[i][j], LDC, wmma::mem_row_major);
  __syncthreads();
  for (int i = tid; i < BM * BN; i += 128) {
    const int r = i / BN, c = i % BN;
    const int t = t0 + r;
    const int64_t n = n0 + c;
    if (t >= T || n >= N) continue;
    float v = Cs[r * LDC + c];
    if (w.bias) v += load_any(w.bias, n, w.bias_dtype);
    if (out_f32) static_cast<float*>(out)[int64_t(t) * N + n] = v;
    else static_cast<__nv_bfloat16*>(out)[int64_t(t) * N + n] = __float2bfloat16_rn(v);
  }
}

template <int BITS>
__global__ void dequant_kernel(DevMatrix w, __nv_bfloat16* dst) {
  pdl_begin();
  const int64_t chunks_per_row = w.cols / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= w.rows * chunks_per_row) return;
  const int64_t row = i / chunks_per_row, k0 = (i % chunks_per_row) * 32;
  __nv_bfloat16 tmp[32];
  dequant_chunk<BITS>(w, row, k0, tmp);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    reinterpret_cast<uint4*>(dst + row * w.cols + k0)[j] = *reinterpret_cast<const uint4*>(tmp + 8 * j);
}

// 4- and 8-bit weights: a thread per 8 elements (one 16-byte store; 4 or 8 bytes of weights), so a
// warp reads 128 (256) contiguous bytes and writes 512. dequant_kernel's thread per 32 elements
// read its words with 4-byte loads at a 16-byte stride and wrote 64 bytes per thread: ncu on the H200
// (session 13) measured 66 us for a qwen3-8b gate/up matrix, 2 TB/s of reads and writes, 30% of a
// 512-token prefill chunk. The same arithmetic as dequant_chunk_bf16 (the same bits).
template <int BITS>
__global__ void dequant8_kernel(DevMatrix w, __nv_bfloat16* dst) {
  static_assert(BITS == 4 || BITS == 8, "8 elements are one or two whole words");
  pdl_begin();
  const int64_t per_row = w.cols / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= w.rows * per_row) return;
  const int64_t row = i / per_row, k0 = (i % per_row) * 8;
  const uint32_t* p = static_cast<const uint32_t*>(w.data) + (row * w.cols + k0) * BITS / 32;  // 8 | k0
  uint32_t wd[BITS / 4];
  if constexpr (BITS == 4) {
    wd[0] = __ldg(p);
  } else {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    wd[0] = v.x, wd[1] = v.y;
  }
  const int64_t g = row * (w.cols / w.group) + k0 / w.group;
  const float s = load_any(w.scales, g, w.dtype), b = load_any(w.biases, g, w.dtype);
  uint32_t o[4];
#pragma unroll
  for (int e = 0; e < 8; e += 2) {
    const int bit = e * BITS;
    const uint32_t q0 = (wd[bit >> 5] >> (bit & 31)) & ((1u << BITS) - 1u);
    const uint32_t q1 = (wd[(bit + BITS) >> 5] >> ((bit + BITS) & 31)) & ((1u << BITS) - 1u);
    const __nv_bfloat162 v = __halves2bfloat162(__float2bfloat16_rn(fmaf(s, float(q0), b)),
                                                __float2bfloat16_rn(fmaf(s, float(q1), b)));
    o[e / 2] = *reinterpret_cast<const uint32_t*>(&v);
  }
  *reinterpret_cast<uint4*>(dst + row * w.cols + k0) = make_uint4(o[0], o[1], o[2], o[3]);
}

__global__ void add_bias_kernel(void* out, bool out_f32, int64_t rows, int64_t n, const void* bias, Elem bd) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * n) return;
  const float b = load_any(bias, i % n, bd);
  if (out_f32) static_cast<float*>(out)[i] += b;
  else {
    __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out);
    o[i] = __float2bfloat16_rn(__bfloat162float(o[i]) + b);
  }
}

}  // namespace

cudaError_t dequant_bf16(const DevMatrix& w, void* dst, cudaStream_t s) {
  if (w.cols % 32 != 0) return cudaErrorInvalidValue;
  auto* d = static_cast<__nv_bfloat16*>(dst);
  if (w.bits == 4 || w.bits == 8) {
    const dim3 grid8(static_cast<unsigned>((w.rows * (w.cols / 8) + 255) / 256));
    if (w.bits == 4) launch_k(dequant8_kernel<4>, grid8, dim3(256), 0, s, w, d);
    else launch_k(dequant8_kernel<8>, grid8, dim3(256), 0, s, w, d);
    return cudaGetLastError();
  }
  const int64_t n = w.rows * (w.cols / 32);
  const dim3 grid(static_cast<unsigned>((n + 255) / 256));
  switch (w.bits) {
    case 0: launch_k(dequant_kernel<0>, grid, dim3(256), 0, s, w, d); break;
    case 2: launch_k(dequant_kernel<2>, grid, dim3(256), 0, s, w, d); break;
    case 3: launch_k(dequant_kernel<3>, grid, dim3(256), 0, s, w, d); break;
    case 4: launch_k(dequant_kernel<4>, grid, dim3(256), 0, s, w, d); break;
    case 5: launch_k(dequant_kernel<5>, grid, dim3(256), 0, s, w, d); break;
    case 6: launch_k(dequant_kernel<6>, grid, dim3(256), 0, s, w, d); break;
    case 8: launch_k(dequant_kernel<8>, grid, dim3(256), 0, s, w, d); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t gemm_cublas(void* handle, const void* wd, const DevMatrix& w, const void* x, int T, void* out,
                        bool out_f32, cudaStream_t s) {
  // Row-major out[T, N] = x[T, K] W^T is column-major out^T[N, T] = W[N, K] x^T, with W (row-major
  // [N, K]) read as column-major [K, N] transposed.
  auto h = static_cast<cublasHandle_t>(handle);
  if (cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  const float alpha = 1.0f, beta = 0.0f;
  const int N = int(w.rows), K = int(w.cols);
  const cublasStatus_t st =
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, wd, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &beta, out,
                   out_f32 ? CUDA_R_32F : CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  if (w.bias) {
    const int64_t n = int64_t(T) * N;
    launch_k(add_bias_kernel, dim3(static_cast<unsigned>((n + 255) / 256)), dim3(256), 0, s, out, out_f32, int64_t(T),
             int64_t(N), w.bias, w.bias_dtype);
  }
  return cudaGetLastError();
}

cudaError_t gemm(const DevMatrix& w, const void* x, int T, void* out, bool out_f32, cudaStream_t s) {
  if (w.cols % 32 != 0) return cudaErrorInvalidValue;
  const dim3 grid(unsigned((w.rows + BN - 1) / BN), unsigned((T + BM - 1) / BM));
  const auto* xb = static_cast<const __nv_bfloat16*>(x);
  switch (w.bits) {
    case 0: launch_k(gemm_kernel<0>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    case 2: launch_k(gemm_kernel<2>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    case 3: launch_k(gemm_kernel<3>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    case 4: launch_k(gemm_kernel<4>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    case 5: launch_k(gemm_kernel<5>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    case 6: launch_k(gemm_kernel<6>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    case 8: launch_k(gemm_kernel<8>, dim3(grid), dim3(128), 0, s, w, xb, T, out, out_f32); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace anvil::cuda
