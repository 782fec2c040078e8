// The CUDA moe_ffn (moe.cu, moe_runner.cpp) against the CPU backend's moe_ffn (the reference; it is held
// to the double-precision cpu::moe_ffn_reference_f32 by tests/backend/cpu_moe_test.cpp) over expert
// counts, top-k, formats (4/8-bit MLX at group sizes 32/64/128, dense bf16/f32), batch sizes on both
// paths (1 and 3 tokens: the decode mat-vec kernels; 17 and 64: the grouped prefill kernels), with and
// without qwen2_moe's shared expert (fused into the expert kernels at decode when its format matches the
// routed experts', run through the dense ops otherwise), norm_topk_prob on and off. Also: routing ties
// go to the lower index, a captured graph re-routes new inputs on the device, the decode kernel count,
// and unsupported weights are refused with an error naming them. Skips where no GPU is usable.
//
// Bounds (rel_err over the compared tokens' rows, cuda_test_util.h) come from the dense CUDA ops' errors
// measured on the H200 (docs/benchmarks.md, max over shapes): linear_swiglu 3.9e-3, a mat-vec 2.4e-3,
// tensor-core paths with bf16-rounded weights 2.4e-3. One expert is exactly a linear_swiglu (h rounded to
// bf16, as the dense MLP on CUDA) followed by a linear, and the weighted sum of the k experts adds no
// rounding (fp32, one bf16 rounding of the output), so the two ops' errors add: 6.3e-3. Bound 8e-3 at
// decode (CUDA-core mat-vecs on exact weights); 1.2e-2 for prefill, whose two grouped GEMMs both round
// the dequantized weights to bf16 for the tensor cores (the ~1.5-2x margin the op tests keep).
// These kernels were written in a session without a GPU: the first GPU run prints every measured
// rel_err ("[ cuda-err ]"); re-derive the bounds from those numbers then.
//
// Routing near-ties: a token whose k-th and (k+1)-th router probabilities (from the CPU's fp32 logits)
// are within 3e-4 relative may legitimately pick the other expert; its row is left out of the comparison
// (counted and printed; at most a tenth of the tokens may be). Why 3e-4: the relative gap of two
// probabilities is the difference of their logits, and the CPU's router logits carry the error of its
// int16 quantization of x (AVX2 path: ~5e-5 per element of |x| <= 3, ~3e-5 on a 2048-wide logit with
// weights ~1/sqrt(2048)); the CUDA ones only fp32 summation order (~1e-6). 3e-4 is 10x the larger.
#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"

namespace anvil::cuda_test {
namespace {

constexpr double kMoEDecodeBound = 8e-3;
constexpr double kMoEPrefillBound = 1.2e-2;
constexpr double kTieMargin = 3e-4;

struct MoECase {
  int E, k;
  int64_t H, F;
  int bits, group;
  DType dt;
  int router_bits;    // 0: dense router of dt
  int64_t S;          // shared expert width (0: none)
  int shared_bits;    // the shared expert's bits (== bits: fusable at decode)
  bool norm;
};

std::string case_name(const MoECase& c) {
  std::string s = "E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " H=" + std::to_string(c.H) +
                  " F=" + std::to_string(c.F) + " " + fmt_name(c.bits, c.group, c.dt) + " router " +
                  fmt_name(c.router_bits, 64, c.dt);
  if (c.S) s += " shared " + std::to_string(c.S) + (c.shared_bits == c.bits ? " (fused)" : " (dense ops)");
  return s + (c.norm ? " norm" : "");
}

// Host weights of one MoE layer and the device copy.
struct MoELayer {
  std::vector<HostWeight> store;
  MoEWeights host, dev;
  std::vector<WeightMatrix> uploaded;
};

class CudaMoE : public CudaFixture {
 protected:
  void TearDown() override {
    for (auto& l : layers_)
      for (const WeightMatrix& m : l->uploaded) gpu_->free_weight(m);
    layers_.clear();
    CudaFixture::TearDown();
  }

  MoELayer& make_layer(const MoECase& c) {
    auto l = std::make_unique<MoELayer>();
    l->store.reserve(size_t(3 * c.E + 6));
    auto add = [&](int64_t rows, int64_t cols, int bits, int group) -> WeightMatrix {
      l->store.push_back(make_weight(rng_, rows, cols, bits, group, c.dt, false));
      return l->store.back().w;
    };
    MoEWeights& w = l->host;
    w.num_experts = c.E, w.top_k = c.k, w.norm_topk_prob = c.norm;
    w.router = add(c.E, c.H, c.router_bits, 64);
    for (int e = 0; e < c.E; ++e) {
      w.gate.push_back(add(c.F, c.H, c.bits, c.group));
      w.up.push_back(add(c.F, c.H, c.bits, c.group));
      w.down.push_back(add(c.H, c.F, c.bits, c.group));
    }
    if (c.S) {
      w.shared_gate = add(c.S, c.H, c.shared_bits, c.group);
      w.shared_up = add(c.S, c.H, c.shared_bits, c.group);
      w.shared_down = add(c.H, c.S, c.shared_bits, c.group);
      w.shared_gate_w = add(1, c.H, c.router_bits, 64);
    }
    upload(*l);
    layers_.push_back(std::move(l));
    return *layers_.back();
  }

