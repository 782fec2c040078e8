// Phi-3's fused projections: self_attn.qkv_proj (q, k, v stacked along the output rows, in that order)
// and mlp.gate_up_proj (gate, then up) bind to row views of themselves that are the q/k/v and gate/up
// matrices a checkpoint with separate modules gives, dense or MLX-quantized (the packed rows with
// their scales and biases), so the forward pass is bit-identical to that of the same weights stored
// apart; a fused tensor of the wrong shape is named with what it holds. The golden tests (phi3-bf16,
// phi3-q4) check the model against mlx-lm.
#include <gtest/gtest.h>

#include <cstring>
#include <list>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "format/model_config.h"
#include "model/synth.h"
#include "model/transformer.h"
#include "model/weights.h"
#include "weights_logits.h"

using namespace anvil;

namespace {

std::unique_ptr<SynthModel> tiny(const std::string& quant) {
  auto shape = synth_shape("tiny");
  auto q = parse_synth_quant(quant);
  auto m = synth_build(*shape, *q, 5);
  EXPECT_TRUE(m.is_ok());
  return std::move(*m);
}

// The synthetic model's config.json as `model_type` (the tiny shape: head_dim == hidden / heads).
ModelConfig config_as(const SynthModel& m, const std::string& model_type) {
  auto j = nlohmann::json::parse(m.config_json);
  j["model_type"] = model_type;
  j.erase("architectures");
  j.erase("head_dim");
  auto c = parse_model_config(j.dump(), model_type);
  EXPECT_TRUE(c.is_ok()) << c.status().message();
  return c.is_ok() ? *c : ModelConfig{};
}

// A model's tensors by name, some of them in buffers of its own.
struct Tensors {
  std::map<std::string, TensorView> views;
  std::list<std::vector<uint8_t>> buffers;

  // The synthetic model's tensors, each quantized module's scales and biases made different in every
  // row and group (the synthetic ones are one value throughout, which would hide a view of the wrong
  // rows' groups).
  explicit Tensors(const SynthModel& m) {
    size_t k = 0;  // the tensor's index: another pattern in each
    for (const TensorView& t : m.tensors) {
      ++k;
      views[t.name] = t;
      const bool groups = t.name.ends_with(".scales") || t.name.ends_with(".biases");
      if (!groups || t.dtype != DType::kBF16) continue;
      std::vector<uint8_t>& b = buffers.emplace_back(t.data, t.data + t.nbytes);
      auto* v = reinterpret_cast<uint16_t*>(b.data());
      for (size_t i = 0; i < b.size() / 2; ++i) v[i] = uint16_t(v[i] + (i * 7 + k * 13) % 31);  // mantissa bits only
      views[t.name].data = b.data();
    }
  }
  TensorLookup lookup() const {
    return [this](const std::string& n) -> const TensorView* {
      auto it = views.find(n);
      return it == views.end() ? nullptr : &it->second;
    };
  }
};

// The same tensors with each layer's q/k/v and gate/up modules concatenated along the rows, as Phi-3
// checkpoints store them (row-major: concatenating the rows is concatenating the bytes, of the packed
// weights and of the scales and biases alike).
struct Fused : Tensors {
  Fused(const SynthModel& m, int layers) : Tensors(m) {
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      fuse(p + "self_attn.", {"q_proj", "k_proj", "v_proj"}, "qkv_proj");
      fuse(p + "mlp.", {"gate_proj", "up_proj"}, "gate_up_proj");
    }
  }
  void fuse(const std::string& prefix, const std::vector<std::string>& parts, const std::string& name) {
    for (const char* suffix : {".weight", ".scales", ".biases"}) {
      if (!views.count(prefix + parts[0] + suffix)) continue;
      TensorView f = views[prefix + parts[0] + suffix];
      std::vector<uint8_t> bytes;
      f.shape[0] = 0;
      for (const std::string& part : parts) {
        const TensorView t = views[prefix + part + suffix];
        bytes.insert(bytes.end(), t.data, t.data + t.nbytes);
        f.shape[0] += t.shape[0];
        views.erase(prefix + part + suffix);
      }
      const std::vector<uint8_t>& b = buffers.emplace_back(std::move(bytes));
      f.name = prefix + name + suffix;
      f.data = b.data();
      f.nbytes = b.size();
      views[f.name] = f;
    }
  }
};

