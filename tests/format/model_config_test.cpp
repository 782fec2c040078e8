// parse_model_config / load_model_config: real configs (as transformers writes them, and the two
// shared tiny models) give the values transformers' own config classes report; every bad field is
// an error naming the file and the field.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/mmap_file.h"
#include "format/model_config.h"
#include "model/rope.h"
#include "format_test_util.h"

using namespace anvil;
using anvil_test::contains;
using nlohmann::json;

namespace {

const std::string kData = std::string(ANVIL_TEST_DATA) + "/format/";
const std::string kShared = std::string(ANVIL_SHARED_DIR) + "/fixtures/";

// A minimal valid qwen3 config; tests edit a copy.
json base_config() {
  return json{{"model_type", "qwen3"},     {"vocab_size", 1000},       {"hidden_size", 256},
              {"intermediate_size", 512},  {"num_hidden_layers", 2},   {"num_attention_heads", 8},
              {"num_key_value_heads", 2},  {"eos_token_id", 5},        {"torch_dtype", "bfloat16"}};
}

Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump(), "/models/x/config.json"); }

// Parsing must fail with a message that names the file and contains each needle.
void expect_error(const json& j, const std::vector<std::string>& needles, StatusCode code = StatusCode::kInvalidArgument) {
  auto r = parse(j);
  ASSERT_FALSE(r.is_ok()) << j.dump();
  EXPECT_EQ(r.status().code(), code) << r.status().message();
  EXPECT_TRUE(contains(r.status().message(), "/models/x/config.json: ")) << r.status().message();
  for (const auto& n : needles) EXPECT_TRUE(contains(r.status().message(), n)) << r.status().message();
}

void expect_matches_reference(const ModelConfig& c, const json& e) {
  EXPECT_EQ(c.model_type, e["model_type"].get<std::string>());
  EXPECT_EQ(arch_name(c.arch), e["model_type"].get<std::string>());
  EXPECT_EQ(c.vocab_size, e["vocab_size"].get<int>());
  EXPECT_EQ(c.hidden_size, e["hidden_size"].get<int>());
  EXPECT_EQ(c.intermediate_size, e["intermediate_size"].get<int>());
  EXPECT_EQ(c.num_hidden_layers, e["num_hidden_layers"].get<int>());
  EXPECT_EQ(c.num_attention_heads, e["num_attention_heads"].get<int>());
  EXPECT_EQ(c.num_key_value_heads, e["num_key_value_heads"].get<int>());
  EXPECT_EQ(c.head_dim, e["head_dim"].get<int>());
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, e["rms_norm_eps"].get<double>());
  EXPECT_DOUBLE_EQ(c.rope_theta, e["rope_theta"].get<double>());
  std::string rope_type = e["rope_type"].get<std::string>();
  EXPECT_EQ(c.rope_scaling.type.empty() ? "default" : c.rope_scaling.type, rope_type);
  if (rope_type == "llama3") {
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, e["rope_factor"].get<double>());
    EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, e["low_freq_factor"].get<double>());
    EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, e["high_freq_factor"].get<double>());
    EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, e["original_max_position_embeddings"].get<int>());
  }
  EXPECT_EQ(c.max_position_embeddings, e["max_position_embeddings"].get<int>());
  EXPECT_EQ(c.tie_word_embeddings, e["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.eos_token_ids, e["eos_token_ids"].get<std::vector<int>>());
  EXPECT_EQ(c.bos_token_id, e["bos_token_id"].get<int>());
  EXPECT_EQ(c.torch_dtype, e["dtype"] == "bfloat16" ? DType::kBF16 : e["dtype"] == "float16" ? DType::kF16 : DType::kF32);
  if (e.contains("sliding_window"))  // mistral and mixtral: null is none (0 here)
    EXPECT_EQ(c.sliding_window, e["sliding_window"].is_null() ? 0 : e["sliding_window"].get<int>());
  // Architecture facts transformers encodes in its modeling code rather than the config.
  EXPECT_EQ(c.qk_norm, c.arch == Arch::kQwen3);
  if (c.arch == Arch::kQwen2) EXPECT_TRUE(c.attention_bias);
}

json reference() {
  auto text = read_file(kData + "config_expected.json");
  EXPECT_TRUE(text.is_ok());
  return json::parse(*text);
}

}  // namespace

TEST(ModelConfig, TransformersWrittenConfigsMatchTransformers) {
  json ref = reference();
  for (const char* name : {"config_llama.json", "config_qwen2.json"}) {
    SCOPED_TRACE(name);
    auto text = read_file(kData + name);
    ASSERT_TRUE(text.is_ok());
    auto c = parse_model_config(*text, name);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    expect_matches_reference(*c, ref[name]);
    EXPECT_FALSE(c->quant.default_spec.quantized());
  }
}

