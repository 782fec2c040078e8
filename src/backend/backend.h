// The ONLY boundary between the model math and hardware: device buffers plus the op set.
// src/model/ writes each forward pass once against this interface; src/backend/cpu/ is the
// reference implementation every other backend (src/backend/cuda/) is tested against.
//
// Conventions
// - Activations are row-major 2-D tensors [rows, cols] in the backend's act_dtype()
//   (CPU: F32; CUDA: BF16). A batch is a flat list of tokens, one row per token, which may belong
//   to different sequences: prefill and decode, one sequence or many, are the same call.
// - Weights are WeightMatrix / WeightVector views living where the backend can read them
//   (CPU: the mmapped checkpoint; CUDA: device memory after upload_weight()).
// - The KV cache is paged (see KVCacheView): page p holds P consecutive positions of one sequence
//   for all layers, K and V.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/status.h"

namespace anvil {

// A [rows, cols] weight matrix used as y = x W^T (+ bias).
// Dense: `data` is [rows, cols] of `dtype` (F32/F16/BF16).
// MLX affine quantized (bits > 0): `data` is uint32 [rows, cols*bits/32]; each row is a
// little-endian bit stream where element k occupies bits [k*bits, (k+1)*bits);
// `scales` and `biases` are [rows, cols/group_size] of `dtype`; w = scales*q + biases.
struct WeightMatrix {
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kBF16;
  int bits = 0;
  int group_size = 0;
  const void* data = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  const void* bias = nullptr;  // optional [rows] of bias_dtype
  DType bias_dtype = DType::kBF16;

