// config.json -> ModelConfig. Every field is type-checked before use (nlohmann's get<> would
// throw on a wrong type); an error names the file, the field and what was expected.
#include "format/model_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "base/mmap_file.h"
#include "base/optional_file.h"

namespace anvil {

using nlohmann::json;

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kQwen3: return "qwen3";
    case Arch::kQwen2: return "qwen2";
    case Arch::kLlama: return "llama";
    case Arch::kQwen3Moe: return "qwen3_moe";
    case Arch::kQwen2Moe: return "qwen2_moe";
    case Arch::kOlmoe: return "olmoe";
    case Arch::kMixtral: return "mixtral";
    case Arch::kMistral: return "mistral";
    case Arch::kPhi3: return "phi3";
  }
  return "?";
}

bool ModelConfig::is_moe_layer(int layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

QuantSpec QuantConfig::for_module(const std::string& module_path) const {
  auto it = overrides.find(module_path);
  return it == overrides.end() ? default_spec : it->second;
}

namespace {

constexpr const char* kSupportedArchs = "qwen3, qwen2, llama, mistral, phi3, qwen3_moe, qwen2_moe, olmoe, mixtral";

// Field access with the file label and the field path carried along for error messages.
class Fields {
 public:
  Fields(const json& obj, std::string label, std::string prefix = "")
      : obj_(obj), label_(std::move(label)), prefix_(std::move(prefix)) {}

  // Absent and null both mean "not given".
  const json* get(const char* key) const {
    auto it = obj_.find(key);
    return (it == obj_.end() || it->is_null()) ? nullptr : &*it;
  }
  bool has(const char* key) const { return get(key) != nullptr; }

  Status error(const char* key, const std::string& what) const {
    return invalid_argument(label_ + ": field '" + prefix_ + key + "': " + what);
  }
  Status unsupported_value(const char* key, const std::string& what) const {
    return unsupported(label_ + ": field '" + prefix_ + key + "': " + what);
  }
  Status wrong_type(const char* key, const char* expected) const {
    const json* v = get(key);
    return error(key, std::string("expected ") + expected + ", got " + (v ? v->dump() : "null"));
  }

  // An integer that fits in int. `required`: absent is an error; else *out keeps its default.
  Status get_int(const char* key, int* out, bool required, bool positive) const {
    const json* v = get(key);
    if (!v) return required ? error(key, "missing (required)") : Status::ok();
    const char* expected = positive ? "a positive integer" : "an integer";
    if (!v->is_number_integer()) return wrong_type(key, expected);
    if (v->is_number_unsigned() ? v->get<uint64_t>() > uint64_t(INT_MAX)
                                : (v->get<int64_t>() > INT_MAX || v->get<int64_t>() < INT_MIN))
      return wrong_type(key, expected);
    int x = v->get<int>();
    if (positive && x <= 0) return wrong_type(key, expected);
    *out = x;
    return Status::ok();
  }
  Status get_double(const char* key, double* out, bool positive, bool required = false) const {
    const json* v = get(key);
    if (!v) return required ? error(key, "missing (required)") : Status::ok();
    const char* expected = positive ? "a positive number" : "a number";
    if (!v->is_number()) return wrong_type(key, expected);
    double x = v->get<double>();
    if (!std::isfinite(x) || (positive && x <= 0)) return wrong_type(key, expected);
    *out = x;
    return Status::ok();
  }
  Status get_bool(const char* key, bool* out) const {
    const json* v = get(key);
    if (!v) return Status::ok();
    if (!v->is_boolean()) return wrong_type(key, "true or false");
    *out = v->get<bool>();
    return Status::ok();
  }
  Status get_string(const char* key, std::string* out) const {
    const json* v = get(key);
    if (!v) return Status::ok();
    if (!v->is_string()) return wrong_type(key, "a string");
    *out = v->get<std::string>();
    return Status::ok();
  }
  // An int or a list of ints (eos_token_id); appended to *out without duplicates.
  Status get_int_list(const char* key, std::vector<int>* out) const {
    const json* v = get(key);
    if (!v) return Status::ok();
    auto add = [&](const json& x) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > INT_MAX) return false;
      int id = x.get<int>();
      if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
      return true;
    };
    if (v->is_array()) {
      for (const json& x : *v)
        if (!add(x)) return wrong_type(key, "a token id or a list of token ids");
      return Status::ok();
    }
    if (!add(*v)) return wrong_type(key, "a token id or a list of token ids");
    return Status::ok();
  }

 private:
  const json& obj_;
  std::string label_;
  std::string prefix_;
};