// Mistral as the Hub writes it (v0.3, Nemo's explicit head_dim, v0.1's window, and one leaving
// sliding_window and num_key_value_heads to MistralConfig's defaults), against what transformers'
// MistralConfig makes of the same files (scripts/make_format_fixtures.py configs).
TEST(ModelConfig, MistralConfigsMatchTransformers) {
  json ref = reference();
  for (const char* name : {"config_mistral.json", "config_mistral_nemo.json", "config_mistral_v01.json",
                           "config_mistral_defaults.json"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(ref.contains(name)) << "config_expected.json has no " << name;
    auto text = read_file(kData + name);
    ASSERT_TRUE(text.is_ok());
    auto c = parse_model_config(*text, name);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->arch, Arch::kMistral);
    expect_matches_reference(*c, ref[name]);
    EXPECT_FALSE(c->attention_bias);
    EXPECT_FALSE(c->qk_norm || c->qk_norm_full);
    EXPECT_FALSE(c->is_moe());
  }
}

// Identified by architectures alone as well; printed as "mistral"; a bad sliding_window is named.
TEST(ModelConfig, MistralByClassNameAndBadSlidingWindow) {
  json j = base_config();
  j.erase("model_type");
  j["architectures"] = {"MistralForCausalLM"};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->arch, Arch::kMistral);
  EXPECT_EQ(c->model_type, "mistral");
  EXPECT_STREQ(arch_name(c->arch), "mistral");
  EXPECT_EQ(c->sliding_window, 4096);  // absent: MistralConfig's default
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse(j)->sliding_window, 0);
  j["sliding_window"] = 128;
  EXPECT_EQ(parse(j)->sliding_window, 128);
  for (json bad : {json(0), json(-4096), json(4096.5), json("4096"), json(true), json(int64_t(1) << 40)}) {
    j["sliding_window"] = bad;
    expect_error(j, {"'sliding_window'", "a positive integer", "or null", bad.dump()});
  }
  // A config that gives no num_key_value_heads gets MistralConfig's 8, which must divide the heads.
  j = base_config();
  j["model_type"] = "mistral";
  j.erase("num_key_value_heads");
  j["num_attention_heads"] = 12;
  j["hidden_size"] = 768;
  expect_error(j, {"'num_key_value_heads'", "got 8 (the default when absent)"});
  // Qwen and Llama have no sliding_window of their own: it is read (and capped) only where the model has one.
  j = base_config();
  j["sliding_window"] = 4096;
  EXPECT_EQ(parse(j)->sliding_window, 0);
  j["model_type"] = "llama";
  EXPECT_EQ(parse(j)->sliding_window, 0);
}

// Phi-3 / Phi-4 as the Hub writes them (Phi-3-mini-4k's window of 2047 over 32 heads of 96, Phi-4's 40
// heads over 10 kv heads and no window), one leaving Phi3Config's defaults out (kv heads = heads,
// rms_norm_eps 1e-5, max_position_embeddings 4096, no window), and one as transformers 5 writes it
// (rope_parameters holding partial_rotary_factor 1.0), against what transformers' Phi3Config makes of
// the same files (scripts/make_format_fixtures.py configs).
TEST(ModelConfig, Phi3ConfigsMatchTransformers) {
  json ref = reference();
  for (const char* name : {"config_phi3_mini_4k.json", "config_phi4.json", "config_phi3_defaults.json",
                           "config_phi3_v5.json"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(ref.contains(name)) << "config_expected.json has no " << name;
    auto text = read_file(kData + name);
    ASSERT_TRUE(text.is_ok());
    auto c = parse_model_config(*text, name);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->arch, Arch::kPhi3);
    ASSERT_TRUE(ref[name].contains("sliding_window"));
    expect_matches_reference(*c, ref[name]);
    EXPECT_FALSE(c->attention_bias);
    EXPECT_FALSE(c->qk_norm || c->qk_norm_full);
    EXPECT_FALSE(c->is_moe());
  }
}