  bool quantized() const { return bits != 0; }
  // Bytes read by one full pass over the matrix (data + scales + biases + bias).
  size_t bytes() const;
  // Bytes of the (packed) weights, and of each of scales and biases (0 when not quantized).
  size_t data_bytes() const;
  size_t group_bytes() const;
};

struct WeightVector {
  int64_t n = 0;
  DType dtype = DType::kBF16;
  const void* data = nullptr;
};

// ---- mixture of experts (issue 12) ----
// The routed FFN of one MoE layer. Expert e is gate[e], up[e]: [ffn, hidden] and down[e]: [hidden, ffn];
// both checkpoint layouts bind to these per-expert views (MLX stacked switch_mlp tensors are sliced along
// their leading expert dimension, HF per-expert tensors are used as they are), so a backend may re-pack
// them on upload (e.g. into one stacked device buffer with a pointer table) as it likes.
struct MoEWeights {
  int num_experts = 0, top_k = 0;
  bool norm_topk_prob = false;            // renormalize the top-k probabilities to sum to 1
  WeightMatrix router;                    // [num_experts, hidden]; may be quantized at its own bits
  std::vector<WeightMatrix> gate, up, down;
  // qwen2_moe's shared expert (shared_up.rows == 0: none): a dense SwiGLU MLP of every token, scaled by
  // sigmoid(x . shared_gate_w) with shared_gate_w: [1, hidden].
  WeightMatrix shared_gate, shared_up, shared_down, shared_gate_w;
  bool has_shared() const { return shared_up.rows > 0; }
};
// ---- end mixture of experts ----

// An activation tensor [rows, cols], contiguous, in act_dtype().
struct Act {
  void* data = nullptr;
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kF32;
  Act slice_rows(int64_t begin, int64_t count) const {
    Act a = *this;
    a.data = static_cast<uint8_t*>(data) + size_t(begin * cols) * dtype_size(dtype);
    a.rows = count;
    return a;
  }
};

// Where the KV cache lives and how it is laid out. One page stores, for every layer l, K then V:
//   element (page, layer, kv, head, slot, d) at
//   ((((page*n_layers + layer)*2 + kv)*n_kv_heads + head)*page_size + slot)*head_dim + d
// so a page is one contiguous block (the unit the durable store persists), and within it one
// head's page_size K (or V) rows are contiguous: attention for a (token, kv head) streams them.
struct KVCacheView {
  void* base = nullptr;
  DType dtype = DType::kBF16;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  int64_t n_pages = 0;
  // Partial rotary embeddings (Phi-4-mini: 0.75 of each head): RoPE over the first rotary_dim dims
  // of a head only, pairs (i, i + rotary_dim/2), the rest passed through, and the rotated dims
  // multiplied by rope_scale (LongRoPE's / YaRN's attention factor, which cannot go into the softmax
  // scale when only some dims carry it). 0: the whole head (and rope_scale 1). A backend that cannot
  // rotate part of a head refuses the model (Backend::partial_rotary_supported).
  int rotary_dim = 0;
  float rope_scale = 1.0f;
  // Sliding-window attention (Mistral v0.1, Phi-3-mini-4k, ...): a query at position p attends to
  // positions p - window + 1 .. p only, as transformers' and mlx-lm's masks do (0: the whole context).
  // Every layer slides today; window_of is the one place that says which layer does.
  int window = 0;
  int window_of(int /*layer*/) const { return window; }
  size_t page_elems() const { return size_t(n_layers) * 2 * page_size * n_kv_heads * head_dim; }
  size_t page_bytes() const { return page_elems() * dtype_size(dtype); }
};

// Per-token placement of a batch, in memory the backend can read (host for CPU, device for CUDA).
// Token t belongs to sequence seq[t] at absolute position pos[t]; sequence s's pages are
// page_table[s*max_pages + 0 ..]. Attention for token t covers positions 0..pos[t] of its sequence
// (the last KVCacheView::window of them with a window),
// so every token of the batch must be appended (rope_kv_append) before attention runs.
// max_pages is the page table's row stride. The engine keeps it fixed (the most pages one sequence
// can hold) rather than the batch's current maximum, so a captured decode step (graph_*) whose
// kernels were sized from it stays valid from one step to the next.
// pos_host / seq_host mirror pos / seq in host memory (the same values; on the CPU backend the same
// arrays) for backends that plan a launch on the host; the kernels themselves read pos / seq.
struct BatchView {
  int n_tokens = 0;
  int n_seqs = 0;  // rows of page_table; every one has at least one token in the batch (so n_tokens
                   // == n_seqs is a decode step: one token per sequence, at its last position)
  int max_pages = 0;
  const int32_t* pos = nullptr;         // [n_tokens]
  const int32_t* seq = nullptr;         // [n_tokens]
  const int32_t* page_table = nullptr;  // [n_seqs, max_pages]
  const int32_t* pos_host = nullptr;    // [n_tokens], host
  const int32_t* seq_host = nullptr;    // [n_tokens], host
};

// ---- sampling on the device (issue 9) ----
// One row's sampling parameters for Backend::sample_rows (runtime/sampler.h SamplingParams, which
// validated them), plus this step's random number.
struct SampleRowParams {
  float temperature = 0.0f;         // 0: greedy (argmax after penalty and suppression)
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t top_k = 0;
  int32_t count_row = -1;           // row of SampleArgs::counts with this sequence's history; -1: no penalty
  uint64_t random = 0;              // 53 random bits: Sampler::next_random53() of the row's sampler
  uint32_t flags = 0;               // kSampleRow*: 0 samples the row as described at sample_rows
};
// SampleRowParams::flags. A step may mix rows the device samples with rows sampled on the host
// (Engine::step_sample: log-probabilities, presence/frequency penalties, JSON mode) and rows that
// suppress SampleArgs::suppress (EOS when ignored) with rows that do not.
// kSampleRowSkip: not sampled: the row's logits and counts are left as they are (the caller copies
// the logits out afterwards) and ids[r] = -1; the other fields are not read.
inline constexpr uint32_t kSampleRowSkip = 1;
// kSampleRowNoSuppress: SampleArgs::suppress does not apply to this row.
inline constexpr uint32_t kSampleRowNoSuppress = 2;
// Everything sample_rows reads besides the logits, in backend memory. counts[row, vocab] holds, per
// sequence, how often each id occurs in its repetition-penalty window; row r first applies its
// updates[update_offsets[r] .. update_offsets[r+1]) (+(id+1) counts one more id, -(id+1) one fewer)
// to counts[params[r].count_row], so the history is maintained on the device step by step.
// Row r's logit_bias (runtime/sampler.h LogitBias), applied before everything else:
// logits[bias_ids[j]] += bias_values[j] for j in [bias_offsets[r], bias_offsets[r+1]), the ids of a
// row distinct and below vocab (bias_offsets null: no row has a bias).
struct SampleArgs {
  const SampleRowParams* params = nullptr;  // [R]
  const int32_t* suppress = nullptr;        // never sampled (e.g. EOS when ignored)
  int n_suppress = 0;
  int32_t* counts = nullptr;
  const int32_t* updates = nullptr;
  const int32_t* update_offsets = nullptr;  // [R + 1]
  void* scratch = nullptr;                  // sample_scratch_bytes(R, vocab)
  const int32_t* bias_offsets = nullptr;    // [R + 1]
  const int32_t* bias_ids = nullptr;
  const float* bias_values = nullptr;
};
// ---- end sampling on the device ----

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DType act_dtype() const = 0;

