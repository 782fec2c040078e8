// MoE weight binding: the MLX stacked layout (switch_mlp, a leading expert dimension) and the Hugging Face
// per-expert layout bind to the same per-expert views and give bit-identical logits; the router keeps its
// own quantization; bytes/token and active parameters count only top_k experts; a missing or misshapen
// expert tensor is an error naming it. The golden tests check both layouts against transformers / mlx-lm.
#include <gtest/gtest.h>

#include <map>

#include "backend/backend.h"
#include "format/model_config.h"
#include "model/synth.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "weights_logits.h"

using namespace anvil;

namespace {

struct Tiny {
  std::unique_ptr<SynthModel> m;
  ModelConfig cfg;
};

Tiny tiny_moe(const std::string& quant) {
  Tiny t;
  auto shape = synth_shape("tiny-moe");
  auto q = parse_synth_quant(quant);
  auto m = synth_build(*shape, *q, 3);
  EXPECT_TRUE(m.is_ok());
  t.m = std::move(*m);
  auto c = parse_model_config(t.m->config_json, "synth");
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  t.cfg = *c;
  return t;
}

// The stacked tensors re-exposed under per-expert names (slices of the same bytes).
std::map<std::string, TensorView> per_expert_views(const SynthModel& m, int experts) {
  std::map<std::string, TensorView> out;
  for (const TensorView& t : m.tensors) {
    const auto pos = t.name.find("switch_mlp.");
    if (pos == std::string::npos) {
      out[t.name] = t;
      continue;
    }
    const size_t per = t.nbytes / size_t(experts);
    for (int e = 0; e < experts; ++e) {
      TensorView v = t;
      v.name = t.name.substr(0, pos) + "experts." + std::to_string(e) + "." + t.name.substr(pos + 11);
      v.shape = {t.shape[1], t.shape[2]};
      v.data = t.data + size_t(e) * per;
      v.nbytes = per;
      out[v.name] = v;
    }
  }
  return out;
}

TEST(MoEWeights, StackedAndPerExpertLayoutsAgree) {
  for (const char* quant : {"q4g64", "bf16"}) {
    Tiny t = tiny_moe(quant);
    auto stacked = bind_weights(t.cfg, [&](const std::string& n) { return t.m->find(n); }, "synth");
    ASSERT_TRUE(stacked.is_ok()) << stacked.status().message();
    auto views = per_expert_views(*t.m, t.cfg.num_experts);
    auto per = bind_weights(t.cfg, [&](const std::string& n) -> const TensorView* {
      auto it = views.find(n);
      return it == views.end() ? nullptr : &it->second;
    }, "per-expert");
    ASSERT_TRUE(per.is_ok()) << per.status().message();
    const MoEWeights& a = stacked->layers[1].experts;
    const MoEWeights& b = per->layers[1].experts;
    ASSERT_TRUE(stacked->layers[1].moe);
    ASSERT_EQ(a.gate.size(), size_t(t.cfg.num_experts));
    for (int e = 0; e < t.cfg.num_experts; ++e) {
      EXPECT_EQ(a.gate[size_t(e)].data, b.gate[size_t(e)].data) << quant << " expert " << e;
      EXPECT_EQ(a.down[size_t(e)].scales, b.down[size_t(e)].scales) << quant << " expert " << e;
    }
    EXPECT_EQ(logits_of(t.cfg, *stacked), logits_of(t.cfg, *per)) << quant;
    if (std::string(quant) == "q4g64") {
      EXPECT_EQ(a.router.bits, 8);  // the per-module override
      EXPECT_EQ(a.gate[0].bits, 4);
    }
    // Accounting: top_k of num_experts experts per token.
    int64_t expert_params = 0;
    for (auto& l : stacked->layers)
      for (auto* list : {&l.experts.gate, &l.experts.up, &l.experts.down})
        for (auto& m : *list) expert_params += m.rows * m.cols;
    EXPECT_EQ(stacked->parameter_count() - stacked->active_parameter_count(),
              expert_params - expert_params * t.cfg.num_experts_per_tok / t.cfg.num_experts);
  }
}

TEST(MoEWeights, MissingOrMisshapenExpertTensorIsNamed) {
  Tiny t = tiny_moe("q4g64");
  const std::string gone = "model.layers.1.mlp.switch_mlp.up_proj.scales";
  auto r = bind_weights(t.cfg, [&](const std::string& n) { return n == gone ? nullptr : t.m->find(n); }, "m");
  ASSERT_FALSE(r.is_ok());
  // Without .scales the U32 weight is reported as needing them.
  EXPECT_NE(r.status().message().find("switch_mlp.up_proj"), std::string::npos) << r.status().message();
  // A stacked weight that is not there at all is named with the shape it should have.
  const std::string gone_w = "model.layers.1.mlp.switch_mlp.up_proj.weight";  // (gate_proj there: stacked)
  auto rw = bind_weights(t.cfg, [&](const std::string& n) { return n == gone_w ? nullptr : t.m->find(n); }, "m");
  ASSERT_FALSE(rw.is_ok());
  EXPECT_NE(rw.status().message().find(gone_w), std::string::npos) << rw.status().message();
  EXPECT_NE(rw.status().message().find("[" + std::to_string(t.cfg.num_experts) + ", "), std::string::npos)
      << rw.status().message();
  EXPECT_NE(rw.status().message().find(", ...] stacked expert weights"), std::string::npos) << rw.status().message();
  TensorView bad = *t.m->find("model.layers.0.mlp.switch_mlp.down_proj.weight");
  bad.shape[0] = 7;
  auto r2 = bind_weights(t.cfg, [&](const std::string& n) {
    return n == bad.name ? &bad : t.m->find(n);
  }, "m");
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().message().find("leading expert dimension of 8"), std::string::npos) << r2.status().message();
  auto r3 = bind_weights(t.cfg, [&](const std::string& n) {
    return n.find("mlp.switch_mlp.gate_proj") != std::string::npos && n.find("layers.0.") != std::string::npos
               ? nullptr : t.m->find(n);
  }, "m");
  ASSERT_FALSE(r3.is_ok());
  EXPECT_NE(r3.status().message().find("model.layers.0.mlp.experts.0.gate_proj.weight"), std::string::npos)
      << r3.status().message();
}

}  // namespace
