#include "model/weights.h"

#include <algorithm>

#include <sstream>

namespace anvil {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

class Binder {
 public:
  Binder(const ModelConfig& cfg, const TensorLookup& lookup, const std::string& label)
      : cfg_(cfg), lookup_(lookup), label_(label) {}

  const TensorView* find(const std::string& name) const { return lookup_(name); }

  Status missing(const std::string& name, const std::string& expected) const {
    return not_found(label_ + ": missing tensor '" + name + "' (expected " + expected + ")");
  }

  Result<WeightVector> vector(const std::string& name, int64_t n) const {
    const TensorView* t = find(name);
    if (!t) return missing(name, shape_str({n}) + " float");
    if (t->shape != std::vector<int64_t>{n})
      return invalid_argument(label_ + ": tensor '" + name + "' has shape " + shape_str(t->shape) + ", expected " +
                              shape_str({n}));
    if (!is_float_dtype(t->dtype))
      return invalid_argument(label_ + ": tensor '" + name + "' has dtype " + std::string(dtype_name(t->dtype)) +
                              ", expected F32, F16 or BF16");
    return WeightVector{n, t->dtype, t->data};
  }

  // A [rows, cols] linear weight at module path `module` (without the .weight suffix): dense, or
  // MLX affine quantized when module.scales exists.
  Result<WeightMatrix> matrix(const std::string& module, int64_t rows, int64_t cols, bool with_bias) const {
    return matrix_of(module, find(module + ".weight"), find(module + ".scales"), find(module + ".biases"), rows,
                     cols, with_bias);
  }

  // The `experts` [rows, cols] linears stacked along a leading expert dimension at `module` (MLX
  // switch_mlp: weight [E, rows, cols or packed], scales/biases [E, rows, groups]), as one view per expert.
  Result<std::vector<WeightMatrix>> stacked(const std::string& module, int64_t experts, int64_t rows,
                                            int64_t cols) const {
    const TensorView* w = find(module + ".weight");
    const TensorView* sc = find(module + ".scales");
    const TensorView* bi = find(module + ".biases");
    if (!w) {
      // (Appended piece by piece: GCC 12 warns falsely, -Wrestrict, on "[" + std::to_string(...).)
      std::string shape = "[";
      shape += std::to_string(experts);
      shape += ", ";
      shape += std::to_string(rows);
      shape += ", ...] stacked expert weights";
      return missing(module + ".weight", shape);
    }
    for (const TensorView* t : {w, sc, bi})
      if (t && (t->shape.size() != 3 || t->shape[0] != experts))
        return invalid_argument(label_ + ": tensor '" + t->name + "' has shape " + shape_str(t->shape) +
                                ", expected a leading expert dimension of " + std::to_string(experts) +
                                " (3-D stacked experts)");
    auto slice = [](const TensorView* t, int64_t e, TensorView* out) -> const TensorView* {
      if (!t) return nullptr;
      *out = *t;
      out->shape = {t->shape[1], t->shape[2]};
      const size_t per = t->nbytes / size_t(t->shape[0]);
      out->data = static_cast<const uint8_t*>(t->data) + size_t(e) * per;
      out->nbytes = per;
      return out;
    };
    std::vector<WeightMatrix> out;
    out.reserve(size_t(experts));
    for (int64_t e = 0; e < experts; ++e) {
      TensorView ws, ss, bs;
      ANVIL_ASSIGN_OR_RETURN(WeightMatrix m, matrix_of(module, slice(w, e, &ws), slice(sc, e, &ss), slice(bi, e, &bs),
                                                       rows, cols, false));
      out.push_back(m);
    }
    return out;
  }

