// The mixture-of-experts part of parse_model_config: the four families, transformers' defaults for
// omitted fields (Qwen3MoeConfig / Qwen2MoeConfig / OlmoeConfig / MixtralConfig), which layers are MoE,
// and clear errors for what is not supported. The golden fixtures check the same fields end to end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "format/model_config.h"
#include "format_test_util.h"

using namespace anvil;
using anvil_test::contains;
using nlohmann::json;

namespace {

json moe_config(const std::string& type) {
  json j{{"model_type", type},        {"vocab_size", 1000},        {"hidden_size", 256},
         {"intermediate_size", 512},  {"num_hidden_layers", 4},    {"num_attention_heads", 8},
         {"num_key_value_heads", 2},  {"num_experts_per_tok", 2},  {"rms_norm_eps", 1e-6}};
  if (type == "mixtral") j["num_local_experts"] = 8;
  else j["num_experts"] = 8;
  if (type == "qwen3_moe" || type == "qwen2_moe") j["moe_intermediate_size"] = 128;
  if (type == "qwen2_moe") j["shared_expert_intermediate_size"] = 384;
  return j;
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "/m/config.json"); }

TEST(MoEConfig, Qwen3MoeDefaultsAndLayers) {
  json j = moe_config("qwen3_moe");
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->arch, Arch::kQwen3Moe);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->moe_intermediate_size, 128);
  EXPECT_FALSE(c->norm_topk_prob);  // Qwen3MoeConfig's default
  // (l + 1) % 2 == 0 and l not in mlp_only_layers: only layer 1 (layer 3 is listed).
  EXPECT_FALSE(c->is_moe_layer(0));
  EXPECT_TRUE(c->is_moe_layer(1));
  EXPECT_FALSE(c->is_moe_layer(2));
  EXPECT_FALSE(c->is_moe_layer(3));
}

TEST(MoEConfig, Qwen2MoeSharedExpertAndBias) {
  auto c = parse(moe_config("qwen2_moe"));
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->shared_expert_intermediate_size, 384);
  EXPECT_TRUE(c->attention_bias);  // qkv_bias defaults to true
  json j = moe_config("qwen2_moe");
  j["qkv_bias"] = false;
  EXPECT_FALSE(parse(j)->attention_bias);
  j.erase("shared_expert_intermediate_size");
  auto e = parse(j);
  ASSERT_FALSE(e.is_ok());
  EXPECT_TRUE(contains(e.status().message(), "shared_expert_intermediate_size")) << e.status().message();
}

TEST(MoEConfig, OlmoeAndMixtral) {
  auto o = parse(moe_config("olmoe"));
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  EXPECT_TRUE(o->qk_norm_full);
  EXPECT_FALSE(o->qk_norm);
  EXPECT_EQ(o->moe_intermediate_size, 512);  // OLMoE's experts use intermediate_size
  for (int l = 0; l < 4; ++l) EXPECT_TRUE(o->is_moe_layer(l));
  auto m = parse(moe_config("mixtral"));
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->num_experts, 8);
  EXPECT_TRUE(m->norm_topk_prob);  // softmax over the top-k logits
  EXPECT_EQ(m->moe_intermediate_size, 512);
  json a = moe_config("qwen3_moe");  // transformers 5 writes num_local_experts for every family
  a.erase("num_experts");
  a["num_local_experts"] = 16;
  EXPECT_EQ(parse(a)->num_experts, 16);
}

TEST(MoEConfig, Errors) {
  json j = moe_config("qwen3_moe");
  j["num_experts_per_tok"] = 9;
  auto e = parse(j);
  ASSERT_FALSE(e.is_ok());
  EXPECT_TRUE(contains(e.status().message(), "num_experts_per_tok")) << e.status().message();
  j = moe_config("qwen3_moe");
  j.erase("moe_intermediate_size");
  EXPECT_TRUE(contains(parse(j).status().message(), "moe_intermediate_size"));
  j = moe_config("qwen3_moe");
  j["mlp_only_layers"] = {7};
  EXPECT_TRUE(contains(parse(j).status().message(), "mlp_only_layers"));
  j = moe_config("olmoe");
  j["clip_qkv"] = 8.0;
  EXPECT_EQ(parse(j).status().code(), StatusCode::kUnsupported);
  // Mixtral's sliding_window, as Mistral's: a window is taken (the context is capped at it), null and
  // absent (MixtralConfig's default) are none, anything else is named.
  j = moe_config("mixtral");
  j["sliding_window"] = 4096;
  ASSERT_TRUE(parse(j).is_ok()) << parse(j).status().message();
  EXPECT_EQ(parse(j)->sliding_window, 4096);
  j["sliding_window"] = nullptr;
  ASSERT_TRUE(parse(j).is_ok());
  EXPECT_EQ(parse(j)->sliding_window, 0);
  j.erase("sliding_window");
  EXPECT_EQ(parse(j)->sliding_window, 0);
  j["sliding_window"] = "4096";
  EXPECT_TRUE(contains(parse(j).status().message(), "'sliding_window'")) << parse(j).status().message();
  // Qwen's use_sliding_window: refused where a layer would slide (from max_window_layers on).
  j = moe_config("qwen3_moe");
  const int layers = j["num_hidden_layers"].get<int>();
  j["use_sliding_window"] = true;
  j["max_window_layers"] = layers - 1;
  auto sw = parse(j);
  EXPECT_EQ(sw.status().code(), StatusCode::kUnsupported);
  EXPECT_TRUE(contains(sw.status().message(), "use_sliding_window")) << sw.status().message();
  j["max_window_layers"] = layers;  // no layer slides
  EXPECT_TRUE(parse(j).is_ok());
  j["use_sliding_window"] = false;
  j["max_window_layers"] = 0;
  EXPECT_TRUE(parse(j).is_ok());
}

}  // namespace
