// The dense decoder-only transformer shared by the qwen3, qwen2 and llama families, written once
// against the backend op set. Per-family differences are data, not code paths:
//   qwen3: per-head q/k RMSNorm before RoPE;  qwen2: q/k/v biases;  llama: llama3 RoPE scaling;
//   mixture of experts (qwen3_moe, qwen2_moe, olmoe, mixtral): the MLP of an MoE layer is one moe_ffn op;
//   olmoe: q/k RMSNorm over the whole projection (an rmsnorm op on q and k) before RoPE.
//
// One forward() call runs a flat batch of tokens that may mix sequences and mix prefill chunks with
// decode tokens (see BatchView). Per layer:
//   x = rmsnorm(h) -> q,k,v = linear -> qk_norm+rope+kv_append -> attention -> o = linear
//   h += o; x = rmsnorm(h) -> gate,up = linear -> swiglu -> down = linear; h += down
// then the final norm and the lm_head on the rows that want logits.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "format/model_config.h"
#include "model/weights.h"

namespace anvil {

class Transformer {
 public:
  // `weights` must already live on `backend`. max_tokens bounds one forward() call's batch.
  static Result<std::unique_ptr<Transformer>> create(const ModelConfig& cfg, ModelWeights weights, Backend& backend,
                                                     int max_tokens);
  ~Transformer();

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  Backend& backend() { return backend_; }
  int max_tokens() const { return max_tokens_; }

  // Runs the batch; token ids ids[t] (host memory). Writes float32 logits [logit_rows.size(), vocab]
  // to `logits` for the batch rows listed in logit_rows (host memory, ascending).
  // `batch` pointers must be readable by the backend.
  Status forward(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                 const std::vector<int>& logit_rows, float* logits);

 private:
  Transformer(const ModelConfig& cfg, ModelWeights w, Backend& backend, int max_tokens);
  Status alloc_scratch();
  Act act(void* p, int64_t rows, int64_t cols) const { return Act{p, rows, cols, backend_.act_dtype()}; }

  ModelConfig cfg_;
  ModelWeights w_;
  Backend& backend_;
  int max_tokens_;
  std::vector<float> inv_freq_host_;
  float* inv_freq_ = nullptr;  // on the backend
  int32_t* ids_dev_ = nullptr;
  // Scratch activations, each sized for max_tokens rows.
  void* h_ = nullptr;     // [T, hidden] residual stream
  void* x_ = nullptr;     // [T, hidden] normed input of a sublayer
  void* q_ = nullptr;     // [T, heads*head_dim]
  void* k_ = nullptr;     // [T, kv_heads*head_dim]
  void* v_ = nullptr;     // [T, kv_heads*head_dim]
  void* attn_ = nullptr;  // [T, heads*head_dim]
  void* o_ = nullptr;     // [T, hidden]
  void* gate_ = nullptr;  // [T, ffn]
  void* up_ = nullptr;    // [T, ffn]
  void* logits_ = nullptr;  // [T, vocab]
  std::vector<void*> owned_;
};

}  // namespace anvil