  Result<WeightMatrix> matrix_of(const std::string& module, const TensorView* w, const TensorView* scales,
                                 const TensorView* biases, int64_t rows, int64_t cols, bool with_bias) const {
    const std::string wname = module + ".weight";
    QuantSpec spec = cfg_.quant.for_module(module);
    WeightMatrix m;
    m.rows = rows;
    m.cols = cols;
    if (!w) {
      std::string exp = scales || spec.quantized() ? "U32 packed, " + std::to_string(spec.bits) + "-bit quantized"
                                                   : shape_str({rows, cols}) + " float";
      return missing(wname, exp);
    }
    if (scales) {
      if (!biases) return missing(module + ".biases", "the affine biases of a quantized module");
      if (w->dtype != DType::kU32)
        return invalid_argument(label_ + ": tensor '" + wname + "' is quantized (has .scales) but has dtype " +
                                std::string(dtype_name(w->dtype)) + ", expected U32");
      if (w->shape.size() != 2 || w->shape[0] != rows)
        return invalid_argument(label_ + ": tensor '" + wname + "' has shape " + shape_str(w->shape) +
                                ", expected [" + std::to_string(rows) + ", cols*bits/32] with cols = " +
                                std::to_string(cols));
      int64_t packed = w->shape[1];
      if ((packed * 32) % cols != 0)
        return invalid_argument(label_ + ": tensor '" + wname + "' has " + std::to_string(packed) +
                                " packed words per row, which is not a whole number of bits for " +
                                std::to_string(cols) + " inputs");
      int bits = int(packed * 32 / cols);
      if (scales->shape.size() != 2 || scales->shape[0] != rows || scales->shape[1] <= 0 ||
          cols % scales->shape[1] != 0)
        return invalid_argument(label_ + ": tensor '" + module + ".scales' has shape " + shape_str(scales->shape) +
                                ", expected [" + std::to_string(rows) + ", " + std::to_string(cols) + "/group_size]");
      int group = int(cols / scales->shape[1]);
      if (biases->shape != scales->shape)
        return invalid_argument(label_ + ": tensor '" + module + ".biases' has shape " + shape_str(biases->shape) +
                                ", expected " + shape_str(scales->shape) + " like its scales");
      if (!is_float_dtype(scales->dtype) || biases->dtype != scales->dtype)
        return invalid_argument(label_ + ": tensors '" + module + ".scales'/.biases' must share one float dtype");
      if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8)
        return unsupported(label_ + ": tensor '" + wname + "' decodes to " + std::to_string(bits) +
                           "-bit quantization; supported: 2, 3, 4, 5, 6, 8");
      if (group != 32 && group != 64 && group != 128)
        return unsupported(label_ + ": tensor '" + module + ".scales' implies group size " + std::to_string(group) +
                           "; supported: 32, 64, 128");
      if (spec.quantized() && (spec.bits != bits || spec.group_size != group))
        return invalid_argument(label_ + ": module '" + module + "' is stored as " + std::to_string(bits) +
                                "-bit group " + std::to_string(group) + " but config.json quantization says " +
                                std::to_string(spec.bits) + "-bit group " + std::to_string(spec.group_size));
      m.bits = bits;
      m.group_size = group;
      m.dtype = scales->dtype;
      m.data = w->data;
      m.scales = scales->data;
      m.biases = biases->data;
    } else {
      if (w->dtype == DType::kU32)  // packed words without their scales: say that, not the shape
        return missing(module + ".scales", "the scales of a quantized module (its .weight is U32 packed)");
      if (w->shape != std::vector<int64_t>{rows, cols})
        return invalid_argument(label_ + ": tensor '" + wname + "' has shape " + shape_str(w->shape) + ", expected " +
                                shape_str({rows, cols}));
      if (!is_float_dtype(w->dtype))
        return invalid_argument(label_ + ": tensor '" + wname + "' has dtype " + std::string(dtype_name(w->dtype)) +
                                ", expected F32, F16 or BF16" +
                                (w->dtype == DType::kU32 ? " (a U32 weight needs .scales and .biases)" : ""));
      m.dtype = w->dtype;
      m.data = w->data;
    }
    if (with_bias) {
      const std::string bname = module + ".bias";
      const TensorView* b = find(bname);
      if (!b) return missing(bname, shape_str({rows}) + " float");
      if (b->shape != std::vector<int64_t>{rows} || !is_float_dtype(b->dtype))
        return invalid_argument(label_ + ": tensor '" + bname + "' has shape " + shape_str(b->shape) + " dtype " +
                                std::string(dtype_name(b->dtype)) + ", expected " + shape_str({rows}) + " float");
      m.bias = b->data;
      m.bias_dtype = b->dtype;
    }
    return m;
  }

