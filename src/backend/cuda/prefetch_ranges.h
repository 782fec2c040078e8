// Where the batch kernel's wave-ahead L2 prefetch reads (ANVIL_QGEMM_WAVE_PF): the byte
// ranges of the weights that a block of a later wave will read, relative to the matrix's base. The
// kernels issue them as cp.async.bulk.prefetch.L2 (16-byte aligned, sizes a multiple of 16, 32-bit);
// tests/cuda/cuda_prefetch_ranges_test.cpp checks on the host that every range lies inside its
// matrix for the shapes the kernels take (a prefetch outside an allocation could fault).
// 4-bit MLX weights: a row of K columns is K / 2 bytes; scales and biases are bf16, ng per row.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define ANVIL_HD __host__ __device__
#else
#define ANVIL_HD
#endif

namespace anvil::cuda {

struct ByteRange {
  int64_t off = 0;    // from the matrix's (or its scales') base
  int64_t bytes = 0;  // 0: nothing to prefetch
};

// The batch kernel's block (qgemm_batch.cu) `lin` blocks after block (bx, by) of a gx x gy grid,
// counted x fastest: its row block and split, or false past the grid's end.
ANVIL_HD inline bool batch_block_after(int64_t bx, int64_t by, int64_t gx, int64_t gy, int64_t lin, int64_t* nbx,
                                       int64_t* nby) {
  const int64_t l = by * gx + bx + lin;
  if (l >= gx * gy) return false;
  *nbx = l % gx, *nby = l / gx;
  return true;
}

// Row `row` of a matrix of K 4-bit columns over the split's steps [s0, s0 + n) of 128 columns
// (64 bytes each): the weights that row's lanes of the batch kernel copy.
ANVIL_HD inline ByteRange batch_row_range(int64_t row, int64_t K, int64_t s0, int64_t n) {
  return ByteRange{row * (K / 2) + s0 * 64, n > 0 ? n * 64 : 0};
}

}  // namespace anvil::cuda