  void upload(MoELayer& l) {
    auto up = [&](const WeightMatrix& m) {
      if (m.rows == 0) return WeightMatrix{};
      auto d = gpu_->upload_weight(m);
      EXPECT_TRUE(d.is_ok()) << d.status().message();
      l.uploaded.push_back(*d);
      return *d;
    };
    const MoEWeights& h = l.host;
    MoEWeights& d = l.dev;
    d.num_experts = h.num_experts, d.top_k = h.top_k, d.norm_topk_prob = h.norm_topk_prob;
    d.router = up(h.router);
    for (size_t e = 0; e < h.gate.size(); ++e) {
      d.gate.push_back(up(h.gate[e]));
      d.up.push_back(up(h.up[e]));
      d.down.push_back(up(h.down[e]));
    }
    d.shared_gate = up(h.shared_gate), d.shared_up = up(h.shared_up), d.shared_down = up(h.shared_down);
    d.shared_gate_w = up(h.shared_gate_w);
  }

  std::vector<float> cpu_moe(const MoEWeights& w, std::vector<float> x, int64_t T) {
    std::vector<float> out(x.size());
    const int64_t H = w.router.cols;
    cpu_->moe_ffn(Act{x.data(), T, H, DType::kF32}, w, Act{out.data(), T, H, DType::kF32});
    EXPECT_TRUE(cpu_->synchronize().is_ok());
    return out;
  }

  // Per token: whether its top-k boundary is a near-tie (see the file comment), from the CPU's logits.
  std::vector<bool> near_ties(const MoEWeights& w, std::vector<float> x, int64_t T) {
    const int E = w.num_experts, k = w.top_k;
    std::vector<float> logits(size_t(T * E));
    cpu_->linear(Act{x.data(), T, w.router.cols, DType::kF32}, w.router, Act{logits.data(), T, E, DType::kF32});
    std::vector<bool> tie(size_t(T), false);
    if (k == E) return tie;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> p(logits.begin() + t * E, logits.begin() + (t + 1) * E);
      const double mx = *std::max_element(p.begin(), p.end());
      for (double& v : p) v = std::exp(v - mx);
      std::sort(p.begin(), p.end(), std::greater<double>());
      tie[size_t(t)] = (p[size_t(k) - 1] - p[size_t(k)]) <= kTieMargin * p[size_t(k) - 1];
    }
    return tie;
  }

  std::vector<float> gpu_moe(const MoEWeights& w, const std::vector<float>& x, int64_t T, const std::string& what) {
    const int64_t H = w.router.cols;
    Guarded gx = dev_bf16(x), go = dev_out(size_t(T * H) * 2);
    gpu_->moe_ffn(Act{gx.data(), T, H, DType::kBF16}, w, Act{go.data(), T, H, DType::kBF16});
    const Status st = gpu_->synchronize();
    EXPECT_TRUE(st.is_ok()) << what << ": " << st.message();
    return read(go, DType::kBF16, what);
  }

  // Compares the rows of tokens without a routing near-tie.
  void compare(const MoEWeights& hw, const MoEWeights& dw, int64_t T, double bound, const std::string& what) {
    const int64_t H = hw.router.cols;
    const auto x = randn(size_t(T * H));
    const auto ref = cpu_moe(hw, x, T);
    const auto got = gpu_moe(dw, x, T, what);
    const auto tie = near_ties(hw, x, T);
    std::vector<float> g, r;
    int skipped = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (tie[size_t(t)]) {
        ++skipped;
        continue;
      }
      g.insert(g.end(), got.begin() + t * H, got.begin() + (t + 1) * H);
      r.insert(r.end(), ref.begin() + t * H, ref.begin() + (t + 1) * H);
    }
    for (float v : got) ASSERT_TRUE(std::isfinite(v)) << what << ": a non-finite output (never written?)";
    if (skipped) std::printf("[ cuda-moe ] %s: %d of %lld tokens at a routing near-tie, not compared\n", what.c_str(),
                             skipped, static_cast<long long>(T));
    EXPECT_LE(skipped * 10, T + 9) << what << ": too many near-ties for the comparison to mean anything";
    expect_close(g, r, bound, what);
  }

