// Bad checkpoints give a clear error naming the tensor/field and what was expected, never a crash:
// a model directory is built with SafetensorsWriter from the synthetic tiny shape, then broken.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/loader.h"
#include "model/synth.h"

using namespace anvil;
namespace fs = std::filesystem;

namespace {

// Writes the synthetic tiny model (bf16 or q4g64) to a fresh temp dir, letting `edit` change the
// tensor list first.
std::string write_model(const std::string& tag, const std::string& quant,
                        const std::function<void(SynthModel&)>& edit = nullptr) {
  fs::path dir = fs::temp_directory_path() / ("anvil_badckpt_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto shape = synth_shape("tiny");
  auto q = parse_synth_quant(quant);
  auto m = synth_build(*shape, *q, 1);
  EXPECT_TRUE(m.is_ok());
  if (edit) edit(**m);
  Status st = synth_write(**m, dir.string(), "");
  EXPECT_TRUE(st.is_ok()) << st.message();
  return dir.string();
}

std::string load_error(const std::string& dir) {
  auto r = load_model(dir);
  EXPECT_FALSE(r.is_ok());
  return r.is_ok() ? "" : r.status().message();
}

void erase_tensor(SynthModel& m, const std::string& name) {
  for (size_t i = 0; i < m.tensors.size(); ++i)
    if (m.tensors[i].name == name) {
      m.tensors.erase(m.tensors.begin() + i);
      return;
    }
  FAIL() << "no tensor " << name;
}

TensorView* tensor(SynthModel& m, const std::string& name) {
  for (auto& t : m.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace

TEST(BadCheckpoint, ValidModelLoads) {
  for (const char* q : {"bf16", "q4g64", "q8g64", "q3g32"}) {
    auto dir = write_model(std::string("ok_") + q, q);
    auto r = load_model(dir);
    ASSERT_TRUE(r.is_ok()) << q << ": " << r.status().message();
    EXPECT_EQ((*r)->weights.layers.size(), 2u);
    fs::remove_all(dir);
  }
}

TEST(BadCheckpoint, MissingTensorIsNamed) {
  auto dir = write_model("missing", "bf16", [](SynthModel& m) { erase_tensor(m, "model.layers.1.mlp.up_proj.weight"); });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("missing tensor 'model.layers.1.mlp.up_proj.weight'"), std::string::npos) << e;
  EXPECT_NE(e.find("[256, 128]"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, MissingQuantBiasesIsNamed) {
  auto dir = write_model("missing_biases", "q4g64",
                         [](SynthModel& m) { erase_tensor(m, "model.layers.0.self_attn.q_proj.biases"); });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.layers.0.self_attn.q_proj.biases"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, WrongShapeIsNamed) {
  auto dir = write_model("shape", "bf16", [](SynthModel& m) {
    TensorView* t = tensor(m, "model.layers.0.self_attn.k_proj.weight");
    ASSERT_NE(t, nullptr);
    // [64, 128] -> [32, 256]: same bytes, wrong shape.
    t->shape = {32, 256};
  });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [64, 128]"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, WrongDtypeIsNamed) {
  auto dir = write_model("dtype", "bf16", [](SynthModel& m) {
    TensorView* t = tensor(m, "model.norm.weight");
    ASSERT_NE(t, nullptr);
    t->dtype = DType::kI16;  // same size, not a float
  });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.norm.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("I16"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, QuantizationMismatchWithConfig) {
  auto dir = write_model("qmismatch", "q4g64", [](SynthModel& m) {
    // Claim 8-bit in config.json while tensors are 4-bit.
    auto p = m.config_json.find("\"bits\": 4");
    ASSERT_NE(p, std::string::npos);
    m.config_json.replace(p, 9, "\"bits\": 8");
  });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("4-bit"), std::string::npos) << e;
  EXPECT_NE(e.find("8-bit"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, UntiedWithoutLmHead) {
  auto dir = write_model("nolmhead", "bf16", [](SynthModel& m) {
    auto p = m.config_json.find("\"tie_word_embeddings\": true");
    ASSERT_NE(p, std::string::npos);
    m.config_json.replace(p, 27, "\"tie_word_embeddings\": false");
  });
  std::string e = load_error(dir);
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, NoSafetensors) {
  auto dir = write_model("nofiles", "bf16");
  fs::remove(fs::path(dir) / "model.safetensors");
  std::string e = load_error(dir);
  EXPECT_NE(e.find("safetensors"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(BadCheckpoint, TruncatedWeightsFile) {
  auto dir = write_model("trunc", "bf16");
  fs::path f = fs::path(dir) / "model.safetensors";
  fs::resize_file(f, fs::file_size(f) / 2);
  std::string e = load_error(dir);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  fs::remove_all(dir);
}

// The MoE benchmark shapes are written in the MLX layout (stacked switch_mlp experts, the router 8-bit
// through a per-module override) and load back from disk as MoE layers.
TEST(SynthMoe, WritesStackedExpertsThatLoad) {
  fs::path dir = fs::temp_directory_path() / ("anvil_synth_moe_" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto shape = synth_shape("tiny-moe");
  ASSERT_TRUE(shape.is_ok());
  auto q = parse_synth_quant("q4g64");
  auto m = synth_build(*shape, *q, 0);
  ASSERT_TRUE(m.is_ok());
  ASSERT_TRUE(synth_write(**m, dir.string(), "").is_ok());
  auto f = SafetensorsFile::open((dir / "model.safetensors").string());
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  const TensorView* up = (*f)->find("model.layers.1.mlp.switch_mlp.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape, (std::vector<int64_t>{8, 64, 128 * 4 / 32}));
  const TensorView* sc = (*f)->find("model.layers.1.mlp.switch_mlp.down_proj.scales");
  ASSERT_NE(sc, nullptr);
  EXPECT_EQ(sc->shape, (std::vector<int64_t>{8, 128, 64 / 64}));
  const TensorView* router = (*f)->find("model.layers.0.mlp.gate.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(router->shape, (std::vector<int64_t>{8, 128 * 8 / 32}));  // 8-bit
  auto r = load_model(dir.string());
  ASSERT_TRUE(r.is_ok()) << r.status().message();
  EXPECT_EQ((*r)->config.arch, Arch::kQwen3Moe);
  for (const auto& l : (*r)->weights.layers) {
    EXPECT_TRUE(l.moe);
    EXPECT_EQ(l.experts.router.bits, 8);
    EXPECT_EQ(l.experts.gate.size(), 8u);
    EXPECT_EQ(l.experts.up[7].bits, 4);
  }
  fs::remove_all(dir);
}
