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
#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "format/model_config.h"
#include "model/weights.h"

namespace anvil {

class Transformer {
 public:
  // `weights` must already live on `backend` (upload_weights); the transformer owns them from here and
  // frees them with itself. max_tokens bounds one forward() call's batch, max_logit_rows (0: max_tokens)
  // the rows of one call that want logits (its fp32 [rows, vocab] scratch: 1.2 GB for 2048 rows of a
  // 152k vocabulary, so a server sizes it by its sequences instead).
  static Result<std::unique_ptr<Transformer>> create(const ModelConfig& cfg, ModelWeights weights, Backend& backend,
                                                     int max_tokens, int max_logit_rows = 0);
  ~Transformer();

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  Backend& backend() { return backend_; }
  int max_tokens() const { return max_tokens_; }
  int max_logit_rows() const { return max_logit_rows_; }

  // Runs the batch; token ids ids[t] (host memory). Writes float32 logits [logit_rows.size(), vocab]
  // to `logits` for the batch rows listed in logit_rows (host memory, ascending).
  // `batch` pointers must be readable by the backend.
  Status forward(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                 const std::vector<int>& logit_rows, float* logits);
  // The same forward pass, sampling greedily on the backend: out_ids[i] (host) = argmax of logit
  // row logit_rows[i], never a token of `suppress`; only the ids come back, not the logits. Where the
  // backend supports graphs, a decode-shaped batch (every row wants logits) runs as one graph per
  // batch shape, captured on first use and replayed after (ANVIL_NO_GRAPH=1 turns that off).
  Status forward_greedy(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                        const std::vector<int>& logit_rows, std::span<const int32_t> suppress, int32_t* out_ids);
  // The same again with the full sampler on the backend (Backend::sample_rows, issue 9): out_ids[i]
  // is the token row logit_rows[i] samples with args.params[i] (device memory, as are args' buffers;
  // args.suppress/n_suppress are replaced by `suppress`, like forward_greedy's). Graphs as above.
  // host_rows (ascending indices i into logit_rows) lists the rows whose args.params flags say
  // kSampleRowSkip: their logits, as the model gave them, are copied to host_logits
  // ([host_rows.size(), vocab] F32, host memory), and out_ids[i] is -1; only those rows' logits
  // leave the backend (adjacent rows in one copy).
  Status forward_sample(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                        const std::vector<int>& logit_rows, std::span<const int32_t> suppress, const SampleArgs& args,
                        int32_t* out_ids, std::span<const int> host_rows = {}, float* host_logits = nullptr);
  // Graphs captured so far (0 without graph support).
  int graphs_captured() const { return int(graph_keys_.size()); }
  // Whether one-sequence decode tokens run every layer in one backend launch (decode_layers).
  bool decodes_layers_in_one_launch() const { return decode_layers_ >= 0; }
  // When the last forward call began issuing its kernels (its inputs uploaded; a graph launch or the
  // first op next). On a GPU the device idles from the end of the previous step until about then,
  // so the time from a step's start to this is host work the device waits through (Engine::step's
  // last_step_prep_ns). On the CPU backend the ops run as they are issued, after this point too.
  std::chrono::steady_clock::time_point last_issue() const { return last_issue_; }

 private:
  Transformer(const ModelConfig& cfg, ModelWeights w, Backend& backend, int max_tokens);
  Status alloc_scratch();
  Status check_batch(const int32_t* ids, const BatchView& batch, const std::vector<int>& logit_rows) const;
  // Enqueues the layers for the ids already in ids_dev_: the residual stream ends in h_.
  void run_layers(const BatchView& batch, const KVCacheView& kv);
  // Enqueues final norm + lm_head for the logit rows (gathered through rows_dev_ unless `identity`):
  // returns the F32 logits [R, vocab].
  Act run_head(int T, int R, bool identity);
  // forward_greedy (sample == nullptr) and forward_sample.
  Status forward_on_device(const int32_t* ids, const BatchView& batch, const KVCacheView& kv,
                           const std::vector<int>& logit_rows, std::span<const int32_t> suppress,
                           const SampleArgs* sample, int32_t* out_ids, std::span<const int> host_rows = {},
                           float* host_logits = nullptr);
  Act act(void* p, int64_t rows, int64_t cols) const { return Act{p, rows, cols, backend_.act_dtype()}; }

  ModelConfig cfg_;
  ModelWeights w_;
  std::chrono::steady_clock::time_point last_issue_{};
  Backend& backend_;
  int max_tokens_;
  int max_logit_rows_;
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
  void* logits_ = nullptr;  // [max_logit_rows, vocab] F32
  int32_t* rows_dev_ = nullptr;     // [T] logit rows
  int decode_layers_ = -1;  // Backend::prepare_decode_layers's handle (-1: op by op)
  int32_t* out_ids_dev_ = nullptr;  // [T] sampled ids
  int32_t* suppress_dev_ = nullptr; // [kMaxSuppress]
  std::vector<int32_t> suppress_host_;  // what suppress_dev_ holds
  std::vector<uint64_t> graph_keys_;
  static constexpr int kMaxSuppress = 64;
  std::vector<void*> owned_;
};

}  // namespace anvil
