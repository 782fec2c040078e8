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

TEST(CudaPersist, DecodeLogitsMatchOpByOp) {
  for (const char* q : {"q4g64", "q4g32", "q4g128"}) {
    const std::string synth = std::string("qwen3-0.6b:") + q;
    Stack ref = make_persist(synth, 2048, false);
    if (!ref.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
    Stack per = make_persist(synth, 2048, true);
    ASSERT_TRUE(per.backend);
    // (The build targets Hopper, where the kernel must take this model; stderr has the reason if not.)
    ASSERT_TRUE(per.tf->decodes_layers_in_one_launch()) << synth;
    // A prompt of 700 tokens: attention runs 3 splits per kv head (256 positions per split) and
    // crosses pages; the decode steps go on past 768 (4 splits).
    std::vector<int32_t> prompt;
    for (int i = 0; i < 700; ++i) prompt.push_back((i * 7919 + 13) % 151936);
    auto sr = ref.engine->seq_create(), sp = per.engine->seq_create();
    ASSERT_TRUE(sr.is_ok() && sp.is_ok());
    std::vector<float> lr, lp;
    ASSERT_TRUE(ref.engine->extend(*sr, prompt, &lr).is_ok());
    ASSERT_TRUE(per.engine->extend(*sp, prompt, &lp).is_ok());
    double worst = 0.0;
    int same = 0;
    const int steps = 80;
    for (int i = 0; i < steps; ++i) {
      const int32_t tok = int32_t(argmax(lr));
      same += argmax(lp) == size_t(tok);
      const uint64_t before = per.backend->launch_count();
      ASSERT_TRUE(ref.engine->extend(*sr, std::vector<int32_t>{tok}, &lr).is_ok());
      ASSERT_TRUE(per.engine->extend(*sp, std::vector<int32_t>{tok}, &lp).is_ok());
      // The layers ran as one launch: embed, the persistent kernel, final norm, lm_head (and its
      // split sums): far fewer than the 8 or more per layer of the op-by-op path.
      EXPECT_LT(per.backend->launch_count() - before, 10u) << synth << " step " << i;
      double d = 0.0, n = 0.0;
      for (size_t j = 0; j < lr.size(); ++j) {
        ASSERT_TRUE(std::isfinite(lp[j])) << synth << " step " << i << " logit " << j;
        d += (double(lp[j]) - lr[j]) * (double(lp[j]) - lr[j]);
        n += double(lr[j]) * lr[j];
      }
      worst = std::max(worst, std::sqrt(d / n));
    }
    std::printf("%s: worst normalized logit error %.3e over %d steps; argmax equal in %d\n", synth.c_str(), worst,
                steps, same);
    // Bounds from the measurements (H100, session 28): worst 2.04e-2..2.11e-2 over the three
    // group sizes, the argmax equal in 77..80 of 80 steps. The random synthetic weights of 28
    // layers amplify single bf16 roundings that land on the other side (the sums' order differs),
    // so the bound is 2.5x the measured worst; a wrong tile, slot, head or position corrupts whole
    // rows of an activation in every layer, far beyond it.
    EXPECT_LT(worst, 5e-2) << synth;
    EXPECT_GE(same, steps * 9 / 10) << synth;
  }
}

// The same stack on the CPU backend (fp32 activations): the reference every CUDA op is tested against.
Stack make_cpu_stack(const std::string& synth, int ctx) {
  return make_model_stack(make_cpu_backend(int(std::max(1u, std::thread::hardware_concurrency()))), synth, ctx, 1);
}

double rel_err(const std::vector<float>& x, const std::vector<float>& ref) {
  double d = 0.0, n = 0.0;
  for (size_t j = 0; j < ref.size(); ++j) d += (double(x[j]) - ref[j]) * (double(x[j]) - ref[j]), n += double(ref[j]) * ref[j];
  return std::sqrt(d / n);
}

TEST(CudaPersist, AsCloseToTheCpuAsOpByOp) {
  // Against the CPU backend itself: both CUDA paths keep bf16 activations where the CPU keeps fp32,
  // so neither equals it; the persistent kernel, doing the same ops with the same roundings in
  // another order, must not be much further from it than the op-by-op path. A 300-token prompt
  // (two attention splits) and 40 decode steps, the CPU's argmax fed to all three.
  const std::string synth = "qwen3-0.6b:q4g64";
  Stack ref = make_persist(synth, 1024, false);
  if (!ref.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  Stack per = make_persist(synth, 1024, true);
  ASSERT_TRUE(per.backend && per.tf->decodes_layers_in_one_launch());
  Stack cpu = make_cpu_stack(synth, 1024);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 300; ++i) prompt.push_back((i * 7919 + 13) % 151936);
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
  // Not yet measured on a GPU (written in session 28 after the device budget was spent): a first
  // bound of twice the op-by-op path's distance (at least 1e-2), to be tightened from the figures.
  EXPECT_LT(worst_per, 2.0 * std::max(worst_ref, 1e-2));
}

TEST(CudaPersist, GraphReplaysEqualEagerLaunches) {
  Stack s = make_persist("qwen3-0.6b:q4g64", 1024, true);
  if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  ASSERT_TRUE(s.tf->decodes_layers_in_one_launch());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 104729 + 7) % 151936);
  // 300 tokens: past 256 positions, a second attention split.
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
