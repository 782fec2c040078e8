// The persistent decode kernel (persist_decode.cu, ANVIL_CUDA_PERSIST=1) against the op-by-op CUDA
// decode: the same synthetic qwen3-0.6b-shaped model (head_dim 128, the shape the kernel takes)
// in two stacks, fed the same tokens; each decode step's logits compared by normalized error, and
// its argmax. The kernel computes every op with the op-by-op path's arithmetic and bf16 roundings
// but sums in another order (each 32-row tile split over blocks), so the logits are close, not
// equal. Replays of the captured decode graph must give exactly the tokens of eager launches (the
// kernel is deterministic: its split sums are added in a fixed order), which also checks that its
// device-wide barriers and per-head counters are consistent from one launch to the next.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "cuda_model_stack.h"
#include "cuda_test_util.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace anvil {
namespace {

using Stack = CudaModelStack;

Stack make_persist(const std::string& synth, int ctx, bool on) {
  const char* prev = std::getenv("ANVIL_CUDA_PERSIST");
  const std::string saved = prev ? prev : "";
  if (!on) unsetenv("ANVIL_CUDA_PERSIST");
  else if (!(prev && *prev >= '1' && *prev <= '3')) setenv("ANVIL_CUDA_PERSIST", "1", 1);  // (=2, =3 kept)
  Stack s = make_cuda_model_stack(synth, ctx, 1);
  if (prev) setenv("ANVIL_CUDA_PERSIST", saved.c_str(), 1);
  else unsetenv("ANVIL_CUDA_PERSIST");
  return s;
}

size_t argmax(const std::vector<float>& v) { return size_t(std::max_element(v.begin(), v.end()) - v.begin()); }

// Decodes `steps` tokens after a prompt of `prompt_len` on the op-by-op path and in the persistent
// kernel, the op-by-op argmax fed to both; the worst normalized logit error and the steps whose
// argmax agree. Also asserts the kernel took the model and ran each step in few launches.
struct Compared {
  double worst = 0.0;
  int same = 0;
};
Compared compare_with_op_by_op(const std::string& synth, int ctx, int prompt_len, int steps) {
  Compared c;
  Stack ref = make_persist(synth, ctx, false);
  if (!ref.backend) return c;
  Stack per = make_persist(synth, ctx, true);
  EXPECT_TRUE(per.backend);
  if (!per.backend) return c;
  // (The build targets Hopper, where the kernel must take this model; stderr has the reason if not.)
  EXPECT_TRUE(per.tf->decodes_layers_in_one_launch()) << synth;
  if (!per.tf->decodes_layers_in_one_launch()) return c;
  const std::vector<int32_t> prompt = cuda_test::spread_ids(prompt_len);
  auto sr = ref.engine->seq_create(), sp = per.engine->seq_create();
  EXPECT_TRUE(sr.is_ok() && sp.is_ok());
  if (!sr.is_ok() || !sp.is_ok()) return c;
  std::vector<float> lr, lp;
  EXPECT_TRUE(ref.engine->extend(*sr, prompt, &lr).is_ok());
  EXPECT_TRUE(per.engine->extend(*sp, prompt, &lp).is_ok());
  for (int i = 0; i < steps; ++i) {
    const int32_t tok = int32_t(argmax(lr));
    c.same += argmax(lp) == size_t(tok);
    const uint64_t before = per.backend->launch_count();
    EXPECT_TRUE(ref.engine->extend(*sr, std::vector<int32_t>{tok}, &lr).is_ok());
    EXPECT_TRUE(per.engine->extend(*sp, std::vector<int32_t>{tok}, &lp).is_ok());
    // The layers ran as one launch: embed, the persistent kernel, final norm, lm_head (and its
    // split sums): far fewer than the 8 or more per layer of the op-by-op path.
    EXPECT_LT(per.backend->launch_count() - before, 10u) << synth << " step " << i;
    double d = 0.0, n = 0.0;
    for (size_t j = 0; j < lr.size(); ++j) {
      if (!std::isfinite(lp[j])) {
        ADD_FAILURE() << synth << " step " << i << " logit " << j << " is " << lp[j];
        return c;
      }
      d += (double(lp[j]) - lr[j]) * (double(lp[j]) - lr[j]);
      n += double(lr[j]) * lr[j];
    }
    c.worst = std::max(c.worst, std::sqrt(d / n));
  }
  std::printf("%s: worst normalized logit error %.3e over %d steps; argmax equal in %d\n", synth.c_str(), c.worst,
              steps, c.same);
  return c;
}

TEST(CudaPersist, DecodeLogitsMatchOpByOp) {
  if (!make_cuda_backend(0).is_ok()) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  for (const char* q : {"q4g64", "q4g32", "q4g128"}) {
    // A prompt of 700 tokens: 8 kv heads take 16 attention splits of 44 positions on 132 SMs
    // (at most one item per block), across pages; the decode steps go on past 768.
    const int steps = 80;
    const Compared c = compare_with_op_by_op(std::string("qwen3-0.6b:") + q, 2048, 700, steps);
    // Bounds from the measurements (H100, sessions 28-29): worst 2.04e-2..2.16e-2 over the three
    // group sizes, the argmax equal in 75..80 of 80 steps. The random synthetic weights of 28
    // layers amplify single bf16 roundings that land on the other side (the sums' order differs),
    // so the bound is 2.5x the measured worst; a wrong tile, slot, head or position corrupts whole
    // rows of an activation in every layer, far beyond it.
    EXPECT_LT(c.worst, 5e-2) << q;
    EXPECT_GE(c.same, steps * 9 / 10) << q;
  }
}

TEST(CudaPersist, FewKvHeadsManySplits) {
  // Two kv heads (gqa-2kv: 8 query heads of 128, 4 layers): up to 64 attention splits per kv head,
  // 32 positions and more each. The context passes 2,049..2,079, where the first split rule of
  // session 29 left the last split empty on 132 SMs (the current position then read by a block
  // that had not appended it; CudaPersistPlan.AttentionSplits* checks the rule on the host).
  if (!make_cuda_backend(0).is_ok()) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  const int steps = 64;
  const Compared c = compare_with_op_by_op("gqa-2kv:q4g64", 4096, 2040, steps);
  // Not yet measured on a GPU: the bound of the 28-layer test above (4 layers amplify less); a
  // position attended without its K/V row, or a split merged twice, is far beyond it.
  EXPECT_LT(c.worst, 5e-2);
  EXPECT_GE(c.same, steps * 9 / 10);
}

// The same stack on the CPU backend (fp32 activations): the reference every CUDA op is tested against.
Stack make_cpu_stack(const std::string& synth, int ctx) {
  return make_model_stack(make_cpu_backend(int(std::max(1u, std::thread::hardware_concurrency()))), synth, ctx, 1);
}

using cuda_test::rel_err;

TEST(CudaPersist, AsCloseToTheCpuAsOpByOp) {
  // Against the CPU backend itself: both CUDA paths keep bf16 activations where the CPU keeps fp32,
  // so neither equals it; the persistent kernel, doing the same ops with the same roundings in
  // another order, must not be much further from it than the op-by-op path. A 300-token prompt
  // (10 attention splits per kv head) and 40 decode steps, the CPU's argmax fed to all three.
  const std::string synth = "qwen3-0.6b:q4g64";
  Stack ref = make_persist(synth, 1024, false);
  if (!ref.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  Stack per = make_persist(synth, 1024, true);
  ASSERT_TRUE(per.backend && per.tf->decodes_layers_in_one_launch());
  Stack cpu = make_cpu_stack(synth, 1024);
  const std::vector<int32_t> prompt = cuda_test::spread_ids(300);
  auto sc = cpu.engine->seq_create(), sr = ref.engine->seq_create(), sp = per.engine->seq_create();
  ASSERT_TRUE(sc.is_ok() && sr.is_ok() && sp.is_ok());
  std::vector<float> lc, lr, lp;
  ASSERT_TRUE(cpu.engine->extend(*sc, prompt, &lc).is_ok());
  ASSERT_TRUE(ref.engine->extend(*sr, prompt, &lr).is_ok());
  ASSERT_TRUE(per.engine->extend(*sp, prompt, &lp).is_ok());
  double worst_ref = 0.0, worst_per = 0.0;
  for (int i = 0; i < 40; ++i) {
    const std::vector<int32_t> tok{int32_t(argmax(lc))};
    ASSERT_TRUE(cpu.engine->extend(*sc, tok, &lc).is_ok());
    ASSERT_TRUE(ref.engine->extend(*sr, tok, &lr).is_ok());
    ASSERT_TRUE(per.engine->extend(*sp, tok, &lp).is_ok());
    worst_ref = std::max(worst_ref, rel_err(lr, lc));
    worst_per = std::max(worst_per, rel_err(lp, lc));
  }
  std::printf("against the CPU: op by op %.3e, persistent kernel %.3e (worst normalized logit error)\n", worst_ref,
              worst_per);
  // Measured (H100, session 29, five runs over four builds): op by op 2.365e-2, the kernel
  // 2.486e-2..2.496e-2, 1.05-1.06x. Bound: 1.25x the op-by-op distance (at least 1e-2), room for
  // other GPUs' block counts (another split of the sums) while a systematic error, e.g. a norm or
  // RoPE off by one bf16 rounding per layer, would show as a multiple.
  EXPECT_LT(worst_per, 1.25 * std::max(worst_ref, 1e-2));
}

TEST(CudaPersist, GraphReplaysEqualEagerLaunches) {
  Stack s = make_persist("qwen3-0.6b:q4g64", 1024, true);
  if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  ASSERT_TRUE(s.tf->decodes_layers_in_one_launch());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 104729 + 7) % 151936);
  // 300 tokens: the attention split count grows with the context (a split per 32 positions, up to
  // 16 per kv head on 132 SMs), so the replays cross several split counts.
  auto run = [&] { return greedy_ids(s, prompt, 300); };
  setenv("ANVIL_NO_GRAPH", "1", 1);
  const auto eager = run();
  unsetenv("ANVIL_NO_GRAPH");
  const auto graphed = run();
  ASSERT_EQ(eager.size(), 300u);
  EXPECT_GE(s.tf->graphs_captured(), 1);
  EXPECT_EQ(graphed, eager);
  EXPECT_EQ(run(), eager);  // replays of the graph captured above
}

}  // namespace
}  // namespace anvil