bool arch_from_model_type(const std::string& t, Arch* out) {
  if (t == "qwen3") *out = Arch::kQwen3;
  else if (t == "qwen2") *out = Arch::kQwen2;
  else if (t == "llama") *out = Arch::kLlama;
  else if (t == "qwen3_moe") *out = Arch::kQwen3Moe;
  else if (t == "qwen2_moe") *out = Arch::kQwen2Moe;
  else if (t == "olmoe") *out = Arch::kOlmoe;
  else if (t == "mixtral") *out = Arch::kMixtral;
  else if (t == "mistral") *out = Arch::kMistral;
  else if (t == "phi3") *out = Arch::kPhi3;
  else return false;
  return true;
}

bool arch_from_class(const std::string& c, Arch* out) {
  if (c == "Qwen3ForCausalLM") *out = Arch::kQwen3;
  else if (c == "Qwen2ForCausalLM") *out = Arch::kQwen2;
  else if (c == "LlamaForCausalLM") *out = Arch::kLlama;
  else if (c == "Qwen3MoeForCausalLM") *out = Arch::kQwen3Moe;
  else if (c == "Qwen2MoeForCausalLM") *out = Arch::kQwen2Moe;
  else if (c == "OlmoeForCausalLM") *out = Arch::kOlmoe;
  else if (c == "MixtralForCausalLM") *out = Arch::kMixtral;
  else if (c == "MistralForCausalLM") *out = Arch::kMistral;
  else if (c == "Phi3ForCausalLM") *out = Arch::kPhi3;
  else return false;
  return true;
}

// model_type decides; architectures[0] is the fallback for configs without model_type.
Status parse_arch(const Fields& f, const json& root, const std::string& label, ModelConfig* c) {
  ANVIL_RETURN_IF_ERROR(f.get_string("model_type", &c->model_type));
  if (!c->model_type.empty()) {
    if (!arch_from_model_type(c->model_type, &c->arch))
      return unsupported(label + ": unsupported architecture '" + c->model_type +
                         "' (model_type); supported: " + kSupportedArchs);
    return Status::ok();
  }
  const json* archs = f.get("architectures");
  if (!archs) return f.error("model_type", "missing (required; or give architectures)");
  if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string())
    return f.wrong_type("architectures", "a list of architecture class names");
  std::string cls = (*archs)[0].get<std::string>();
  if (!arch_from_class(cls, &c->arch))
    return unsupported(label + ": unsupported architecture '" + cls + "' (architectures); supported: " +
                       kSupportedArchs);
  c->model_type = arch_name(c->arch);
  return Status::ok();
}

Status parse_dtype(const Fields& f, ModelConfig* c) {
  const char* key = f.has("torch_dtype") ? "torch_dtype" : "dtype";
  std::string s;
  ANVIL_RETURN_IF_ERROR(f.get_string(key, &s));
  if (s.empty()) return Status::ok();
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "bfloat16") c->torch_dtype = DType::kBF16;
  else if (s == "float16" || s == "half") c->torch_dtype = DType::kF16;
  else if (s == "float32" || s == "float") c->torch_dtype = DType::kF32;
  else return f.error(key, "expected \"bfloat16\", \"float16\" or \"float32\", got \"" + s + "\"");
  return Status::ok();
}

// Phi3Config takes no rope scaling but its own LongRoPE ("longrope"; the older "su" and "yarn" are
// read as "longrope", not as the YaRN of other families): any other type is refused by name.
Status refuse_phi3_rope_scaling(const Fields& r, bool rope_type_key, const std::string& type) {
  const char* key = rope_type_key ? "rope_type" : "type";
  return r.unsupported_value(key, "rope scaling '" + type +
                                      "' is not one a Phi-3 model has (Phi3Config takes only 'default' and 'longrope')");
}