TEST(FusedWeights, Phi3QkvAndGateUpSplitIntoTheSeparateMatrices) {
  // q4g64 and q3g32: several groups per row, and 3-bit rows of 12 words; bf16: dense rows.
  for (const char* quant : {"bf16", "q4g64", "q3g32"}) {
    SCOPED_TRACE(quant);
    auto m = tiny(quant);
    // Llama computes what Phi-3 does, from separate modules (the synthetic model's q/k norms go unused).
    const ModelConfig llama = config_as(*m, "llama"), phi3 = config_as(*m, "phi3");
    ASSERT_EQ(phi3.arch, Arch::kPhi3);
    Tensors apart(*m);
    auto split = bind_weights(llama, apart.lookup(), "split");
    ASSERT_TRUE(split.is_ok()) << split.status().message();
    Fused f(*m, phi3.num_hidden_layers);
    auto fused = bind_weights(phi3, f.lookup(), "fused");
    ASSERT_TRUE(fused.is_ok()) << fused.status().message();
    for (int l = 0; l < phi3.num_hidden_layers; ++l) {
      const LayerWeights& a = split->layers[size_t(l)];
      const LayerWeights& b = fused->layers[size_t(l)];
      const std::string p = "model.layers." + std::to_string(l) + ".";
      // Views into the fused tensors, at the rows where each part starts.
      const TensorView& qkv = f.views.at(p + "self_attn.qkv_proj.weight");
      const TensorView& gate_up = f.views.at(p + "mlp.gate_up_proj.weight");
      const size_t row = qkv.nbytes / size_t(qkv.shape[0]);
      EXPECT_EQ(b.q.data, qkv.data);
      EXPECT_EQ(b.k.data, qkv.data + size_t(a.q.rows) * row);
      EXPECT_EQ(b.v.data, qkv.data + size_t(a.q.rows + a.k.rows) * row);
      EXPECT_EQ(b.gate.data, gate_up.data);
      EXPECT_EQ(b.up.data, gate_up.data + gate_up.nbytes / 2);
      if (a.q.quantized()) {  // the groups of the same rows
        const TensorView& qkv_scales = f.views.at(p + "self_attn.qkv_proj.scales");
        const TensorView& gate_up_biases = f.views.at(p + "mlp.gate_up_proj.biases");
        const size_t groups = qkv_scales.nbytes / size_t(qkv_scales.shape[0]);
        EXPECT_EQ(b.k.scales, qkv_scales.data + size_t(a.q.rows) * groups);
        EXPECT_EQ(b.v.scales, qkv_scales.data + size_t(a.q.rows + a.k.rows) * groups);
        EXPECT_EQ(b.up.biases, gate_up_biases.data + gate_up_biases.nbytes / 2);
      }
      using P = std::pair<const WeightMatrix*, const WeightMatrix*>;
      for (auto [x, y] : {P{&a.q, &b.q}, P{&a.k, &b.k}, P{&a.v, &b.v}, P{&a.gate, &b.gate}, P{&a.up, &b.up}}) {
        ASSERT_EQ(x->rows, y->rows);
        ASSERT_EQ(x->cols, y->cols);
        EXPECT_EQ(x->bits, y->bits);
        EXPECT_EQ(x->group_size, y->group_size);
        EXPECT_EQ(std::memcmp(x->data, y->data, x->data_bytes()), 0);
        if (x->quantized()) {
          EXPECT_EQ(std::memcmp(x->scales, y->scales, x->group_bytes()), 0);
          EXPECT_EQ(std::memcmp(x->biases, y->biases, x->group_bytes()), 0);
        }
      }
    }
    EXPECT_EQ(split->parameter_count(), fused->parameter_count());
    EXPECT_EQ(split->bytes_per_token(), fused->bytes_per_token());
    EXPECT_EQ(logits_of(llama, *split), logits_of(phi3, *fused));
  }
}

TEST(FusedWeights, Phi3FusedTensorOfTheWrongShapeIsNamed) {
  auto m = tiny("q4g64");
  ModelConfig phi3 = config_as(*m, "phi3");
  Fused f(*m, phi3.num_hidden_layers);
  // A config with more kv heads than the checkpoint has: qkv_proj is 4 + 2 x 2 heads of 32 rows, not 4 + 2 x 4.
  ModelConfig mha = phi3;
  mha.num_key_value_heads = 4;
  auto r = bind_weights(mha, f.lookup(), "m");
  ASSERT_FALSE(r.is_ok());
  for (const char* says : {"'model.layers.0.self_attn.qkv_proj.weight' has shape [256, 16]", "expected [384, ",
                           "Phi-3's q, k and v projections fused: 4 + 2 x 4 heads of 32 rows"})
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  // A checkpoint with separate modules under a phi3 config: the fused tensor it lacks is named.
  auto r2 = bind_weights(phi3, [&](const std::string& n) { return m->find(n); }, "m");
  ASSERT_FALSE(r2.is_ok());
  EXPECT_EQ(r2.status().code(), StatusCode::kNotFound);
  for (const char* says : {"missing tensor 'model.layers.0.self_attn.qkv_proj.weight'", "q, k and v projections fused"})
    EXPECT_NE(r2.status().message().find(says), std::string::npos) << r2.status().message();
  f.views.erase("model.layers.1.mlp.gate_up_proj.scales");
  auto r3 = bind_weights(phi3, f.lookup(), "m");
  ASSERT_FALSE(r3.is_ok());
  for (const char* says : {"model.layers.1.mlp.gate_up_proj.scales", "gate and up projections fused: 2 x intermediate_size 256"})
    EXPECT_NE(r3.status().message().find(says), std::string::npos) << r3.status().message();
}

}  // namespace