  // ---- memory ----
  virtual Result<void*> alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src_host, size_t bytes) = 0;
  virtual void copy_to_host(void* dst_host, const void* src, size_t bytes) = 0;
  virtual void copy_device(void* dst, const void* src, size_t bytes) = 0;
  // Makes a host-resident weight readable by this backend (CPU: returns it unchanged).
  virtual Result<WeightMatrix> upload_weight(const WeightMatrix& host) = 0;
  virtual Result<WeightVector> upload_vector(const WeightVector& host) = 0;
  // Releases what upload_weight / upload_vector allocated for it (CPU: nothing).
  virtual void free_weight(const WeightMatrix& w) = 0;
  virtual void free_vector(const WeightVector& v) = 0;
  // Waits for queued work. Ops enqueue and return nothing: an op given bad arguments, a failed launch
  // or an asynchronous device fault is recorded (the first one sticks) and returned here.
  virtual Status synchronize() = 0;

  // ---- decode-step graphs (CUDA graphs; unsupported on CPU) ----
  // Ops issued between graph_capture_begin() and graph_capture_end(key) are recorded, not run, and
  // graph_launch(key) replays them. A replay reads whatever the recorded buffers hold then, so the
  // caller keeps every buffer address and every launch shape (n_tokens, n_seqs, max_pages) of the
  // step fixed per key, and uploads the step's inputs before graph_launch.
  virtual bool graphs_supported() const { return false; }
  virtual Status graph_capture_begin() { return unsupported(name() + ": no graph capture"); }
  virtual Status graph_capture_end(uint64_t key) { return unsupported(name() + ": no graph capture"); }
  // True when a graph for `key` exists and was enqueued.
  virtual bool graph_launch(uint64_t key) { return false; }
  // Kernels launched (or recorded into a graph) so far; 0 where not counted (CPU).
  virtual uint64_t launch_count() const { return 0; }

  // ---- device -> host staging for the durable KV store (called from the store's writer thread) ----
  // Host memory that copy_2d_to_host_async can target at full speed (CUDA: pinned).
  virtual Result<void*> alloc_host_staging(size_t bytes);
  virtual void free_host_staging(void* p);
  // Marks the point in the compute order after all work enqueued so far (called by the thread that
  // runs the engine, when it hands a page to the store); a copy queued with the returned fence
  // waits for that point only, not for work enqueued later. 0: no fence (the default: a backend
  // whose work is done when its calls return).
  virtual uint64_t record_fence() { return 0; }
  // Queues a copy of `rows` rows of `width` bytes from device memory (rows `src_pitch` apart) to
  // host staging (rows `dst_pitch` apart), ordered on a copy stream of its own so the decode stream
  // is not stalled, after `after_fence` (record_fence; 0: after all work enqueued so far);
  // wait_host_copies() blocks until every queued copy is done. The source must not be written
  // until then (the store copies only immutable rows). The default is a synchronous copy_to_host
  // per row: correct for any backend; CUDA overrides it with cudaMemcpy2DAsync.
  virtual void copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                     size_t rows, uint64_t after_fence);
  // An asynchronous failure of one of those copies is returned here (the staging bytes are then
  // not the device's).
  virtual Status wait_host_copies() { return Status::ok(); }
  // ---- host -> device for the store's restores (called from the thread that runs the engine) ----
  // True where device memory is host memory (CPU): the store reads records straight into KV pages.
  virtual bool device_memory_is_host() const { return false; }
  // Queues a copy from host staging (alloc_host_staging) to device memory, ordered before any work
  // enqueued on the compute stream after it. The source must stay unchanged until
  // wait_device_copies() returns, which blocks until every copy queued so far has finished reading
  // it (and reports an asynchronous failure). Default: copy_to_device + synchronize.
  virtual void copy_to_device_async(void* dst, const void* src_staging, size_t bytes) {
    copy_to_device(dst, src_staging, bytes);
  }
  virtual Status wait_device_copies() { return synchronize(); }
  // Blocks until the copies queued so far from this staging buffer have finished reading it (and
  // reports an asynchronous failure), not the copies queued since from other buffers: what a restore
  // thread needs before it refills one of its own slots. Default: wait_device_copies().
  virtual Status wait_device_copies_from(const void* src_staging) {
    (void)src_staging;
    return wait_device_copies();
  }
  // True where several threads may call copy_to_device_async / wait_device_copies at once (each
  // with staging of its own), so the store reads a restore's records on several threads (CUDA).
  virtual bool device_copies_concurrent() const { return false; }

  // ---- ops ----
  // out[t, :] = row ids[t] of table (dequantized).   ids: [out.rows]
  virtual void embed(const WeightMatrix& table, const int32_t* ids, Act out) = 0;
  // out = rmsnorm(x) * w, per row.
  virtual void rmsnorm(Act x, const WeightVector& w, float eps, Act out) = 0;
  // residual += x; out = rmsnorm(residual) * w.   (the fused add + norm between sublayers)
  virtual void add_rmsnorm(Act residual, Act x, const WeightVector& w, float eps, Act out) = 0;
  // out[rows, W.rows] = x[rows, W.cols] W^T (+ bias). out is act_dtype() or F32 (the logits).
  virtual void linear(Act x, const WeightMatrix& w, Act out) = 0;
  // outs[i] = x ws[i]^T for every i, in one pass where the backend can (q/k/v share x; CUDA runs
  // them as one launch when the matrices share a format). Reference: linear() per output.
  virtual void linear_multi(Act x, std::span<const WeightMatrix* const> ws, std::span<const Act> outs);
  // A hint that the next ops read these weights against `rows` activation rows: a backend may start
  // moving them closer meanwhile. `when` says what runs in between: kAttention, given after the q/k/v
  // projections (o, gate, up come after attention); kMlp, given after gate/up (down comes next).
  // CUDA: into L2, ANVIL_CUDA_L2_PREFETCH and ANVIL_CUDA_L2_PREFETCH_MLP, off by default, for
  // measuring. It changes no result; the default does nothing.
  enum class PrefetchWindow { kAttention, kMlp };
  virtual void prefetch_weights(int64_t rows, std::span<const WeightMatrix* const> ws, PrefetchWindow when) {}
  // The norm before a sublayer fused into its input projections, and the output projection fused
  // with the residual add (decode on CUDA: two kernels per layer fewer). The transformer uses them
  // for a layer only when fuses_norm_linear() says the backend runs them fused for these matrices
  // at T rows; otherwise it keeps rmsnorm / add_rmsnorm / linear. The defaults compose the plain
  // ops and are the reference.
  virtual bool fuses_norm_linear(int64_t T, std::span<const WeightMatrix* const> ws) const { return false; }
  // x = rmsnorm(h) * norm (a backend that fuses may leave x unwritten); outs[i] = x ws[i]^T.
  virtual void rmsnorm_linear_multi(Act h, const WeightVector& norm, float eps, Act x,
                                    std::span<const WeightMatrix* const> ws, std::span<const Act> outs);
  // x = rmsnorm(h) * norm (may be left unwritten); out = silu(x gate^T) * (x up^T).
  virtual void rmsnorm_linear_swiglu(Act h, const WeightVector& norm, float eps, Act x, const WeightMatrix& gate,
                                     const WeightMatrix& up, Act out);
  // h += x W^T, the product rounded to act_dtype() first (as linear() into scratch, then add());
  // scratch [x.rows, W.rows] may be used.
  virtual void linear_add(Act x, const WeightMatrix& w, Act h, Act scratch);
  // out = silu(x gate^T) * (x up^T): the MLP's gate and up projections and SwiGLU in one op.
  //   x: [T, hidden], gate/up: [ffn, hidden], out: [T, ffn]
  virtual void linear_swiglu(Act x, const WeightMatrix& gate, const WeightMatrix& up, Act out) = 0;
  // out = silu(gate) * up, elementwise.
  virtual void swiglu(Act gate, Act up, Act out) = 0;
  // a += b, elementwise.
  virtual void add(Act a, Act b) = 0;
  // For each token t: optional per-head RMSNorm of q and k (q_norm/k_norm with n = head_dim; skipped
  // when data is null), RoPE (rotate-half convention: pairs (i, i + head_dim/2), angle
  // pos * inv_freq[i]; with kv.rotary_dim, pairs (i, i + rotary_dim/2) times kv.rope_scale, see
  // KVCacheView) on q in place and on k, then writes k and v at (layer, pos[t]) of the
  // sequence's pages.   q: [T, n_heads*head_dim], k, v: [T, n_kv_heads*head_dim], inv_freq: [head_dim/2]
  virtual void qk_norm_rope_kv_append(Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm,
                                      float eps, const float* inv_freq, const KVCacheView& kv, int layer,
                                      const BatchView& batch) = 0;
  // Causal attention with GQA (head h reads kv head h / (n_heads / n_kv_heads)), softmax in fp32.
  //   q: [T, n_heads*head_dim] -> out: [T, n_heads*head_dim]
  virtual void attention(Act q, const KVCacheView& kv, int layer, const BatchView& batch, float scale,
                         Act out) = 0;
  // The q/k/v projections with qk_norm_rope_kv_append's work folded in (its arguments as there, q, k
  // and v being outs[0..2]): norm non-null, `in` is the residual stream h and the projections are
  // rmsnorm_linear_multi's (x may be left unwritten); null, `in` is x, as linear_multi. q is left
  // rotated and k/v are in the pages, so attention() follows, not rope_attention(). The transformer
  // calls it only where fuses_qkv_rope() says the backend runs it as one launch (CUDA, one token,
  // ANVIL_CUDA_QKV_ROPE=1); the default composes the plain ops and is the reference.
  virtual bool fuses_qkv_rope(int64_t T, const KVCacheView& kv, std::span<const WeightMatrix* const> qkv) const {
    return false;
  }
  virtual void linear_qkv_rope(Act in, const WeightVector* norm, float eps, Act x,
                               std::span<const WeightMatrix* const> ws, std::span<const Act> outs,
                               const WeightVector& q_norm, const WeightVector& k_norm, const float* inv_freq,
                               const KVCacheView& kv, int layer, const BatchView& batch);
  // qk_norm_rope_kv_append, then attention (their arguments as there): one op so that a backend may
  // run them as one kernel (CUDA does for decode steps: attention_decode_tc.cu). q may be left
  // rotated or unchanged; k/v are written to the pages as qk_norm_rope_kv_append writes them.
  virtual void rope_attention(Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                              const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch,
                              float scale, Act out);
  // dst[i, :] = src[rows[i], :] for i < dst.rows.   rows: backend memory, each in [0, src.rows)
  virtual void gather_rows(Act src, const int32_t* rows, Act dst) = 0;
  // Greedy sampling on the device: ids[r] = argmax over row r of logits (F32 [R, vocab]), never one of
  // suppress[0..n_suppress) (e.g. EOS when it is ignored), ties to the lowest id, NaN never chosen
  // (-1 when no token is possible). suppress and ids: backend memory.
  virtual void argmax_rows(Act logits, const int32_t* suppress, int n_suppress, int32_t* ids) = 0;
  // Full sampling on the device (issue 9): ids[r] = the token runtime/sampler.h's Sampler picks for
  // row r of logits (F32 [R, vocab], overwritten with the processed logits) with params[r], the
  // row's logit bias, the history counted in counts (after the row's updates), a.suppress (unless
  // the row's flags say kSampleRowNoSuppress), and params[r].random as the draw's 53 random bits (-1
  // when no token is possible). Exactly the Sampler's token, bit for bit (base/sample_math.h says
  // why that holds). A kSampleRowSkip row is not touched (ids[r] = -1). vocab <= sampling::kMaxVocab.
  virtual bool has_sample_rows() const { return false; }
  virtual size_t sample_scratch_bytes(int rows, int64_t vocab) const { return 0; }
  virtual void sample_rows(Act logits, const SampleArgs& a, int32_t* ids);
  // Copies activations to host as float32 (the logits for the sampler).   dst: [x.rows * x.cols]
  virtual void to_host_f32(Act x, float* dst) = 0;

  // ---- mixture of experts (issue 12) ----
  // The whole routed FFN of one MoE layer, for each token t (row of x) independently:
  //   p = softmax(x_t W_router^T) in fp32;  the top_k experts by p (ties: lower index first), in that
  //   order; w_i = p_i (or p_i / sum of the k, when norm_topk_prob);
  //   out_t = sum_i w_i * down_e(silu(gate_e x_t) * up_e x_t)   (i = 0..k-1 in top-k order)
  //           [+ sigmoid(x_t . shared_gate_w) * shared_down(silu(shared_gate x_t) * shared_up x_t)]
  // One op so a device backend can run it as a few fused kernels with routing on the device (no host
  // synchronisation). A token's result must not depend on its batch-mates or the thread count.
  // x: [T, hidden] -> out: [T, hidden] (out != x).
  // Not pure so a backend without MoE kernels still builds: has_moe_ffn() says false (Transformer::create
  // then refuses an MoE model with a clear error) and the default moe_ffn aborts naming the backend.
  virtual bool has_moe_ffn() const { return false; }
  // Whether the durable KV store may copy pages out of this backend's KV pool from its writer
  // thread (the staging copies below). The CUDA backend says no until it overrides them with a
  // stream of its own (a copy from another thread would break the decode graph's capture).
  virtual bool supports_page_store() const { return true; }
  // Why this backend's attention (q/k norm + RoPE + attention) cannot take a model with these heads
  // (rotary_dim: the dims of a head RoPE turns, 0 or head_dim for all), or "" when it can.
  // Transformer::create refuses such a model with the reason, before any step.
  virtual std::string attention_unsupported(int n_heads, int n_kv_heads, int head_dim, int rotary_dim = 0) const {
    (void)n_heads, (void)n_kv_heads, (void)head_dim, (void)rotary_dim;
    return {};
  }
  virtual void moe_ffn(Act x, const MoEWeights& w, Act out);
  // ---- end mixture of experts ----

  // ---- a decode token's layers in one launch (optional; the CUDA backend's persistent kernel) ----
  // One dense layer's weights as the model holds them (pointers into its ModelWeights).
  struct DenseLayerView {
    const WeightVector *attn_norm = nullptr, *ffn_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr;
    const WeightMatrix *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
    const WeightMatrix *gate = nullptr, *up = nullptr, *down = nullptr;
  };
  // Offered once, when a dense model without whole-projection q/k norms is created (outside any
  // graph capture): a backend that can run all of these layers for one token in one launch
  // prepares for it and returns a handle >= 0 for decode_layers; -1: it cannot (the default).
  virtual int prepare_decode_layers(std::span<const DenseLayerView> layers, int n_heads, int n_kv_heads,
                                    int head_dim) {
    (void)layers, (void)n_heads, (void)n_kv_heads, (void)head_dim;
    return -1;
  }
  // Runs every layer for the one token of a one-sequence decode batch: h ([1, hidden]) holds the
  // embedded token on entry and the last layer's residual stream (the o/down sums added) on exit,
  // as the op-by-op layers leave it; the token's K/V rows are appended for every layer. false:
  // nothing was enqueued (the caller runs the layers op by op).
  virtual bool decode_layers(int handle, Act h, float eps, const float* inv_freq, const KVCacheView& kv,
                             const BatchView& batch, float scale) {
    (void)handle, (void)h, (void)eps, (void)inv_freq, (void)kv, (void)batch, (void)scale;
    return false;
  }
};

std::unique_ptr<Backend> make_cpu_backend(int n_threads);

}  // namespace anvil
