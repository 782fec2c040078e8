// How the persistent decode kernel (persist_decode.cu) divides each matrix among its blocks, on the
// host (buffer sizes, the checks of prepare_decode_layers) and on the device (which units a block
// copies and multiplies, which slot a split row's part goes to, which slots a reader sums).
// tests/cuda/cuda_persist_plan_test.cpp checks the invariants on the host for many shapes.
//
// A phase's matrix is a list of units: 32-row tiles (gate/up: 16 rows of each) x U column chunks
// of kc columns, N = tiles * U in tile-major order.
// - Balanced ranges: block s of S owns units [first_unit(N, S, s), first_unit(N, S, s + 1)); the
//   ranges partition [0, N), and owner_of(N, S, u) is the block whose range holds u.
// - Whole tiles (gate/up when there are at least S tiles): block s owns tiles
//   [first_unit(T, S, s), first_unit(T, S, s + 1)), so no tile is split.
// - A tile split over blocks s0..s1 (s0 = owner of its first unit) has its rows' parts in slots
//   0..s1 - s0 (slot = block - s0), at most max_parts of them: the reader adds them in slot order.
//   With fewer units than blocks, a block between s0 and s1 may own no unit at all: its slot is
//   never written, so the host zeroes the part buffers once and those slots add 0.
// The arithmetic is 32-bit: N * S must stay below 2^32 (the host checks).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define ANVIL_PERSIST_HD __host__ __device__
#else
#define ANVIL_PERSIST_HD
#endif

namespace anvil::cuda::persist {

ANVIL_PERSIST_HD inline int64_t first_unit(int64_t N, int S, int s) {
  return int64_t(uint32_t(s) * uint32_t(N) / uint32_t(S));
}
ANVIL_PERSIST_HD inline int owner_of(int64_t N, int S, int64_t u) {
  return int((uint32_t(u + 1) * uint32_t(S) - 1u) / uint32_t(N));
}
// The attention phase's splits of a context of ctx positions (ctx >= 1) per kv head: at most
// max_split, each at least min_pos positions where the context allows, split k holding positions
// [k * chunk, min(ctx, (k + 1) * chunk)). Every split is non-empty, so the last one holds the
// current position (ctx - 1): the block that appends its K/V row is the one that reads it. (A
// first version took the split count as given and computed the chunk from it; with 34 splits or
// more, e.g. ctx 1,089 and 34 splits of 33, the last split came out empty and the current
// position fell to another block, which read the K/V row before it was appended.)
inline constexpr int kAttnMinPos = 32;  // the kernel's positions per split at least
struct AttnSplits {
  int n, chunk;
};
ANVIL_PERSIST_HD inline AttnSplits attn_splits(int ctx, int max_split, int min_pos) {
  int n = (ctx + min_pos - 1) / min_pos;
  if (n > max_split) n = max_split;
  if (n < 1) n = 1;
  const int chunk = (ctx + n - 1) / n;
  return {(ctx + chunk - 1) / chunk, chunk};
}

// Whether N units over S blocks stay within the 32-bit arithmetic above.
inline bool fits_32bit(int64_t N, int S) { return N > 0 && S > 0 && N * int64_t(S) < (int64_t(1) << 32); }

// The most blocks one tile of a balanced-range phase is split over (rows_v virtual rows, U chunks).
inline int64_t max_parts(int64_t rows_v, int64_t U, int S) {
  const int64_t tiles = rows_v / 32, N = tiles * U;
  int64_t most = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n = owner_of(N, S, (t + 1) * U - 1) - owner_of(N, S, t * U) + 1;
    most = n > most ? n : most;
  }
  return most;
}

}  // namespace anvil::cuda::persist