  std::vector<std::unique_ptr<MoELayer>> layers_;
};

TEST_F(CudaMoE, MatchesCpuOverExpertsTopKFormatsAndBatch) {
  const DType bf = DType::kBF16;
  const MoECase cases[] = {
      {8, 2, 256, 128, 4, 64, bf, 8, 0, 0, true},          // qwen3_moe-like, 8-bit router
      {8, 2, 256, 128, 4, 32, bf, 8, 0, 0, false},         // no renormalization (qwen2_moe, olmoe)
      {16, 4, 512, 256, 4, 128, bf, 8, 0, 0, true},
      {64, 8, 256, 128, 8, 64, bf, 8, 0, 0, false},        // olmoe-like: 64 experts, top-8
      {8, 2, 256, 128, 8, 32, bf, 0, 0, 0, true},          // bf16 router
      {8, 2, 256, 96, 0, 0, bf, 0, 0, 0, true},            // dense bf16 experts (HF checkpoints)
      {4, 4, 128, 64, 0, 0, DType::kF32, 0, 0, 0, true},   // dense f32, k == E
      {60, 4, 256, 128, 4, 64, bf, 8, 256, 4, false},      // qwen2_moe: shared expert fused at decode
      {60, 4, 256, 128, 4, 64, bf, 8, 192, 0, false},      // shared expert in bf16: through the dense ops
      {128, 8, 2048, 768, 4, 64, bf, 8, 0, 0, true},       // one qwen3-30b-a3b layer
      {8, 2, 160, 96, 4, 32, bf, 0, 0, 0, true},          // 4-bit, K % 64 = 32 (gate/up 160, down 96): the grouped GEMM's half step
      // The other MLX widths (mlx-community also ships 2/3/5/6-bit MoE models); a 3-bit router too.
      {8, 2, 256, 128, 3, 64, bf, 3, 0, 0, true},
      {8, 2, 256, 128, 6, 32, bf, 8, 0, 0, true},
      {8, 2, 256, 128, 5, 64, bf, 8, 256, 5, false},       // with a fused 5-bit shared expert
      {8, 2, 256, 128, 2, 64, bf, 8, 0, 0, true},
  };
  for (const MoECase& c : cases) {
    MoELayer& l = make_layer(c);
    for (int64_t T : {1, 3, 17, 64}) {
      const std::string what = "moe_ffn " + case_name(c) + " T=" + std::to_string(T);
      compare(l.host, l.dev, T, T <= 8 ? kMoEDecodeBound : kMoEPrefillBound, what);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(CudaMoE, LongBatchIsSplitIntoPasses) {
  // More tokens than one pass takes (moe_runner.h kMoEMaxChunk = 1024): the backend splits the batch.
  MoELayer& l = make_layer({8, 2, 128, 64, 4, 64, DType::kBF16, 8, 64, 4, true});
  compare(l.host, l.dev, 1100, kMoEPrefillBound, "moe_ffn T=1100 (two passes)");
}

TEST_F(CudaMoE, RoutingTiesGoToTheLowerIndex) {
  // Experts 1, 2 and 5 have identical router rows that dominate every token's logits: exactly equal
  // probabilities on both backends. The CPU's rule picks 1 (k = 1) or 1 and 2 (k = 2); their FFNs
  // differ from expert 5's, so picking 5 would be an O(1) error.
  const int64_t H = 128;
  for (int k : {1, 2}) {
    MoECase c{8, k, H, 64, 4, 64, DType::kBF16, 0, 0, 0, true};
    MoELayer& l = make_layer(c);
    // Rewrite the (bf16) router on the host: rows 1, 2, 5 = 0.5 * v, the rest small noise; x = v + noise.
    std::vector<float> v = randn(size_t(H));
    uint16_t* r = static_cast<uint16_t*>(const_cast<void*>(l.host.router.data));
    for (int e = 0; e < 8; ++e)
      for (int64_t i = 0; i < H; ++i)
        r[e * H + i] = f32_to_bf16((e == 1 || e == 2 || e == 5) ? 0.5f * v[size_t(i)] : 0.01f * randn(1)[0]);
    // Re-upload the router in place of the old one.
    auto d = gpu_->upload_weight(l.host.router);
    ASSERT_TRUE(d.is_ok());
    l.uploaded.push_back(*d);
    l.dev.router = *d;
    // T = 5: the cluster routing (decode, route_cluster_kernel); T = 20: the prefill's route_kernel.
    for (const int64_t T : {5, 20}) {
      std::vector<float> x(size_t(T * H));
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < H; ++i) x[size_t(t * H + i)] = bf16_round(v[size_t(i)] + 0.1f * randn(1)[0]);
      const auto ref = cpu_moe(l.host, x, T);
      const auto got = gpu_moe(l.dev, x, T, "ties");
      expect_close(got, ref, T <= 8 ? kMoEDecodeBound : kMoEPrefillBound,
                   "moe_ffn routing tie k=" + std::to_string(k) + " T=" + std::to_string(T));
    }
  }
}

TEST_F(CudaMoE, GraphReplayRoutesNewInputsOnTheDevice) {
  // One decode-sized MoE call captured as a graph, replayed after new inputs are copied into the same
  // buffer: the replay must equal a direct call on those inputs bit for bit (the routing is re-done on the
  // device; nothing chosen at capture time is baked in), and the chosen experts must actually differ.
  MoELayer& l = make_layer({16, 4, 256, 128, 4, 64, DType::kBF16, 8, 128, 4, true});
  const int64_t T = 1, H = 256;
  Guarded gx = guarded(size_t(H) * 2), go = guarded(size_t(H) * 2), gd = guarded(size_t(H) * 2);
  const Act ax{gx.data(), T, H, DType::kBF16}, ao{go.data(), T, H, DType::kBF16}, ad{gd.data(), T, H, DType::kBF16};
  auto put = [&](const std::vector<float>& x) {
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
    gpu_->copy_to_device(gx.data(), b.data(), b.size() * 2);
  };
  auto top1 = [&](const std::vector<float>& x) {
    std::vector<float> logits(16), xin = x;
    cpu_->linear(Act{xin.data(), 1, H, DType::kF32}, l.host.router, Act{logits.data(), 1, 16, DType::kF32});
    return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  };
  std::vector<float> x1 = randn(size_t(H)), x2 = randn(size_t(H));
  for (int tries = 0; tries < 20 && top1(x2) == top1(x1); ++tries) x2 = randn(size_t(H));
  ASSERT_NE(top1(x1), top1(x2));

  put(x1);
  gpu_->moe_ffn(ax, l.dev, ad);  // warm: tables and workspace exist before the capture
  ASSERT_TRUE(gpu_->graphs_supported());
  ASSERT_TRUE(gpu_->graph_capture_begin().is_ok());
  gpu_->moe_ffn(ax, l.dev, ao);
  ASSERT_TRUE(gpu_->graph_capture_end(77).is_ok());
  for (const auto* x : {&x1, &x2}) {
    put(*x);
    ASSERT_TRUE(gpu_->graph_launch(77));
    gpu_->moe_ffn(ax, l.dev, ad);
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    const auto replay = read(go, DType::kBF16, "replay"), direct = read(gd, DType::kBF16, "direct");
    EXPECT_EQ(replay, direct) << "graph replay differs from a direct call";
    expect_close(replay, cpu_moe(l.host, *x, T), kMoEDecodeBound, "moe_ffn graph replay");
  }
}

TEST_F(CudaMoE, AtMostFourKernelsPerBlockAtDecode) {
  // Issue 12's budget: routing, gate/up + SwiGLU, down + weighted sum (+ the fused shared expert).
  for (int64_t S : {0, 128}) {
    MoELayer& l = make_layer({128, 8, 256, 128, 4, 64, DType::kBF16, 8, S, 4, true});
    const auto x = randn(256);
    gpu_moe(l.dev, x, 1, "warm");
    Guarded gx = dev_bf16(x), go = dev_out(256 * 2);
    const uint64_t before = gpu_->launch_count();
    gpu_->moe_ffn(Act{gx.data(), 1, 256, DType::kBF16}, l.dev, Act{go.data(), 1, 256, DType::kBF16});
    ASSERT_TRUE(gpu_->synchronize().is_ok());
    EXPECT_LE(gpu_->launch_count() - before, 4u) << "shared expert width " << S;
  }
}

TEST_F(CudaMoE, UnsupportedWeightsAreRefusedByName) {
  // Experts with a bias (no MoE architecture has one): a clear error from synchronize(), not garbage.
  MoELayer& l = make_layer({8, 2, 256, 128, 4, 64, DType::kBF16, 8, 0, 0, true});
  MoEWeights w = l.dev;
  WeightMatrix g0 = w.gate[0];
  g0.bias = g0.data;  // any non-null pointer: refused before anything reads it
  g0.bias_dtype = DType::kBF16;
  w.gate[0] = g0;
  const auto x = randn(256);
  Guarded gx = dev_bf16(x), go = dev_out(256 * 2);
  gpu_->moe_ffn(Act{gx.data(), 1, 256, DType::kBF16}, w, Act{go.data(), 1, 256, DType::kBF16});
  const Status st = gpu_->synchronize();
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("bias"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("expert 0 gate"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace anvil::cuda_test
