// q/k RMSNorm + RoPE + KV page append in one launch: one warp per (token, head) item, q heads first,
// then kv heads (whose K row is normed and rotated, and whose V row is copied, into the token's page
// slot). The whole-head item's arithmetic (lanes, angles in double) is rope_kv.cuh's.
#include "backend/cuda/rope_kv.cuh"

namespace anvil::cuda {
namespace {

using rope::kMaxPairsPerLane;
using rope::load_weight;

// One warp's item: head h of token t, q heads first, then kv heads (whose rows go into the token's
// page slot). Read before the wait for the previous kernel: positions and page table are the host's,
// written before the step. valid: the item exists (else the warp has nothing to do).
struct RopeItem {
  bool valid = false, is_q = false;
  int t = 0, kh = 0;
  int32_t pos = 0;
  const __nv_bfloat16* src = nullptr;
  const void* nw = nullptr;
  __nv_bfloat16 *dst = nullptr, *vdst = nullptr;
};
__device__ __forceinline__ RopeItem rope_item(__nv_bfloat16* q, const __nv_bfloat16* k, int n_heads, const void* q_norm,
                                              const void* k_norm, const KVDev& kv, int layer, const BatchDev& b) {
  RopeItem it;
  const int64_t item = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int per_tok = n_heads + kv.n_kv_heads;
  if (item >= int64_t(b.n_tokens) * per_tok) return it;
  it.valid = true;
  it.t = int(item / per_tok);
  const int h = int(item % per_tok), D = kv.head_dim;
  it.is_q = h < n_heads;
  it.kh = h - n_heads;
  it.src = it.is_q ? q + (int64_t(it.t) * n_heads + h) * D : k + (int64_t(it.t) * kv.n_kv_heads + it.kh) * D;
  it.nw = it.is_q ? q_norm : k_norm;
  it.pos = b.pos[it.t];
  if (it.is_q) {
    it.dst = q + (int64_t(it.t) * n_heads + h) * D;
  } else {
    const int64_t page = b.page_table[int64_t(b.seq[it.t]) * b.max_pages + it.pos / kv.page_size];
    const int slot = it.pos % kv.page_size;
    it.dst = static_cast<__nv_bfloat16*>(kv.base) +
             kv_row(page, layer, 0, it.kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
    it.vdst = static_cast<__nv_bfloat16*>(kv.base) +
              kv_row(page, layer, 1, it.kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
  }
  return it;
}

__global__ void qk_rope_append_kernel(__nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int n_heads,
                                      const void* q_norm, const void* k_norm, Elem nd, float eps,
                                      const float* inv_freq, KVDev kv, int layer, BatchDev b) {
  // Before the wait for the previous kernel: what does not depend on it (positions and page table,
  // written by the host before the step; the norm weights and inv_freq, never written by a kernel):
  // the angles' double-precision sincos, the norm weights and the destination row. The item's
  // arithmetic is rope_kv.cuh's, which the q/k/v mat-vec's rope epilogue shares.
  pdl_launch();
  const int lane = threadIdx.x & 31;
  const RopeItem it = rope_item(q, k, n_heads, q_norm, k_norm, kv, layer, b);
  if (!it.valid) return;
  const int D = kv.head_dim;
  rope::Lane r;
  rope::prepare(r, lane, D / 2, it.pos, inv_freq, it.nw, nd);
  pdl_wait();
  const __nv_bfloat16* vsrc = it.is_q ? nullptr : v + (int64_t(it.t) * kv.n_kv_heads + it.kh) * D;
  rope::apply<false>(r, lane, D, it.src, it.dst, vsrc, it.vdst, it.nw != nullptr, eps);
  trace::point(9);
}

// Partial rotary embeddings (Phi-4-mini: R = 0.75 D): the same item per warp, over the whole head
// for the norm; lane l turns the pairs (i, i + R/2) for i = l, l + 32, ... < R/2 (angles in double as
// above) and multiplies them by m, and copies dims R.. as they are (normed). A kernel of its own, so
// that the whole-head kernel above stays as it was.
__global__ void qk_rope_append_partial_kernel(__nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                              int n_heads, const void* q_norm, const void* k_norm, Elem nd, float eps,
                                              const float* inv_freq, KVDev kv, int layer, BatchDev b, int R, float m) {
  pdl_launch();
  const int lane = threadIdx.x & 31;
  const RopeItem it = rope_item(q, k, n_heads, q_norm, k_norm, kv, layer, b);
  if (!it.valid) return;
  const int t = it.t, kh = it.kh, D = kv.head_dim, hr = R / 2;
  const bool is_q = it.is_q;
  const __nv_bfloat16* src = it.src;
  const void* nw = it.nw;
  const int32_t pos = it.pos;
  __nv_bfloat16 *dst = it.dst, *vdst = it.vdst;
  pdl_wait();
  // Element e of the head: e = lane + 32 j, j < 8 (D <= 256); its pair partner is e + hr (e < hr).
  constexpr int kMaxPerLane = 2 * kMaxPairsPerLane;
  float x[kMaxPerLane];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int e = lane + 32 * j;
    x[j] = e < D ? __bfloat162float(src[e]) : 0.0f;
    ss += x[j] * x[j];
  }
  float inv = 1.0f;
  if (nw) inv = rsqrtf(warp_sum(ss) / float(D) + eps);
  __syncwarp();  // q is rotated in place: every lane has read its elements before any lane writes
  if (!is_q) {
    const __nv_bfloat16* vsrc = v + (int64_t(t) * kv.n_kv_heads + kh) * D;
    for (int i = lane; i < D; i += 32) vdst[i] = vsrc[i];
  }
  // Normed values in shared memory would do; the pairs' partners are read back from the source
  // instead (another lane's element, which only this lane writes), normed the same way.
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int e = lane + 32 * j;
    if (e >= D) continue;
    const float xe = nw ? x[j] * inv * load_weight(nw, e, nd) : x[j];
    if (e >= R) {
      dst[e] = __float2bfloat16_rn(xe);
    } else if (e < hr) {
      const int p = e + hr;
      const float xp = nw ? __bfloat162float(src[p]) * inv * load_weight(nw, p, nd) : __bfloat162float(src[p]);
      double sn, cs;
      sincos(double(pos) * double(inv_freq[e]), &sn, &cs);
      const float fc = float(cs), fs = float(sn);
      dst[e] = __float2bfloat16_rn((xe * fc - xp * fs) * m);
      dst[p] = __float2bfloat16_rn((xp * fc + xe * fs) * m);
    }
  }
  trace::point(9);
}

}  // namespace

cudaError_t qk_norm_rope_kv_append(void* q, const void* k, const void* v, int n_heads, const void* q_norm,
                                   const void* k_norm, Elem norm_dtype, float eps, const float* inv_freq,
                                   const KVDev& kv, int layer, const BatchDev& b, cudaStream_t s, int rotary_dim,
                                   float rope_scale) {
  if (kv.head_dim % 2 != 0 || kv.head_dim > 2 * 32 * kMaxPairsPerLane) return cudaErrorInvalidValue;
  const int64_t items = int64_t(b.n_tokens) * (n_heads + kv.n_kv_heads);
  constexpr int kWarpsPerBlock = 4;
  const unsigned blocks = unsigned((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (rotary_dim > 0 && rotary_dim < kv.head_dim) {
    if (rotary_dim % 2 != 0) return cudaErrorInvalidValue;
    launch_k(qk_rope_append_partial_kernel, dim3(blocks), dim3(kWarpsPerBlock * 32), 0, s,
             static_cast<__nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v),
             n_heads, q_norm, k_norm, norm_dtype, eps, inv_freq, kv, layer, b, rotary_dim, rope_scale);
    return cudaGetLastError();
  }
  launch_k(qk_rope_append_kernel, dim3(blocks), dim3(kWarpsPerBlock * 32), 0, s, 
      static_cast<__nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k), static_cast<const __nv_bfloat16*>(v),
      n_heads, q_norm, k_norm, norm_dtype, eps, inv_freq, kv, layer, b);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
