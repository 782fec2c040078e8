#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "model/rope.h"

namespace anvil {

Transformer::Transformer(const ModelConfig& cfg, ModelWeights w, Backend& backend, int max_tokens)
    : cfg_(cfg), w_(std::move(w)), backend_(backend), max_tokens_(max_tokens), max_logit_rows_(max_tokens) {}

Transformer::~Transformer() {
  for (void* p : owned_) backend_.free(p);
  free_weights(w_, backend_);
}

Result<std::unique_ptr<Transformer>> Transformer::create(const ModelConfig& cfg, ModelWeights weights,
                                                         Backend& backend, int max_tokens, int max_logit_rows) {
  if (max_tokens <= 0) return invalid_argument("max batch tokens must be positive");
  if (max_logit_rows < 0) return invalid_argument("max logit rows must be >= 0");
  if (cfg.is_moe() && !backend.has_moe_ffn())
    return unsupported("the " + backend.name() + " backend cannot run mixture-of-experts models (" +
                       cfg.model_type + ") yet");
  if (const std::string why =
          backend.attention_unsupported(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rotary_dim);
      !why.empty())
    return unsupported("the " + backend.name() + " backend cannot run this model's attention: " + why);
  std::unique_ptr<Transformer> t(new Transformer(cfg, std::move(weights), backend, max_tokens));
  if (max_logit_rows > 0) t->max_logit_rows_ = std::min(max_logit_rows, max_tokens);
  ANVIL_RETURN_IF_ERROR(t->alloc_scratch());
  if (!cfg.is_moe() && !cfg.qk_norm_full && rotary_dims(cfg) == cfg.head_dim) {  // (the kernel turns whole heads)
    std::vector<Backend::DenseLayerView> views;
    for (const LayerWeights& lw : t->w_.layers) {
      Backend::DenseLayerView v;
      v.attn_norm = &lw.attn_norm, v.ffn_norm = &lw.ffn_norm, v.q_norm = &lw.q_norm, v.k_norm = &lw.k_norm;
      v.q = &lw.q, v.k = &lw.k, v.v = &lw.v, v.o = &lw.o, v.gate = &lw.gate, v.up = &lw.up, v.down = &lw.down;
      views.push_back(v);
    }
    t->decode_layers_ = backend.prepare_decode_layers(views, cfg.num_attention_heads, cfg.num_key_value_heads,
                                                      cfg.head_dim);
  }
  return t;
}

Status Transformer::alloc_scratch() {
  const size_t es = dtype_size(backend_.act_dtype());
  const size_t T = size_t(max_tokens_);
  auto get = [&](void** p, size_t bytes) -> Status {
    ANVIL_ASSIGN_OR_RETURN(*p, backend_.alloc(bytes));
    owned_.push_back(*p);
    return Status::ok();
  };
  const size_t H = cfg_.hidden_size, QD = size_t(cfg_.num_attention_heads) * cfg_.head_dim,
               KD = size_t(cfg_.num_key_value_heads) * cfg_.head_dim, F = cfg_.intermediate_size,
               V = cfg_.vocab_size;
  ANVIL_RETURN_IF_ERROR(get(&h_, T * H * es));
  ANVIL_RETURN_IF_ERROR(get(&x_, T * H * es));
  ANVIL_RETURN_IF_ERROR(get(&q_, T * QD * es));
  ANVIL_RETURN_IF_ERROR(get(&k_, T * KD * es));
  ANVIL_RETURN_IF_ERROR(get(&v_, T * KD * es));
  ANVIL_RETURN_IF_ERROR(get(&attn_, T * QD * es));
  ANVIL_RETURN_IF_ERROR(get(&o_, T * H * es));
  ANVIL_RETURN_IF_ERROR(get(&gate_, T * F * es));
  ANVIL_RETURN_IF_ERROR(get(&up_, T * F * es));
  ANVIL_RETURN_IF_ERROR(get(&logits_, size_t(max_logit_rows_) * V * sizeof(float)));  // F32 on every backend
  void* p;
  ANVIL_RETURN_IF_ERROR(get(&p, T * sizeof(int32_t)));
  ids_dev_ = static_cast<int32_t*>(p);
  ANVIL_RETURN_IF_ERROR(get(&p, T * sizeof(int32_t)));
  rows_dev_ = static_cast<int32_t*>(p);
  ANVIL_RETURN_IF_ERROR(get(&p, T * sizeof(int32_t)));
  out_ids_dev_ = static_cast<int32_t*>(p);
  ANVIL_RETURN_IF_ERROR(get(&p, kMaxSuppress * sizeof(int32_t)));
  suppress_dev_ = static_cast<int32_t*>(p);
  inv_freq_host_ = rope_inv_freq(cfg_);
  ANVIL_RETURN_IF_ERROR(get(&p, inv_freq_host_.size() * sizeof(float)));
  inv_freq_ = static_cast<float*>(p);
  backend_.copy_to_device(inv_freq_, inv_freq_host_.data(), inv_freq_host_.size() * sizeof(float));
  return Status::ok();
}

Status Transformer::check_batch(const int32_t* ids, const BatchView& batch, const std::vector<int>& logit_rows) const {
  const int T = batch.n_tokens;
  if (T <= 0 || T > max_tokens_)
    return invalid_argument("forward: batch of " + std::to_string(T) + " tokens; expected 1.." +
                            std::to_string(max_tokens_));
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= cfg_.vocab_size)
      return invalid_argument("token id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                              std::to_string(cfg_.vocab_size) + ")");
  for (int r : logit_rows)
    if (r < 0 || r >= T) return invalid_argument("forward: logit row out of range");
  if (int(logit_rows.size()) > max_logit_rows_)
    return invalid_argument("forward: logits for " + std::to_string(logit_rows.size()) + " rows; at most " +
                            std::to_string(max_logit_rows_) + " per call");
  return Status::ok();
}

