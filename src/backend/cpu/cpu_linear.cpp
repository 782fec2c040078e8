// linear: out[T, N] = x[T, K] W^T (+ bias) for dense (F32/F16/BF16) and MLX affine quantized W.
//
// Batch invariance (docs/architecture.md, "Numerical contract"): row t of the output depends only
// on row t of x and on W, never on T, on the other rows, or on the thread count. Every path below
// computes each output element with one fixed reduction order whatever the tile it lands in, and
// threads split output rows only.
//
// Quantized W (2, 3, 4, 5, 6, 8 bits) with AVX2, any T (decode, batched decode and prefill): x is
// quantized to int16 per group and the integer kernels (cpu_qdot_avx2.cpp) run tiles of weight rows x
// activation rows,
// reading the packed weights without shuffles or fp32 dequantization. Threads split the output
// rows into contiguous chunks; within a chunk a sub-block of rows stays in L2 while every tile of
// activation rows (up to 4) passes over it. For prefill this integer path does twice the
// multiply-adds per instruction of an fp32 FMA GEMM over dequantized weights.
// Every other case (dense W, no AVX2), any T: a block of kRowBlock weight rows is dequantized to
// fp32 once and reused against every activation row with a register-tiled kernel whose per-element
// order does not depend on the tile shape. Dense bf16/f16 W at T <= 4 with AVX2 skips the fp32 block:
// gemv_half_avx2 converts in registers and computes every element in that same order, so a row's
// result is the same bits alone or in a batch (a separate T == 1 mat-vec with its own order once
// gave other logits than the same row inside a batch).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "format/mlx_quant.h"

namespace anvil::cpu {
namespace {

constexpr int kRowBlock = 16;  // weight rows dequantized together for the fp32 matmul

float dot_scalar(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) t += a[i] * b[i];
  return t;
}

std::vector<float>& scratch_f32(int slot, size_t n) {
  thread_local std::vector<float> bufs[2];
  if (bufs[slot].size() < n) bufs[slot].resize(n);
  return bufs[slot];
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "anvil: cpu backend: %s\n", what);
  std::abort();
}

// Rows of W per thread chunk so each chunk streams at least ~256 KiB (amortizes the wake-up).
int64_t gemv_grain(const WeightMatrix& w) {
  const int64_t row_bytes = std::max<int64_t>(1, int64_t(w.bytes() / size_t(std::max<int64_t>(1, w.rows))));
  return std::max<int64_t>(1, (int64_t(256) << 10) / row_bytes);
}

// T rows against 4/8-bit W with the AVX2 integer kernel: each weight row block is streamed once
// from memory and reused from L2 by every group of activation rows.
void linear_quant_avx2(ThreadPool& pool, const float* x, int64_t T, const WeightMatrix& w, float* out) {
  const int64_t cols = w.cols, G = w.group_size, ng = cols / G, N = w.rows;
  thread_local std::vector<int16_t> xq;
  thread_local std::vector<float> xscale, xsum;
  thread_local std::vector<QuantizedX> xs_buf;
  xq.resize(size_t(T * cols));
  xscale.resize(size_t(T * ng));
  xsum.resize(size_t(T * ng));
  xs_buf.resize(size_t(T));
  // thread_local names resolve per thread inside a lambda: hand the caller's buffers by pointer.
  int16_t* xqp = xq.data();
  float* xscalep = xscale.data();
  float* xsump = xsum.data();
  auto quantize_rows = [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      quantize_x_int16_avx2(x + t * cols, cols, w.bits, G, xqp + t * cols, xscalep + t * ng, xsump + t * ng);
  };
  if (T >= 8)
    pool.parallel_for(T, 4, quantize_rows);
  else
    quantize_rows(0, T);
  QuantizedX* xs = xs_buf.data();
  for (int64_t t = 0; t < T; ++t) xs[t] = QuantizedX{xqp + t * cols, xscalep + t * ng, xsump + t * ng};
  const int64_t row_bytes = std::max<int64_t>(1, int64_t(w.bytes() / size_t(N)));
  const int64_t sub = std::max<int64_t>(1, (int64_t(128) << 10) / row_bytes);  // rows kept in L2 across x groups
  // Activation rows per kernel pass: up to 4 in one pass while W streams from memory (batched
  // decode); for larger batches, whose W sub-block is L2-resident, 3 with the AVX2 kernel, whose 4-row
  // tile would spill its accumulators (3-row tiles measured 1.3x the multiply-add rate of 4-row
  // ones), and 4 with the AVX-512 form (32 registers: pp512 of qwen3-0.6b q4g64 126 tok/s against
  // 120 with 3-row tiles and 116 for AVX2; 5- to 8-row tiles were slower, 80-116).
  const int64_t tile = T <= 4 ? T : (cpu_use_avx512() && !(w.bits == 4 && w.group_size == 32) ? 4 : 3);
  pool.parallel_for(N, gemv_grain(w), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r += sub) {
      const int64_t re = std::min(e, r + sub);
      for (int64_t t0 = 0; t0 < T; t0 += tile)
        qgemv_rows_avx2(w, r, re, xs + t0, int(std::min<int64_t>(tile, T - t0)), out + t0 * N, N);
    }
  });
}