// Identified by architectures alone as well, printed as "phi3". LongRoPE (Phi-3-mini-128k,
// Phi-3.5-mini; the older configs' "su", and "yarn", which Phi3Config reads as longrope, not as other
// families' YaRN) is read as transformers reads it: the factors, the original context, the attention
// factor (Phi-3.5-mini's is 1.1902380714238083, the constant its own modeling code computes), and the
// inverse frequencies the engine rotates with (rope.h). What Phi-3 checkpoints ask for that the engine
// lacks is refused by name: a factor list of the wrong length or with a non-positive factor, any
// other scaling (Phi3Config takes none), and Phi-4-mini's partial_rotary_factor, top level or inside
// transformers 5's rope_parameters.
TEST(ModelConfig, Phi3ByClassNameLongRopeAndWhatIsRefused) {
  json j = base_config();
  j.erase("model_type");
  j["architectures"] = {"Phi3ForCausalLM"};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->arch, Arch::kPhi3);
  EXPECT_EQ(c->model_type, "phi3");
  EXPECT_STREQ(arch_name(c->arch), "phi3");
  EXPECT_EQ(c->sliding_window, 0);  // absent: Phi3Config's None
  j["sliding_window"] = 2047;
  EXPECT_EQ(parse(j)->sliding_window, 2047);
  j["sliding_window"] = "2047";
  expect_error(j, {"'sliding_window'", "a positive integer", "or null"});

  // Phi-3.5-mini-instruct: LongRoPE over a 131072 context from an original 4096 (head_dim 32 here: 16 factors).
  json phi35 = base_config();
  phi35["model_type"] = "phi3";
  phi35["max_position_embeddings"] = 131072;
  phi35["original_max_position_embeddings"] = 4096;
  phi35["sliding_window"] = 262144;
  std::vector<double> shortf(16), longf(16);
  for (int i = 0; i < 16; ++i) shortf[size_t(i)] = 1.0 + 0.01 * i, longf[size_t(i)] = 1.0 + 3.0 * i;
  phi35["rope_scaling"] = {{"type", "longrope"}, {"long_factor", longf}, {"short_factor", shortf}};
  for (const char* type : {"longrope", "su", "yarn"}) {
    SCOPED_TRACE(type);
    phi35["rope_scaling"]["type"] = type;
    auto p = parse(phi35);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_EQ(p->rope_scaling.type, "longrope");
    EXPECT_EQ(p->rope_scaling.short_factor, shortf);
    EXPECT_EQ(p->rope_scaling.long_factor, longf);
    EXPECT_EQ(p->rope_scaling.original_max_position_embeddings, 4096);
    EXPECT_DOUBLE_EQ(p->rope_scaling.factor, 32.0);
    EXPECT_NEAR(rope_attention_factor(*p), 1.1902380714238083, 1e-12);
    EXPECT_NEAR(attention_softmax_scale(*p), 1.1902380714238083 * 1.1902380714238083 / std::sqrt(32.0), 1e-6);
    ModelConfig cfg = *p;
    for (bool long_factors : {false, true}) {
      cfg.rope_scaling.longrope_long = long_factors;
      const std::vector<float> inv = rope_inv_freq(cfg);
      ASSERT_EQ(inv.size(), 16u);
      for (int i : {0, 5, 15}) {
        const double ext = long_factors ? longf[size_t(i)] : shortf[size_t(i)];
        EXPECT_NEAR(inv[size_t(i)], 1.0 / (ext * std::pow(10000.0, 2.0 * i / 32)), 1e-6 * inv[size_t(i)]) << i;
      }
    }
  }
  phi35["rope_scaling"]["type"] = "longrope";
  phi35["rope_scaling"]["attention_factor"] = 1.25;  // given: used as it is
  EXPECT_DOUBLE_EQ(rope_attention_factor(*parse(phi35)), 1.25);
  phi35["rope_scaling"].erase("attention_factor");
  // transformers 5 keeps the original context in rope_parameters; Phi3Config's default is 4096.
  {
    json v5 = phi35;
    v5.erase("original_max_position_embeddings");
    v5["rope_scaling"]["original_max_position_embeddings"] = 8192;
    EXPECT_EQ(parse(v5)->rope_scaling.original_max_position_embeddings, 8192);
    v5["rope_scaling"].erase("original_max_position_embeddings");
    EXPECT_EQ(parse(v5)->rope_scaling.original_max_position_embeddings, 4096);
  }
  // Another family: without an original context, the factor is rope_scaling's and the original
  // context max_position_embeddings, as transformers reads it.
  {
    json llama = phi35;
    llama["model_type"] = "llama";
    llama.erase("original_max_position_embeddings");
    expect_error(llama, {"'rope_scaling.factor'", "missing"});
    llama["rope_scaling"]["factor"] = 4.0;
    auto p = parse(llama);
    ASSERT_TRUE(p.is_ok()) << p.status().message();
    EXPECT_EQ(p->rope_scaling.original_max_position_embeddings, 131072);
    EXPECT_NEAR(rope_attention_factor(*p), std::sqrt(1.0 + std::log(4.0) / std::log(131072.0)), 1e-12);
  }
  {
    json bad = phi35;
    bad["rope_scaling"]["long_factor"] = std::vector<double>(15, 1.0);
    expect_error(bad, {"'rope_scaling.long_factor'", "a list of 16 positive numbers", "head_dim / 2)", "a list of 15"});
    bad["rope_scaling"]["long_factor"] = longf;
    bad["rope_scaling"]["short_factor"][3] = 0.0;
    expect_error(bad, {"'rope_scaling.short_factor'", "got 0.0 in it"});
    bad["rope_scaling"]["short_factor"] = "1.0";
    expect_error(bad, {"'rope_scaling.short_factor'", "\"1.0\""});
    bad["rope_scaling"].erase("short_factor");
    expect_error(bad, {"'rope_scaling.short_factor'", "missing"});
  }
  phi35["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};  // Qwen3's YaRN: a Phi-3's is LongRoPE's
  expect_error(phi35, {"'rope_scaling.short_factor'", "missing"});
  phi35["model_type"] = "qwen3";
  EXPECT_TRUE(parse(phi35).is_ok()) << parse(phi35).status().message();
  phi35["model_type"] = "phi3";
  phi35["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  expect_error(phi35, {"'rope_scaling.type'", "'linear'", "Phi3Config takes only 'default' and 'longrope'"},
               StatusCode::kUnsupported);
  phi35["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_TRUE(parse(phi35).is_ok()) << parse(phi35).status().message();

  // Phi-4-mini: RoPE over 0.75 of each head (head_dim 32 here: 24 rotary dims), top level or in
  // transformers 5's rope_parameters; LongRoPE then has one factor per rotary pair. Another family's
  // partial_rotary_factor is refused by name, and so is a factor giving an odd number of dims.
  json phi4mini = base_config();
  phi4mini["model_type"] = "phi3";
  phi4mini["partial_rotary_factor"] = 0.75;
  auto pm = parse(phi4mini);
  ASSERT_TRUE(pm.is_ok()) << pm.status().message();
  EXPECT_EQ(pm->rotary_dim, 24);
  EXPECT_EQ(rotary_dims(*pm), 24);
  {
    const std::vector<float> inv = rope_inv_freq(*pm);
    ASSERT_EQ(inv.size(), 16u);
    EXPECT_NEAR(inv[1], std::pow(10000.0, -2.0 / 24), 1e-7);  // theta^(-2i/R), R the rotary dims
    EXPECT_EQ(inv[12], 0.0f);                                   // past R/2: not turned
    EXPECT_EQ(rope_scale_in_rotation(*pm), 1.0f);
  }
  phi4mini["max_position_embeddings"] = 131072;
  phi4mini["original_max_position_embeddings"] = 4096;
  phi4mini["rope_scaling"] = {{"type", "longrope"},
                              {"long_factor", std::vector<double>(12, 2.0)},
                              {"short_factor", std::vector<double>(12, 1.0)}};
  pm = parse(phi4mini);
  ASSERT_TRUE(pm.is_ok()) << pm.status().message();
  // With part of each head turned, the attention factor is the rotation's, not the softmax scale's.
  EXPECT_NEAR(rope_scale_in_rotation(*pm), 1.1902380714238083, 1e-6);
  EXPECT_NEAR(attention_softmax_scale(*pm), 1.0 / std::sqrt(32.0), 1e-7);
  phi4mini["rope_scaling"]["long_factor"] = std::vector<double>(16, 2.0);  // head_dim / 2: the whole head's count
  expect_error(phi4mini, {"'rope_scaling.long_factor'", "a list of 12 positive numbers", "the rotary dims / 2"});
  phi4mini.erase("rope_scaling");
  phi4mini.erase("partial_rotary_factor");
  phi4mini["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.75}};
  EXPECT_EQ(parse(phi4mini)->rotary_dim, 24);
  phi4mini["rope_parameters"]["partial_rotary_factor"] = 0.7;  // 22.4 -> 22 dims: even, as transformers truncates
  EXPECT_EQ(parse(phi4mini)->rotary_dim, 22);
  phi4mini["rope_parameters"]["partial_rotary_factor"] = 0.72;  // 23 dims
  expect_error(phi4mini, {"'rope_parameters.partial_rotary_factor'", "23 rotary dims", "even"});
  phi4mini["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(parse(phi4mini)->rotary_dim, 0);
  phi4mini["rope_parameters"].erase("rope_type");  // no type: rope_theta and partial_rotary_factor are no scaling
  EXPECT_TRUE(parse(phi4mini).is_ok()) << parse(phi4mini).status().message();
  json qwen = base_config();
  qwen["partial_rotary_factor"] = 0.5;
  expect_error(qwen, {"'partial_rotary_factor'", "0.5", "phi3 models"}, StatusCode::kUnsupported);
}

TEST(ModelConfig, SharedTinyModelsMatchTransformers) {
  if (!std::filesystem::exists(kShared + "anvil-tiny-code")) GTEST_SKIP() << kShared << " not present";
  json ref = reference();
  for (const char* name : {"anvil-tiny-code", "anvil-tiny-code-q4"}) {
    SCOPED_TRACE(name);
    auto c = load_model_config(kShared + name);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    expect_matches_reference(*c, ref[name]);
    EXPECT_EQ(c->arch, Arch::kQwen3);
    EXPECT_FALSE(c->attention_bias);
  }
  auto dense = load_model_config(kShared + "anvil-tiny-code");
  auto q4 = load_model_config(kShared + "anvil-tiny-code-q4");
  ASSERT_TRUE(dense.is_ok() && q4.is_ok());
  EXPECT_FALSE(dense->quant.for_module("model.embed_tokens").quantized());
  EXPECT_EQ(q4->quant.default_spec.bits, 4);
  EXPECT_EQ(q4->quant.default_spec.group_size, 64);
  EXPECT_EQ(q4->quant.for_module("model.layers.3.mlp.down_proj").bits, 4);
}

TEST(ModelConfig, LegacyLlama3RopeScalingSpellings) {
  for (const char* type_key : {"rope_type", "type"}) {
    json j = base_config();
    j["model_type"] = "llama";
    j["rope_theta"] = 500000.0;
    j["rope_scaling"] = {{type_key, "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    auto c = parse(j);
    ASSERT_TRUE(c.is_ok()) << c.status().message();
    EXPECT_EQ(c->arch, Arch::kLlama);
    EXPECT_EQ(c->rope_scaling.type, "llama3");
    EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
    EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
    EXPECT_FALSE(c->qk_norm);
    EXPECT_FALSE(c->attention_bias);
  }
  json j = base_config();
  j["model_type"] = "llama";
  j["attention_bias"] = true;
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};  // read (Phi3ByClassName...): its factors are missing
  expect_error(j, {"rope_scaling.short_factor", "missing"});
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 4.0}};
  expect_error(j, {"rope_scaling.rope_type", "dynamic"}, StatusCode::kUnsupported);
  j.erase("rope_scaling");
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok());
  EXPECT_TRUE(c->attention_bias);
}

// YaRN as Qwen3's model cards have users add it to config.json ({"rope_type": "yarn", "factor": 4.0,
// "original_max_position_embeddings": 32768}; the legacy "type" key and transformers 5's rope_parameters
// too): the factor is required, the other parameters take transformers' defaults (beta_fast 32,
// beta_slow 1, the original context = max_position_embeddings, truncate, derived attention factor).
TEST(ModelConfig, YarnRopeScaling) {
  json j = base_config();
  j["max_position_embeddings"] = 40960;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_EQ(c->max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c->rope_scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.beta_slow, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor, 0.0);
  EXPECT_TRUE(c->rope_scaling.truncate);

  j["rope_scaling"] = {{"type", "yarn"}, {"factor", 2.0}, {"beta_fast", 16}, {"beta_slow", 2.0},
                       {"attention_factor", 1.5}, {"mscale", 0.707}, {"mscale_all_dim", 0.707}, {"truncate", false}};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 40960);  // max_position_embeddings
  EXPECT_DOUBLE_EQ(c->rope_scaling.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.beta_slow, 2.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.attention_factor, 1.5);
  EXPECT_DOUBLE_EQ(c->rope_scaling.mscale, 0.707);
  EXPECT_DOUBLE_EQ(c->rope_scaling.mscale_all_dim, 0.707);
  EXPECT_FALSE(c->rope_scaling.truncate);

  // transformers 5: rope_parameters holds rope_theta and the scaling.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4.0},
                          {"original_max_position_embeddings", 32768}};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->rope_scaling.type, "yarn");
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 32768);

  j = base_config();
  j["max_position_embeddings"] = 40960;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"original_max_position_embeddings", 32768}};
  expect_error(j, {"rope_scaling.factor", "missing"});
  j["rope_scaling"]["factor"] = 0;
  expect_error(j, {"rope_scaling.factor", "positive"});
  j["rope_scaling"]["factor"] = 4.0;
  j["rope_scaling"]["beta_fast"] = "32";
  expect_error(j, {"rope_scaling.beta_fast"});
  j["rope_scaling"].erase("beta_fast");
  j["rope_scaling"]["truncate"] = 1;
  expect_error(j, {"rope_scaling.truncate"});
  // Neither the original context nor max_position_embeddings: nothing to scale from.
  j = base_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error(j, {"rope_scaling.original_max_position_embeddings", "missing"});
}