void Transformer::run_layers(const BatchView& batch, const KVCacheView& kv) {
  const int T = batch.n_tokens;
  const int64_t H = cfg_.hidden_size, QD = int64_t(cfg_.num_attention_heads) * cfg_.head_dim,
                KD = int64_t(cfg_.num_key_value_heads) * cfg_.head_dim, F = cfg_.intermediate_size;
  const float eps = float(cfg_.rms_norm_eps);
  const float scale = attention_softmax_scale(cfg_);
  Backend& be = backend_;
  Act h = act(h_, T, H), x = act(x_, T, H), q = act(q_, T, QD), k = act(k_, T, KD), v = act(v_, T, KD),
      attn = act(attn_, T, QD), o = act(o_, T, H), gate = act(gate_, T, F);

  be.embed(w_.embed, ids_dev_, h);
  if (T == 1 && batch.n_seqs == 1 && decode_layers_ >= 0 &&
      be.decode_layers(decode_layers_, h, eps, inv_freq_, kv, batch, scale))
    return;
  // `pending`: o holds the previous sublayer's output, not yet added to h (the plain path fuses
  // that add into the next norm; the fused path adds it in the output projection's kernel).
  bool pending = false;
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    const WeightMatrix* all_w[7] = {&lw.q, &lw.k, &lw.v, &lw.o, &lw.gate, &lw.up, &lw.down};
    const bool fused = !lw.moe && be.fuses_norm_linear(T, all_w);
    const WeightMatrix* qkv_w[3] = {&lw.q, &lw.k, &lw.v};
    const Act qkv_out[3] = {q, k, v};
    const WeightVector none{};  // per-head q/k norms (Qwen3), or none
    const WeightVector& q_norm = cfg_.qk_norm_full ? none : lw.q_norm;
    const WeightVector& k_norm = cfg_.qk_norm_full ? none : lw.k_norm;
    // The q/k norms, RoPE and the K/V append inside the q/k/v launch (fuses_qkv_rope; not with
    // OLMoE's whole-projection norms, which come between the projections and RoPE).
    const bool qkv_rope = !cfg_.qk_norm_full && be.fuses_qkv_rope(T, kv, qkv_w);
    // Attention sublayer.
    if (fused) {
      if (pending) be.add(h, o);
      pending = false;
      if (qkv_rope)
        be.linear_qkv_rope(h, &lw.attn_norm, eps, x, qkv_w, qkv_out, q_norm, k_norm, inv_freq_, kv, l, batch);
      else
        be.rmsnorm_linear_multi(h, lw.attn_norm, eps, x, qkv_w, qkv_out);
    } else {
      if (pending) be.add_rmsnorm(h, o, lw.attn_norm, eps, x);
      else be.rmsnorm(h, lw.attn_norm, eps, x);
      if (qkv_rope) be.linear_qkv_rope(x, nullptr, eps, x, qkv_w, qkv_out, q_norm, k_norm, inv_freq_, kv, l, batch);
      else be.linear_multi(x, qkv_w, qkv_out);
    }
    if (cfg_.qk_norm_full) {  // olmoe: RMSNorm over the whole q and k projections (in place), then RoPE
      be.rmsnorm(q, lw.q_norm, eps, q);
      be.rmsnorm(k, lw.k_norm, eps, k);
    }
    if (!lw.moe) {  // the sublayer's next matrices, which a backend may fetch during attention
      const WeightMatrix* next[3] = {&lw.o, &lw.gate, &lw.up};
      be.prefetch_weights(T, next, Backend::PrefetchWindow::kAttention);
    }
    if (qkv_rope) be.attention(q, kv, l, batch, scale, attn);
    else be.rope_attention(q, k, v, q_norm, k_norm, eps, inv_freq_, kv, l, batch, scale, attn);
    // MLP sublayer.
    if (fused) {
      be.linear_add(attn, lw.o, h, o);
      be.rmsnorm_linear_swiglu(h, lw.ffn_norm, eps, x, lw.gate, lw.up, gate);
      be.linear_add(gate, lw.down, h, o);
      continue;
    }
    be.linear(attn, lw.o, o);
    be.add_rmsnorm(h, o, lw.ffn_norm, eps, x);
    pending = true;
    if (lw.moe) {  // mixture of experts: routing, the chosen experts and their weighted sum in one op
      be.moe_ffn(x, lw.experts, o);
      continue;
    }
    be.linear_swiglu(x, lw.gate, lw.up, gate);
    const WeightMatrix* down[1] = {&lw.down};
    be.prefetch_weights(T, down, Backend::PrefetchWindow::kMlp);
    be.linear(gate, lw.down, o);
  }
  if (pending) be.add(h, o);
}