 private:
  const ModelConfig& cfg_;
  const TensorLookup& lookup_;
  std::string label_;
};

// Rows [first, first + n) of `m`: a view into the same bytes. MLX affine quantization packs and groups
// each row on its own (a row is cols * bits / 32 whole words, its scales and biases cols / group_size
// values), so a quantized matrix splits at any row with its scales and biases, and every row of the
// view starts where a row of `m` did (what a backend's alignment of rows rests on is kept).
WeightMatrix row_view(const WeightMatrix& m, int64_t first, int64_t n) {
  WeightMatrix v = m;
  v.rows = n;
  auto at = [&](const void* base, size_t row_bytes) -> const void* {
    return base ? static_cast<const uint8_t*>(base) + size_t(first) * row_bytes : nullptr;
  };
  v.data = at(m.data, m.data_bytes() / size_t(m.rows));
  v.scales = at(m.scales, m.group_bytes() / size_t(m.rows));
  v.biases = at(m.biases, m.group_bytes() / size_t(m.rows));
  v.bias = at(m.bias, dtype_size(m.bias_dtype));
  return v;
}

// A module that stores several projections stacked along its output rows (Phi-3's qkv_proj and
// gate_up_proj), split into one view per part: `rows` lists the parts' row counts in stored order.
// A bad shape is named with what the parts are (`what`).
Result<std::vector<WeightMatrix>> fused(const Binder& b, const std::string& module, const std::vector<int64_t>& rows,
                                        int64_t cols, const std::string& what) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  Result<WeightMatrix> m = b.matrix(module, total, cols, false);
  if (!m.is_ok()) return Status(m.status().code(), m.status().message() + " (" + what + ")");
  std::vector<WeightMatrix> parts;
  int64_t first = 0;
  for (int64_t r : rows) {
    parts.push_back(row_view(*m, first, r));
    first += r;
  }
  return parts;
}

// The routed experts of layer prefix `p` (e.g. "model.layers.3."): router, experts in either layout, and
// qwen2_moe's shared expert.
Status bind_moe(const ModelConfig& cfg, const Binder& b, const std::string& p, MoEWeights* m) {
  const int64_t H = cfg.hidden_size, F = cfg.moe_intermediate_size, E = cfg.num_experts;
  const bool mixtral = cfg.arch == Arch::kMixtral;
  const std::string block = p + (mixtral ? "block_sparse_moe." : "mlp.");
  m->num_experts = cfg.num_experts;
  m->top_k = cfg.num_experts_per_tok;
  m->norm_topk_prob = cfg.norm_topk_prob;
  ANVIL_ASSIGN_OR_RETURN(m->router, b.matrix(block + "gate", E, H, false));
  if (b.find(block + "switch_mlp.gate_proj.weight")) {  // MLX: stacked along a leading expert dimension
    ANVIL_ASSIGN_OR_RETURN(m->gate, b.stacked(block + "switch_mlp.gate_proj", E, F, H));
    ANVIL_ASSIGN_OR_RETURN(m->up, b.stacked(block + "switch_mlp.up_proj", E, F, H));
    ANVIL_ASSIGN_OR_RETURN(m->down, b.stacked(block + "switch_mlp.down_proj", E, H, F));
  } else {  // Hugging Face: one module per expert (Mixtral names them w1 = gate, w3 = up, w2 = down)
    const char* gn = mixtral ? "w1" : "gate_proj";
    const char* un = mixtral ? "w3" : "up_proj";
    const char* dn = mixtral ? "w2" : "down_proj";
    if (!b.find(block + "experts.0." + gn + ".weight"))
      return b.missing(block + "experts.0." + gn + ".weight",
                       "the experts of an MoE layer, per expert (" + block + "experts.N." + gn + ") or stacked (" +
                           block + "switch_mlp.gate_proj)");
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = block + "experts." + std::to_string(e) + ".";
      ANVIL_ASSIGN_OR_RETURN(WeightMatrix g, b.matrix(ep + gn, F, H, false));
      ANVIL_ASSIGN_OR_RETURN(WeightMatrix u, b.matrix(ep + un, F, H, false));
      ANVIL_ASSIGN_OR_RETURN(WeightMatrix d, b.matrix(ep + dn, H, F, false));
      m->gate.push_back(g);
      m->up.push_back(u);
      m->down.push_back(d);
    }
  }
  if (cfg.shared_expert_intermediate_size > 0) {
    const int64_t S = cfg.shared_expert_intermediate_size;
    ANVIL_ASSIGN_OR_RETURN(m->shared_gate, b.matrix(block + "shared_expert.gate_proj", S, H, false));
    ANVIL_ASSIGN_OR_RETURN(m->shared_up, b.matrix(block + "shared_expert.up_proj", S, H, false));
    ANVIL_ASSIGN_OR_RETURN(m->shared_down, b.matrix(block + "shared_expert.down_proj", H, S, false));
    ANVIL_ASSIGN_OR_RETURN(m->shared_gate_w, b.matrix(block + "shared_expert_gate", 1, H, false));
  }
  return Status::ok();
}

}  // namespace

