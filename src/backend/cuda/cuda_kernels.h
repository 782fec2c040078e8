// Internal to src/backend/cuda/: the host-side launchers of the kernel files, one family per file
// (qgemv.cu, gemm.cu, norm.cu, rope_kv.cu, attention.cu, sample.cu). Every launcher enqueues on
// `stream` and returns the launch's error (cudaSuccess or the reason); argument checks live in
// cuda_backend.cpp. Plain C++ (no device code), so host files include it. Activations ("x", "out") are bf16 [rows, cols] unless a parameter says otherwise.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>


namespace anvil::cuda {

// The weight / activation element types a kernel can be instantiated for.
enum class Elem : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// A weight matrix in device memory (backend.h WeightMatrix, with the dtype as Elem).
struct DevMatrix {
  const void* data = nullptr;
  const void* scales = nullptr;  // quantized only: [rows, cols/group] of dtype
  const void* biases = nullptr;
  const void* bias = nullptr;    // optional [rows] of bias_dtype
  int64_t rows = 0, cols = 0;
  int bits = 0, group = 0;       // bits == 0: dense
  Elem dtype = Elem::kBF16, bias_dtype = Elem::kBF16;
};

// Launch kernels with programmatic dependent launch from now on (true while a decode graph is
// captured; see cuda_common.cuh).
void set_pdl_capture(bool on);

// ---- qgemv.cu: mat-vec for small batches, weight-bandwidth bound ----
// Tokens per launch: kGemvMaxTokens for the CUDA-core kernels, kTcMaxTokens for the tensor-core q4
// one (gemv_tc_ok); gemv()/gemv_swiglu() split a larger T into launches of those sizes.
constexpr int kGemvMaxTokens = 8;
constexpr int kTcMaxTokens = 64;
// From this many rows (to kTcMaxTokens) q4 tensor-core matrices take the batch kernel
// (qgemm_batch.cu) when given scratch; below, the register-fed kernel (faster at 16 on the H200).
constexpr int kBatchMinTokens = 17;
// GemvScratch::sum_kernel's policies.
inline constexpr int kSumKernelNever = 0, kSumKernelAlways = 1, kSumKernelWavePlanner = 2;
// Scratch for the q4 batch kernel (qgemm_batch.cu): the activations in mma
// fragment order, fp32 partial sums of a split K, and one counter per 64-row block, zero before
// the first launch (the kernel leaves them zero). Without it (null, or smaller than
// gemv_batch_need says) those rows run the register-fed kernel, 32 at a time.
struct GemvScratch {
  void* xperm = nullptr;
  size_t xperm_bytes = 0;
  float* part = nullptr;
  size_t part_floats = 0;
  unsigned* done = nullptr;
  size_t n_done = 0;
  // One row (T = 1): x already as the integer path's int16 planes (rmsnorm() with planes wrote them
  // from the same bf16 values), so the one-token mat-vec copies them instead of staging x; or null.
  const void* xplanes = nullptr;
  // The batch kernel may add a split row block's partial sums inside a thread block cluster
  // (qgemm_batch.cu; ANVIL_QGEMM_CLUSTER, read by the backend) instead of through part and done.
  bool cluster = false;
  // Split launches not in clusters leave every partial in part and a second kernel adds them (no
  // done counters, no last block): kSumKernelNever, kSumKernelAlways, or kSumKernelWavePlanner (the
  // backend's default: only the launches the wave planner plans, beyond 32 rows; ANVIL_QGEMM_SUM_KERNEL).
  int sum_kernel = 0;
  // The batch kernel reads x as it is (its plain-x form, no permute_x_kernel launch before it; the
  // backend's default) instead of a copy permuted into mma fragment order in xperm
  // (ANVIL_QGEMM_PLAIN_X=0, read by the backend).
  bool plain_x = true;
};
// The scratch sizes a call at T rows needs (pointers left null); false: the batch kernel does not
// take it.
// need->cluster is the policy the call will run under (set by the caller).
bool gemv_batch_need(const DevMatrix* ws, int n, const DevMatrix* up, int T, GemvScratch* need);
// outs[i][T, ws[i].rows] = x[T, K] ws[i]^T (+ bias) for i < n (n <= 3, one launch per token chunk
// when the matrices share a format). out_f32: outputs are F32 instead of bf16.
cudaError_t gemv(const DevMatrix* ws, void* const* outs, int n, const void* x, int T, bool out_f32, cudaStream_t s,
                 const GemvScratch* scratch = nullptr);
// out[T, F] = silu(x gate^T) * (x up^T), gate and up read in the same pass.
cudaError_t gemv_swiglu(const DevMatrix& gate, const DevMatrix& up, const void* x, int T, void* out,
                        cudaStream_t s, const GemvScratch* scratch = nullptr);
// Whether gemv()/gemv_swiglu() take these matrices in one launch (same bits, group, dtype, cols).
bool gemv_fusable(const DevMatrix& a, const DevMatrix& b);
// gemv_bf16.cu: the one-token bf16 mat-vec with two register buffers of weights in flight and x
// staged in shared memory (the default; ANVIL_GEMV_BF16=0 turns it off). gemv()/gemv_swiglu() use
// it for what it takes (up: gate/up with SwiGLU, else null).
bool gemv_bf16_takes(const DevMatrix* ws, int n, const DevMatrix* up, const void* x, int T);
cudaError_t gemv_bf16(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, bool out_f32,
                      cudaStream_t s);
// qgemv_tc.cu: the tensor-core 4-bit mat-vec that gemv()/gemv_swiglu() use for q4 matrices with
// bf16 scales and cols % 128 == 0 (ANVIL_CUDA_NO_TC=1 forces the CUDA-core kernels, for comparison).
bool gemv_tc_ok(const DevMatrix& w);
// Whether gemv()/gemv_swiglu() take w through the tensor-core kernel (gemv_tc_ok and not
// ANVIL_CUDA_NO_TC): then up to kTcMaxTokens rows read the weights once per launch.
bool gemv_uses_tc(const DevMatrix& w);
cudaError_t gemv_tc(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                    bool out_f32, cudaStream_t s, const GemvScratch* scratch = nullptr);
// The streamed q4 kernel's fusions (decode, T <= 8): norm_w set: x is the residual stream h and each
// row is RMS-normalized (times norm_w) before the product, as rmsnorm() would write it; residual:
// outs[i] is h and receives h + bf16(product) instead of the product (not with `up`).
struct RopeEpi;
struct GemvFuse {
  const void* norm_w = nullptr;
  Elem norm_dtype = Elem::kBF16;
  float eps = 0.0f;
  bool residual = false;
  // One token without norm_w: x as the integer path's int16 planes already (rmsnorm with planes), or null.
  const void* xplanes = nullptr;
  // The q/k/v launch (3 matrices, one token, the integer path) with rope_kv's work in its tail, or null.
  const RopeEpi* rope = nullptr;
};
// Whether gemv_tc_fused() takes these matrices (and `up`, or null) at T tokens.
bool gemv_tc_fusable(const DevMatrix* ws, int n, const DevMatrix* up, int T);
cudaError_t gemv_tc_fused(const DevMatrix* ws, void* const* outs, int n, const DevMatrix* up, const void* x, int T,
                          const GemvFuse& f, cudaStream_t s);
// Whether this thread's one-token streamed mat-vec launches of 8-warp blocks take rings no deeper
// than their warps' steps (qgemv_stream.cu, ring_fit_rule; on until set; ANVIL_QGEMV_RING_FIT
// overrides). The backend sets it before each mat-vec op: off once its model has run an MoE block.
void set_ring_fit_default(bool on);

// ---- gemm.cu: tensor-core GEMM for prefill (any T), weights dequantized tile by tile ----
cudaError_t gemm(const DevMatrix& w, const void* x, int T, void* out, bool out_f32, cudaStream_t s);
// From kCublasMinTokens rows: dequantize w into dst (bf16 [rows, cols], cols % 32 == 0), then
// out = x dst^T (+ bias) through cuBLAS on `handle` (a cublasHandle_t).
constexpr int kCublasMinTokens = 64;
cudaError_t dequant_bf16(const DevMatrix& w, void* dst, cudaStream_t s);
cudaError_t gemm_cublas(void* handle, const void* wd, const DevMatrix& w, const void* x, int T, void* out,
                        bool out_f32, cudaStream_t s);

// ---- norm.cu: embedding, norms and element-wise ops ----
cudaError_t embed(const DevMatrix& table, const int32_t* ids, int T, void* out, cudaStream_t s);
// out = rmsnorm(x) * w per row; with residual: residual += x first and the norm reads the sum.
// late: a decode-sized launch lets the next kernel in (PDL) only once it has its rows (norm.cu).
// planes (rows == 1, cols % 32 == 0, the 16-byte-load kernel; else *planes_written = false): also
// out as the one-token integer mat-vec's int16 planes, rmsnorm_planes_bytes(cols) bytes (qgemv_int.cuh).
cudaError_t rmsnorm(void* residual, const void* x, const void* w, Elem w_dtype, float eps, int rows, int cols,
                    void* out, cudaStream_t s, bool late = false, void* planes = nullptr,
                    bool* planes_written = nullptr);
size_t rmsnorm_planes_bytes(int cols);
cudaError_t add(void* a, const void* b, int64_t n, cudaStream_t s);
cudaError_t swiglu(const void* gate, const void* up, void* out, int64_t n, cudaStream_t s);

// ---- rope_kv.cu ----
struct KVDev {
  void* base = nullptr;
  int n_layers = 0, n_kv_heads = 0, head_dim = 0, page_size = 0;
  int window = 0;  // the launch's layer's sliding window (KVCacheView::window_of): keys len - window .. len - 1; 0: all
};
struct BatchDev {
  int n_tokens = 0, n_seqs = 0, max_pages = 0;
  const int32_t* pos = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* page_table = nullptr;
};
// The q/k/v mat-vec's rope epilogue (GemvFuse::rope, ANVIL_CUDA_QKV_ROPE): after the q, k and v
// projections of one token (the launch's segments 0, 1, 2), each q head and each kv head, once all
// its 16-row tiles are stored, gets what qk_norm_rope_kv_append() does to it, by the block that
// stored its last tile (whole-head rotary; head_dim a multiple of 16, at most 256). counters: n_heads
// + n_kv_heads words, zero before the launch; the launch leaves them zero.
struct RopeEpi {
  unsigned* counters = nullptr;
  int n_heads = 0;
  const void* q_norm = nullptr;  // null: no q norm
  const void* k_norm = nullptr;
  Elem norm_dtype = Elem::kBF16;
  float eps = 0.0f;
  const float* inv_freq = nullptr;
  KVDev kv;
  int layer = 0;
  BatchDev b;
};
// Whether gemv_tc_fused() takes these q/k/v matrices with a rope epilogue at T tokens.
bool gemv_qkv_rope_ok(const DevMatrix* qkv, int T, int head_dim);

// q: [T, n_heads*D] in place; k, v: [T, n_kv*D]. q_norm/k_norm may be null. rotary_dim R (0 or D:
// the whole head): partial rotary embeddings, pairs (i, i + R/2) for i < R/2 turned and multiplied by
// rope_scale, dims R.. passed through (KVCacheView::rotary_dim; an even R in [2, D)).
cudaError_t qk_norm_rope_kv_append(void* q, const void* k, const void* v, int n_heads, const void* q_norm,
                                   const void* k_norm, Elem norm_dtype, float eps, const float* inv_freq,
                                   const KVDev& kv, int layer, const BatchDev& b, cudaStream_t s, int rotary_dim = 0,
                                   float rope_scale = 1.0f);

// ---- attention.cu: split-KV (flash-decoding) over the pages ----
// Workspace floats needed for a batch of T tokens with n_heads heads split n_splits ways.
size_t attention_workspace_floats(int T, int n_heads, int head_dim, int n_splits);
// How many splits a batch gets: enough (token, kv head, split) blocks to fill the GPU for decode,
// 1 for long prefill batches. Depends only on the launch shape, so a captured graph stays valid.
// tc_decode: a decode batch (one token per sequence) on the tensor-core kernel, which takes fewer
// splits from 2 tokens on (the rule and its measurements are at the definition).
int attention_splits(int T, int n_kv_heads, int max_positions, int n_sms, bool tc_decode = false);
// done: null, or T * n_kv_heads zeroed counters: then with n_splits > 1 the last split block of each
// (token, kv head) merges the splits itself (one launch instead of two; left zeroed for the next).
cudaError_t attention(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                      int n_splits, float* workspace, unsigned* done, void* out, cudaStream_t s);
// The split merge alone (attention()'s second kernel): ws holds n_splits partials per (token, head),
// of which the first live_splits(n, n_splits) hold positions (attention_merge.cuh; n: the token's
// positions pos[t] + 1, or with a sliding window the last `window` of them).
cudaError_t attention_combine(const float* ws, const int32_t* pos, int T, int n_heads, int head_dim, int n_splits,
                              int window, void* out, cudaStream_t s);
// attention_decode_tc.cu: the same blocks and partials with the arithmetic on the tensor cores
// (the default; ANVIL_CUDA_ATTN_TC=0 off; up to 16 query heads per kv head, head_dim 64 or 128:
// attention_tc_ok).
bool attention_tc_ok(int n_heads, int n_kv_heads, int head_dim);
cudaError_t attention_tc(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                         int n_splits, float* workspace, void* out, cudaStream_t s);
// attention_tc with its splits as one thread block cluster per (token, kv head), merged in
// distributed shared memory as rope_attention_tc merges them: no workspace, no combine kernel.
// cluster: the splits, 2..attention_tc_cluster_limit() (the largest cluster the device schedules
// for every head shape; 16 on the H200, 8 where non-portable sizes are refused).
int attention_tc_cluster_limit();
// The same for a batch that is one run of a sequence's consecutive positions (a prefill chunk; the
// caller checks): a block serves 16 / G of its tokens as the rows of its fragments, so each K/V tile
// is read once per group of tokens instead of once per token. G <= 8; cluster: the splits,
// 1..attention_tc_chunk_limit(). The default since session 35 (ANVIL_CUDA_ATTN_CHUNK=0: one block per token).
int attention_tc_chunk_limit();
cudaError_t attention_tc_chunk(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                               int cluster, void* out, cudaStream_t s);
cudaError_t attention_tc_cluster(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, float scale,
                                 int cluster, void* out, cudaStream_t s);
// The decode form of the two ops above (every token of the batch is its sequence's next position:
// n_tokens == n_seqs): qk_norm_rope_kv_append and attention_tc in one kernel. Each (token, kv head)
// gets `cluster` split blocks (1, 2, 4, 8 or 16) in one thread block cluster, which rotate q
// themselves, write the new K/V row (the block whose split holds it) and merge their splits through
// distributed shared memory: no workspace, no second kernel. rope_attention_cluster gives the cluster
// size for a launch shape (as attention_splits does; 0: the fused kernel cannot run here).
struct RopeDev {
  const void* k = nullptr;  // [T, n_kv*D] bf16, as produced by the k projection
  const void* v = nullptr;
  const void* q_norm = nullptr;  // [D] or null
  const void* k_norm = nullptr;
  Elem norm_dtype = Elem::kBF16;
  float eps = 0.0f;
  const float* inv_freq = nullptr;  // [D/2]
};
int rope_attention_cluster(int T, int n_kv_heads, int max_positions, int n_sms);
cudaError_t rope_attention_tc(const void* q, int n_heads, const RopeDev& r, const KVDev& kv, int layer,
                              const BatchDev& b, float scale, int cluster, void* out, cudaStream_t s);
// attention_prefill.cu: causal attention on the tensor cores for T tokens of ONE sequence at the
// consecutive positions p0, p0+1, ... (a prefill chunk), head_dim 32, 64 or 128 (attention_prefill_ok).
bool attention_prefill_ok(int head_dim);
cudaError_t attention_prefill(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, int p0,
                              float scale, void* out, cudaStream_t s);

// ---- l2_prefetch.cu ----
// Byte ranges of device memory to pull into L2 (each start 16-byte aligned, each size a multiple of
// 16): one small kernel issues cp.async.bulk.prefetch.L2 over them, after its PDL wait (or before it
// with early), and exits (Backend::prefetch_weights, ANVIL_CUDA_L2_PREFETCH); keep: with the
// evict_last L2 priority.
struct L2Ranges {
  static constexpr int kMax = 12;
  int n = 0;
  const void* ptr[kMax] = {};
  uint64_t bytes[kMax] = {};
};
// pdl = false: launched without PDL even inside a capture (the forked form).
cudaError_t l2_prefetch(const L2Ranges& r, bool early, bool keep, cudaStream_t s, bool pdl = true);

// ---- sample.cu ----
cudaError_t gather_rows(const void* src, int64_t src_rows, const int32_t* rows, int n, int64_t cols, size_t elem,
                        void* dst, cudaStream_t s);
// argmax_rows' scratch: a counter per row (zero between launches: zero it when allocated, the kernel
// leaves it zero; a buffer of its own, so that calls with more rows never find another call's partial
// results in their counters) and each block's partial result (argmax_partial_bytes).
struct ArgmaxScratch {
  unsigned* counters = nullptr;
  float* val = nullptr;
  int* idx = nullptr;
};
size_t argmax_partial_bytes(int rows, int64_t vocab);
ArgmaxScratch argmax_scratch(unsigned* counters, void* partials, int rows, int64_t vocab);
cudaError_t argmax_rows(const float* logits, int rows, int64_t vocab, const int32_t* suppress, int n_suppress,
                        const ArgmaxScratch& ws, int32_t* ids, cudaStream_t s);

// ---- sample_rows.cu: the full sampler on the device (backend.h Backend::sample_rows) ----
// backend.h SampleRowParams, field for field (cuda_backend.cpp checks the layout).
struct SampleRowDev {
  float temperature, top_p, min_p, repetition_penalty;
  int32_t top_k, count_row;
  uint64_t random;
  uint32_t flags;
};
// Its flags: backend.h kSampleRowSkip and kSampleRowNoSuppress (cuda_backend.cpp checks the values).
constexpr uint32_t kSampleDevSkip = 1, kSampleDevNoSuppress = 2;
size_t sample_scratch_bytes(int rows, int64_t vocab);
// logits: F32 [rows, vocab], overwritten with the processed logits. One block per row.
// bias_*: backend.h SampleArgs' logit bias (bias_offsets null: none).
cudaError_t sample_rows(float* logits, int rows, int64_t vocab, const SampleRowDev* params, const int32_t* suppress,
                        int n_suppress, int32_t* counts, const int32_t* updates, const int32_t* update_offsets,
                        const int32_t* bias_offsets, const int32_t* bias_ids, const float* bias_values,
                        void* scratch, int32_t* ids, cudaStream_t s);

// ---- persist_decode.cu: one decode token through every dense layer in one persistent launch ----
// (ANVIL_CUDA_PERSIST=1; see the file's header.) Every matrix MLX q4 with one group size.
struct PersistLayer {
  const void* attn_norm = nullptr;  // bf16 [hidden]
  const void* ffn_norm = nullptr;
  const void* q_norm = nullptr;     // bf16 [head_dim], or null (no per-head norm)
  const void* k_norm = nullptr;
  const void* w[7][3] = {};         // q, k, v, o, gate, up, down: packed data, scales, biases
};
struct PersistArgs {
  const PersistLayer* layers = nullptr;  // device [n_layers]
  int n_layers = 0;
  int hidden = 0, q_dim = 0, kv_dim = 0, ffn = 0, n_heads = 0, n_kv = 0;
  int group = 0, kc = 0;                 // q4 group; columns per unit (512 or 1024, >= persist_kc)
  float eps = 0.0f, scale = 0.0f;
  const float* inv_freq = nullptr;
  KVDev kv;
  BatchDev b;                            // one token of one sequence
  void* h = nullptr;                     // bf16 [hidden]: the embedded token in, the last residual out
  void* attn = nullptr;                  // bf16 [q_dim] scratch
  void* act = nullptr;                   // bf16 [ffn] scratch: SwiGLU of gate/up
  float* part[4] = {};                   // per phase (q/k/v, o, gate/up, down): [parts][rows] fp32
  float* attn_ws = nullptr;              // persist_attn_ws_floats
  int max_split = 1;
  unsigned* sync = nullptr;              // persist_sync_words, zero when new
  int copy_async = 0;                    // the producer's copies: 0 cp.async.bulk per row, 1 16-byte cp.async,
                                         // 3 tensor-map boxes (cp.async.bulk.tensor, 3 per unit)
  int l2_ahead = 0;                      // copy_async 3: units pulled into L2 ahead of the ring's copies
  int inflight = 0;                      // the producer's outstanding units at most (0: the whole ring)
  int kv_prefetch = 1;                   // the attention items' K/V rows pulled into L2 before the q/k/v barrier
  int red_release = 0;                   // barrier arrivals as one red.release.gpu (else fence + atomicAdd)
  const void* tmaps = nullptr;           // copy_async 3: [n_layers][7 matrices][data, scales, biases] CUtensorMap
  unsigned long long* trace = nullptr;   // ANVIL_CUDA_PERSIST_TRACE: [n_layers + 1][5 phases][kPersistMarks][blocks] ns
  // shared memory layout (persist_layout)
  int off_res = 0, off_x = 0, off_ring = 0, stages = 0, stage_bytes = 0;
  size_t smem_bytes = 0;
};
// Timer marks per phase in PersistArgs::trace (persist_decode.cu's tmark).
inline constexpr int kPersistMarks = 8;
// The smallest unit width for a group size (8 groups: each row's scales a multiple of 16 bytes).
int persist_kc(int group);
size_t persist_stage_bytes(int group, int kc);
size_t persist_attn_ws_floats(int n_kv, int max_split, int G);
size_t persist_sync_words(int n_kv, int n_layers);
// The most parts (blocks) one 32-row tile of a [rows_v, K] phase is split over with S blocks.
int64_t persist_max_parts(int64_t rows_v, int K, int kc, int S);
// Fills the shared-memory layout for up to smem_limit bytes; false if the ring gets < 4 stages.
bool persist_layout(PersistArgs& a, size_t smem_limit);
int persist_blocks_per_sm(size_t smem_bytes);
cudaError_t persist_decode(const PersistArgs& a, int blocks, cudaStream_t s);

}  // namespace anvil::cuda
