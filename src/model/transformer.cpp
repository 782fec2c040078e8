#include "model/transformer.h"

#include <cmath>
#include <cstring>

#include "model/rope.h"

namespace anvil {

Transformer::Transformer(const ModelConfig& cfg, ModelWeights w, Backend& backend, int max_tokens)
    : cfg_(cfg), w_(std::move(w)), backend_(backend), max_tokens_(max_tokens) {}

Transformer::~Transformer() {
  for (void* p : owned_) backend_.free(p);
}

Result<std::unique_ptr<Transformer>> Transformer::create(const ModelConfig& cfg, ModelWeights weights,
                                                         Backend& backend, int max_tokens) {
  if (max_tokens <= 0) return invalid_argument("max batch tokens must be positive");
  if (cfg.is_moe() && !backend.has_moe_ffn())
    return unsupported("the " + backend.name() + " backend cannot run mixture-of-experts models (" +
                       cfg.model_type + ") yet");
  std::unique_ptr<Transformer> t(new Transformer(cfg, std::move(weights), backend, max_tokens));
  ANVIL_RETURN_IF_ERROR(t->alloc_scratch());
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
  ANVIL_RETURN_IF_ERROR(get(&logits_, T * V * es));
  void* p;
  ANVIL_RETURN_IF_ERROR(get(&p, T * sizeof(int32_t)));
  ids_dev_ = static_cast<int32_t*>(p);
  inv_freq_host_ = rope_inv_freq(cfg_);
  ANVIL_RETURN_IF_ERROR(get(&p, inv_freq_host_.size() * sizeof(float)));
  inv_freq_ = static_cast<float*>(p);
  backend_.copy_to_device(inv_freq_, inv_freq_host_.data(), inv_freq_host_.size() * sizeof(float));
  return Status::ok();
}

Status Transformer::forward(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                            const std::vector<int>& logit_rows, float* logits) {
  const int T = batch.n_tokens;
  if (T <= 0 || T > max_tokens_)
    return invalid_argument("forward: batch of " + std::to_string(T) + " tokens; expected 1.." +
                            std::to_string(max_tokens_));
  for (int t = 0; t < T; ++t)
    if (ids[t] < 0 || ids[t] >= cfg_.vocab_size)
      return invalid_argument("token id " + std::to_string(ids[t]) + " is outside the vocabulary [0, " +
                              std::to_string(cfg_.vocab_size) + ")");
  const int64_t H = cfg_.hidden_size, QD = int64_t(cfg_.num_attention_heads) * cfg_.head_dim,
                KD = int64_t(cfg_.num_key_value_heads) * cfg_.head_dim, F = cfg_.intermediate_size;
  const float eps = float(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(float(cfg_.head_dim));
  Backend& be = backend_;

  be.copy_to_device(ids_dev_, ids, size_t(T) * sizeof(int32_t));
  Act h = act(h_, T, H), x = act(x_, T, H), q = act(q_, T, QD), k = act(k_, T, KD), v = act(v_, T, KD),
      attn = act(attn_, T, QD), o = act(o_, T, H), gate = act(gate_, T, F), up = act(up_, T, F);

  be.embed(w_.embed, ids_dev_, h);
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerWeights& lw = w_.layers[l];
    // Attention sublayer. For l > 0 the residual add of the previous MLP is fused into the norm.
    if (l == 0) be.rmsnorm(h, lw.attn_norm, eps, x);
    else be.add_rmsnorm(h, o, lw.attn_norm, eps, x);
    be.linear(x, lw.q, q);
    be.linear(x, lw.k, k);
    be.linear(x, lw.v, v);
    if (cfg_.qk_norm_full) {  // olmoe: RMSNorm over the whole q and k projections (in place), then RoPE
      be.rmsnorm(q, lw.q_norm, eps, q);
      be.rmsnorm(k, lw.k_norm, eps, k);
      be.qk_norm_rope_kv_append(q, k, v, WeightVector{}, WeightVector{}, eps, inv_freq_, kv, l, batch);
    } else {
      be.qk_norm_rope_kv_append(q, k, v, lw.q_norm, lw.k_norm, eps, inv_freq_, kv, l, batch);
    }
    be.attention(q, kv, l, batch, scale, attn);
    be.linear(attn, lw.o, o);
    // MLP sublayer.
    be.add_rmsnorm(h, o, lw.ffn_norm, eps, x);
    if (lw.moe) {  // mixture of experts: routing, the chosen experts and their weighted sum in one op
      be.moe_ffn(x, lw.experts, o);
      continue;
    }
    be.linear(x, lw.gate, gate);
    be.linear(x, lw.up, up);
    be.swiglu(gate, up, gate);
    be.linear(gate, lw.down, o);
  }
  be.add(h, o);
  if (logit_rows.empty()) return Status::ok();

  // Final norm and lm_head only on the rows that want logits: gather them to the front of x.
  const size_t es = dtype_size(be.act_dtype());
  const int R = int(logit_rows.size());
  bool identity = true;
  for (int i = 0; i < R; ++i) identity &= logit_rows[i] == i;
  Act hs = h.slice_rows(0, R);
  if (!identity) {
    for (int i = 0; i < R; ++i) {
      int r = logit_rows[i];
      if (r < 0 || r >= T) return invalid_argument("forward: logit row out of range");
      // o is free now: use it as the gather buffer.
      be.copy_device(static_cast<uint8_t*>(o_) + size_t(i) * H * es,
                          static_cast<uint8_t*>(h_) + size_t(r) * H * es, size_t(H) * es);
    }
    hs = act(o_, R, H);
  }
  Act xs = act(x_, R, H);
  be.rmsnorm(hs, w_.final_norm, eps, xs);
  Act lg = act(logits_, R, cfg_.vocab_size);
  be.linear(xs, w_.lm_head, lg);
  be.to_host_f32(lg, logits);
  return Status::ok();
}

}  // namespace anvil