Result<ModelWeights> bind_weights(const ModelConfig& cfg, const TensorLookup& lookup, const std::string& label) {
  Binder b(cfg, lookup, label);
  ModelWeights mw;
  const int64_t H = cfg.hidden_size, F = cfg.intermediate_size, V = cfg.vocab_size;
  const int64_t QD = int64_t(cfg.num_attention_heads) * cfg.head_dim;
  const int64_t KD = int64_t(cfg.num_key_value_heads) * cfg.head_dim;
  ANVIL_ASSIGN_OR_RETURN(mw.embed, b.matrix("model.embed_tokens", V, H, false));
  ANVIL_ASSIGN_OR_RETURN(mw.final_norm, b.vector("model.norm.weight", H));
  if (cfg.tie_word_embeddings) {
    mw.lm_head = mw.embed;
    mw.tied = true;
  } else if (!b.find("lm_head.weight")) {
    return b.missing("lm_head.weight", std::string("[").append(std::to_string(V)).append(", ").append(
                                           std::to_string(H)) + "] (tie_word_embeddings is false or absent in config.json)");
  } else {
    ANVIL_ASSIGN_OR_RETURN(mw.lm_head, b.matrix("lm_head", V, H, false));
  }
  // Phi-3 stores q, k, v as one qkv_proj [QD + 2 KD, H], in that order, and gate, up as one gate_up_proj
  // [2 F, H], gate first (transformers' Phi3MLP chunk(2), mlx-lm's split): bound as row views of them.
  const bool phi3 = cfg.arch == Arch::kPhi3;
  const std::string qkv_what = "Phi-3's q, k and v projections fused: " + std::to_string(cfg.num_attention_heads) +
                               " + 2 x " + std::to_string(cfg.num_key_value_heads) + " heads of " +
                               std::to_string(cfg.head_dim) + " rows";
  const std::string gate_up_what =
      "Phi-3's gate and up projections fused: 2 x intermediate_size " + std::to_string(F) + " rows";
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights lw;
    ANVIL_ASSIGN_OR_RETURN(lw.attn_norm, b.vector(p + "input_layernorm.weight", H));
    ANVIL_ASSIGN_OR_RETURN(lw.ffn_norm, b.vector(p + "post_attention_layernorm.weight", H));
    if (cfg.qk_norm) {
      ANVIL_ASSIGN_OR_RETURN(lw.q_norm, b.vector(p + "self_attn.q_norm.weight", cfg.head_dim));
      ANVIL_ASSIGN_OR_RETURN(lw.k_norm, b.vector(p + "self_attn.k_norm.weight", cfg.head_dim));
    } else if (cfg.qk_norm_full) {
      ANVIL_ASSIGN_OR_RETURN(lw.q_norm, b.vector(p + "self_attn.q_norm.weight", QD));
      ANVIL_ASSIGN_OR_RETURN(lw.k_norm, b.vector(p + "self_attn.k_norm.weight", KD));
    }
    const bool qkv_bias = cfg.attention_bias;
    if (phi3) {
      ANVIL_ASSIGN_OR_RETURN(std::vector<WeightMatrix> qkv, fused(b, p + "self_attn.qkv_proj", {QD, KD, KD}, H, qkv_what));
      lw.q = qkv[0];
      lw.k = qkv[1];
      lw.v = qkv[2];
    } else {
      ANVIL_ASSIGN_OR_RETURN(lw.q, b.matrix(p + "self_attn.q_proj", QD, H, qkv_bias));
      ANVIL_ASSIGN_OR_RETURN(lw.k, b.matrix(p + "self_attn.k_proj", KD, H, qkv_bias));
      ANVIL_ASSIGN_OR_RETURN(lw.v, b.matrix(p + "self_attn.v_proj", KD, H, qkv_bias));
    }
    // Llama's and Qwen3's attention_bias also covers o_proj; Qwen2 has biases on q/k/v only.
    bool o_bias = cfg.attention_bias && cfg.arch != Arch::kQwen2 && cfg.arch != Arch::kQwen2Moe;
    ANVIL_ASSIGN_OR_RETURN(lw.o, b.matrix(p + "self_attn.o_proj", H, QD, o_bias));
    if (cfg.is_moe_layer(l)) {
      lw.moe = true;
      ANVIL_RETURN_IF_ERROR(bind_moe(cfg, b, p, &lw.experts));
    } else if (phi3) {
      ANVIL_ASSIGN_OR_RETURN(std::vector<WeightMatrix> gate_up, fused(b, p + "mlp.gate_up_proj", {F, F}, H, gate_up_what));
      lw.gate = gate_up[0];
      lw.up = gate_up[1];
      ANVIL_ASSIGN_OR_RETURN(lw.down, b.matrix(p + "mlp.down_proj", H, F, false));
    } else {
      ANVIL_ASSIGN_OR_RETURN(lw.gate, b.matrix(p + "mlp.gate_proj", F, H, false));
      ANVIL_ASSIGN_OR_RETURN(lw.up, b.matrix(p + "mlp.up_proj", F, H, false));
      ANVIL_ASSIGN_OR_RETURN(lw.down, b.matrix(p + "mlp.down_proj", H, F, false));
    }
    mw.layers.push_back(lw);
  }
  return mw;
}