TEST(ModelConfig, DefaultsForOptionalFields) {
  json j = base_config();
  j.erase("num_key_value_heads");
  j.erase("torch_dtype");
  j["dtype"] = "float16";
  j["eos_token_id"] = {3, 4, 3};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->torch_dtype, DType::kF16);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{3, 4}));
  EXPECT_EQ(c->bos_token_id, -1);

  // Only model_type may be missing when architectures names a known class.
  j = base_config();
  j.erase("model_type");
  j["architectures"] = {"Qwen2ForCausalLM"};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->arch, Arch::kQwen2);
  EXPECT_TRUE(c->attention_bias);
}

// Fields that change what the model computes, which this engine does not implement, are refused by
// name, never run as another model: another activation, partial rotary embeddings, MLP biases,
// sliding layers (by layer_types, or max_window_layers with transformers' default of 28), a rope
// scaling without its type or its parameters, and a multimodal wrapper's text_config.
TEST(ModelConfigBad, MathChangingFieldsThisEngineLacksAreRefused) {
  auto refused = [](json j, const std::string& field) {
    auto r = parse(j);
    ASSERT_FALSE(r.is_ok()) << j.dump();
    EXPECT_TRUE(contains(r.status().message(), "'" + field)) << r.status().message();
  };
  json j = base_config();
  j["hidden_act"] = "gelu";
  refused(j, "hidden_act");
  j["hidden_act"] = "silu";
  EXPECT_TRUE(parse(j).is_ok());
  j["hidden_act"] = "swish";
  EXPECT_TRUE(parse(j).is_ok());
  j = base_config();
  j["partial_rotary_factor"] = 0.5;
  refused(j, "partial_rotary_factor");
  j["partial_rotary_factor"] = 1.0;
  EXPECT_TRUE(parse(j).is_ok());
  j = base_config();
  j["model_type"] = "llama";
  j["mlp_bias"] = true;
  refused(j, "mlp_bias");
  j["mlp_bias"] = false;
  EXPECT_TRUE(parse(j).is_ok());
  j = base_config();
  j["use_sliding_window"] = true;
  j["layer_types"] = {"full_attention", "sliding_attention"};
  refused(j, "use_sliding_window");
  j["use_sliding_window"] = false;  // transformers then has no window: every layer is full
  EXPECT_TRUE(parse(j).is_ok());
  j = base_config();
  j["num_hidden_layers"] = 30;
  j["use_sliding_window"] = true;  // no max_window_layers: 28, so layers 28 and 29 slide
  refused(j, "use_sliding_window");
  j["num_hidden_layers"] = 28;
  EXPECT_TRUE(parse(j).is_ok());
  j = base_config();
  j["rope_scaling"] = {{"factor", 8.0}};
  refused(j, "rope_scaling.rope_type");
  j["rope_scaling"] = {{"type", "linear"}};
  refused(j, "rope_scaling.factor");
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}};
  refused(j, "rope_scaling.original_max_position_embeddings");
  j = json{{"model_type", "qwen3"}, {"text_config", base_config()}};
  auto w = parse(j);
  ASSERT_FALSE(w.is_ok());
  EXPECT_TRUE(contains(w.status().message(), "text_config")) << w.status().message();
}