// LongRoPE (transformers' _compute_longrope_parameters; Phi-3-mini-128k, Phi-3-medium-128k,
// Phi-3.5-mini): inv_freq[i] = 1 / (ext[i] * theta^(2i/D)) with ext the short or the long factors,
// and cos and sin multiplied by the attention factor (given, or sqrt(1 + ln(factor) / ln(original))
// where factor = max_position_embeddings / original_max_position_embeddings > 1, else 1). The
// original context is original_max_position_embeddings at the top level (Phi3Config's, default
// 4096) or in rope_scaling / rope_parameters; a config without one has factor in rope_scaling and
// its original context is max_position_embeddings, as transformers reads it.
Status parse_longrope(const Fields& top, const Fields& r, ModelConfig* c) {
  RopeScaling& s = c->rope_scaling;
  s.type = "longrope";
  const int half = (c->rotary_dim > 0 ? c->rotary_dim : c->head_dim) / 2;
  for (const auto& [key, out] : {std::pair<const char*, std::vector<double>*>{"short_factor", &s.short_factor},
                                 {"long_factor", &s.long_factor}}) {
    const json* v = r.get(key);
    const std::string want = "a list of " + std::to_string(half) + " positive numbers (one per rotary frequency: " +
                             (c->rotary_dim > 0 ? "the rotary dims / 2)" : "head_dim / 2)");
    if (!v) return r.error(key, "missing (required: " + want + ")");
    if (!v->is_array()) return r.error(key, "expected " + want + ", got " + v->dump().substr(0, 80));
    if (v->size() != size_t(half))
      return r.error(key, "expected " + want + ", got a list of " + std::to_string(v->size()));
    out->clear();
    for (const json& x : *v) {
      if (!x.is_number() || !std::isfinite(x.get<double>()) || x.get<double>() <= 0)
        return r.error(key, "expected " + want + ", got " + x.dump().substr(0, 40) + " in it");
      out->push_back(x.get<double>());
    }
  }
  int orig = c->arch == Arch::kPhi3 ? 4096 : 0;  // Phi3Config's default
  ANVIL_RETURN_IF_ERROR(top.get_int("original_max_position_embeddings", &orig, false, true));
  ANVIL_RETURN_IF_ERROR(r.get_int("original_max_position_embeddings", &orig, false, true));
  if (orig > 0) {
    if (c->max_position_embeddings <= 0)
      return top.error("max_position_embeddings", "missing (LongRoPE's factor is max_position_embeddings / "
                                                   "original_max_position_embeddings)");
    s.factor = double(c->max_position_embeddings) / orig;
  } else {
    if (c->max_position_embeddings <= 0)
      return top.error("max_position_embeddings", "missing (required with LongRoPE)");
    orig = c->max_position_embeddings;
    ANVIL_RETURN_IF_ERROR(
        r.get_double("factor", &s.factor, true, true));  // transformers needs it without an original context
  }
  s.original_max_position_embeddings = orig;
  return r.get_double("attention_factor", &s.attention_factor, true);
}

// partial_rotary_factor, top level or (transformers >= 5 writes it there) inside rope_parameters:
// RoPE over int(head_dim * factor) dims of each head (Phi3Attention's rotary_ndims; Phi-4-mini:
// 0.75), which must be even. Only Phi-3's attention turns part of a head; another family with a
// factor other than 1 is refused (its transformers class would turn all of it, or fail).
Status parse_partial_rotary(const Fields& f, const std::string& label, ModelConfig* c) {
  const json none = json::object();
  const json* rp = f.get("rope_parameters");
  const Fields r(rp && rp->is_object() ? *rp : none, label, "rope_parameters.");
  for (const Fields* at : {static_cast<const Fields*>(&f), &r}) {
    if (!at->has("partial_rotary_factor")) continue;
    double rotary = 1.0;
    ANVIL_RETURN_IF_ERROR(at->get_double("partial_rotary_factor", &rotary, true));
    if (rotary == 1.0) continue;
    if (c->arch != Arch::kPhi3 || rotary > 1.0)
      return at->unsupported_value("partial_rotary_factor",
                                   "partial rotary embeddings (RoPE over " + json(rotary).dump() +
                                       " of each head) are supported for phi3 models (Phi-4-mini: 0.75) only (expected 1.0)");
    const int rot = int(c->head_dim * rotary);
    if (rot < 2 || rot % 2 != 0)
      return at->error("partial_rotary_factor", json(rotary).dump() + " of head_dim " + std::to_string(c->head_dim) +
                                                    " is " + std::to_string(rot) + " rotary dims; expected an even number");
    c->rotary_dim = rot;
  }
  return Status::ok();
}