Act Transformer::run_head(int T, int R, bool identity) {
  Backend& be = backend_;
  const int64_t H = cfg_.hidden_size;
  // Final norm and lm_head only on the rows that want logits, gathered to the front (o is free now).
  Act hs = act(h_, R, H);
  if (!identity) {
    hs = act(o_, R, H);
    be.gather_rows(act(h_, T, H), rows_dev_, hs);
  }
  Act xs = act(x_, R, H);
  be.rmsnorm(hs, w_.final_norm, float(cfg_.rms_norm_eps), xs);
  Act lg{logits_, R, cfg_.vocab_size, DType::kF32};
  be.linear(xs, w_.lm_head, lg);
  return lg;
}

static bool is_identity(const std::vector<int>& rows) {
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i] != int(i)) return false;
  return true;
}

Status Transformer::forward(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                            const std::vector<int>& logit_rows, float* logits) {
  ANVIL_RETURN_IF_ERROR(check_batch(ids, batch, logit_rows));
  const int T = batch.n_tokens, R = int(logit_rows.size());
  Backend& be = backend_;
  be.copy_to_device(ids_dev_, ids, size_t(T) * sizeof(int32_t));
  const bool identity = is_identity(logit_rows);
  if (R > 0 && !identity) be.copy_to_device(rows_dev_, logit_rows.data(), size_t(R) * sizeof(int32_t));
  last_issue_ = std::chrono::steady_clock::now();
  run_layers(batch, kv);
  if (R > 0) be.to_host_f32(run_head(T, R, identity), logits);
  return be.synchronize();
}

Status Transformer::forward_greedy(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                                   const std::vector<int>& logit_rows, std::span<const int32_t> suppress,
                                   int32_t* out_ids) {
  return forward_on_device(ids, batch, kv, logit_rows, suppress, nullptr, out_ids);
}

Status Transformer::forward_sample(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                                   const std::vector<int>& logit_rows, std::span<const int32_t> suppress,
                                   const SampleArgs& args, int32_t* out_ids, std::span<const int> host_rows,
                                   float* host_logits) {
  if (!backend_.has_sample_rows()) return unsupported("the " + backend_.name() + " backend has no device sampler");
  return forward_on_device(ids, batch, kv, logit_rows, suppress, &args, out_ids, host_rows, host_logits);
}

