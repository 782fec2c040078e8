// The transformer's fused layer flow (Backend::fuses_norm_linear: the norm inside the input
// projections, the residual add inside the output projections; what CUDA runs at one token on
// narrow models, or always with ANVIL_CUDA_FUSE=1) must compute exactly what the plain flow
// computes. On the CPU the fused ops are their reference compositions (rmsnorm + linear, linear +
// add), the same float operations in the same order as add_rmsnorm + linear, so the logits must be
// equal bit for bit: prefill, decode,
// dense models (with and without q/k/v bias) and a mixture-of-experts model with a dense layer
// between MoE layers (MoE layers keep the plain flow, so a pending residual crosses flows).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "engine_test_util.h"

using namespace anvil;
using namespace anvil::testing;

namespace {

// Prefill of 23 tokens (all logits), then 3 decode steps; every logit row of both. `spec`: a
// synthetic model, or "golden:NAME" for a committed golden fixture (tests/data/golden/NAME).
std::vector<float> run_flow(const std::string& spec, bool fused) {
  if (fused) setenv("ANVIL_CPU_FUSED_FLOW", "1", 1);
  SharedEngineFixture f;
  if (spec.rfind("golden:", 0) == 0) {
    auto m = load_model(std::string(ANVIL_TEST_DATA) + "/golden/" + spec.substr(7));
    EXPECT_TRUE(m.is_ok()) << m.status().message();
    if (m.is_ok()) {
      f.model = std::shared_ptr<LoadedModel>(std::move(m).value());
      f.backend = make_cpu_backend(2);
      auto w = upload_weights(f.model->weights, *f.backend);
      EXPECT_TRUE(w.is_ok());
      auto tf = Transformer::create(f.model->config, *w, *f.backend, 64);
      EXPECT_TRUE(tf.is_ok());
      if (tf.is_ok()) f.tf = std::move(tf).value();
      if (f.tf) {
        FixtureOptions o;
        auto e = Engine::create(*f.tf, f.model->fingerprint, o.engine);
        EXPECT_TRUE(e.is_ok());
        if (e.is_ok()) f.engine = std::move(e).value();
      }
    }
  } else {
    FixtureOptions o;
    o.spec = spec;
    f = make_engine(o);
  }
  unsetenv("ANVIL_CPU_FUSED_FLOW");
  if (!f.engine) return {};
  const auto ids = random_ids(26, 11, f.vocab());
  std::vector<float> all, out;
  const int s = *f.engine->seq_create();
  EXPECT_TRUE(f.engine->extend(s, std::span<const int32_t>(ids).first(23), nullptr, &all).is_ok());
  out = all;
  for (int i = 23; i < 26; ++i) {
    std::vector<float> logits;
    const int32_t id = ids[size_t(i)];
    EXPECT_TRUE(f.engine->decode(std::span<const int>(&s, 1), std::span<const int32_t>(&id, 1), &logits).is_ok());
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

TEST(FusedLayerFlow, EqualsPlainFlowBitForBitOnCpu) {
  // qwen3-moe-q4 has a dense layer between MoE layers (mlp_only_layers = [1]): the flows mix.
  for (const char* spec : {"tiny:q4g64", "tiny:bf16", "tiny-moe:q4g64", "golden:qwen3-moe-q4", "golden:qwen2-bf16"}) {
    const auto plain = run_flow(spec, false), fused = run_flow(spec, true);
    ASSERT_FALSE(plain.empty()) << spec;
    ASSERT_EQ(plain.size(), fused.size()) << spec;
    EXPECT_TRUE(bit_equal(plain, fused)) << spec << ": max |diff| "
                                         << max_abs_diff(plain.data(), fused.data(), plain.size());
  }
}

// The switch really changes the flow: the fused flow calls the fused ops, which the plain one never
// does (a test of the test: without this, an ignored switch would pass the test above).
TEST(FusedLayerFlow, TheSwitchTakesTheFusedOps) {
  setenv("ANVIL_CPU_FUSED_FLOW", "1", 1);
  auto fused = make_cpu_backend(1);
  unsetenv("ANVIL_CPU_FUSED_FLOW");
  auto plain = make_cpu_backend(1);
  const WeightMatrix w{};
  const WeightMatrix* ws[1] = {&w};
  EXPECT_TRUE(fused->fuses_norm_linear(1, ws));
  EXPECT_FALSE(plain->fuses_norm_linear(1, ws));
}

}  // namespace
