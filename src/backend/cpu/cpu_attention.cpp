// qk_norm_rope_kv_append and paged causal attention (GQA, online softmax in fp32).
//
// KV page layout (backend.h): element (page, layer, kv, slot, head, d) at
//   ((((page*n_layers + layer)*2 + kv)*n_kv_heads + head)*page_size + slot)*head_dim + d.
// Attention work items are (token block, kv head): the n_heads/n_kv_heads query heads sharing a kv
// head, for up to 4 consecutive tokens of one sequence (a prefill chunk; decode tokens are blocks
// of one), are processed together so each K/V row is read (and converted from bf16) once per item;
// keys past a query's own position get weight 0. Items are dealt round-robin to threads, which
// balances causal prefill (later tokens see more keys).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace anvil::cpu {
namespace {

inline size_t kv_index(const KVCacheView& kv, int64_t page, int layer, int which, int64_t slot, int head) {
  return size_t(((((page * kv.n_layers + layer) * 2 + which) * kv.n_kv_heads + head) * kv.page_size + slot) *
                kv.head_dim);
}

// Per-head RMSNorm in place (w: [head_dim]).
void head_rmsnorm(float* x, int d, const WeightVector& w, float eps) {
  double ss = 0.0;
  for (int i = 0; i < d; ++i) ss += double(x[i]) * x[i];
  const float inv = float(1.0 / std::sqrt(ss / d + double(eps)));
  for (int i = 0; i < d; ++i) x[i] = x[i] * inv * load_float(w.data, w.dtype, size_t(i));
}

// Rotate-half RoPE in place: pairs (i, i + d/2).
// Rotate-half RoPE over the first d dims (the head's, or its rotary part: pairs (i, i + d/2)); the
// rest of the head is left as it is. m: what the rotated dims are multiplied by (KVCacheView::rope_scale).
void rope(float* x, int d, const float* cs, const float* sn, float m) {
  const int h = d / 2;
  if (m == 1.0f) {
    for (int i = 0; i < h; ++i) {
      const float a = x[i], b = x[i + h];
      x[i] = a * cs[i] - b * sn[i];
      x[i + h] = b * cs[i] + a * sn[i];
    }
    return;
  }
  for (int i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = (a * cs[i] - b * sn[i]) * m;
    x[i + h] = (b * cs[i] + a * sn[i]) * m;
  }
}

void store_row(const KVCacheView& kv, size_t at, const float* src, int d) {
  if (kv.dtype == DType::kF32) {
    std::memcpy(static_cast<float*>(kv.base) + at, src, size_t(d) * 4);
  } else {
    uint16_t* dst = static_cast<uint16_t*>(kv.base) + at;
    for (int i = 0; i < d; ++i) dst[i] = f32_to_bf16(src[i]);
  }
}

// A K or V row as fp32: a pointer into the cache (F32) or converted into buf (BF16).
inline const float* load_row(const KVCacheView& kv, size_t at, float* buf) {
  if (kv.dtype == DType::kF32) return static_cast<const float*>(kv.base) + at;
  const uint16_t* p = static_cast<const uint16_t*>(kv.base) + at;
  for (int i = 0; i < kv.head_dim; ++i) buf[i] = bf16_to_f32(p[i]);
  return buf;
}

float dot_any(const float* a, const float* b, int n, bool avx2) {
  if (avx2) return dot_f32_avx2(a, b, n);
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_any(float a, const float* x, float* y, int n, bool avx2) {
  if (avx2) return axpy_f32_avx2(a, x, y, n);
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

void qk_norm_rope_kv_append_f32(ThreadPool& pool, float* q, const float* k, const float* v, int n_heads,
                                const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                                const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch) {
  const int D = kv.head_dim, Hkv = kv.n_kv_heads;
  const int R = kv.rotary_dim > 0 && kv.rotary_dim < D ? kv.rotary_dim : D, half = R / 2;  // the turned dims
  const float m = kv.rope_scale;
  const int64_t grain = std::max<int64_t>(1, 16384 / (int64_t(n_heads + 2 * Hkv) * D));
  pool.parallel_for(batch.n_tokens, grain, [&](int64_t t0, int64_t t1) {
    // Per-thread scratch, reused across calls: the decode step does not allocate.
    thread_local std::vector<float> cs, sn, tmp;
    cs.resize(static_cast<size_t>(half));
    sn.resize(static_cast<size_t>(half));
    tmp.resize(static_cast<size_t>(D));
    for (int64_t t = t0; t < t1; ++t) {
      const int32_t pos = batch.pos[t], s = batch.seq[t];
      for (int i = 0; i < half; ++i) {  // angles in double: pos * inv_freq loses ~1e-3 rad in fp32 at 40k
        const double a = double(pos) * double(inv_freq[i]);
        cs[size_t(i)] = float(std::cos(a));
        sn[size_t(i)] = float(std::sin(a));
      }
      for (int h = 0; h < n_heads; ++h) {
        float* qh = q + (t * n_heads + h) * D;
        if (q_norm.data) head_rmsnorm(qh, D, q_norm, eps);
        rope(qh, R, cs.data(), sn.data(), m);
      }
      const int64_t page = batch.page_table[int64_t(s) * batch.max_pages + pos / kv.page_size];
      const int64_t slot = pos % kv.page_size;
      for (int h = 0; h < Hkv; ++h) {
        std::memcpy(tmp.data(), k + (t * Hkv + h) * D, size_t(D) * 4);
        if (k_norm.data) head_rmsnorm(tmp.data(), D, k_norm, eps);
        rope(tmp.data(), R, cs.data(), sn.data(), m);
        store_row(kv, kv_index(kv, page, layer, 0, slot, h), tmp.data(), D);
        store_row(kv, kv_index(kv, page, layer, 1, slot, h), v + (t * Hkv + h) * D, D);
      }
    }
  });
}

void attention_f32(ThreadPool& pool, const float* q, int n_heads, const KVCacheView& kv, int layer,
                   const BatchView& batch, float scale, float* out) {
  const int D = kv.head_dim, Hkv = kv.n_kv_heads, P = kv.page_size;
  const int ratio = n_heads / Hkv;
  const int64_t window = kv.window_of(layer);  // 0: the whole context
  const bool avx2 = cpu_use_avx2();
  // BF16 cache with AVX2: K/V rows are converted in registers, no staging copy.
  constexpr int kMaxQueries = 64;
  const bool bf16_fast = avx2 && kv.dtype == DType::kBF16 && ratio <= kMaxQueries;
  // Token blocks: up to kBlock consecutive tokens of one sequence at consecutive positions (a
  // prefill chunk) share each K/V row they read; single tokens (decode) are blocks of one.
  const int kBlock = std::max(1, std::min(4, kMaxQueries / ratio));
  // Reused across calls (no allocation per step). A named reference, because the workers' lambda
  // must read this thread's vector, not their own thread_local instance.
  thread_local std::vector<int32_t> tl_block_start;
  std::vector<int32_t>& block_start = tl_block_start;
  block_start.clear();
  for (int32_t t = 0; t < batch.n_tokens;) {
    block_start.push_back(t);
    int32_t e = t + 1;
    while (e < batch.n_tokens && e - t < kBlock && batch.seq[e] == batch.seq[t] && batch.pos[e] == batch.pos[e - 1] + 1)
      ++e;
    t = e;
  }
  block_start.push_back(batch.n_tokens);
  const int64_t n_blocks = int64_t(block_start.size()) - 1;
  const int64_t items = n_blocks * Hkv;
  const int workers = int(std::min<int64_t>(pool.size(), items));
  pool.parallel_for(workers, 1, [&](int64_t w0, int64_t w1) {
    const int max_q = kBlock * ratio;
    // Per-thread scratch, reused across calls; every item initialises what it reads.
    thread_local std::vector<float> kbuf, vbuf, qbuf, acc, score, m, l, corr;
    thread_local std::vector<int64_t> limit, first;  // the keys each query sees: first .. limit - 1
    kbuf.resize(static_cast<size_t>(D));
    vbuf.resize(static_cast<size_t>(D));
    qbuf.resize(size_t(max_q) * D);
    acc.resize(size_t(max_q) * D);
    score.resize(size_t(max_q) * P);
    m.resize(static_cast<size_t>(max_q));
    l.resize(static_cast<size_t>(max_q));
    corr.resize(static_cast<size_t>(max_q));
    limit.resize(static_cast<size_t>(max_q));
    first.resize(static_cast<size_t>(max_q));
    for (int64_t wk = w0; wk < w1; ++wk)
      for (int64_t item = wk; item < items; item += workers) {
        const int64_t blk = item / Hkv;
        const int kvh = int(item % Hkv);
        const int64_t t0 = block_start[size_t(blk)];
        const int nt = int(block_start[size_t(blk) + 1] - t0);
        const int nq = nt * ratio;
        const int32_t* pages = batch.page_table + int64_t(batch.seq[t0]) * batch.max_pages;
        // The block's queries, token-major: query i is head (i % ratio) of the group, token i / ratio.
        const float* qg = q + (t0 * n_heads + int64_t(kvh) * ratio) * D;
        if (nt > 1) {
          for (int ti = 0; ti < nt; ++ti)
            std::memcpy(qbuf.data() + size_t(ti) * ratio * D, qg + int64_t(ti) * n_heads * D, size_t(ratio) * D * 4);
          qg = qbuf.data();
        }
        for (int i = 0; i < nq; ++i) limit[size_t(i)] = int64_t(batch.pos[t0 + i / ratio]) + 1;
        const int64_t n_ctx = limit[size_t(nq - 1)];
        // Sliding window W: query i sees positions limit - W .. limit - 1 only (first[i]); the block's
        // first token has the earliest, so pages before its window's page are not read at all.
        for (int i = 0; i < nq; ++i) first[size_t(i)] = window > 0 ? std::max<int64_t>(0, limit[size_t(i)] - window) : 0;
        const int64_t j_begin = first[0] / P * P;
        // The P contiguous K (which = 0) or V (1) rows of this kv head in a page of a BF16 cache.
        auto bf16_rows = [&](int64_t pg, int which) {
          return static_cast<const uint16_t*>(kv.base) + kv_index(kv, pg, layer, which, 0, kvh);
        };
        std::fill(acc.begin(), acc.begin() + int64_t(nq) * D, 0.0f);
        std::fill(m.begin(), m.begin() + nq, -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.begin() + nq, 0.0f);
        for (int64_t j0 = j_begin; j0 < n_ctx; j0 += P) {
          const int64_t page = pages[j0 / P];
          const int n = int(std::min<int64_t>(P, n_ctx - j0));
          if (bf16_fast) {
            if (j0 + P < n_ctx) {  // the next page's K and V rows are elsewhere in the pool: fetch them now
              const int64_t next = pages[j0 / P + 1];
              const char* kn = reinterpret_cast<const char*>(bf16_rows(next, 0));
              const char* vn = reinterpret_cast<const char*>(bf16_rows(next, 1));
              for (int64_t b = 0; b < int64_t(P) * D * 2; b += 64) {
                __builtin_prefetch(kn + b);
                __builtin_prefetch(vn + b);
              }
            }
            scores_bf16_avx2(qg, nq, bf16_rows(page, 0), n, D, scale, score.data(), P);
          } else {
            for (int j = 0; j < n; ++j) {
              const float* kr = load_row(kv, kv_index(kv, page, layer, 0, j, kvh), kbuf.data());
              for (int r = 0; r < nq; ++r) score[size_t(r) * P + j] = dot_any(qg + r * D, kr, D, avx2) * scale;
            }
          }
          // Online softmax: rescale what was accumulated to the new running max. Keys past a
          // query's own position (later tokens of its block) and before its window get weight 0.
          for (int r = 0; r < nq; ++r) {
            float* sc = score.data() + size_t(r) * P;
            const int visible = int(std::clamp<int64_t>(limit[size_t(r)] - j0, 0, n));
            const int from = int(std::clamp<int64_t>(first[size_t(r)] - j0, 0, visible));
            float mx = m[size_t(r)];
            for (int j = from; j < visible; ++j) mx = std::max(mx, sc[j]);
            if (visible == from) {
              // Nothing for this query in this page. m stays as it was: -inf until the query's first
              // visible key (its window may start on a later page than the block's first query's),
              // and acc and l are still 0 then, so the next page's exp(-inf - mx) = 0 leaves them be.
              std::fill(sc, sc + n, 0.0f);
              corr[size_t(r)] = 1.0f;
              continue;
            }
            const float c = std::exp(m[size_t(r)] - mx);  // exp(-inf) = 0 on the query's first page
            float sum = 0.0f;
            if (avx2) {
              sum = exp_shift_sum_avx2(sc + from, visible - from, mx);
            } else {
              for (int j = from; j < visible; ++j) {
                sc[j] = std::exp(sc[j] - mx);
                sum += sc[j];
              }
            }
            std::fill(sc, sc + from, 0.0f);
            std::fill(sc + visible, sc + n, 0.0f);
            l[size_t(r)] = l[size_t(r)] * c + sum;
            m[size_t(r)] = mx;
            corr[size_t(r)] = c;
          }
          if (bf16_fast) {
            pv_bf16_avx2(score.data(), P, nq, bf16_rows(page, 1), n, D, corr.data(), acc.data());
            continue;
          }
          for (int r = 0; r < nq; ++r) {
            float* a = acc.data() + size_t(r) * D;
            for (int d = 0; d < D; ++d) a[d] *= corr[size_t(r)];
          }
          for (int j = 0; j < n; ++j) {
            const float* vr = load_row(kv, kv_index(kv, page, layer, 1, j, kvh), vbuf.data());
            for (int r = 0; r < nq; ++r)
              if (score[size_t(r) * P + j] != 0.0f) axpy_any(score[size_t(r) * P + j], vr, acc.data() + size_t(r) * D, D, avx2);
          }
        }
        for (int i = 0; i < nq; ++i) {
          float* o = out + ((t0 + i / ratio) * n_heads + int64_t(kvh) * ratio + i % ratio) * D;
          const float inv = 1.0f / l[size_t(i)];
          for (int d = 0; d < D; ++d) o[d] = acc[size_t(i) * D + d] * inv;
        }
      }
  });
}

}  // namespace anvil::cpu
