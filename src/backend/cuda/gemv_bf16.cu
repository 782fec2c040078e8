// One-token mat-vec for dense bf16 weights (the decode of bf16 checkpoints), written to keep more
// of the weights in flight than the generic CUDA-core kernel (qgemv.cu), which read them at ~2.5
// TB/s on the H200 (60% of the copy bandwidth). The default since session 25: qwen3-8b bf16 decode
// 168.9 -> 231.3-232.1 tok/s, qwen3-0.6b bf16 931 -> 1,197 (docs/benchmarks.md).
// ANVIL_GEMV_BF16=0 goes back to the generic kernel.
//
// Work split: a warp owns R rows of each of M matrices (M = 2 for gate/up with SwiGLU, R = 2 / M);
// a "piece" is 16 bytes (8 weights), and lane l reads pieces l, l + 32, ... of each row, so a warp's
// loads are 512 consecutive bytes of a row (coalesced). Pieces go in batches of kU per lane, in two
// register buffers: the next batch's loads are issued before the current batch is multiplied, so a
// warp keeps up to 2 x M x R x kU x 16 bytes in flight instead of waiting for each batch.
// PDL: the first batch's weights are loaded before griddepcontrol.wait (weights are written by no
// kernel of the step); x is then staged once per block into shared memory as bf16 (its 16-byte
// pieces read back by the lane that multiplies them, conflict-free), shared by every row.
// Accumulation in fp32 per row, reduced over the warp at the end (warp_sum); the outputs are those of
// the CPU reference within the mat-vec bound (tests/cuda/cuda_ops_test.cpp, run with the switch on).
// Needs T = 1, cols % 8 == 0, cols * 2 bytes of x within 48 KB, 16-byte-aligned x; the rest goes to
// the generic kernel.
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/dequant.cuh"

