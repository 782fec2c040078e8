// The host half of the CUDA moe_ffn (moe_runner.h moe_plan): which path a call takes, when qwen2_moe's
// shared expert is fused into the expert kernels, the workspace it needs, and the errors for weights the
// kernels cannot run. No CUDA call is made, so these run (and must pass) on a machine without a GPU.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe_runner.h"
#include "cuda_test_util.h"

namespace anvil::cuda_test {
namespace {

struct HostLayer {
  std::vector<HostWeight> store;
  MoEWeights w;
};

// E experts of [F, H] / [H, F] at `bits`/`group` (0: bf16), an 8-bit router, optional shared expert of
// width S at shared_bits.
HostLayer layer(int E, int k, int64_t H, int64_t F, int bits, int group, int64_t S = 0, int shared_bits = 4) {
  std::mt19937 rng(7);
  HostLayer l;
  l.store.reserve(size_t(3 * E + 5));
  auto add = [&](int64_t r, int64_t c, int b, int g) {
    l.store.push_back(make_weight(rng, r, c, b, g, DType::kBF16, false));
    return l.store.back().w;
  };
  l.w.num_experts = E, l.w.top_k = k, l.w.norm_topk_prob = true;
  l.w.router = add(E, H, 8, 64);
  for (int e = 0; e < E; ++e) {
    l.w.gate.push_back(add(F, H, bits, group));
    l.w.up.push_back(add(F, H, bits, group));
    l.w.down.push_back(add(H, F, bits, group));
  }
  if (S) {
    l.w.shared_gate = add(S, H, shared_bits, group);
    l.w.shared_up = add(S, H, shared_bits, group);
    l.w.shared_down = add(H, S, shared_bits, group);
    l.w.shared_gate_w = add(1, H, 8, 64);
  }
  return l;
}

TEST(CudaMoEPlan, PathsSharedExpertFusionAndWorkspace) {
  cuda::MoEPlan p;
  HostLayer a = layer(16, 4, 256, 128, 4, 64);
  for (int64_t T : {1, 8}) {
    ASSERT_TRUE(cuda::moe_plan(a.w, T, &p).is_ok());
    EXPECT_TRUE(p.decode) << T;
    EXPECT_FALSE(p.shared);
    EXPECT_EQ(p.part_bytes[12], 0u) << "decode needs no fp32 expert rows";
  }
  ASSERT_TRUE(cuda::moe_plan(a.w, 9, &p).is_ok());
  EXPECT_FALSE(p.decode);
  EXPECT_EQ(p.part_bytes[12], size_t(9 * 4 * 256 * 4)) << "prefill: T*k rows of H fp32 expert outputs";
  EXPECT_EQ(p.part_bytes[4], size_t(9 * 4 * 128 * 2)) << "h: T*k rows of F bf16";
  size_t sum = 0;
  for (size_t b : p.part_bytes) sum += (b + 255) / 256 * 256;
  EXPECT_EQ(p.workspace_bytes, sum);

  // The shared expert in the routed experts' format: fused at decode, through the dense ops at prefill.
  HostLayer s = layer(8, 2, 256, 128, 4, 64, 192, 4);
  ASSERT_TRUE(cuda::moe_plan(s.w, 1, &p).is_ok());
  EXPECT_TRUE(p.shared && p.shared_fusable && p.shared_fused);
  EXPECT_EQ(p.part_bytes[5], size_t(192 * 2)) << "hs";
  EXPECT_EQ(p.part_bytes[7], 0u) << "no dense shared output when fused";
  ASSERT_TRUE(cuda::moe_plan(s.w, 20, &p).is_ok());
  EXPECT_TRUE(p.shared && p.shared_fusable && !p.shared_fused);
  EXPECT_EQ(p.part_bytes[7], size_t(20 * 256 * 2)) << "shared_out";

  // Another format (bf16 shared expert, q4 routed ones): never fused.
  HostLayer d = layer(8, 2, 256, 128, 4, 64, 192, 0);
  ASSERT_TRUE(cuda::moe_plan(d.w, 1, &p).is_ok());
  EXPECT_TRUE(p.shared && !p.shared_fusable && !p.shared_fused);
  EXPECT_EQ(p.part_bytes[6], size_t(192 * 2)) << "shared_h";
}

TEST(CudaMoEPlan, RefusesWhatTheKernelsCannotRunNamingIt) {
  cuda::MoEPlan p;
  auto expect_error = [&](const MoEWeights& w, int64_t T, const std::vector<std::string>& words) {
    const Status st = cuda::moe_plan(w, T, &p);
    ASSERT_FALSE(st.is_ok());
    for (const auto& word : words) EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
  };
  HostLayer q3 = layer(8, 2, 256, 128, 3, 64);  // 2..6 and 8 bits are kernel formats
  EXPECT_TRUE(cuda::moe_plan(q3.w, 1, &p).is_ok());
  HostLayer q7 = layer(8, 2, 256, 128, 4, 64);
  for (WeightMatrix* m : {&q7.w.gate[0], &q7.w.up[0]}) m->bits = 7;  // no MLX width: refused by name
  expect_error(q7.w, 1, {"expert 0 gate", "7-bit"});

  HostLayer mixed = layer(8, 2, 256, 128, 4, 64);
  std::mt19937 rng(3);
  mixed.store.push_back(make_weight(rng, 256, 128, 4, 32, DType::kBF16, false));
  mixed.w.down[5] = mixed.store.back().w;
  expect_error(mixed.w, 1, {"expert 5", "share one format"});

  HostLayer biased = layer(8, 2, 256, 128, 4, 64);
  biased.store.push_back(make_weight(rng, 128, 256, 4, 64, DType::kBF16, true));
  biased.w.up[2] = biased.store.back().w;
  expect_error(biased.w, 1, {"expert 2 up", "bias"});

  HostLayer topk = layer(8, 2, 256, 128, 4, 64);
  topk.w.top_k = 9;
  expect_error(topk.w, 1, {"top_k", "9"});

  HostLayer narrow = layer(8, 2, 256, 80, 0, 0);  // dense bf16 experts 80 wide
  expect_error(narrow.w, 1, {"multiples of 32", "80"});

  HostLayer shape = layer(8, 2, 256, 128, 4, 64);
  shape.w.down[1].rows = 200;
  expect_error(shape.w, 1, {"expert 1 down", "[256, 128]"});

  HostLayer ok = layer(8, 2, 256, 128, 4, 64);
  expect_error(ok.w, 0, {"tokens per pass"});
  expect_error(ok.w, cuda::kMoEMaxChunk + 1, {"tokens per pass"});
}

}  // namespace
}  // namespace anvil::cuda_test
