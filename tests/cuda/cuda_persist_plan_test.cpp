// How the persistent decode kernel divides its matrices among blocks (src/backend/cuda/
// persist_plan.h): every unit belongs to exactly one block, owner_of names it, a split tile's parts
// land in distinct slots below max_parts (the buffers the host sizes), and whole-tile ranges never
// split a tile. Host arithmetic only, for the shapes of real checkpoints and block counts of other
// GPUs than the one the kernel was measured on: runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/persist_plan.h"

namespace anvil::cuda::persist {
namespace {

struct Dims {
  int64_t hidden, q, kv, ffn;
};

TEST(CudaPersistPlan, UnitsPartitionAndSlotsStayBelowMaxParts) {
  // qwen3-0.6b, -1.7b, -4b, -8b, -14b and a llama-3-8b-like shape; kc 512 (groups <= 64) and 1024.
  const Dims dims[] = {{1024, 2048, 1024, 3072},  {2048, 2048, 1024, 6144},  {2560, 4096, 1024, 9728},
                       {4096, 4096, 1024, 12288}, {5120, 5120, 1024, 17408}, {4096, 4096, 1024, 14336}};
  for (const Dims& d : dims)
    for (int kc : {512, 1024})
      for (int S : {1, 7, 66, 108, 114, 132, 144}) {
        // The four phases: q/k/v, o, gate/up (virtual rows: 16 of gate then 16 of up per tile), down.
        const int64_t rows_v[4] = {d.q + 2 * d.kv, d.hidden, 2 * d.ffn, d.hidden};
        const int64_t K[4] = {d.hidden, d.q, d.hidden, d.ffn};
        for (int p = 0; p < 4; ++p) {
          if (K[p] % kc != 0) continue;
          const int64_t U = K[p] / kc, tiles = rows_v[p] / 32, N = tiles * U;
          ASSERT_TRUE(fits_32bit(N, S));
          const int64_t parts = max_parts(rows_v[p], U, S);
          ASSERT_GE(parts, 1);
          std::vector<int> owner(size_t(N), -1);
          for (int s = 0; s < S; ++s) {
            const int64_t u0 = first_unit(N, S, s), u1 = first_unit(N, S, s + 1);
            ASSERT_LE(u0, u1);
            for (int64_t u = u0; u < u1; ++u) {
              ASSERT_EQ(owner[size_t(u)], -1) << "unit " << u << " owned twice";
              owner[size_t(u)] = s;
              ASSERT_EQ(owner_of(N, S, u), s) << "N " << N << " S " << S << " u " << u;
            }
          }
          for (int64_t u = 0; u < N; ++u) ASSERT_GE(owner[size_t(u)], 0) << "unit " << u << " unowned";
          // A tile's slots: block - s0 for the blocks holding its units, below max_parts. A reader
          // adds slots 0..s1 - s0; one that no block of the tile writes must belong to a block with
          // no units at all (fewer units than blocks), which writes nothing anywhere, so it stays
          // as the host zeroed it.
          for (int64_t t = 0; t < tiles; ++t) {
            const int s0 = owner_of(N, S, t * U), s1 = owner_of(N, S, (t + 1) * U - 1);
            std::set<int> slots;
            for (int64_t u = t * U; u < (t + 1) * U; ++u) slots.insert(owner[size_t(u)] - s0);
            EXPECT_EQ(*slots.begin(), 0);
            EXPECT_EQ(*slots.rbegin(), s1 - s0);
            EXPECT_LT(int64_t(s1 - s0), parts);
            for (int k = 0; k <= s1 - s0; ++k)
              if (!slots.count(k))
                EXPECT_EQ(first_unit(N, S, s0 + k), first_unit(N, S, s0 + k + 1))
                    << "slot " << k << " of tile " << t << " is read but its block has units elsewhere";
          }
          // Gate/up by whole tiles (when there are at least S): each tile in exactly one block.
          if (p == 2 && tiles >= S) {
            int64_t covered = 0;
            for (int s = 0; s < S; ++s) {
              const int64_t t0 = first_unit(tiles, S, s), t1 = first_unit(tiles, S, s + 1);
              EXPECT_EQ(t0, covered);
              EXPECT_LE(t1 - t0, tiles / S + 1);  // at most one tile of imbalance
              covered = t1;
            }
            EXPECT_EQ(covered, tiles);
          }
        }
      }
}

TEST(CudaPersistPlan, SharedMemoryLayoutFitsTheRing) {
  // Hopper's 227 KB per block (less the 1 KB the backend keeps back): the residual stream, the
  // largest staged input (or the attention scratch) and at least 4 ring stages, each region
  // 128-byte aligned, for the dense shapes above and every group size.
  const Dims dims[] = {{1024, 2048, 1024, 3072},
                       {2560, 4096, 1024, 9728},
                       {4096, 4096, 1024, 12288},
                       {5120, 5120, 1024, 17408},
                       {8192, 8192, 1024, 28672}};
  for (const Dims& d : dims)
    for (int group : {32, 64, 128}) {
      for (int kc : {512, 1024}) {
        if (kc < persist_kc(group)) continue;
        PersistArgs a;
        a.hidden = int(d.hidden), a.q_dim = int(d.q), a.kv_dim = int(d.kv), a.ffn = int(d.ffn);
        a.n_heads = int(d.q / 128), a.n_kv = int(d.kv / 128), a.group = group, a.kc = kc;
        ASSERT_TRUE(persist_layout(a, 232448 - 1024)) << d.hidden << " g" << group << " kc " << kc;
        EXPECT_GE(a.stages, 4);
        EXPECT_EQ(a.off_res % 128, 0);
        EXPECT_EQ(a.off_x % 128, 0);
        EXPECT_EQ(a.off_ring % 128, 0);
        EXPECT_EQ(a.stage_bytes % 16, 0);
        EXPECT_LE(a.smem_bytes, size_t(232448 - 1024));
        // A unit: 32 rows of kc / 2 bytes of weights plus kc / group scales and biases each.
        EXPECT_EQ(size_t(a.stage_bytes), size_t(32) * (a.kc / 2 + 2 * (a.kc / group) * 2));
        EXPECT_EQ(a.kc % (8 * group), 0);  // each row's scales: a multiple of 16 bytes
        // Tensor-map copies land 128-byte aligned: every stage, its scales and biases, and the
        // second (up) half of a gate/up unit (16 rows in).
        const int row_w = a.kc / 2, row_s = a.kc / group * 2;
        EXPECT_EQ(a.stage_bytes % 128, 0);
        for (int off : {32 * row_w, 32 * row_w + 32 * row_s, 16 * row_w, 16 * row_s})
          EXPECT_EQ(off % 128, 0) << "g" << group << " kc " << kc << " offset " << off;
      }
    }
}

TEST(CudaPersistPlan, AttentionSplitsCoverTheContextAndTheLastHoldsTheCurrentPosition) {
  // Every split count the host can choose (max_split = SMs / kv heads, clamped to 1..64) and
  // contexts up to 70,000: the splits tile [0, ctx) without gaps or overlap, none is empty (so the
  // last holds position ctx - 1, whose K/V row its own block appends), there are at most
  // max_split, and each has at least half the minimum where there is more than one.
  for (int max_split = 1; max_split <= 64; ++max_split)
    for (int ctx = 1; ctx <= 70000; ++ctx) {
      const AttnSplits a = attn_splits(ctx, max_split, kAttnMinPos);
      ASSERT_GE(a.n, 1);
      ASSERT_LE(a.n, max_split);
      ASSERT_GE(int64_t(a.n) * a.chunk, ctx) << "ctx " << ctx << " max_split " << max_split;
      ASSERT_LT(int64_t(a.n - 1) * a.chunk, ctx) << "empty last split: ctx " << ctx << " max_split " << max_split;
      if (a.n > 1) ASSERT_GE(a.chunk, kAttnMinPos / 2) << "ctx " << ctx << " max_split " << max_split;
    }
  // The case that broke the first version: 34 splits of 33 positions for 1,089.
  const AttnSplits b = attn_splits(1089, 34, kAttnMinPos);
  EXPECT_EQ(b.chunk, 33);
  EXPECT_EQ(b.n, 33);
}

}  // namespace
}  // namespace anvil::cuda::persist
