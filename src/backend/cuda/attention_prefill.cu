// Causal prefill attention on the tensor cores (flash-attention style), for a chunk of one
// sequence's consecutive positions: block (query tile of 64 tokens, head) keeps its 64 query rows in
// shared memory and walks the keys 64 at a time up to the tile's last position, straight from the
// paged cache. Each of the 4 warps owns 16 query rows: S = Q K^T by WMMA (bf16 in, fp32 out) into
// shared memory, the online softmax per row in fp32 (scores in log2 units, the running max and sum
// kept per row; the previous output rows rescaled), P rounded to bf16, O += P V by WMMA with the fp32
// output tile held in shared memory. The last step divides by the row sum and writes bf16.
// The default for prefill chunks (cuda_backend.cpp; ANVIL_CUDA_FA=0 sends them to attention.cu's
// split kernels). tests/cuda/cuda_ops_test.cpp compares both with the CPU on every chunk.
#include <mma.h>

#include <cfloat>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace anvil::cuda {
namespace {

using namespace nvcuda;

constexpr int kQ = 64;  // query rows per block
constexpr int kK = 64;  // keys per iteration
constexpr int kFaWarps = 4;

template <int D>
constexpr size_t fa_smem_bytes() {
  return size_t(kQ) * D * 2          // Q
         + size_t(kK) * D * 2 * 2    // K, V
         + size_t(kQ) * kK * 4       // S (fp32)
         + size_t(kQ) * kK * 2       // P (bf16)
         + size_t(kQ) * D * 4        // O (fp32)
         + size_t(kQ) * 2 * 4;       // running max and sum per row
}

template <int D>
__global__ void __launch_bounds__(kFaWarps * 32) fa_prefill_kernel(const __nv_bfloat16* q, int n_heads, KVDev kv,
                                                                   int layer, BatchDev b, int p0, float scale_log2,
                                                                   __nv_bfloat16* out) {
  pdl_begin();
  extern __shared__ __align__(128) unsigned char smem[];
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* Ks = Qs + kQ * D;
  __nv_bfloat16* Vs = Ks + kK * D;
  float* S = reinterpret_cast<float*>(Vs + kK * D);
  __nv_bfloat16* P = reinterpret_cast<__nv_bfloat16*>(S + kQ * kK);
  float* O = reinterpret_cast<float*>(P + kQ * kK);
  float* row_m = O + kQ * D;
  float* row_l = row_m + kQ;

  const int tile = blockIdx.x, h = blockIdx.y;
  const int T = b.n_tokens, G = n_heads / kv.n_kv_heads, kh = h / G;
  const int t0 = tile * kQ;
  const int rows = min(kQ, T - t0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t* pages = b.page_table + int64_t(b.seq[0]) * b.max_pages;
  const __nv_bfloat16* kvb = static_cast<const __nv_bfloat16*>(kv.base);

  // Q rows (zeros past T), O = 0, m = -inf, l = 0.
  for (int i = threadIdx.x; i < kQ * D / 8; i += blockDim.x) {
    const int r = i / (D / 8), c8 = i % (D / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) v = *reinterpret_cast<const uint4*>(q + (int64_t(t0 + r) * n_heads + h) * D + c8 * 8);
    *reinterpret_cast<uint4*>(Qs + r * D + c8 * 8) = v;
  }
  for (int i = threadIdx.x; i < kQ * D; i += blockDim.x) O[i] = 0.0f;
  for (int i = threadIdx.x; i < kQ; i += blockDim.x) row_m[i] = -FLT_MAX, row_l[i] = 0.0f;
  const int last_pos = p0 + t0 + rows - 1;  // the tile's last query position: keys 0..last_pos
  const int n_kb = last_pos / kK + 1;
  __syncthreads();

  for (int kb = 0; kb < n_kb; ++kb) {
    // K and V rows of positions kb*64 .. kb*64+63 (zeros past last_pos).
    for (int i = threadIdx.x; i < kK * D / 8; i += blockDim.x) {
      const int j = i / (D / 8), c8 = i % (D / 8);
      const int p = kb * kK + j;
      uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
      if (p <= last_pos) {
        const int64_t page = pages[p / kv.page_size];
        const int slot = p % kv.page_size;
        kv4 = *reinterpret_cast<const uint4*>(
            kvb + kv_row(page, layer, 0, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D) + c8 * 8);
        vv4 = *reinterpret_cast<const uint4*>(
            kvb + kv_row(page, layer, 1, kh, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D) + c8 * 8);
      }
      *reinterpret_cast<uint4*>(Ks + j * D + c8 * 8) = kv4;
      *reinterpret_cast<uint4*>(Vs + j * D + c8 * 8) = vv4;
    }
    __syncthreads();

    // S[warp rows] = Q[warp rows] K^T.
    float* Sw = S + warp * 16 * kK;
#pragma unroll
    for (int n = 0; n < kK / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bk;
        wmma::load_matrix_sync(a, Qs + warp * 16 * D + kk * 16, D);
        wmma::load_matrix_sync(bk, Ks + n * 16 * D + kk * 16, D);  // K^T: element (k, n) at Ks[n][k]
        wmma::mma_sync(acc, a, bk, acc);
      }
      wmma::store_matrix_sync(Sw + n * 16, acc, kK, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of the warp's 16 rows: each lane holds 2 of the 64 keys.
    __nv_bfloat16* Pw = P + warp * 16 * kK;
    for (int r = 0; r < 16; ++r) {
      const int qr = warp * 16 + r;
      const int qpos = p0 + t0 + qr;
      float s[2];
      float mx = -FLT_MAX;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = lane * 2 + e;
        const int kp = kb * kK + j;
        s[e] = (qr < rows && kp <= qpos) ? Sw[r * kK + j] * scale_log2 : -FLT_MAX;
        mx = fmaxf(mx, s[e]);
      }
      mx = warp_max(mx);
      const float m_old = row_m[qr];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = s[e] == -FLT_MAX ? 0.0f : exp2f(s[e] - m_new);
        const __nv_bfloat16 pb = __float2bfloat16_rn(pe);
        Pw[r * kK + lane * 2 + e] = pb;
        sum += __bfloat162float(pb);  // the sum of what P V adds up
      }
      sum = warp_sum(sum);
      const float alpha = m_old == -FLT_MAX ? 0.0f : exp2f(m_old - m_new);
      for (int d = lane; d < D; d += 32) O[qr * D + d] *= alpha;
      if (lane == 0) {
        row_l[qr] = row_l[qr] * alpha + sum;
        row_m[qr] = m_new;
      }
    }
    __syncwarp();

    // O[warp rows] += P[warp rows] V.
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, O + warp * 16 * D + n * 16, D, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kK / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> bv;
        wmma::load_matrix_sync(a, Pw + kk * 16, kK);
        wmma::load_matrix_sync(bv, Vs + kk * 16 * D + n * 16, D);
        wmma::mma_sync(acc, a, bv, acc);
      }
      wmma::store_matrix_sync(O + warp * 16 * D + n * 16, acc, D, wmma::mem_row_major);
    }
    __syncthreads();  // K, V are overwritten next
  }

  for (int i = threadIdx.x; i < rows * D; i += blockDim.x) {
    const int r = i / D, d = i % D;
    const float l = row_l[r];
    out[(int64_t(t0 + r) * n_heads + h) * D + d] = __float2bfloat16_rn(l > 0.0f ? O[r * D + d] / l : 0.0f);
  }
}

template <int D>
cudaError_t fa_launch(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, int p0, float scale,
                      void* out, cudaStream_t s) {
  constexpr size_t smem = fa_smem_bytes<D>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(fa_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(unsigned((b.n_tokens + kQ - 1) / kQ), unsigned(n_heads));
  launch_k(fa_prefill_kernel<D>, grid, dim3(kFaWarps * 32), smem, s, static_cast<const __nv_bfloat16*>(q), n_heads, kv,
           layer, b, p0, scale * 1.4426950408889634f, static_cast<__nv_bfloat16*>(out));
  return cudaGetLastError();
}

}  // namespace

bool attention_prefill_ok(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

cudaError_t attention_prefill(const void* q, int n_heads, const KVDev& kv, int layer, const BatchDev& b, int p0,
                              float scale, void* out, cudaStream_t s) {
  switch (kv.head_dim) {
    case 32: return fa_launch<32>(q, n_heads, kv, layer, b, p0, scale, out, s);
    case 64: return fa_launch<64>(q, n_heads, kv, layer, b, p0, scale, out, s);
    case 128: return fa_launch<128>(q, n_heads, kv, layer, b, p0, scale, out, s);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace anvil::cuda