// Rope scaling comes from `rope_scaling` (transformers < 5, MLX) or from `rope_parameters`
// (transformers >= 5, which also holds rope_theta there); the type key is `rope_type` or `type`.
Status parse_rope_scaling(const Fields& f, const std::string& label, ModelConfig* c) {
  const char* field = f.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json* rs = f.get(field);
  if (!rs) return Status::ok();
  if (!rs->is_object()) return f.wrong_type(field, "an object or null");
  const std::string prefix = std::string(field) + ".";
  Fields r(*rs, label, prefix);
  std::string type;
  ANVIL_RETURN_IF_ERROR(r.get_string("rope_type", &type));
  if (type.empty()) ANVIL_RETURN_IF_ERROR(r.get_string("type", &type));
  RopeScaling& s = c->rope_scaling;
  s.type = type;
  if (type == "default") return Status::ok();
  if (type == "longrope" || (c->arch == Arch::kPhi3 && (type == "su" || type == "yarn"))) return parse_longrope(f, r, c);
  if (c->arch == Arch::kPhi3 && !type.empty()) return refuse_phi3_rope_scaling(r, rs->contains("rope_type"), type);
  if (type == "") {
    // transformers refuses a scaling without its type; an object of only rope_theta (v5) is no scaling
    // (partial_rotary_factor, which v5 may keep there too, is checked apart).
    for (auto it = rs->begin(); it != rs->end(); ++it)
      if (it.key() != "rope_theta" && it.key() != "partial_rotary_factor" && !it->is_null())
        return r.error("rope_type", "missing (required next to '" + it.key() + "'; e.g. \"linear\" or \"llama3\")");
    return Status::ok();
  }
  // The parameters each type needs are required, as transformers' rope validation has them.
  if (type == "linear") return r.get_double("factor", &s.factor, true, true);
  if (type == "llama3") {
    ANVIL_RETURN_IF_ERROR(r.get_double("factor", &s.factor, true, true));
    ANVIL_RETURN_IF_ERROR(r.get_double("low_freq_factor", &s.low_freq_factor, true, true));
    ANVIL_RETURN_IF_ERROR(r.get_double("high_freq_factor", &s.high_freq_factor, true, true));
    ANVIL_RETURN_IF_ERROR(r.get_int("original_max_position_embeddings", &s.original_max_position_embeddings,
                                    true, true));
    if (s.high_freq_factor <= s.low_freq_factor)
      return r.error("high_freq_factor", "must be greater than low_freq_factor");
    return Status::ok();
  }
  if (type == "yarn") {
    // transformers requires the factor; the rest default as in its _compute_yarn_parameters (beta_fast 32,
    // beta_slow 1, original_max_position_embeddings = max_position_embeddings, truncate true, and the
    // attention factor 0.1 ln(factor) + 1 unless given, or mscale and mscale_all_dim give it).
    ANVIL_RETURN_IF_ERROR(r.get_double("factor", &s.factor, true, true));
    s.original_max_position_embeddings = c->max_position_embeddings;
    ANVIL_RETURN_IF_ERROR(r.get_int("original_max_position_embeddings", &s.original_max_position_embeddings,
                                    c->max_position_embeddings <= 0, true));
    ANVIL_RETURN_IF_ERROR(r.get_double("beta_fast", &s.beta_fast, true));
    ANVIL_RETURN_IF_ERROR(r.get_double("beta_slow", &s.beta_slow, true));
    ANVIL_RETURN_IF_ERROR(r.get_double("attention_factor", &s.attention_factor, true));
    ANVIL_RETURN_IF_ERROR(r.get_double("mscale", &s.mscale, false));
    ANVIL_RETURN_IF_ERROR(r.get_double("mscale_all_dim", &s.mscale_all_dim, false));
    ANVIL_RETURN_IF_ERROR(r.get_bool("truncate", &s.truncate));
    return Status::ok();
  }
  return r.unsupported_value("rope_type", "unsupported rope scaling '" + type +
                                             "' (supported: default, linear, llama3, yarn, longrope)");
}

