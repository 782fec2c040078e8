// The whole model on CUDA: decode through the captured graph gives exactly the tokens of decode
// without it (same kernels, same order: any difference is a replay bug such as a stale buffer or a
// launch shape that changed under the graph), and device memory does not grow while generating.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
Stack make_stack(const std::string& synth, int ctx) { return make_cuda_model_stack(synth, ctx, 1); }

std::vector<int32_t> run(Stack& s, const std::vector<int32_t>& prompt, int n) { return greedy_ids(s, prompt, n); }

TEST(CudaModel, GraphDecodeEqualsDecodeWithoutGraph) {
  Stack s = make_stack("tiny:q4g64", 512);
  if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  const std::vector<int32_t> prompt = cuda_test::spread_ids(45);
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
  const std::vector<int32_t> prompt = cuda_test::spread_ids(45);
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
  const std::vector<int32_t> prompt = cuda_test::spread_ids(45);
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

// The fused layer flow (the norms inside the q/k/v and gate/up mat-vecs, the residual adds in the o
// and down epilogues: CudaBackend::fuse_rule), which one-token decode of a model with a 1,024-wide
// residual stream (qwen3-0.6b) takes by default, against the plain flow (ANVIL_CUDA_FUSE=0) and the
// CPU backend: it runs 2 kernels per layer fewer (and no final add), it is no further from the CPU
// than the plain flow beyond a margin, and its graph replays give exactly its eager tokens.
TEST(CudaModel, FusedLayersAsCloseToTheCpuAsPlain) {
  const std::string synth = "qwen3-0.6b:q4g64";
  const cuda_test::ScopedEnv env{"ANVIL_CUDA_FUSE", "ANVIL_NO_GRAPH"};
  unsetenv("ANVIL_NO_GRAPH");
  setenv("ANVIL_CUDA_FUSE", "0", 1);
  Stack plain = make_stack(synth, 1024);
  if (!plain.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
  unsetenv("ANVIL_CUDA_FUSE");
  const int sms = cuda_test::gpu_sms();
  if (sms < 64) GTEST_SKIP() << "a GPU of " << sms << " SMs: the rule fuses a 1,024-wide stream from 64 on";
  Stack fused = make_stack(synth, 1024);
  ASSERT_TRUE(fused.backend);
  auto cpu = make_model_stack(make_cpu_backend(int(std::max(1u, std::thread::hardware_concurrency()))), synth, 1024, 1);
  ASSERT_TRUE(cpu.backend);

  const std::vector<int32_t> prompt = cuda_test::spread_ids(300);
  auto sc = cpu.engine->seq_create(), sp = plain.engine->seq_create(), sf = fused.engine->seq_create();
  ASSERT_TRUE(sc.is_ok() && sp.is_ok() && sf.is_ok());
  std::vector<float> lc, lp, lf;
  ASSERT_TRUE(cpu.engine->extend(*sc, prompt, &lc).is_ok());
  ASSERT_TRUE(plain.engine->extend(*sp, prompt, &lp).is_ok());
  ASSERT_TRUE(fused.engine->extend(*sf, prompt, &lf).is_ok());
  double worst_plain = 0.0, worst_fused = 0.0;
  for (int i = 0; i < 40; ++i) {
    const std::vector<int32_t> tok{int32_t(std::max_element(lc.begin(), lc.end()) - lc.begin())};
    ASSERT_TRUE(cpu.engine->extend(*sc, tok, &lc).is_ok());
    // One step without the graph: every launch counted.
    if (i == 0) setenv("ANVIL_NO_GRAPH", "1", 1);
    const uint64_t p0 = plain.backend->launch_count(), f0 = fused.backend->launch_count();
    ASSERT_TRUE(plain.engine->extend(*sp, tok, &lp).is_ok());
    ASSERT_TRUE(fused.engine->extend(*sf, tok, &lf).is_ok());
    if (i == 0) {
      unsetenv("ANVIL_NO_GRAPH");
      const int64_t fewer = int64_t(plain.backend->launch_count() - p0) - int64_t(fused.backend->launch_count() - f0);
      EXPECT_EQ(fewer, 2 * int64_t(plain.model->config.num_hidden_layers) + 1)
          << "the default one-token step of " << synth << " must run the fused layers";
    }
    worst_plain = std::max(worst_plain, cuda_test::rel_err(lp, lc));
    worst_fused = std::max(worst_fused, cuda_test::rel_err(lf, lc));
  }
  std::printf("against the CPU: plain %.3e, fused %.3e (worst normalized logit error over 40 steps)\n", worst_plain,
              worst_fused);
  // Both keep bf16 activations where the CPU keeps fp32; the fused flow rounds h * w to bf16 where
  // the plain one rounds the normalized h * inv * w, and sums h^2 in another order. The bound is the
  // persistent kernel's (CudaPersist.AsCloseToTheCpuAsOpByOp: 1.25x the plain distance, at least
  // 1e-2): a systematic error, a norm or an add off by one rounding per layer, shows as a multiple.
  EXPECT_LT(worst_fused, 1.25 * std::max(worst_plain, 1e-2));

  // The fused step is deterministic: the same token after the same prompt gives the same logits,
  // bit for bit (its sums of squares are added in a fixed order, not by atomics).
  fused.engine->seq_release(*sf);
  std::vector<float> again[2];
  for (auto& l : again) {
    auto sq = fused.engine->seq_create();
    ASSERT_TRUE(sq.is_ok());
    ASSERT_TRUE(fused.engine->extend(*sq, prompt, &l).is_ok());
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(fused.engine->extend(*sq, std::vector<int32_t>{int32_t(1000 + i)}, &l).is_ok());
    fused.engine->seq_release(*sq);
  }
  EXPECT_TRUE(again[0] == again[1]) << "two runs of the same fused steps gave different logits";

  // Graph replays of the fused step give exactly the eager launches' tokens.
  setenv("ANVIL_NO_GRAPH", "1", 1);
  const auto eager = greedy_ids(fused, prompt, 24);
  unsetenv("ANVIL_NO_GRAPH");
  const auto graphed = greedy_ids(fused, prompt, 24);
  ASSERT_EQ(eager.size(), 24u);
  EXPECT_EQ(graphed, eager);
}

// Sets the layer flow for the backends made next (ANVIL_CUDA_FUSE=flow; "" unsets it: the rule)
// and names it for failure messages.
std::string set_fuse_flow(const char* flow) {
  if (*flow) setenv("ANVIL_CUDA_FUSE", flow, 1);
  else unsetenv("ANVIL_CUDA_FUSE");
  return std::string("ANVIL_CUDA_FUSE=") + (*flow ? flow : "(unset)");
}

// ANVIL_CUDA_QKV_ROPE=1 (the q/k/v mat-vec doing rope_kv's work in its tail) computes the same bits as
// the q/k/v launch followed by rope_kv.cu (the same mat-vec arithmetic, rope_kv.cuh's item), so a
// whole model's decode must give exactly the same logits and greedy tokens with it as without, in
// the fused layer flow (the default for qwen3-0.6b) and in the plain one (ANVIL_CUDA_FUSE=0, where
// the mat-vec copies the norm's int16 planes), with one kernel fewer per layer.
TEST(CudaModel, QkvRopeEpilogueDecodesAsTheComposition) {
  const std::string synth = "qwen3-0.6b:q4g64";
  const cuda_test::ScopedEnv env{"ANVIL_CUDA_FUSE", "ANVIL_CUDA_QKV_ROPE"};
  const std::vector<int32_t> prompt = cuda_test::spread_ids(100);
  for (const char* flow : {"", "0"}) {
    const std::string what = set_fuse_flow(flow);
    unsetenv("ANVIL_CUDA_QKV_ROPE");
    Stack ref = make_stack(synth, 512);
    if (!ref.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
    setenv("ANVIL_CUDA_QKV_ROPE", "1", 1);
    Stack s = make_stack(synth, 512);
    unsetenv("ANVIL_CUDA_QKV_ROPE");
    ASSERT_TRUE(s.backend);
    auto sr = ref.engine->seq_create(), ss = s.engine->seq_create();
    ASSERT_TRUE(sr.is_ok() && ss.is_ok());
    std::vector<float> lr, ls;
    ASSERT_TRUE(ref.engine->extend(*sr, prompt, &lr).is_ok());
    ASSERT_TRUE(s.engine->extend(*ss, prompt, &ls).is_ok());
    for (int i = 0; i < 8; ++i) {
      const std::vector<int32_t> tok{int32_t(std::max_element(lr.begin(), lr.end()) - lr.begin())};
      const uint64_t r0 = ref.backend->launch_count(), s0 = s.backend->launch_count();
      ASSERT_TRUE(ref.engine->extend(*sr, tok, &lr).is_ok());
      ASSERT_TRUE(s.engine->extend(*ss, tok, &ls).is_ok());
      if (i == 0)
        EXPECT_EQ(int64_t(ref.backend->launch_count() - r0) - int64_t(s.backend->launch_count() - s0),
                  int64_t(ref.model->config.num_hidden_layers))
            << "one kernel fewer per layer: " << what;
      EXPECT_TRUE(lr == ls) << "decode step " << i << " logits differ: " << what;
    }
    ref.engine->seq_release(*sr);
    s.engine->seq_release(*ss);
    EXPECT_EQ(greedy_ids(s, prompt, 40), greedy_ids(ref, prompt, 40)) << what;
  }
}

// The one-token mat-vecs without a fused form run the streamed kernel's instances compiled without the
// fused forms' code (qgemv_stream.cu, FU = false; the default), ANVIL_QGEMV_PLAIN=0 the ones with it,
// and ANVIL_QGEMV_RING_FIT=1 (measuring; passed on an H100 in session 49) gives launches whose warps
// have few steps a smaller ring (qwen3-0.6b: all of them, the fused forms' included; by default only
// its one-token 8-warp launches, and =0 none); ANVIL_CUDA_CARVEOUT=100 (measuring; passed on an H100
// in session 50) changes only where blocks fit. Same arithmetic in the same order, so the logits must
// be the same bits, in both layer flows (the plain flow runs every projection through the FU = false
// instances; the fused flow only the LM head).
TEST(CudaModel, PlainMatVecInstancesDecodeAsTheDefault) {
  const std::string synth = "qwen3-0.6b:q4g64";
  const cuda_test::ScopedEnv env{"ANVIL_CUDA_FUSE", "ANVIL_QGEMV_PLAIN", "ANVIL_QGEMV_RING_FIT", "ANVIL_CUDA_CARVEOUT"};
  const std::vector<int32_t> prompt = cuda_test::spread_ids(100);
  constexpr int kWays = 5;
  const char* ways[kWays][2] = {{"ANVIL_QGEMV_PLAIN", "1"},
                                {"ANVIL_QGEMV_PLAIN", "0"},
                                {"ANVIL_QGEMV_RING_FIT", "1"},
                                {"ANVIL_QGEMV_RING_FIT", "0"},
                                {"ANVIL_CUDA_CARVEOUT", "100"}};
  for (const char* flow : {"", "0"}) {
    const std::string what = set_fuse_flow(flow);
    std::vector<std::vector<float>> logits[kWays];
    std::vector<int32_t> ids[kWays];
    for (int w = 0; w < kWays; ++w) {
      unsetenv("ANVIL_QGEMV_PLAIN");
      unsetenv("ANVIL_QGEMV_RING_FIT");
      unsetenv("ANVIL_CUDA_CARVEOUT");
      setenv(ways[w][0], ways[w][1], 1);
      Stack s = make_stack(synth, 512);
      if (!s.backend) GTEST_SKIP() << "no CUDA GPU usable here: " << make_cuda_backend(0).status().message();
      auto sq = s.engine->seq_create();
      ASSERT_TRUE(sq.is_ok());
      std::vector<float> l;
      ASSERT_TRUE(s.engine->extend(*sq, prompt, &l).is_ok());
      for (int i = 0; i < 8; ++i) {
        const std::vector<int32_t> tok{int32_t(std::max_element(l.begin(), l.end()) - l.begin())};
        ASSERT_TRUE(s.engine->extend(*sq, tok, &l).is_ok());
        logits[w].push_back(l);
      }
      s.engine->seq_release(*sq);
      ids[w] = greedy_ids(s, prompt, 40);
    }
    for (int w = 1; w < kWays; ++w) {
      const std::string way = std::string(ways[w][0]) + "=" + ways[w][1] + ", " + what;
      ASSERT_EQ(logits[0].size(), logits[w].size());
      for (size_t i = 0; i < logits[0].size(); ++i)
        EXPECT_TRUE(logits[0][i] == logits[w][i]) << "decode step " << i << " logits differ: " << way;
      EXPECT_EQ(ids[w], ids[0]) << way;
    }
  }
}

}  // namespace
}  // namespace anvil
