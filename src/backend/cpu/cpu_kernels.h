// Internal to src/backend/cpu/: the kernels behind the CPU backend's ops, shared between its files.
// Every AVX2 kernel (cpu_qdot_avx2.cpp) has a portable scalar twin; callers pick one with
// cpu_use_avx2(). Activations are F32 throughout.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "base/thread_pool.h"

namespace anvil::cpu {

// ---- weights, element access (portable) ----
// Bytes of one packed row of a quantized matrix: cols*bits/8 (cols is a multiple of 32).
inline int64_t qrow_bytes(const WeightMatrix& w) { return w.cols * w.bits / 8; }
// Dequantizes (or converts) row r of w into out[0, w.cols).
void weight_row_to_f32(const WeightMatrix& w, int64_t r, float* out);
// The optional per-row bias of w at row r (0 when absent).
inline float weight_bias(const WeightMatrix& w, int64_t r) {
  return w.bias ? load_float(w.bias, w.bias_dtype, size_t(r)) : 0.0f;
}

// ---- sampling (cpu_sample.cpp) ----
// Backend::sample_rows: the reference of the on-device sampler (host memory throughout).
void sample_rows(const Act& logits, const SampleArgs& a, int32_t* ids);

// ---- linear ----
// out[rows, w.rows] = x[rows, w.cols] w^T (+ bias).
void linear_f32(ThreadPool& pool, const float* x, int64_t rows, const WeightMatrix& w, float* out);
// The fewest output rows (of w) one thread chunk of linear_f32 takes for a batch of `rows`: the
// tests use it to make sure their shapes really split the work between threads.
int64_t linear_min_chunk_rows(const WeightMatrix& w, int64_t rows);

// ---- AVX2 kernels (call only when cpu_has_avx2()) ----
// The quantized mat-vec fast path (bits 2, 3, 4, 5, 6, 8) works on x quantized to int16 per weight
// group (step = max|x_group|/32767, so the relative error per term is <= 1.6e-5, far below the bf16
// precision of the model's activations) and permuted into the kernel's lane order:
//   with e = 16/bits elements per 16-bit word for bits 4 and 8 (e = 1, natural order, for the
//   others, whose elements straddle bytes) and blocks of B = 16*e elements,
//   xq[blk*B + j*16 + w] = round(x[blk*B + e*w + j] / xscale[group]).
// Needs cols % B == 0. xsum[g] = sum of the fp32 x over group g (for the affine bias term).
struct QuantizedX {
  const int16_t* xq;
  const float* xscale;
  const float* xsum;
};
bool qdot_avx2_supported(int bits, int group_size, int64_t cols);
// One row of x into that form: xq[cols], xscale[cols/G], xsum[cols/G] (G a multiple of 8).
void quantize_x_int16_avx2(const float* x, int64_t cols, int bits, int64_t G, int16_t* xq, float* xscale,
                           float* xsum);
// For weight rows r in [r0, r1) and activation rows x < nx (1..4), one pass over W:
//   out[x*ldo + r] = sum_g scale_g*xscale_g*dot(q_g, xq_g) + bias_g*xsum_g (+ row bias).
void qgemv_rows_avx2(const WeightMatrix& w, int64_t r0, int64_t r1, const QuantizedX* xs, int nx, float* out,
                     int64_t ldo);
// out[t*ldo + r] = dot(W[r, :cols], X[t, :cols]) for r < nw, t < nx (W rows contiguous, stride cols).
// Each element's reduction order is the same whatever nw and nx (batch invariance).
void gemm_tile_avx2(const float* W, int nw, const float* X, int64_t ldx, int nx, int64_t cols, float* out,
                    int64_t ldo);
// out[x*ldo + r] = dot(W[r, :cols], X[x*ldx, :cols]) for r < nw and x < nx (1..4), W dense bf16
// (f16 = false) or f16 rows of stride cols, converted in registers; each element bit for bit what
// gemm_tile_avx2 gives on the converted rows.
void gemv_half_avx2(const uint16_t* W, bool f16, int64_t nw, const float* X, int64_t ldx, int nx, int64_t cols,
                    float* out, int64_t ldo);
float dot_f32_avx2(const float* a, const float* b, int64_t n);
// y += a * x
void axpy_f32_avx2(float a, const float* x, float* y, int64_t n);
// Attention on a BF16 KV cache, one page at a time, converting K/V in registers (no staging copy).
// nq queries (q: [nq][d] fp32) against n contiguous bf16 rows ([n][d]):
//   s[r*lds + j] = scale * dot(q_r, k_j);
//   acc[r*d + :] = corr[r] * acc[r*d + :] + sum_j p[r*ldp + j] * v_j   (accumulators held in registers
//   across the page's rows, so acc is read and written once per page, not once per row).
void scores_bf16_avx2(const float* q, int nq, const uint16_t* k, int n, int d, float scale, float* s, int64_t lds);
void pv_bf16_avx2(const float* p, int64_t ldp, int nq, const uint16_t* v, int n, int d, const float* corr, float* acc);
// s[j] = exp(s[j] - mx) for j < n (every s[j] <= mx); returns their sum. Relative error ~2e-7.
float exp_shift_sum_avx2(float* s, int n, float mx);
// Reads n bytes (a multiple of 128) and returns a checksum so the loads are not optimized away.
uint64_t read_sum_avx2(const uint8_t* p, size_t n);

// ---- attention ----
void qk_norm_rope_kv_append_f32(ThreadPool& pool, float* q, const float* k, const float* v, int n_heads,
                                const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                                const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch);
void attention_f32(ThreadPool& pool, const float* q, int n_heads, const KVCacheView& kv, int layer,
                   const BatchView& batch, float scale, float* out);

// ---- mixture of experts (cpu_moe.cpp) ----
// Routing of one token: p = softmax(logits[0..E)) in fp32; idx[0..k) = the top-k experts by p (ties to
// the lower index) in descending order; wt = their p, divided by their sum when `norm`.
void moe_route(const float* logits, int E, int k, bool norm, int* idx, float* wt);
// Backend::moe_ffn: x [T, hidden] -> out [T, hidden] (see backend.h). The fast path groups tokens by
// expert and streams only the chosen experts' rows.
void moe_ffn_f32(ThreadPool& pool, const float* x, int64_t T, const MoEWeights& w, float* out);
// The same op computed naively (per token, dequantized rows, double accumulation): the reference.
void moe_ffn_reference_f32(const float* x, int64_t T, const MoEWeights& w, float* out);

}  // namespace anvil::cpu