// Mistral's, Mixtral's and Phi-3's sliding_window, as their transformers config classes read it: null is
// none, absent is the class default (MistralConfig: 4096; MixtralConfig, Phi3Config: none), else a positive
// integer W: each position attends to the last W (KVCacheView::window, in every layer).
Status parse_sliding_window(const Fields& f, const json& root, ModelConfig* c) {
  auto it = root.find("sliding_window");
  if (it == root.end()) {
    if (c->arch == Arch::kMistral) c->sliding_window = 4096;
    return Status::ok();
  }
  if (it->is_null()) return Status::ok();
  if (!f.get_int("sliding_window", &c->sliding_window, false, true).is_ok())
    return f.wrong_type("sliding_window", "a positive integer (a window of that many positions) or null (none)");
  return Status::ok();
}

bool valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
bool valid_group(int g) { return g == 32 || g == 64 || g == 128; }

// One {bits, group_size[, mode]} object; missing fields inherit from `base` (the block default).
Status parse_quant_params(const Fields& q, const std::string& label, const QuantSpec& base, bool required,
                          QuantSpec* out) {
  *out = base;
  ANVIL_RETURN_IF_ERROR(q.get_int("bits", &out->bits, required, false));
  ANVIL_RETURN_IF_ERROR(q.get_int("group_size", &out->group_size, required, false));
  if (!valid_bits(out->bits)) return q.error("bits", "expected 2, 3, 4, 5, 6 or 8, got " + std::to_string(out->bits));
  if (!valid_group(out->group_size))
    return q.error("group_size", "expected 32, 64 or 128, got " + std::to_string(out->group_size));
  std::string mode;
  ANVIL_RETURN_IF_ERROR(q.get_string("mode", &mode));
  if (!mode.empty() && mode != "affine")
    return q.unsupported_value("mode", "unsupported quantization mode '" + mode + "' (only affine is supported)");
  return Status::ok();
}

Status parse_quant(const Fields& f, const std::string& label, ModelConfig* c) {
  // MLX writes `quantization` (and often a copy as `quantization_config`); prefer the former.
  const char* key = f.has("quantization") ? "quantization" : "quantization_config";
  const json* block = f.get(key);
  if (!block) return Status::ok();
  if (!block->is_object()) return f.wrong_type(key, "an object with bits and group_size");
  const std::string prefix = std::string(key) + ".";
  Fields q(*block, label, prefix);
  if (const json* m = q.get("quant_method"); m && !(m->is_string() && m->get<std::string>() == "mlx"))
    return unsupported(label + ": field '" + prefix + "quant_method': unsupported quantization method " + m->dump() +
                       " (only MLX affine quantization is supported)");
  ANVIL_RETURN_IF_ERROR(parse_quant_params(q, label, QuantSpec{}, true, &c->quant.default_spec));
  for (auto it = block->begin(); it != block->end(); ++it) {
    const std::string& k = it.key();
    if (k == "bits" || k == "group_size" || k == "mode" || k == "quant_method") continue;
    if (it->is_boolean() && !it->get<bool>()) {
      c->quant.overrides[k] = QuantSpec{};
    } else if (it->is_object()) {
      Fields o(*it, label, prefix + k + ".");
      ANVIL_RETURN_IF_ERROR(parse_quant_params(o, label, c->quant.default_spec, false, &c->quant.overrides[k]));
    } else {
      return invalid_argument(label + ": field '" + prefix + k +
                              "': expected a per-module override ({bits, group_size} or false), got " + it->dump());
    }
  }
  return Status::ok();
}

