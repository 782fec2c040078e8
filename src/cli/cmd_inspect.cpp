// anvil inspect: what a checkpoint is and what running it costs.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/common.h"
#ifdef ANVIL_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_device.h"
#endif

namespace anvil::cli {
namespace {

struct InspectArgs {
  std::string model, revision, synthetic;
  int ctx = 4096;
  bool ctx_given = false;
  int seqs = 1;
  std::string kv_dtype = "bf16";
  bool json = false;
};

std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", bytes, units[u]);
  return buf;
}

std::string quant_desc(const WeightMatrix& m) {
  if (!m.quantized()) return std::string(dtype_name(m.dtype));
  return "q" + std::to_string(m.bits) + "g" + std::to_string(m.group_size) + " (" +
         std::string(dtype_name(m.dtype)) + " scales)";
}

// The formats of a group of matrices, most common first, with their counts: a mixed checkpoint
// (mlx-community's "mixed", DWQ, per-module overrides) shows each with its share.
std::vector<std::pair<int, std::string>> format_counts(const std::vector<const WeightMatrix*>& mats) {
  std::map<std::string, int> formats;
  for (const WeightMatrix* m : mats)
    if (m->data) ++formats[quant_desc(*m)];
  std::vector<std::pair<int, std::string>> by_count;
  for (auto& [f, n] : formats) by_count.push_back({n, f});
  std::stable_sort(by_count.begin(), by_count.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return by_count;
}

std::string formats_desc(const std::vector<std::pair<int, std::string>>& by_count) {
  int total = 0;
  for (auto& [n, f] : by_count) total += n;
  std::string d = by_count.empty() ? "-" : "";
  for (size_t i = 0; i < by_count.size(); ++i) {
    if (i) d += ", ";
    d += by_count[i].second;
    if (by_count.size() > 1) d += " (" + std::to_string(by_count[i].first) + " of " + std::to_string(total) + ")";
  }
  return by_count.size() > 1 ? "mixed: " + d : d;
}

nlohmann::json formats_json(const std::vector<std::pair<int, std::string>>& by_count) {
  nlohmann::json j = nlohmann::json::object();
  for (auto& [n, f] : by_count) j[f] = n;
  return j;
}

int run_inspect(const InspectArgs& a) {
  if (a.model.empty() == a.synthetic.empty()) return fail("give exactly one of -m/--model DIR and --synthetic NAME");
  if (!a.revision.empty() && a.model.empty())
    return fail("--revision selects a revision of the repo id -m names; --synthetic has none");
  if (a.ctx < 1) return fail("--ctx must be >= 1, got " + std::to_string(a.ctx));
  if (a.seqs < 1 || a.seqs > 65536) return fail("--seqs must be in [1, 65536], got " + std::to_string(a.seqs));
  if (a.kv_dtype != "bf16" && a.kv_dtype != "f32") return fail("--kv-dtype must be bf16 or f32, got '" + a.kv_dtype + "'");
  auto m = a.model.empty() ? load_synthetic(a.synthetic) : load_model(a.model, a.revision);
  if (!m.is_ok()) return fail(m.status().message());
  const ModelConfig& c = (*m)->config;
  const ModelWeights& w = (*m)->weights;
  // The context LongRoPE's factors are chosen for: --ctx, or without it generate's default (4096, or
  // max_position_embeddings when smaller).
  const int rope_ctx = a.ctx_given || c.max_position_embeddings <= 0 ? a.ctx : std::min(a.ctx, c.max_position_embeddings);
  if (c.max_position_embeddings > 0 && a.ctx > c.max_position_embeddings)
    std::fprintf(stderr,
                 "[anvil] warning: --ctx %d is above the model's max_position_embeddings (%d): positions past it "
                 "were never trained (generate caps its default context there)\n",
                 a.ctx, c.max_position_embeddings);
  // The layers' dense matrices (attention, dense MLPs, a shared expert) and the routed experts'.
  std::vector<const WeightMatrix*> layer_mats, expert_mats, router_mats;
  for (const auto& l : w.layers) {
    for (const WeightMatrix* x : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) layer_mats.push_back(x);
    if (!l.moe) continue;
    router_mats.push_back(&l.experts.router);
    for (const WeightMatrix* x : {&l.experts.shared_gate, &l.experts.shared_up, &l.experts.shared_down})
      layer_mats.push_back(x);
    for (const auto* v : {&l.experts.gate, &l.experts.up, &l.experts.down})
      for (const WeightMatrix& x : *v) expert_mats.push_back(&x);
  }
  const auto layer_formats = format_counts(layer_mats), expert_formats = format_counts(expert_mats),
             router_formats = format_counts(router_mats);
  const size_t kv_elem = a.kv_dtype == "bf16" ? 2 : 4;
  const size_t kv_per_token = size_t(2) * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * kv_elem;
  const size_t weights = w.total_bytes();
  const size_t per_token = w.bytes_per_token();
  // Checked: an absurd --ctx x --seqs is an error naming them, never a wrapped-around figure.
  auto kv_checked = kv_cache_bytes(kv_per_token, a.ctx, a.seqs, "--ctx", "--seqs");
  if (!kv_checked.is_ok()) return fail(kv_checked.status().message());
  const size_t kv_total = *kv_checked;
  // Activation scratch of one forward of --batch's default tokens (float32 on CPU): h, x, q, k, v,
  // attn, o, gate, up, logits (see Transformer::alloc_scratch).
  const size_t batch = kCpuDefaultBatch;
  const size_t QD = size_t(c.num_attention_heads) * c.head_dim, KD = size_t(c.num_key_value_heads) * c.head_dim;
  const size_t act = batch * 4 * (3 * size_t(c.hidden_size) + 2 * QD + 2 * KD + 2 * size_t(c.intermediate_size) +
                                  size_t(c.vocab_size));
  size_t total = 0;
  if (__builtin_add_overflow(weights, kv_total, &total) || __builtin_add_overflow(total, act, &total))
    return fail("the memory plan for --ctx " + std::to_string(a.ctx) + " x --seqs " + std::to_string(a.seqs) +
                " is more than 64-bit memory can address: lower --ctx or --seqs");
  // The GPU plan (CUDA backend: bf16 activations, F32 logits, the preflight's 256 MiB margin) against
  // the first GPU's free memory, and the longest context that fits beside the weights.
  std::string gpu_name;
  size_t gpu_free = 0, gpu_total = 0, gpu_need = 0;
  int64_t gpu_fit_ctx = 0;
#ifdef ANVIL_HAVE_CUDA
  {
    std::string err;
    auto devs = cuda::list_devices(&err);
    if (!devs.empty() && cuda_memory_info(0, &gpu_free, &gpu_total).is_ok()) {
      gpu_name = devs[0].name;
      const int gpu_batch = default_batch(true, a.seqs);
      const size_t act_gpu =
          size_t(gpu_batch) * 2 * (3 * size_t(c.hidden_size) + 2 * QD + 2 * KD + 2 * size_t(c.intermediate_size)) +
          size_t(logit_rows_for(gpu_batch, a.seqs)) * 4 * size_t(c.vocab_size);
      const size_t margin = size_t(256) << 20;
      const size_t kv_gpu_per_token = kv_per_token / kv_elem * 2 * size_t(a.seqs);
      // In long double: the bf16 KV of an absurd context only has to compare as "does NOT fit".
      const long double need = (long double)weights + (long double)kv_gpu_per_token * a.ctx + act_gpu + margin;
      gpu_need = need >= 18446744073709551615.0L ? SIZE_MAX : size_t(need);
      const double room = double(gpu_free) - double(weights + act_gpu + margin);
      gpu_fit_ctx = room > 0 ? int64_t(room / double(kv_gpu_per_token)) : 0;
    }
  }
#endif
  if (a.json) {
    nlohmann::ordered_json j;
    j["source"] = (*m)->source;
    j["architecture"] = arch_name(c.arch);
    j["layers"] = c.num_hidden_layers;
    j["hidden_size"] = c.hidden_size;
    j["heads"] = c.num_attention_heads;
    j["kv_heads"] = c.num_key_value_heads;
    j["head_dim"] = c.head_dim;
    j["intermediate_size"] = c.intermediate_size;
    j["vocab_size"] = c.vocab_size;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nlohmann::ordered_json();
    j["rotary_dim"] = c.rotary_dim > 0 ? c.rotary_dim : c.head_dim;
    // RoPE scaling as the engine runs it at --ctx (LongRoPE: which factors), null for none.
    if (c.rope_scaling.type.empty() || c.rope_scaling.type == "default") {
      j["rope_scaling"] = nullptr;
    } else {
      j["rope_scaling"] = {{"type", c.rope_scaling.type}};
      if (c.rope_scaling.type == "longrope")
        j["rope_scaling"]["factors"] = rope_ctx > c.rope_scaling.original_max_position_embeddings ? "long" : "short";
    }
    j["tied_embeddings"] = w.tied;
    j["parameters"] = w.parameter_count();
    j["active_parameters"] = w.active_parameter_count();
    if (c.is_moe()) {
      int moe_layers = 0;
      for (int l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe_layer(l);
      j["moe"] = {{"experts", c.num_experts}, {"experts_per_token", c.num_experts_per_tok},
                  {"expert_intermediate_size", c.moe_intermediate_size},
                  {"shared_expert_intermediate_size", c.shared_expert_intermediate_size},
                  {"norm_topk_prob", c.norm_topk_prob}, {"moe_layers", moe_layers}};
    }
    j["formats"] = {{"embed", quant_desc(w.embed)}, {"lm_head", quant_desc(w.lm_head)},
                    {"layers", formats_json(layer_formats)}};
    if (c.is_moe()) {
      j["formats"]["experts"] = formats_json(expert_formats);
      j["formats"]["router"] = formats_json(router_formats);
    }
    j["weight_bytes"] = weights;
    j["bytes_per_token"] = per_token;
    j["kv_bytes_per_token"] = kv_per_token;
    j["memory_plan"] = {{"context", a.ctx}, {"sequences", a.seqs}, {"weights", weights},
                        {"kv_cache", kv_total}, {"activations", act}, {"total", total}};
    if (!gpu_name.empty())
      j["gpu_plan"] = {{"device", gpu_name}, {"needed", gpu_need}, {"free", gpu_free}, {"total", gpu_total},
                       {"fits", gpu_need <= gpu_free}, {"max_context", gpu_fit_ctx}};
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model            %s\n", (*m)->source.c_str());
  std::printf("architecture     %s (model_type %s)\n", arch_name(c.arch), c.model_type.c_str());
  std::printf("layers           %d, hidden %d, heads %d / kv heads %d, head dim %d, ffn %d, vocab %d\n",
              c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
              c.intermediate_size, c.vocab_size);
  std::printf("features         %s%s%s%s%s%s\n", c.qk_norm ? "q/k-norm " : c.qk_norm_full ? "q/k-norm(whole projection) " : "", c.attention_bias ? "qkv-bias " : "",
              c.rotary_dim > 0 ? ("partial-rotary " + std::to_string(c.rotary_dim) + "/" + std::to_string(c.head_dim) + " ").c_str() : "",
              c.rope_scaling.type.empty() ? ""
              : c.rope_scaling.type == "longrope"
                  ? ("rope-longrope (" + std::string(rope_ctx > c.rope_scaling.original_max_position_embeddings ? "long" : "short") +
                     " factors at --ctx " + std::to_string(rope_ctx) + "; long past " +
                     std::to_string(c.rope_scaling.original_max_position_embeddings) + ") ").c_str()
                  : ("rope-" + c.rope_scaling.type + " ").c_str(),
              c.sliding_window > 0 ? ("sliding-window " + std::to_string(c.sliding_window) + " ").c_str() : "",
              w.tied ? "tied-embeddings" : "separate-lm-head");
  const std::string layers_desc = formats_desc(layer_formats);
  std::printf("weights          embed %s, layers %s, lm_head %s\n", quant_desc(w.embed).c_str(), layers_desc.c_str(),
              quant_desc(w.lm_head).c_str());
  if (c.is_moe()) {
    int moe_layers = 0;
    for (int l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.is_moe_layer(l);
    std::printf("experts          %d per MoE layer (%d of %d layers), %d per token, width %d%s%s; experts %s; "
                "router %s\n",
                c.num_experts, moe_layers, c.num_hidden_layers, c.num_experts_per_tok, c.moe_intermediate_size,
                c.norm_topk_prob ? ", top-k renormalized" : "",
                c.shared_expert_intermediate_size
                    ? (", shared expert " + std::to_string(c.shared_expert_intermediate_size)).c_str()
                    : "",
                formats_desc(expert_formats).c_str(), formats_desc(router_formats).c_str());
  }
  std::printf("parameters       %.3f M total, %.3f M active per token\n", w.parameter_count() / 1e6,
              w.active_parameter_count() / 1e6);
  std::printf("weight bytes     %s\n", human(double(weights)).c_str());
  std::printf("bytes per token  %s read per decoded token (weights; + KV %s per token of context)\n",
              human(double(per_token)).c_str(), human(double(kv_per_token)).c_str());
  std::printf("KV per token     %s (%s, %d layers x %d kv heads x %d x K,V)\n", human(double(kv_per_token)).c_str(),
              a.kv_dtype.c_str(), c.num_hidden_layers, c.num_key_value_heads, c.head_dim);
  std::printf("memory plan      context %d x %d sequence(s): weights %s + KV %s + activations %s = %s\n", a.ctx,
              a.seqs, human(double(weights)).c_str(), human(double(kv_total)).c_str(), human(double(act)).c_str(),
              human(double(total)).c_str());
  if (!gpu_name.empty())
    std::printf("GPU plan         %s: needs %s (bf16 KV, %d x %d), %s free of %s: %s; longest context that fits: %lld\n",
                gpu_name.c_str(), human(double(gpu_need)).c_str(), a.ctx, a.seqs, human(double(gpu_free)).c_str(),
                human(double(gpu_total)).c_str(), gpu_need <= gpu_free ? "fits" : "does NOT fit",
                (long long)gpu_fit_ctx);
  return 0;
}

Command reg("inspect", "Show a model's architecture, size, bytes per token and a memory plan", 40,
            [](CLI::App& app) -> std::function<int()> {
              auto a = std::make_shared<InspectArgs>();
              app.add_option("-m,--model", a->model, "Model directory or Hugging Face repo id in the local cache");
              add_revision_option(app, a->revision);
              app.add_option("--synthetic", a->synthetic, "A synthetic shape NAME[:QUANT] instead of -m");
              add_int_option(app, "-c,--ctx", a->ctx, "Context length for the memory plan", 1, INT32_MAX)
                  ->default_str(std::to_string(a->ctx))
                  ->each([a](const std::string&) { a->ctx_given = true; });
              add_int_option(app, "--seqs", a->seqs, "Concurrent sequences for the memory plan, 1 to 65536", 1, 65536)
                  ->default_str(std::to_string(a->seqs));
              app.add_option("--kv-dtype", a->kv_dtype, "KV cache element type: bf16 or f32")->capture_default_str();
              app.add_flag("--json", a->json, "Print JSON");
              return [a] { return run_inspect(*a); };
            });

}  // namespace
}  // namespace anvil::cli