static size_t vec_bytes(const WeightVector& v) { return v.data ? size_t(v.n) * dtype_size(v.dtype) : 0; }
static int64_t mat_params(const WeightMatrix& m) { return m.rows * m.cols + (m.bias ? m.rows : 0); }

namespace {
// Per layer: bytes and parameters of everything but the routed experts, and of the routed experts
// (all of them, and the share one token reads: top_k of num_experts).
struct LayerCost {
  size_t bytes = 0, expert_bytes = 0;
  int64_t params = 0, expert_params = 0;
  double active_fraction = 1.0;
};
LayerCost layer_cost(const LayerWeights& l) {
  LayerCost c;
  for (const WeightVector* v : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm}) {
    c.bytes += vec_bytes(*v);
    c.params += v->data ? v->n : 0;
  }
  std::vector<const WeightMatrix*> mats = {&l.q, &l.k, &l.v, &l.o};
  if (l.moe) {
    const MoEWeights& m = l.experts;
    for (const WeightMatrix* x : {&m.router, &m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_gate_w})
      if (x->data) mats.push_back(x);
    for (const auto* list : {&m.gate, &m.up, &m.down})
      for (const WeightMatrix& x : *list) {
        c.expert_bytes += x.bytes();
        c.expert_params += mat_params(x);
      }
    c.active_fraction = m.num_experts ? double(m.top_k) / m.num_experts : 0.0;
  } else {
    mats.insert(mats.end(), {&l.gate, &l.up, &l.down});
  }
  for (const WeightMatrix* m : mats) {
    c.bytes += m->bytes();
    c.params += mat_params(*m);
  }
  return c;
}
}  // namespace