void gemm_tile_scalar(const float* W, int nw, const float* X, int64_t ldx, int nx, int64_t cols, float* out,
                      int64_t ldo) {
  for (int t = 0; t < nx; ++t)
    for (int r = 0; r < nw; ++r) out[t * ldo + r] = dot_scalar(W + r * cols, X + t * ldx, cols);
}

void gemm(ThreadPool& pool, const float* x, int64_t T, const WeightMatrix& w, float* out) {
  const bool avx2 = cpu_use_avx2();
  const int64_t cols = w.cols, N = w.rows;
  if (avx2 && T <= 4 && !w.quantized() && (w.dtype == DType::kBF16 || w.dtype == DType::kF16)) {
    // Up to 4 activation rows (decode, small decode batches) against 2-byte weights: converted in
    // registers, the same bits as below (gemv_half_avx2), streaming each weight row once.
    pool.parallel_for(N, gemv_grain(w), [&](int64_t r0, int64_t r1) {
      gemv_half_avx2(static_cast<const uint16_t*>(w.data) + r0 * cols, w.dtype == DType::kF16, r1 - r0, x, cols,
                     int(T), cols, out + r0, N);
      if (w.bias)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t r = r0; r < r1; ++r) out[t * N + r] += weight_bias(w, r);
    });
    return;
  }
  const int64_t nblocks = (N + kRowBlock - 1) / kRowBlock;
  // Activation rows per pass: keep a pass of x within ~512 KiB (L2) while the weight block stays in L1/L2.
  const int64_t tb = std::clamp<int64_t>((int64_t(512) << 10) / (cols * 4), 2, 256);
  pool.parallel_for(nblocks, 1, [&](int64_t b0, int64_t b1) {
    float* wbuf = scratch_f32(1, size_t(kRowBlock * cols)).data();
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * kRowBlock;
      const int nw = int(std::min<int64_t>(kRowBlock, N - r0));
      // (f32 weights are used in place: the block's rows are already what the tile kernel reads)
      const float* wb = wbuf;
      if (!w.quantized() && w.dtype == DType::kF32)
        wb = static_cast<const float*>(w.data) + r0 * cols;
      else
        for (int i = 0; i < nw; ++i) weight_row_to_f32(w, r0 + i, wbuf + i * cols);
      for (int64_t t0 = 0; t0 < T; t0 += tb) {
        const int nx = int(std::min<int64_t>(tb, T - t0));
        if (avx2)
          gemm_tile_avx2(wb, nw, x + t0 * cols, cols, nx, cols, out + t0 * N + r0, N);
        else
          gemm_tile_scalar(wb, nw, x + t0 * cols, cols, nx, cols, out + t0 * N + r0, N);
      }
      if (w.bias)
        for (int64_t t = 0; t < T; ++t)
          for (int i = 0; i < nw; ++i) out[t * N + r0 + i] += weight_bias(w, r0 + i);
    }
  });
}

}  // namespace

void weight_row_to_f32(const WeightMatrix& w, int64_t r, float* out) {
  const int64_t cols = w.cols;
  if (!w.quantized()) {
    switch (w.dtype) {
      case DType::kF32: std::copy_n(static_cast<const float*>(w.data) + r * cols, cols, out); return;
      case DType::kBF16: {
        const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * cols;
        for (int64_t k = 0; k < cols; ++k) out[k] = bf16_to_f32(p[k]);
        return;
      }
      case DType::kF16: {
        const uint16_t* p = static_cast<const uint16_t*>(w.data) + r * cols;
        for (int64_t k = 0; k < cols; ++k) out[k] = f16_to_f32(p[k]);
        return;
      }
      default: die("weight_row_to_f32: dense weight dtype must be F32, F16 or BF16");
    }
  }
  // The one dequantizer (format/mlx_quant.h), bit-exact with mx.dequantize (tests/quant).
  const int64_t ng = cols / w.group_size;
  const size_t sb = size_t(r * ng) * dtype_size(w.dtype);
  mlx_dequantize_row(reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(w.data) + r * qrow_bytes(w)),
                     static_cast<const uint8_t*>(w.scales) + sb, static_cast<const uint8_t*>(w.biases) + sb, w.dtype,
                     cols, w.bits, w.group_size, out);
}

int64_t linear_min_chunk_rows(const WeightMatrix& w, int64_t rows) {
  if (w.quantized() && cpu_use_avx2() && qdot_avx2_supported(w.bits, w.group_size, w.cols)) return gemv_grain(w);
  return kRowBlock;  // gemm: one block of weight rows per chunk at least
}

void linear_f32(ThreadPool& pool, const float* x, int64_t rows, const WeightMatrix& w, float* out) {
  if (rows <= 0) return;
  if (w.quantized() && cpu_use_avx2() && qdot_avx2_supported(w.bits, w.group_size, w.cols))
    linear_quant_avx2(pool, x, rows, w, out);
  else
    gemm(pool, x, rows, w, out);
}

}  // namespace anvil::cpu