// Defaults of fields a config leaves out are those of the architecture's transformers config class.
TEST(ModelConfig, PerArchitectureDefaults) {
  json j = base_config();
  auto q = parse(j);
  ASSERT_TRUE(q.is_ok());
  EXPECT_EQ(q->rope_theta, 10000.0);
  EXPECT_EQ(q->rms_norm_eps, 1e-6);
  j["model_type"] = "mixtral";
  j["num_local_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  auto m = parse(j);
  ASSERT_TRUE(m.is_ok()) << m.status().message();
  EXPECT_EQ(m->rope_theta, 1e6);
  EXPECT_EQ(m->rms_norm_eps, 1e-5);
  j["model_type"] = "olmoe";
  j.erase("num_local_experts");
  j["num_experts"] = 4;
  auto o = parse(j);
  ASSERT_TRUE(o.is_ok()) << o.status().message();
  EXPECT_EQ(o->rope_theta, 10000.0);
  EXPECT_EQ(o->rms_norm_eps, 1e-5);
  j = base_config();
  j["model_type"] = "phi3";
  j.erase("num_key_value_heads");
  auto p = parse(j);
  ASSERT_TRUE(p.is_ok()) << p.status().message();
  EXPECT_EQ(p->rope_theta, 10000.0);
  EXPECT_EQ(p->rms_norm_eps, 1e-5);
  EXPECT_EQ(p->max_position_embeddings, 4096);
  EXPECT_EQ(p->num_key_value_heads, p->num_attention_heads);
}

TEST(ModelConfigBad, MalformedJson) {
  auto r = parse_model_config("{\"model_type\": \"qwen3\",", "/models/x/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), "/models/x/config.json: not valid JSON")) << r.status().message();
  r = parse_model_config("[1, 2]", "/models/x/config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_TRUE(contains(r.status().message(), "/models/x/config.json")) << r.status().message();
}

TEST(ModelConfigBad, MissingRequiredFields) {
  for (const char* field :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    SCOPED_TRACE(field);
    json j = base_config();
    j.erase(field);
    expect_error(j, {std::string("field '") + field + "'", "missing"});
    j[field] = nullptr;  // null counts as missing
    expect_error(j, {std::string("field '") + field + "'", "missing"});
  }
  json j = base_config();
  j.erase("model_type");
  expect_error(j, {"field 'model_type'", "missing"});
}

TEST(ModelConfigBad, WrongTypes) {
  json j = base_config();
  j["hidden_size"] = "256";
  expect_error(j, {"field 'hidden_size': expected a positive integer, got \"256\""});
  j = base_config();
  j["hidden_size"] = 256.5;
  expect_error(j, {"field 'hidden_size': expected a positive integer"});
  j = base_config();
  j["num_hidden_layers"] = 0;
  expect_error(j, {"field 'num_hidden_layers': expected a positive integer, got 0"});
  j = base_config();
  j["vocab_size"] = 1ll << 40;
  expect_error(j, {"field 'vocab_size'"});
  j = base_config();
  j["tie_word_embeddings"] = "yes";
  expect_error(j, {"field 'tie_word_embeddings': expected true or false"});
  j = base_config();
  j["rms_norm_eps"] = "1e-6";
  expect_error(j, {"field 'rms_norm_eps': expected a positive number"});
  j = base_config();
  j["eos_token_id"] = {1, "two"};
  expect_error(j, {"field 'eos_token_id'"});
  j = base_config();
  j["torch_dtype"] = "int4";
  expect_error(j, {"field 'torch_dtype'", "int4"});
  j = base_config();
  j["model_type"] = 3;
  expect_error(j, {"field 'model_type': expected a string"});
}

TEST(ModelConfigBad, HeadsNotDivisible) {
  json j = base_config();
  j["num_key_value_heads"] = 3;
  expect_error(j, {"field 'num_key_value_heads'", "divide"});
  j = base_config();
  j["hidden_size"] = 250;  // no head_dim and 250 % 8 != 0
  expect_error(j, {"field 'head_dim'"});
  j["head_dim"] = 32;  // explicit head_dim need not equal hidden / heads
  EXPECT_TRUE(parse(j).is_ok());
}

TEST(ModelConfigBad, UnsupportedArchitecture) {
  json j = base_config();
  j["model_type"] = "mamba";
  expect_error(j, {"'mamba'", "supported: qwen3, qwen2, llama"}, StatusCode::kUnsupported);
  j.erase("model_type");
  j["architectures"] = {"MambaForCausalLM"};
  expect_error(j, {"'MambaForCausalLM'", "qwen3, qwen2, llama"}, StatusCode::kUnsupported);
}

TEST(ModelConfigQuant, DefaultAndPerModuleOverrides) {
  json j = base_config();
  j["quantization"] = {{"group_size", 64},
                       {"bits", 4},
                       {"mode", "affine"},
                       {"model.layers.0.mlp.gate_proj", {{"group_size", 32}, {"bits", 8}}},
                       {"model.embed_tokens", {{"bits", 6}}},
                       {"lm_head", false}};
  auto c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  const QuantConfig& q = c->quant;
  EXPECT_EQ(q.default_spec.bits, 4);
  EXPECT_EQ(q.default_spec.group_size, 64);
  EXPECT_EQ(q.for_module("model.layers.0.mlp.gate_proj").bits, 8);
  EXPECT_EQ(q.for_module("model.layers.0.mlp.gate_proj").group_size, 32);
  EXPECT_EQ(q.for_module("model.embed_tokens").bits, 6);
  EXPECT_EQ(q.for_module("model.embed_tokens").group_size, 64);  // inherits the default group
  EXPECT_FALSE(q.for_module("lm_head").quantized());
  EXPECT_EQ(q.for_module("model.layers.1.mlp.gate_proj").bits, 4);

  j.erase("quantization");
  j["quantization_config"] = {{"group_size", 128}, {"bits", 2}};
  c = parse(j);
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->quant.for_module("x").bits, 2);
  EXPECT_EQ(c->quant.for_module("x").group_size, 128);
}

TEST(ModelConfigQuant, BadBitsAndGroups) {
  json j = base_config();
  j["quantization"] = {{"group_size", 64}, {"bits", 7}};
  expect_error(j, {"field 'quantization.bits'", "7"});
  j["quantization"] = {{"group_size", 48}, {"bits", 4}};
  expect_error(j, {"field 'quantization.group_size'", "48"});
  j["quantization"] = {{"bits", 4}};
  expect_error(j, {"field 'quantization.group_size'", "missing"});
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"model.layers.0.mlp.up_proj", {{"bits", 9}}}};
  expect_error(j, {"field 'quantization.model.layers.0.mlp.up_proj.bits'"});
  j["quantization"] = {{"group_size", 64}, {"bits", 4}, {"lm_head", 8}};
  expect_error(j, {"field 'quantization.lm_head'"});
  j["quantization"] = {{"group_size", 32}, {"bits", 4}, {"mode", "mxfp4"}};
  expect_error(j, {"field 'quantization.mode'", "mxfp4"}, StatusCode::kUnsupported);
  j.erase("quantization");
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}};
  expect_error(j, {"quantization_config.quant_method", "gptq"}, StatusCode::kUnsupported);
}