size_t ModelWeights::bytes_per_token() const {
  size_t n = 0;
  for (auto& l : layers) {
    LayerCost c = layer_cost(l);
    n += c.bytes + size_t(double(c.expert_bytes) * c.active_fraction + 0.5);
  }
  n += vec_bytes(final_norm) + lm_head.bytes();
  n += embed.rows ? embed.bytes() / size_t(embed.rows) : 0;  // one embedding row
  return n;
}

size_t ModelWeights::total_bytes() const {
  size_t n = 0;
  for (auto& l : layers) {
    LayerCost c = layer_cost(l);
    n += c.bytes + c.expert_bytes;
  }
  n += vec_bytes(final_norm) + embed.bytes() + (tied ? 0 : lm_head.bytes());
  return n;
}

int64_t ModelWeights::parameter_count() const {
  int64_t n = 0;
  for (auto& l : layers) {
    LayerCost c = layer_cost(l);
    n += c.params + c.expert_params;
  }
  n += final_norm.n + mat_params(embed) + (tied ? 0 : mat_params(lm_head));
  return n;
}

int64_t ModelWeights::active_parameter_count() const {
  int64_t n = 0;
  for (auto& l : layers) {
    LayerCost c = layer_cost(l);
    n += c.params + int64_t(double(c.expert_params) * c.active_fraction + 0.5);
  }
  n += final_norm.n + mat_params(embed) + (tied ? 0 : mat_params(lm_head));
  return n;
}

Result<ModelWeights> upload_weights(const ModelWeights& host, Backend& backend, const UploadProgress& progress) {
  ModelWeights d = host;
  const size_t total = host.total_bytes();
  size_t done = 0;
  auto up_m = [&](WeightMatrix& m) -> Status {
    ANVIL_ASSIGN_OR_RETURN(m, backend.upload_weight(m));
    done += m.bytes();
    if (progress) progress(std::min(done, total), total);
    return Status::ok();
  };
  auto up_v = [&](WeightVector& v) -> Status {
    if (!v.data) return Status::ok();
    ANVIL_ASSIGN_OR_RETURN(v, backend.upload_vector(v));
    return Status::ok();
  };
  ANVIL_RETURN_IF_ERROR(up_m(d.embed));
  if (d.tied) d.lm_head = d.embed;
  else ANVIL_RETURN_IF_ERROR(up_m(d.lm_head));
  ANVIL_RETURN_IF_ERROR(up_v(d.final_norm));
  for (auto& l : d.layers) {
    for (WeightVector* v : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm}) ANVIL_RETURN_IF_ERROR(up_v(*v));
    for (WeightMatrix* m : {&l.q, &l.k, &l.v, &l.o}) ANVIL_RETURN_IF_ERROR(up_m(*m));
    if (!l.moe) {
      for (WeightMatrix* m : {&l.gate, &l.up, &l.down}) ANVIL_RETURN_IF_ERROR(up_m(*m));
      continue;
    }
    MoEWeights& m = l.experts;
    ANVIL_RETURN_IF_ERROR(up_m(m.router));
    for (auto* list : {&m.gate, &m.up, &m.down})
      for (WeightMatrix& x : *list) ANVIL_RETURN_IF_ERROR(up_m(x));
    if (m.has_shared())
      for (WeightMatrix* x : {&m.shared_gate, &m.shared_up, &m.shared_down, &m.shared_gate_w})
        ANVIL_RETURN_IF_ERROR(up_m(*x));
  }
  if (progress) progress(total, total);
  return d;
}

void free_weights(ModelWeights& d, Backend& backend) {
  backend.free_weight(d.embed);
  if (!d.tied) backend.free_weight(d.lm_head);
  if (d.final_norm.data) backend.free_vector(d.final_norm);
  for (auto& l : d.layers) {
    for (WeightVector* v : {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm})
      if (v->data) backend.free_vector(*v);
    for (WeightMatrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) backend.free_weight(*m);
  }
  d = ModelWeights{};
}

}  // namespace anvil
