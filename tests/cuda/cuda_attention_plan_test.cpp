// The host half of decode attention's launch (attention.cu attention_splits): how many splits of the
// KV positions a batch gets. No CUDA call is made, so these run (and must pass) on a machine without
// a GPU. The properties checked are the ones the rule exists for: a decode batch on the tensor cores
// fills the GPU with about one block per SM and no more (its measured optimum, benchmarks.md session
// 18), no split holds fewer than 64 positions at full context, and batch 1 and prefill keep the
// earlier rules.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend/cuda/cuda_kernels.h"

namespace anvil::cuda_test {
namespace {

constexpr int kSms = 132;  // the H200's; the rule takes the count as a parameter

TEST(CudaAttentionPlan, DecodeBatchesFillOneWaveOfBlocks) {
  for (int kv : {1, 2, 4, 8}) {
    for (int T = 2; T <= 64; ++T) {
      for (int P : {64, 640, 4096, 16384}) {
        const int s = cuda::attention_splits(T, kv, P, kSms, /*tc_decode=*/true);
        const int blocks = T * kv;
        SCOPED_TRACE("T=" + std::to_string(T) + " kv=" + std::to_string(kv) + " positions=" + std::to_string(P));
        ASSERT_GE(s, 1);
        EXPECT_GE(P / s, std::min(P, 64)) << "a split of fewer than 64 positions";
        if (P / 64 >= s + 1)  // not capped by the 64-position floor: one wave, and no split more than it needs
          EXPECT_GE(blocks * s, kSms);
        EXPECT_LT(blocks * (s - 1), kSms) << s << " splits where " << s - 1 << " fill the GPU";
      }
    }
  }
  // The measured shapes (qwen3-8b: 8 kv heads; 640 positions after a 512-token prompt).
  EXPECT_EQ(cuda::attention_splits(32, 8, 640, kSms, true), 1);
  EXPECT_EQ(cuda::attention_splits(16, 8, 640, kSms, true), 2);
  EXPECT_EQ(cuda::attention_splits(8, 8, 640, kSms, true), 3);
}

TEST(CudaAttentionPlan, BatchOneAndPrefillKeepTheirRules) {
  // Batch 1 (qwen3-8b, 8 kv heads): ~256 positions per split, at least one wave, at most 4 blocks
  // per SM, >= 64 positions: 17 splits at 4,096 tokens (session 16), 10 at 640 (the 64 floor).
  EXPECT_EQ(cuda::attention_splits(1, 8, 4096, kSms, true), 17);
  EXPECT_EQ(cuda::attention_splits(1, 8, 640, kSms, true), 10);
  EXPECT_EQ(cuda::attention_splits(1, 8, 640, kSms, false), cuda::attention_splits(1, 8, 640, kSms, true));
  // Prefill chunks and the split kernels (tc_decode false): ~4 blocks per SM, 1 once the batch
  // alone has two blocks per SM.
  EXPECT_EQ(cuda::attention_splits(32, 8, 640, kSms, false), 3);
  EXPECT_EQ(cuda::attention_splits(33, 8, 640, kSms, false), 1);
  EXPECT_EQ(cuda::attention_splits(256, 8, 4096, kSms, false), 1);
  EXPECT_EQ(cuda::attention_splits(256, 8, 4096, kSms, true), 1);
}

}  // namespace
}  // namespace anvil::cuda_test