TEST(ModelConfigLoad, MergesGenerationConfigEos) {
  anvil_test::TempDir d;
  json j = base_config();
  j["eos_token_id"] = {1, 2};
  anvil_test::write_text(d.file("config.json"), j.dump());
  anvil_test::write_text(d.file("generation_config.json"), R"({"eos_token_id": [2, 3, 1, 4], "bos_token_id": 0})");
  auto c = load_model_config(d.path());
  ASSERT_TRUE(c.is_ok()) << c.status().message();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 2, 3, 4}));

  anvil_test::write_text(d.file("generation_config.json"), R"({"eos_token_id": 9})");
  c = load_model_config(d.path());
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{1, 2, 9}));

  anvil_test::write_text(d.file("generation_config.json"), R"({"eos_token_id": )");
  c = load_model_config(d.path());
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), d.file("generation_config.json"))) << c.status().message();
}

TEST(ModelConfigLoad, ErrorsArePrefixedWithThePath) {
  anvil_test::TempDir d;
  auto c = load_model_config(d.path());
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), d.file("config.json"))) << c.status().message();
  json j = base_config();
  j.erase("vocab_size");
  anvil_test::write_text(d.file("config.json"), j.dump());
  c = load_model_config(d.path());
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), d.file("config.json") + ": field 'vocab_size'")) << c.status().message();
}

