// The whole model on CUDA: decode through the captured graph gives exactly the tokens of decode
// without it (same kernels, same order: any difference is a replay bug such as a stale buffer or a
// launch shape that changed under the graph), and device memory does not grow while generating.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "cuda_model_stack.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace anvil {
namespace {

using Stack = CudaModelStack;
Stack make_stack(const std::string& synth, int ctx) { return make_cuda_model_stack(synth, ctx, 1); }

std::vector<int32_t> run(Stack& s, const std::vector<int32_t>& prompt, int n) { return greedy_ids(s, prompt, n); }

TEST(CudaModel, GraphDecodeEqualsDecodeWithoutGraph) {
  Stack s = make_stack("tiny:q4g64", 512);
  if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 7919 + 13) % 151936);
  setenv("ANVIL_NO_GRAPH", "1", 1);
  const auto plain = run(s, prompt, 60);  // 45 + 60 positions: crosses several 16-token pages
  EXPECT_EQ(s.tf->graphs_captured(), 0);
  unsetenv("ANVIL_NO_GRAPH");
  const auto graphed = run(s, prompt, 60);
  EXPECT_GE(s.tf->graphs_captured(), 1);
  ASSERT_EQ(plain.size(), 60u);
  EXPECT_EQ(graphed, plain);
  // A second run replays the graph captured in the first (same buffers, same shape).
  const int captured = s.tf->graphs_captured();
  EXPECT_EQ(run(s, prompt, 60), plain);
  EXPECT_EQ(s.tf->graphs_captured(), captured);
}

TEST(CudaModel, MoEGraphDecodeEqualsDecodeWithoutGraph) {
  // The MoE decode step (routing on the device, moe.cu) replayed from a graph gives the tokens of the
  // same step run op by op; the 45-token prompt goes through the grouped prefill kernels.
  Stack s = make_stack("tiny-moe:q4g64", 512);
  if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 7919 + 13) % 151936);
  setenv("ANVIL_NO_GRAPH", "1", 1);
  const auto plain = run(s, prompt, 40);
  unsetenv("ANVIL_NO_GRAPH");
  const auto graphed = run(s, prompt, 40);
  EXPECT_GE(s.tf->graphs_captured(), 1);
  ASSERT_EQ(plain.size(), 40u);
  EXPECT_EQ(graphed, plain);
}

TEST(CudaModel, L2PrefetchChangesNoToken) {
  // ANVIL_CUDA_L2_PREFETCH (Backend::prefetch_weights: a kernel after the q/k/v mat-vec pulls the o,
  // gate and up weights into L2 while attention runs) reads memory and writes nothing a kernel sees,
  // so greedy decode through the graph gives the same tokens with it: 1 MB (o whole, then the tails
  // of gate and up) issued after the kernel's PDL wait, and 64 MB (every byte) issued before it.
  // The reference runs without either switch, whatever the process was started with (cuda_check.sh
  // runs the model tests under them); they are restored at the end.
  struct Saved {
    const char* name;
    std::string value;
    bool set;
  } saved[] = {{"ANVIL_CUDA_L2_PREFETCH", "", false}, {"ANVIL_CUDA_L2_PREFETCH_MLP", "", false}};
  for (auto& v : saved)
    if (const char* e = std::getenv(v.name)) v.value = e, v.set = true, unsetenv(v.name);
  struct Restore {
    Saved* s;
    ~Restore() {
      for (int i = 0; i < 2; ++i)
        if (s[i].set) setenv(s[i].name, s[i].value.c_str(), 1);
    }
  } restore{saved};
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 7919 + 13) % 151936);
  for (const char* synth : {"tiny:q4g64", "tiny:bf16"}) {
    Stack ref = make_stack(synth, 512);
    if (!ref.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
    const auto want = run(ref, prompt, 40);
    ASSERT_EQ(want.size(), 40u) << synth;
    // The second hint (ANVIL_CUDA_L2_PREFETCH_MLP, after gate/up: the down projection) likewise,
    // and the evict_last priority on both.
    const std::pair<const char*, const char*> cfgs[] = {{"ANVIL_CUDA_L2_PREFETCH", "1"},
                                                        {"ANVIL_CUDA_L2_PREFETCH", "64,1"},
                                                        {"ANVIL_CUDA_L2_PREFETCH", "64,1,1"},
                                                        {"ANVIL_CUDA_L2_PREFETCH", "64,0,1,1"},  // forked
                                                        {"ANVIL_CUDA_L2_PREFETCH_MLP", "1"},
                                                        {"ANVIL_CUDA_L2_PREFETCH_MLP", "64,1"}};
    for (const auto& [name, cfg] : cfgs) {
      setenv(name, cfg, 1);
      Stack s = make_stack(synth, 512);
      unsetenv(name);
      EXPECT_EQ(run(s, prompt, 40), want) << synth << " " << name << "=" << cfg;
      EXPECT_TRUE(s.backend->synchronize().is_ok()) << synth << " " << name << "=" << cfg;
      // The prefetch kernels were launched (one per dense layer of every step up to 64 rows).
      EXPECT_GT(s.backend->launch_count(), ref.backend->launch_count()) << synth << " " << name << "=" << cfg;
    }
  }
}

TEST(CudaModel, NoDeviceMemoryGrowthOver10000Tokens) {
  Stack s = make_stack("tiny:q4g64", 10240);
  if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  run(s, {1, 2, 3, 4}, 100);  // warm: graphs captured, workspaces sized
  size_t free0 = 0, free1 = 0, total = 0;
  ASSERT_TRUE(cuda_memory_info(0, &free0, &total).is_ok());
  const auto ids = run(s, {1, 2, 3, 4}, 10000);
  EXPECT_EQ(ids.size(), 10000u);
  ASSERT_TRUE(cuda_memory_info(0, &free1, &total).is_ok());
  // Attention's workspace may grow once as splits change with the context; anything beyond a few MiB
  // would be a per-token leak (10,000 tokens x even 1 KiB = 10 MB).
  EXPECT_LT(double(free0) - double(free1), 8.0 * (1 << 20)) << "device memory fell by "
                                                           << (double(free0) - double(free1)) / 1e6 << " MB";
}

}  // namespace
}  // namespace anvil
