// The batch kernel's wave-ahead L2 prefetch (src/backend/cuda/prefetch_ranges.h) stays inside the matrices they
// name: a bulk prefetch past an allocation's end could fault, and one that misses rows prefetches
// nothing useful. Host arithmetic only: runs without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <set>

#include "backend/cuda/prefetch_ranges.h"

namespace anvil::cuda {
namespace {

TEST(CudaPrefetchRanges, BatchBlocksAheadAreTheLaterWavesOnce) {
  for (int64_t gx : {1, 7, 64, 96, 192})
    for (int64_t gy : {1, 2, 4, 5})
      for (int64_t wave : {1, 132, 264, 528}) {
        std::set<int64_t> targets;
        for (int64_t by = 0; by < gy; ++by)
          for (int64_t bx = 0; bx < gx; ++bx) {
            int64_t nx = -1, ny = -1;
            const bool any = batch_block_after(bx, by, gx, gy, wave, &nx, &ny);
            EXPECT_EQ(any, by * gx + bx + wave < gx * gy);
            if (!any) continue;
            ASSERT_TRUE(nx >= 0 && nx < gx && ny >= 0 && ny < gy);
            EXPECT_EQ(ny * gx + nx, by * gx + bx + wave);
            EXPECT_TRUE(targets.insert(ny * gx + nx).second) << "block prefetched twice";
          }
        // Exactly the blocks past the first `wave` (x fastest) are prefetched.
        EXPECT_EQ(int64_t(targets.size()), gx * gy > wave ? gx * gy - wave : 0);
        if (!targets.empty()) EXPECT_EQ(*targets.begin(), wave);
      }
}

TEST(CudaPrefetchRanges, BatchRowRangesStayInTheirRow) {
  // A split of sps steps at split index y covers steps [y sps, min(steps, (y + 1) sps)).
  for (int64_t K : {1024, 4096, 12288})
    for (int64_t sps : {1, 3, 8, 32}) {
      const int64_t steps = K / 128;
      for (int64_t y = 0; y * sps < steps + sps; ++y)
        for (int64_t row : {0, 1, 63, 4095}) {
          const int64_t s0 = y * sps, n = std::min(steps, s0 + sps) - s0;
          const ByteRange r = batch_row_range(row, K, s0, n);
          if (n <= 0) {
            EXPECT_EQ(r.bytes, 0);
            continue;
          }
          EXPECT_EQ(r.off % 16, 0);
          EXPECT_EQ(r.bytes % 16, 0);
          EXPECT_GE(r.off, row * K / 2);
          EXPECT_LE(r.off + r.bytes, (row + 1) * K / 2) << "K " << K << " split " << y << " of " << sps << " steps";
        }
    }
}

}  // namespace
}  // namespace anvil::cuda