namespace anvil::cuda {
namespace {

constexpr int kWarps = 8;  // per block: x staged once for 8 warps
constexpr int kU = 4;      // pieces per lane, row and batch
// Rows per warp of each matrix: 2, or 1 of gate and of up (the kernel and its launch share it).
__host__ __device__ constexpr int rows_per_warp(bool swiglu) { return swiglu ? 1 : 2; }

struct B16Seg {
  const uint4* w = nullptr;
  const void* bias = nullptr;
  Elem bias_dtype = Elem::kBF16;
  int64_t rows = 0;
  void* out = nullptr;
  int64_t warp_begin = 0;
};
struct B16Params {
  B16Seg seg[3];
  int n_seg = 0;
  const uint4* up = nullptr;  // SWIGLU: same shape as seg[0]
  const uint4* x = nullptr;
  int64_t pieces = 0;  // cols / 8
  bool out_f32 = false;
};

template <int M, int R>
__device__ __forceinline__ void load_batch(const uint4* const (&rowp)[M][R], int64_t first, int64_t pieces,
                                           uint4 (&buf)[M][R][kU]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t j = first + 32 * u;
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) buf[m][r][u] = j < pieces ? __ldg(rowp[m][r] + j) : make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ float dot8(const uint4& w, const float (&xf)[8], float acc) {
  acc = fmaf(bf16_lo(w.x), xf[0], acc);
  acc = fmaf(bf16_hi(w.x), xf[1], acc);
  acc = fmaf(bf16_lo(w.y), xf[2], acc);
  acc = fmaf(bf16_hi(w.y), xf[3], acc);
  acc = fmaf(bf16_lo(w.z), xf[4], acc);
  acc = fmaf(bf16_hi(w.z), xf[5], acc);
  acc = fmaf(bf16_lo(w.w), xf[6], acc);
  acc = fmaf(bf16_hi(w.w), xf[7], acc);
  return acc;
}

template <int M, int R>
__device__ __forceinline__ void mul_batch(const uint4 (&buf)[M][R][kU], const uint4* xs, int64_t first, int64_t pieces,
                                          float (&acc)[M][R]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t j = first + 32 * u;
    if (j < pieces) {
      const uint4 xv = xs[j];
      const float xf[8] = {bf16_lo(xv.x), bf16_hi(xv.x), bf16_lo(xv.y), bf16_hi(xv.y),
                           bf16_lo(xv.z), bf16_hi(xv.z), bf16_lo(xv.w), bf16_hi(xv.w)};
#pragma unroll
      for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = dot8(buf[m][r][u], xf, acc[m][r]);
    }
  }
}

template <bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_bf16_kernel(B16Params p) {
  constexpr int M = SWIGLU ? 2 : 1;
  constexpr int R = rows_per_warp(SWIGLU);
  extern __shared__ uint4 xs[];
  pdl_launch();
  const int lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  int si = 0;
  if (p.n_seg > 1 && gw >= p.seg[1].warp_begin) si = 1;
  if (p.n_seg > 2 && gw >= p.seg[2].warp_begin) si = 2;
  const B16Seg& sg = p.seg[si];
  const int64_t row0 = (gw - sg.warp_begin) * R;
  const bool active = row0 < sg.rows;
  const int64_t pieces = p.pieces;
  const uint4* rowp[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = active ? min(row0 + r, sg.rows - 1) : 0;  // clamped: duplicates are computed, not stored
      rowp[m][r] = (m == 0 ? sg.w : p.up) + row * pieces;
    }
  constexpr int64_t kStride = 32 * kU;  // pieces per batch and row
  uint4 a[M][R][kU], b[M][R][kU];
  if (active) load_batch<M, R>(rowp, lane, pieces, a);  // weights only: before the wait
  pdl_wait();
  for (int64_t i = threadIdx.x; i < pieces; i += blockDim.x) xs[i] = p.x[i];
  __syncthreads();
  if (!active) return;
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.0f;
  // Two buffers, alternating: load the next batch into one while multiplying the other.
  for (int64_t f = lane;;) {
    if (f + kStride < pieces + lane) load_batch<M, R>(rowp, f + kStride, pieces, b);
    mul_batch<M, R>(a, xs, f, pieces, acc);
    f += kStride;
    if (f >= pieces + lane) break;
    if (f + kStride < pieces + lane) load_batch<M, R>(rowp, f + kStride, pieces, a);
    mul_batch<M, R>(b, xs, f, pieces, acc);
    f += kStride;
    if (f >= pieces + lane) break;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v[M];
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = warp_sum(acc[m][r]);
    const int64_t row = row0 + r;
    if (lane == 0 && row < sg.rows) {
      if constexpr (SWIGLU) {
        store_elem<Elem::kBF16>(sg.out, row, v[0] / (1.0f + __expf(-v[0])) * v[1]);
      } else {
        float o = v[0];
        if (sg.bias) o += load_any(sg.bias, row, sg.bias_dtype);
        if (p.out_f32) store_elem<Elem::kF32>(sg.out, row, o);
        else store_elem<Elem::kBF16>(sg.out, row, o);
      }
    }
  }
}

// Read at every call, as ANVIL_CUDA_NO_TC is (host calls only: a replayed graph makes none), so a
// test can switch it around one op.
bool enabled() {
  const char* e = std::getenv("ANVIL_GEMV_BF16");
  return !(e && *e == '0');
}

constexpr int64_t kMaxStagedBytes = 48 * 1024;

bool takes(const DevMatrix& w, const void* x, int T) {
  return enabled() && T == 1 && w.bits == 0 && w.dtype == Elem::kBF16 && w.cols % 8 == 0 && w.cols * 2 <= kMaxStagedBytes &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

}  // namespace

bool gemv_bf16_takes(const DevMatrix* ws, int n, const DevMatrix* up, const void* x, int T) {
  for (int i = 0; i < n; ++i)
    if (!takes(ws[i], x, T) || ws[i].cols != ws[0].cols) return false;
  return !up || (takes(*up, x, T) && up->cols == ws[0].cols && up->rows == ws[0].rows);
}

cudaError_t gemv_bf16(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, bool out_f32,
                      cudaStream_t s) {
  B16Params p;
  p.x = static_cast<const uint4*>(x);
  p.pieces = ws[0].cols / 8;
  p.out_f32 = out_f32;
  p.n_seg = n;
  const int R = rows_per_warp(up != nullptr);
  int64_t warps = 0;
  for (int i = 0; i < n; ++i) {
    p.seg[i].w = static_cast<const uint4*>(ws[i].data);
    p.seg[i].bias = ws[i].bias;
    p.seg[i].bias_dtype = ws[i].bias_dtype;
    p.seg[i].rows = ws[i].rows;
    p.seg[i].out = outs[i];
    p.seg[i].warp_begin = warps;
    warps += (ws[i].rows + R - 1) / R;
  }
  if (up) p.up = static_cast<const uint4*>(up->data);
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  const size_t smem = size_t(p.pieces) * 16;
  if (up) launch_k(gemv_bf16_kernel<true>, dim3(blocks), dim3(kWarps * 32), smem, s, p);
  else launch_k(gemv_bf16_kernel<false>, dim3(blocks), dim3(kWarps * 32), smem, s, p);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