Status Transformer::forward_on_device(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                                      const std::vector<int>& logit_rows, std::span<const int32_t> suppress,
                                      const SampleArgs* sample, int32_t* out_ids, std::span<const int> host_rows,
                                      float* host_logits) {
  ANVIL_RETURN_IF_ERROR(check_batch(ids, batch, logit_rows));
  if (suppress.size() > size_t(kMaxSuppress))
    return invalid_argument("forward_greedy: at most " + std::to_string(kMaxSuppress) + " suppressed tokens");
  const int T = batch.n_tokens, R = int(logit_rows.size());
  if (R == 0) return invalid_argument("forward_greedy: no logit rows");
  if (!host_rows.empty() && (!sample || !host_logits))
    return invalid_argument("forward_sample: host rows need the sampler and a host logits buffer");
  for (size_t i = 0; i < host_rows.size(); ++i)
    if (host_rows[i] < 0 || host_rows[i] >= R || (i > 0 && host_rows[i] <= host_rows[i - 1]))
      return invalid_argument("forward_sample: host rows must be ascending logit rows below " + std::to_string(R));
  SampleArgs sa;
  if (sample) {
    sa = *sample;
    sa.suppress = suppress_dev_;
    sa.n_suppress = int(suppress.size());
  }
  Backend& be = backend_;
  // Inputs first, outside any graph: a replay reads these buffers.
  be.copy_to_device(ids_dev_, ids, size_t(T) * sizeof(int32_t));
  const bool identity = is_identity(logit_rows);
  if (!identity) be.copy_to_device(rows_dev_, logit_rows.data(), size_t(R) * sizeof(int32_t));
  if (!std::equal(suppress.begin(), suppress.end(), suppress_host_.begin(), suppress_host_.end())) {
    suppress_host_.assign(suppress.begin(), suppress.end());
    if (!suppress.empty()) be.copy_to_device(suppress_dev_, suppress.data(), suppress.size() * sizeof(int32_t));
  }
  auto body = [&] {
    run_layers(batch, kv);
    if (sample) be.sample_rows(run_head(T, R, identity), sa, out_ids_dev_);
    else be.argmax_rows(run_head(T, R, identity), suppress_dev_, int(suppress.size()), out_ids_dev_);
  };
  last_issue_ = std::chrono::steady_clock::now();
  const char* no_graph = std::getenv("ANVIL_NO_GRAPH");
  const bool use_graph = be.graphs_supported() && identity && R == T && !(no_graph && *no_graph && *no_graph != '0');
  if (use_graph) {
    // Everything a replay depends on: the launch shapes and the addresses the kernels read.
    const uint64_t parts[] = {uint64_t(T), uint64_t(batch.n_seqs), uint64_t(batch.max_pages),
                              uint64_t(reinterpret_cast<uintptr_t>(kv.base)), uint64_t(kv.n_pages),
                              uint64_t(reinterpret_cast<uintptr_t>(batch.pos)),
                              uint64_t(reinterpret_cast<uintptr_t>(batch.seq)),
                              uint64_t(reinterpret_cast<uintptr_t>(batch.page_table)), uint64_t(suppress.size()),
                              // the sampler's buffers (0 for greedy): a different set is a different graph
                              uint64_t(reinterpret_cast<uintptr_t>(sa.params)), uint64_t(reinterpret_cast<uintptr_t>(sa.counts)),
                              uint64_t(reinterpret_cast<uintptr_t>(sa.updates)),
                              uint64_t(reinterpret_cast<uintptr_t>(sa.update_offsets)),
                              uint64_t(reinterpret_cast<uintptr_t>(sa.scratch)),
                              uint64_t(reinterpret_cast<uintptr_t>(sa.bias_offsets)),
                              uint64_t(reinterpret_cast<uintptr_t>(sa.bias_ids)),
                              uint64_t(reinterpret_cast<uintptr_t>(sa.bias_values))};
    uint64_t key = 1469598103934665603ull;
    for (uint64_t p : parts) key = (key ^ p) * 1099511628211ull;
    if (!be.graph_launch(key)) {
      ANVIL_RETURN_IF_ERROR(be.graph_capture_begin());
      body();
      ANVIL_RETURN_IF_ERROR(be.graph_capture_end(key));
      graph_keys_.push_back(key);
      if (!be.graph_launch(key)) return internal_error("forward_greedy: captured graph did not launch");
    }
  } else {
    body();
  }
  // The host rows' logits, which sample_rows left as the head wrote them: each run of adjacent rows
  // in one copy, and no other row.
  const size_t V = size_t(cfg_.vocab_size);
  for (size_t i = 0; i < host_rows.size();) {
    size_t j = i + 1;
    while (j < host_rows.size() && host_rows[j] == host_rows[j - 1] + 1) ++j;
    be.copy_to_host(host_logits + i * V, static_cast<const float*>(logits_) + size_t(host_rows[i]) * V,
                    (j - i) * V * sizeof(float));
    i = j;
  }
  be.copy_to_host(out_ids, out_ids_dev_, size_t(R) * sizeof(int32_t));
  return be.synchronize();
}

}  // namespace anvil