// The mixture-of-experts block. Defaults are those of transformers' config classes (Qwen3MoeConfig,
// Qwen2MoeConfig, OlmoeConfig, MixtralConfig) for fields a checkpoint may omit; the expert count, top-k
// and the expert width are required. router_aux_loss_coef / output_router_logits only matter for training.
Status parse_moe(const Fields& f, const std::string& label, ModelConfig* c) {
  // Mixtral names the count num_local_experts, the others num_experts; transformers >= 5 writes
  // num_local_experts for every family, so either is accepted.
  const char* experts_key = f.has("num_experts") ? "num_experts" : "num_local_experts";
  ANVIL_RETURN_IF_ERROR(f.get_int(experts_key, &c->num_experts, true, true));
  ANVIL_RETURN_IF_ERROR(f.get_int("num_experts_per_tok", &c->num_experts_per_tok, true, true));
  if (c->num_experts_per_tok > c->num_experts)
    return f.error("num_experts_per_tok", "must be at most " + std::string(experts_key) + " (" +
                                              std::to_string(c->num_experts) + "), got " +
                                              std::to_string(c->num_experts_per_tok));
  switch (c->arch) {
    case Arch::kQwen3Moe:
    case Arch::kQwen2Moe:
      ANVIL_RETURN_IF_ERROR(f.get_int("moe_intermediate_size", &c->moe_intermediate_size, true, true));
      ANVIL_RETURN_IF_ERROR(f.get_bool("norm_topk_prob", &c->norm_topk_prob));
      ANVIL_RETURN_IF_ERROR(f.get_int("decoder_sparse_step", &c->decoder_sparse_step, false, true));
      if (const json* m = f.get("mlp_only_layers")) {
        if (!m->is_array()) return f.wrong_type("mlp_only_layers", "a list of layer indices");
        for (const json& x : *m) {
          if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= c->num_hidden_layers)
            return f.wrong_type("mlp_only_layers", ("a list of layer indices in [0, " +
                                                    std::to_string(c->num_hidden_layers) + ")").c_str());
          c->mlp_only_layers.push_back(x.get<int>());
        }
      }
      if (c->arch == Arch::kQwen2Moe) {
        ANVIL_RETURN_IF_ERROR(f.get_int("shared_expert_intermediate_size", &c->shared_expert_intermediate_size,
                                        true, false));
        if (c->shared_expert_intermediate_size < 0)
          return f.wrong_type("shared_expert_intermediate_size", "a non-negative integer");
      }
      break;
    case Arch::kOlmoe:
      c->moe_intermediate_size = c->intermediate_size;  // OLMoE's experts use intermediate_size
      ANVIL_RETURN_IF_ERROR(f.get_bool("norm_topk_prob", &c->norm_topk_prob));
      if (f.has("clip_qkv"))
        return f.unsupported_value("clip_qkv", "q/k/v clipping is not supported (expected null)");
      break;
    case Arch::kMixtral:
      // Mixtral takes the softmax over the top-k router logits: the same as the full softmax renormalized.
      c->moe_intermediate_size = c->intermediate_size;
      c->norm_topk_prob = true;
      break;
    default:
      break;
  }
  (void)label;
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& label) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return invalid_argument(label + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) return invalid_argument(label + ": expected a JSON object at the top level");

  ModelConfig c;
  Fields f(root, label);
  ANVIL_RETURN_IF_ERROR(parse_arch(f, root, label, &c));

  if (!f.has("vocab_size") && !f.has("hidden_size") && root.contains("text_config"))
    return unsupported(label + ": the model's fields are under 'text_config' (a multimodal wrapper); anvil reads "
                               "text-only checkpoints, whose config.json holds them at the top level");
  ANVIL_RETURN_IF_ERROR(f.get_int("vocab_size", &c.vocab_size, true, true));
  ANVIL_RETURN_IF_ERROR(f.get_int("hidden_size", &c.hidden_size, true, true));
  ANVIL_RETURN_IF_ERROR(f.get_int("intermediate_size", &c.intermediate_size, true, true));
  ANVIL_RETURN_IF_ERROR(f.get_int("num_hidden_layers", &c.num_hidden_layers, true, true));
  ANVIL_RETURN_IF_ERROR(f.get_int("num_attention_heads", &c.num_attention_heads, true, true));
  // Absent: as many as the query heads, or MistralConfig's default of 8.
  c.num_key_value_heads = c.arch == Arch::kMistral ? 8 : c.num_attention_heads;
  ANVIL_RETURN_IF_ERROR(f.get_int("num_key_value_heads", &c.num_key_value_heads, false, true));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return f.error("num_key_value_heads", "must divide num_attention_heads (" +
                                              std::to_string(c.num_attention_heads) + "), got " +
                                              std::to_string(c.num_key_value_heads) +
                                              (f.has("num_key_value_heads") ? "" : " (the default when absent)"));
  if (f.has("head_dim")) {
    ANVIL_RETURN_IF_ERROR(f.get_int("head_dim", &c.head_dim, false, true));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      return f.error("head_dim", "missing, and hidden_size (" + std::to_string(c.hidden_size) +
                                     ") is not a multiple of num_attention_heads (" +
                                     std::to_string(c.num_attention_heads) + ")");
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  // Defaults for fields a config may leave out: those of transformers' config class per architecture.
  if (c.arch == Arch::kMixtral) c.rope_theta = 1e6;
  if (c.arch == Arch::kMixtral || c.arch == Arch::kOlmoe || c.arch == Arch::kPhi3) c.rms_norm_eps = 1e-5;
  if (c.arch == Arch::kPhi3) c.max_position_embeddings = 4096;  // Phi3Config's
  ANVIL_RETURN_IF_ERROR(f.get_double("rms_norm_eps", &c.rms_norm_eps, true));
  // transformers >= 5 moves rope_theta (and the scaling type) into rope_parameters.
  if (const json* rp = f.get("rope_parameters"); rp && rp->is_object()) {
    Fields r(*rp, label, "rope_parameters.");
    ANVIL_RETURN_IF_ERROR(r.get_double("rope_theta", &c.rope_theta, true));
  }
  ANVIL_RETURN_IF_ERROR(f.get_double("rope_theta", &c.rope_theta, true));
  ANVIL_RETURN_IF_ERROR(f.get_int("max_position_embeddings", &c.max_position_embeddings, false, true));
  ANVIL_RETURN_IF_ERROR(parse_partial_rotary(f, label, &c));  // before the scaling: LongRoPE's factors per rotary pair
  ANVIL_RETURN_IF_ERROR(parse_rope_scaling(f, label, &c));  // yarn's default context is the one above
  ANVIL_RETURN_IF_ERROR(f.get_bool("tie_word_embeddings", &c.tie_word_embeddings));

  // Qwen2/Qwen3 (dense and MoE): with use_sliding_window, transformers limits attention to a window
  // in the layers `layer_types` marks "sliding_attention", or without it in the layers from
  // max_window_layers (default 28) on. This engine's windows apply to every layer alike (Mistral's), not
  // to some layers only, so such a config is refused where a layer would slide (real checkpoints say
  // false, or put max_window_layers at the layer count) rather than run with other attention than it
  // asks for.
  if (c.arch == Arch::kQwen3 || c.arch == Arch::kQwen2 || c.arch == Arch::kQwen3Moe || c.arch == Arch::kQwen2Moe) {
    bool sliding = false;
    ANVIL_RETURN_IF_ERROR(f.get_bool("use_sliding_window", &sliding));
    int from = 28;  // transformers' default max_window_layers
    ANVIL_RETURN_IF_ERROR(f.get_int("max_window_layers", &from, false, false));
    int slides = -1;  // the first sliding layer
    if (const json* lt = f.get("layer_types")) {
      if (!lt->is_array()) return f.wrong_type("layer_types", "a list of \"full_attention\" / \"sliding_attention\"");
      for (size_t i = 0; i < lt->size() && slides < 0; ++i)
        if ((*lt)[i] == "sliding_attention") slides = int(i);
    } else if (from < c.num_hidden_layers) {
      slides = std::max(0, from);
    }
    if (sliding && slides >= 0)
      return f.unsupported_value("use_sliding_window",
                                 "sliding-window attention (from layer " + std::to_string(slides) + " by " +
                                     (f.has("layer_types") ? "layer_types" : "max_window_layers") +
                                     ") is not supported (expected false)");
  }
  // What the MLP and RoPE compute: SwiGLU with SiLU and RoPE over the whole head in every supported
  // architecture. A config asking for anything else is refused, never run as something it is not.
  {
    std::string act = "silu";
    ANVIL_RETURN_IF_ERROR(f.get_string("hidden_act", &act));
    if (act != "silu" && act != "swish")
      return f.unsupported_value("hidden_act", "activation '" + act + "' is not supported (the MLP is SwiGLU with silu)");
    bool mlp_bias = false;
    ANVIL_RETURN_IF_ERROR(f.get_bool("mlp_bias", &mlp_bias));
    if (mlp_bias) return f.unsupported_value("mlp_bias", "MLP biases are not supported (expected false)");
  }
  switch (c.arch) {
    case Arch::kQwen3:
      c.qk_norm = true;
      ANVIL_RETURN_IF_ERROR(f.get_bool("attention_bias", &c.attention_bias));
      break;
    case Arch::kQwen2:
      c.attention_bias = true;  // Qwen2 always has q/k/v biases; its config has no flag for it
      break;
    case Arch::kLlama:
      ANVIL_RETURN_IF_ERROR(f.get_bool("attention_bias", &c.attention_bias));
      break;
    case Arch::kMistral:
      // Llama's computation; MistralAttention has no biases and its config no attention_bias.
      ANVIL_RETURN_IF_ERROR(parse_sliding_window(f, root, &c));
      break;
    case Arch::kPhi3:
      // Llama's computation with fused projections; Phi3Attention and Phi3MLP have no biases (the Hub's
      // configs say attention_bias false, which Phi3Config does not read). resid_pdrop, embd_pdrop,
      // attention_dropout are training-only; original_max_position_embeddings only matters to LongRoPE.
      ANVIL_RETURN_IF_ERROR(parse_sliding_window(f, root, &c));
      break;
    case Arch::kQwen3Moe:
      c.qk_norm = true;
      ANVIL_RETURN_IF_ERROR(f.get_bool("attention_bias", &c.attention_bias));
      break;
    case Arch::kQwen2Moe:
      // q/k/v biases, as Qwen2; transformers >= 5 names the switch qkv_bias (default true).
      c.attention_bias = true;
      ANVIL_RETURN_IF_ERROR(f.get_bool("qkv_bias", &c.attention_bias));
      break;
    case Arch::kOlmoe:
      c.qk_norm_full = true;
      ANVIL_RETURN_IF_ERROR(f.get_bool("attention_bias", &c.attention_bias));
      break;
    case Arch::kMixtral:
      ANVIL_RETURN_IF_ERROR(parse_sliding_window(f, root, &c));  // real Mixtral configs say null
      break;
  }
  switch (c.arch) {
    case Arch::kQwen3Moe: case Arch::kQwen2Moe: case Arch::kOlmoe: case Arch::kMixtral:
      ANVIL_RETURN_IF_ERROR(parse_moe(f, label, &c));
      break;
    default:
      break;
  }

  ANVIL_RETURN_IF_ERROR(f.get_int_list("eos_token_id", &c.eos_token_ids));
  ANVIL_RETURN_IF_ERROR(f.get_int("bos_token_id", &c.bos_token_id, false, false));
  ANVIL_RETURN_IF_ERROR(parse_dtype(f, &c));
  ANVIL_RETURN_IF_ERROR(parse_quant(f, label, &c));
  return c;
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "config.json").string();
  ANVIL_ASSIGN_OR_RETURN(std::optional<std::string> text, read_optional_file(path));  // a link to nothing: named
  if (!text) return not_found(path + ": missing (a model directory needs config.json)");
  ANVIL_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config(*text, path));

  // generation_config.json may list more stop ids (e.g. <|im_end|> besides <|endoftext|>): absent is
  // fine, there but unreadable is an error (a model run without its stop ids would not stop).
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  ANVIL_ASSIGN_OR_RETURN(std::optional<std::string> gen_text, read_optional_file(gen_path));
  if (gen_text) {
    json gen;
    try {
      gen = json::parse(*gen_text);
    } catch (const json::exception& e) {
      return invalid_argument(gen_path + ": not valid JSON: " + e.what());
    }
    if (!gen.is_object()) return invalid_argument(gen_path + ": expected a JSON object at the top level");
    ANVIL_RETURN_IF_ERROR(Fields(gen, gen_path).get_int_list("eos_token_id", &c.eos_token_ids));
  }
  return c;
}

}  // namespace anvil