// config.json or generation_config.json that is there but unreadable (a symbolic link to a blob an
// interrupted download never wrote, a directory in its place) is an error naming it and why; a
// dangling generation_config.json was skipped as absent, and the model ran without its stop ids.
// Absent generation_config.json stays fine.
TEST(ModelConfigLoad, UnreadableFilesAreNamedNotTakenForAbsent) {
  anvil_test::TempDir d;
  json j = base_config();
  anvil_test::write_text(d.file("config.json"), j.dump());
  ASSERT_TRUE(load_model_config(d.path()).is_ok());  // no generation_config.json: fine
  std::filesystem::create_symlink(d.file("blobs/missing"), d.file("generation_config.json"));
  auto c = load_model_config(d.path());
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), d.file("generation_config.json") + ": a symbolic link to '" +
                                                 d.file("blobs/missing") + "', which does not exist"))
      << c.status().message();
  std::filesystem::remove(d.file("generation_config.json"));
  std::filesystem::create_directory(d.file("generation_config.json"));
  c = load_model_config(d.path());
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), d.file("generation_config.json") + ": a directory, not a file"))
      << c.status().message();
  std::filesystem::remove(d.file("generation_config.json"));
  std::filesystem::remove(d.file("config.json"));
  std::filesystem::create_symlink(d.file("blobs/config"), d.file("config.json"));
  c = load_model_config(d.path());
  ASSERT_FALSE(c.is_ok());
  EXPECT_TRUE(contains(c.status().message(), d.file("config.json") + ": a symbolic link to")) << c.status().message();
}
