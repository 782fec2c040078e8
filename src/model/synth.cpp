#include "model/synth.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/mmap_file.h"

namespace anvil {

const std::vector<SynthShape>& synth_shapes() {
  static const std::vector<SynthShape> shapes = {
      // name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, tied
      {"tiny", 2, 128, 4, 2, 32, 256, 151936, true},
      {"qwen3-0.6b", 28, 1024, 16, 8, 128, 3072, 151936, true},
      {"qwen3-1.7b", 28, 2048, 16, 8, 128, 6144, 151936, true},
      {"qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, false},
      // Few kv heads (4 query heads each, head_dim 128): many attention splits per kv head.
      {"gqa-2kv", 4, 1024, 8, 2, 128, 3072, 151936, true},
      {"tiny-moe", 2, 128, 4, 2, 32, 256, 151936, false, 8, 2, 64},
      {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, false, 128, 8, 768},
      {"qwen3-30b-a3b-16L", 16, 2048, 32, 4, 128, 6144, 151936, false, 128, 8, 768},
  };
  return shapes;
}

Result<SynthShape> synth_shape(const std::string& name) {
  std::string known;
  for (auto& s : synth_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  return invalid_argument("unknown synthetic shape '" + name + "'; known shapes: " + known);
}

std::string SynthQuant::name() const {
  if (bits == 0) return "bf16";
  return std::string("q").append(std::to_string(bits)).append("g").append(std::to_string(group_size));
}

Result<SynthQuant> parse_synth_quant(const std::string& s) {
  SynthQuant q;
  if (s == "bf16") return q;
  int bits = 0, group = 0;
  char tail = 0;
  if (std::sscanf(s.c_str(), "q%dg%d%c", &bits, &group, &tail) == 2 &&
      (bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8) &&
      (group == 32 || group == 64 || group == 128)) {
    q.bits = bits;
    q.group_size = group;
    return q;
  }
  return invalid_argument("bad quantization '" + s +
                          "': expected bf16 or qBgG with B in {2,3,4,5,6,8} and G in {32,64,128} (e.g. q4g64)");
}

std::string synth_config_json(const SynthShape& sh, const SynthQuant& q) {
  nlohmann::ordered_json j;
  j["architectures"] = {sh.moe() ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM"};
  j["model_type"] = sh.moe() ? "qwen3_moe" : "qwen3";
  j["vocab_size"] = sh.vocab;
  j["hidden_size"] = sh.hidden;
  j["intermediate_size"] = sh.ffn;
  j["num_hidden_layers"] = sh.layers;
  j["num_attention_heads"] = sh.heads;
  j["num_key_value_heads"] = sh.kv_heads;
  j["head_dim"] = sh.head_dim;
  j["rms_norm_eps"] = 1e-6;
  j["rope_theta"] = 1000000.0;
  j["max_position_embeddings"] = 40960;
  j["tie_word_embeddings"] = sh.tied;
  j["attention_bias"] = false;
  j["hidden_act"] = "silu";
  j["bos_token_id"] = 151643;
  j["eos_token_id"] = 151645;
  j["torch_dtype"] = "bfloat16";
  if (sh.moe()) {
    j["num_experts"] = sh.experts;
    j["num_experts_per_tok"] = sh.top_k;
    j["moe_intermediate_size"] = sh.moe_ffn;
    j["norm_topk_prob"] = true;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::ordered_json::array();
  }
  if (q.bits) {
    j["quantization"] = {{"group_size", q.group_size}, {"bits", q.bits}};
    // As mlx-community Qwen3-MoE checkpoints: the router (mlp.gate) stays 8-bit through a per-module override.
    if (sh.moe())
      for (int l = 0; l < sh.layers; ++l)
        j["quantization"]["model.layers." + std::to_string(l) + ".mlp.gate"] = {{"group_size", q.group_size},
                                                                                {"bits", 8}};
    j["quantization_config"] = j["quantization"];
  }
  return j.dump(2) + "\n";
}

const TensorView* SynthModel::find(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

size_t SynthModel::total_bytes() const {
  size_t n = 0;
  for (auto& t : tensors) n += t.nbytes;
  return n;
}

namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `n` 64-bit words from a seed, split across threads (deterministic per seed).
void fill_random(uint64_t* out, size_t n, uint64_t seed) {
  const size_t kChunk = size_t(1) << 20;
  size_t chunks = (n + kChunk - 1) / kChunk;
  unsigned nt = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> th;
  for (unsigned t = 0; t < nt; ++t)
    th.emplace_back([=] {
      for (size_t c = t; c < chunks; c += nt) {
        uint64_t s = seed ^ (c * 0xD1B54A32D192ED03ull);
        size_t e = std::min(n, (c + 1) * kChunk);
        for (size_t i = c * kChunk; i < e; ++i) out[i] = splitmix(s);
      }
    });
  for (auto& x : th) x.join();
}

class Builder {
 public:
  Builder(SynthModel& m, uint64_t seed) : m_(m), seed_(seed) {}

  uint8_t* add(const std::string& name, DType dt, std::vector<int64_t> shape) {
    size_t n = dtype_size(dt);
    for (auto d : shape) n *= size_t(d);
    size_t words = (n + 7) / 8;
    std::unique_ptr<uint8_t[]> buf(new uint8_t[words * 8]);
    m_.tensors.push_back(TensorView{name, dt, shape, buf.get(), n, "<synthetic>"});
    uint8_t* p = buf.get();
    m_.buffers.push_back(std::move(buf));
    return p;
  }

  void ones(const std::string& name, int64_t n) {
    auto* p = reinterpret_cast<uint16_t*>(add(name, DType::kBF16, {n}));
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(1.0f);
  }

  // A [rows, cols] linear, or `experts` of them stacked as [experts, rows, cols] when experts > 0.
  void linear(const std::string& module, int64_t rows, int64_t cols, const SynthQuant& q, int64_t experts = 0) {
    const float a = std::sqrt(3.0f / float(cols));
    const uint64_t s = seed_ ^ std::hash<std::string>{}(module);
    auto shape = [&](std::vector<int64_t> d) {
      if (experts > 0) d.insert(d.begin(), experts);
      return d;
    };
    const int64_t E = std::max<int64_t>(experts, 1);
    if (q.bits == 0) {
      auto* p = reinterpret_cast<uint16_t*>(add(module + ".weight", DType::kBF16, shape({rows, cols})));
      size_t n = size_t(E) * rows * cols;
      std::vector<uint64_t> r((n + 3) / 4);
      fill_random(r.data(), r.size(), s);
      const uint16_t* rr = reinterpret_cast<const uint16_t*>(r.data());
      for (size_t i = 0; i < n; ++i) p[i] = f32_to_bf16(a * (float(rr[i]) / 32767.5f - 1.0f));
      return;
    }
    // Random codes; scale and bias map code range [0, 2^bits - 1] onto [-a, a].
    int64_t packed = cols * q.bits / 32;
    auto* w = add(module + ".weight", DType::kU32, shape({rows, packed}));
    fill_random(reinterpret_cast<uint64_t*>(w), (size_t(E) * rows * packed * 4 + 7) / 8, s);
    int64_t groups = cols / q.group_size;
    auto* sc = reinterpret_cast<uint16_t*>(add(module + ".scales", DType::kBF16, shape({rows, groups})));
    auto* bi = reinterpret_cast<uint16_t*>(add(module + ".biases", DType::kBF16, shape({rows, groups})));
    const float maxq = float((1 << q.bits) - 1);
    uint16_t scale = f32_to_bf16(2.0f * a / maxq), bias = f32_to_bf16(-a);
    for (int64_t i = 0; i < E * rows * groups; ++i) {
      sc[i] = scale;
      bi[i] = bias;
    }
  }

 private:
  SynthModel& m_;
  uint64_t seed_;
};

}  // namespace

Status synth_check(const SynthShape& sh, const SynthQuant& q) {
  if (q.bits == 0) return Status::ok();
  // Every quantized matrix's input width must hold whole groups.
  const std::pair<const char*, int64_t> widths[] = {{"hidden size", sh.hidden},
                                                    {"attention width (heads x head dim)", int64_t(sh.heads) * sh.head_dim},
                                                    {"FFN width", sh.ffn},
                                                    {"expert width", sh.moe() ? sh.moe_ffn : sh.hidden}};
  for (const auto& [what, n] : widths)
    if (n % q.group_size != 0)
      return invalid_argument(q.name() + ": a group of " + std::to_string(q.group_size) + " does not divide " + sh.name +
                              "'s " + what + " (" + std::to_string(n) + "); use a smaller group");
  return Status::ok();
}

Result<std::unique_ptr<SynthModel>> synth_build(const SynthShape& sh, const SynthQuant& q, uint64_t seed) {
  ANVIL_RETURN_IF_ERROR(synth_check(sh, q));
  auto m = std::make_unique<SynthModel>();
  m->shape = sh;
  m->quant = q;
  m->config_json = synth_config_json(sh, q);
  Builder b(*m, seed);
  const int64_t QD = int64_t(sh.heads) * sh.head_dim, KD = int64_t(sh.kv_heads) * sh.head_dim;
  b.linear("model.embed_tokens", sh.vocab, sh.hidden, q);
  for (int l = 0; l < sh.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    b.ones(p + "input_layernorm.weight", sh.hidden);
    b.ones(p + "post_attention_layernorm.weight", sh.hidden);
    b.ones(p + "self_attn.q_norm.weight", sh.head_dim);
    b.ones(p + "self_attn.k_norm.weight", sh.head_dim);
    b.linear(p + "self_attn.q_proj", QD, sh.hidden, q);
    b.linear(p + "self_attn.k_proj", KD, sh.hidden, q);
    b.linear(p + "self_attn.v_proj", KD, sh.hidden, q);
    b.linear(p + "self_attn.o_proj", sh.hidden, QD, q);
    if (sh.moe()) {
      SynthQuant rq = q;  // the router: 8-bit when the model is quantized (see synth_config_json)
      if (q.bits) rq.bits = 8;
      b.linear(p + "mlp.gate", sh.experts, sh.hidden, rq);
      b.linear(p + "mlp.switch_mlp.gate_proj", sh.moe_ffn, sh.hidden, q, sh.experts);
      b.linear(p + "mlp.switch_mlp.up_proj", sh.moe_ffn, sh.hidden, q, sh.experts);
      b.linear(p + "mlp.switch_mlp.down_proj", sh.hidden, sh.moe_ffn, q, sh.experts);
    } else {
      b.linear(p + "mlp.gate_proj", sh.ffn, sh.hidden, q);
      b.linear(p + "mlp.up_proj", sh.ffn, sh.hidden, q);
      b.linear(p + "mlp.down_proj", sh.hidden, sh.ffn, q);
    }
  }
  b.ones("model.norm.weight", sh.hidden);
  if (!sh.tied) b.linear("lm_head", sh.vocab, sh.hidden, q);
  return m;
}

Status synth_write_config(const std::string& config_json, const std::string& dir, const std::string& tokenizer_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create directory: " + ec.message());
  ANVIL_RETURN_IF_ERROR(write_file_atomic(dir + "/config.json", config_json.data(), config_json.size()));
  nlohmann::ordered_json gen = {{"bos_token_id", 151643}, {"eos_token_id", {151645, 151643}}};
  std::string gen_text = gen.dump(2) + "\n";
  ANVIL_RETURN_IF_ERROR(write_file_atomic(dir + "/generation_config.json", gen_text.data(), gen_text.size()));
  if (!tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(fs::path(tokenizer_dir) / f, fs::path(dir) / f, fs::copy_options::overwrite_existing, ec);
      if (ec) return io_error(std::string(f) + ": cannot copy from " + tokenizer_dir + ": " + ec.message());
    }
  }
  return Status::ok();
}

Status synth_write(const SynthModel& m, const std::string& dir, const std::string& tokenizer_dir, size_t shard_bytes) {
  ANVIL_RETURN_IF_ERROR(synth_write_config(m.config_json, dir, tokenizer_dir));
  // Group tensors into shards in order.
  std::vector<std::vector<const TensorView*>> shards(1);
  size_t cur = 0;
  for (auto& t : m.tensors) {
    if (cur > 0 && cur + t.nbytes > shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(&t);
    cur += t.nbytes;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    if (shards.size() == 1) std::snprintf(name, sizeof name, "model.safetensors");
    else std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    SafetensorsWriter w;
    w.set_metadata("format", "mlx");
    for (const TensorView* t : shards[i]) {
      ANVIL_RETURN_IF_ERROR(w.add(t->name, t->dtype, t->shape, t->data, t->nbytes));
      weight_map[t->name] = name;
    }
    ANVIL_RETURN_IF_ERROR(w.write_file(dir + "/" + name));
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json idx = {{"metadata", {{"total_size", m.total_bytes()}}}, {"weight_map", weight_map}};
    std::string text = idx.dump(2) + "\n";
    ANVIL_RETURN_IF_ERROR(write_file_atomic(dir + "/model.safetensors.index.json", text.data(), text.size()));
  }
  return Status::ok();
}

}  // namespace anvil
