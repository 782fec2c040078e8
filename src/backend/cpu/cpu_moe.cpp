// The mixture-of-experts FFN on the CPU (Backend::moe_ffn): routing, the chosen experts' SwiGLU FFNs and
// the routing-weighted sum, plus qwen2_moe's gated shared expert.
//
// Fast path (AVX2, 4/8-bit experts whose widths fit the integer kernel): tokens are grouped by expert
// (a counting sort of the T*k (token, slot) assignments), so each chosen expert's rows are streamed once
// per call however many tokens chose it — at decode only top_k of the num_experts experts are read. The
// work is one parallel_for over (expert, block of rows) items for gate+up (SwiGLU applied in the item),
// and one for down: threads spread over experts and rows, two pool hand-offs per layer instead of three
// per expert. Each item runs the same int16 integer mat-vec kernel as linear (qgemv_rows_avx2) over tiles
// of the expert's tokens. Anything else (scalar, other bit widths, dense experts) runs the grouped tokens
// of each expert through cpu::linear_f32.
//
// Numerical contract: a token's output depends only on its own row. The router is a linear (row-wise);
// every expert output row is computed whole by one kernel call whose per-token arithmetic does not depend
// on which other tokens share the tile; the weighted sum runs over the token's slots in top-k order.
// So neither the batch composition nor the thread count changes a token's result.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace anvil {

namespace {
std::atomic<bool> g_profile{false};
std::atomic<int64_t> g_route_ns{0}, g_experts_ns{0}, g_calls{0};
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void cpu_moe_profile(bool on) { g_profile.store(on); }
MoEPhaseTimes cpu_moe_phase_times() {
  return MoEPhaseTimes{g_route_ns.load() * 1e-9, g_experts_ns.load() * 1e-9, g_calls.load()};
}
bool moe_phase_profiling() { return g_profile.load(std::memory_order_relaxed); }
void moe_phase_add(double route_s, double experts_s) {
  g_route_ns += int64_t(route_s * 1e9);
  g_experts_ns += int64_t(experts_s * 1e9);
  ++g_calls;
}
void cpu_moe_profile_reset() {
  g_route_ns = 0;
  g_experts_ns = 0;
  g_calls = 0;
}

bool moe_skip_experts() {
  static const bool skip = [] {
    const char* e = std::getenv("ANVIL_MOE_SKIP_EXPERTS");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return skip;
}

namespace cpu {
namespace {

float silu(float g) { return g / (1.0f + std::exp(-g)); }

std::vector<float>& scratch(int slot, size_t n) {
  thread_local std::vector<float> bufs[8];
  if (bufs[slot].size() < n) bufs[slot].resize(n);
  return bufs[slot];
}

// True when every expert matrix can run on the AVX2 integer kernel, with one quantization of x shared by
// all gate/up matrices (same bits and group size) and one per down input.
bool fast_path_ok(const MoEWeights& w) {
  if (!cpu_use_avx2()) return false;
  const WeightMatrix &g0 = w.gate[0], &d0 = w.down[0];
  for (int e = 0; e < w.num_experts; ++e)
    for (const WeightMatrix* m : {&w.gate[size_t(e)], &w.up[size_t(e)], &w.down[size_t(e)]}) {
      const WeightMatrix& ref = m == &w.down[size_t(e)] ? d0 : g0;
      if (!m->quantized() || m->bias || m->bits != ref.bits || m->group_size != ref.group_size ||
          !qdot_avx2_supported(m->bits, m->group_size, m->cols))
        return false;
    }
  return true;
}

// Assignments (token t, slot s) -> a = t*k + s, sorted by expert: order[pos] = a for pos in
// [offset[e], offset[e+1]), tokens ascending within an expert; slot_pos[a] = pos.
struct Grouping {
  std::vector<int> offset, order, slot_pos;
};
void group_by_expert(const int* idx, int64_t T, int k, int E, Grouping* g) {
  g->offset.assign(size_t(E) + 1, 0);
  for (int64_t a = 0; a < T * k; ++a) ++g->offset[size_t(idx[a]) + 1];
  for (int e = 0; e < E; ++e) g->offset[size_t(e) + 1] += g->offset[size_t(e)];
  g->order.resize(size_t(T * k));
  g->slot_pos.resize(size_t(T * k));
  std::vector<int> fill(g->offset.begin(), g->offset.end() - 1);
  for (int64_t a = 0; a < T * k; ++a) {
    const int pos = fill[size_t(idx[a])]++;
    g->order[size_t(pos)] = int(a);
    g->slot_pos[size_t(a)] = pos;
  }
}

// Rows quantized to int16 for the AVX2 kernel (one QuantizedX per row), in per-thread buffers reused
// across calls. Used for the tokens' x (gate/up) and for the SwiGLU outputs (down).
struct QuantizedRows {
  std::vector<int16_t> q;
  std::vector<float> scale, sum;
  std::vector<QuantizedX> rows;
  // src: [n, cols]; groups of `group` columns at `bits`. Returns rows.data().
  QuantizedX* quantize(ThreadPool& pool, const float* src, int64_t n, int64_t cols, int bits, int64_t group) {
    const int64_t ng = cols / group;
    q.resize(size_t(n * cols));
    scale.resize(size_t(n * ng));
    sum.resize(size_t(n * ng));
    rows.resize(size_t(n));
    int16_t* qp = q.data();
    float *sp = scale.data(), *mp = sum.data();
    QuantizedX* rp = rows.data();
    auto run = [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        quantize_x_int16_avx2(src + t * cols, cols, bits, group, qp + t * cols, sp + t * ng, mp + t * ng);
        rp[t] = QuantizedX{qp + t * cols, sp + t * ng, mp + t * ng};
      }
    };
    if (n >= 8) pool.parallel_for(n, 4, run);
    else run(0, n);
    return rp;
  }
};

// Expert outputs Y[pos, H] for every assignment, AVX2 integer kernel. x: [T, H].
void experts_avx2(ThreadPool& pool, const float* x, int64_t T, const MoEWeights& w, const Grouping& g, float* Y) {
  const int k = w.top_k, E = w.num_experts;
  const int64_t H = w.gate[0].cols, F = w.gate[0].rows, A = T * k;
  // x quantized once per token for every gate/up matrix.
  thread_local QuantizedRows xquant, hquant;
  const QuantizedX* xst = xquant.quantize(pool, x, T, H, w.gate[0].bits, w.gate[0].group_size);

  // Per assignment position: its token's quantized x, in expert-sorted order (tiles are contiguous).
  thread_local std::vector<QuantizedX> xs_pos;
  xs_pos.resize(size_t(A));
  for (int64_t pos = 0; pos < A; ++pos) xs_pos[size_t(pos)] = xst[g.order[size_t(pos)] / k];

  // Work items: (expert, block of rows). Blocks of ~64 rows keep an item's gate+up rows (~150 KB at
  // q4, hidden 2048) L2-resident while every tile of the expert's tokens passes over them.
  thread_local std::vector<int> active_buf;  // kept between calls: no allocation per token
  active_buf.clear();
  for (int e = 0; e < E; ++e)
    if (g.offset[size_t(e) + 1] > g.offset[size_t(e)]) active_buf.push_back(e);
  const int64_t na = int64_t(active_buf.size());
  // The pool's threads see their own thread_local: they read this thread's list through a pointer.
  const int* active = active_buf.data();
  // Rows per kernel pass, as linear_quant_avx2 picks them: 4 with the AVX-512 form, else 3 (the
  // experts here are 4/8-bit with groups of 64 or more, or 4-bit group 32, which stays AVX2).
  const bool wide = cpu_use_avx512() && !(w.gate[0].bits == 4 && w.gate[0].group_size == 32);
  auto tile_of = [wide](int64_t n) { return n <= 4 ? n : int64_t(wide ? 4 : 3); };
  constexpr int64_t kRows = 64;

  float* G = scratch(2, size_t(A * F)).data();
  float* U = scratch(3, size_t(A * F)).data();
  const int64_t fblocks = (F + kRows - 1) / kRows;
  const QuantizedX* xsp = xs_pos.data();
  pool.parallel_for(na * fblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int ex = active[item / fblocks];
      const int64_t r0 = (item % fblocks) * kRows, r1 = std::min(F, r0 + kRows);
      const int64_t p0 = g.offset[size_t(ex)], p1 = g.offset[size_t(ex) + 1];
      const int64_t tile = tile_of(p1 - p0);
      for (int64_t p = p0; p < p1; p += tile) {
        const int nx = int(std::min(tile, p1 - p));
        qgemv_rows_avx2(w.gate[size_t(ex)], r0, r1, xsp + p, nx, G + p * F, F);
        qgemv_rows_avx2(w.up[size_t(ex)], r0, r1, xsp + p, nx, U + p * F, F);
      }
      for (int64_t p = p0; p < p1; ++p)
        for (int64_t r = r0; r < r1; ++r) G[p * F + r] = silu(G[p * F + r]) * U[p * F + r];
    }
  });

  // The SwiGLU outputs quantized for the down projections, one row per assignment.
  const QuantizedX* hsp = hquant.quantize(pool, G, A, F, w.down[0].bits, w.down[0].group_size);

  const int64_t hblocks = (H + kRows - 1) / kRows;
  pool.parallel_for(na * hblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t item = b; item < e; ++item) {
      const int ex = active[item / hblocks];
      const int64_t r0 = (item % hblocks) * kRows, r1 = std::min(H, r0 + kRows);
      const int64_t p0 = g.offset[size_t(ex)], p1 = g.offset[size_t(ex) + 1];
      const int64_t tile = tile_of(p1 - p0);
      for (int64_t p = p0; p < p1; p += tile)
        qgemv_rows_avx2(w.down[size_t(ex)], r0, r1, hsp + p, int(std::min(tile, p1 - p)), Y + p * H, H);
    }
  });
}

// Expert outputs Y[pos, H], any weights: each expert's tokens gathered and run through linear_f32.
void experts_generic(ThreadPool& pool, const float* x, int64_t T, const MoEWeights& w, const Grouping& g, float* Y) {
  const int k = w.top_k;
  const int64_t H = w.gate[0].cols, F = w.gate[0].rows;
  const int64_t A = T * k;
  float* X = scratch(2, size_t(A * H)).data();
  float* G = scratch(3, size_t(A * F)).data();
  float* U = scratch(4, size_t(A * F)).data();
  for (int64_t pos = 0; pos < A; ++pos)
    std::memcpy(X + pos * H, x + (g.order[size_t(pos)] / k) * H, size_t(H) * sizeof(float));
  for (int e = 0; e < w.num_experts; ++e) {
    const int64_t p0 = g.offset[size_t(e)], n = g.offset[size_t(e) + 1] - p0;
    if (n == 0) continue;
    linear_f32(pool, X + p0 * H, n, w.gate[size_t(e)], G + p0 * F);
    linear_f32(pool, X + p0 * H, n, w.up[size_t(e)], U + p0 * F);
    for (int64_t i = p0 * F; i < (p0 + n) * F; ++i) G[i] = silu(G[i]) * U[i];
    linear_f32(pool, G + p0 * F, n, w.down[size_t(e)], Y + p0 * H);
  }
}

}  // namespace

void moe_route(const float* logits, int E, int k, bool norm, int* idx, float* wt) {
  float mx = logits[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  float* p = scratch(7, size_t(E)).data();
  float sum = 0;
  for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(logits[e] - mx));
  for (int e = 0; e < E; ++e) p[e] /= sum;
  // Top-k by probability, ties to the lower index: k passes of an argmax (k <= E is small).
  for (int i = 0; i < k; ++i) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < i && !taken; ++j) taken = idx[j] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[i] = best;
    wt[i] = p[best];
  }
  if (norm) {
    float s = 0;
    for (int i = 0; i < k; ++i) s += wt[i];
    for (int i = 0; i < k; ++i) wt[i] /= s;
  }
}

void moe_ffn_f32(ThreadPool& pool, const float* x, int64_t T, const MoEWeights& w, float* out) {
  const bool prof = g_profile.load(std::memory_order_relaxed);
  const int64_t t0 = prof ? now_ns() : 0;
  const int E = w.num_experts, k = w.top_k;
  const int64_t H = w.router.cols, A = T * k;
  float* logits = scratch(0, size_t(T * E)).data();
  linear_f32(pool, x, T, w.router, logits);
  std::vector<int> idx(static_cast<size_t>(A));
  std::vector<float> wt(static_cast<size_t>(A));
  for (int64_t t = 0; t < T; ++t) moe_route(logits + t * E, E, k, w.norm_topk_prob, &idx[size_t(t * k)], &wt[size_t(t * k)]);
  const int64_t t1 = prof ? now_ns() : 0;

  std::fill(out, out + T * H, 0.0f);
  if (!moe_skip_experts()) {
    thread_local Grouping g;
    group_by_expert(idx.data(), T, k, E, &g);
    float* Y = scratch(1, size_t(A * H)).data();
    if (fast_path_ok(w)) experts_avx2(pool, x, T, w, g, Y);
    else experts_generic(pool, x, T, w, g, Y);
    // The routing-weighted sum, per token over its slots in top-k order.
    for (int64_t t = 0; t < T; ++t)
      for (int s = 0; s < k; ++s) {
        const float c = wt[size_t(t * k + s)];
        const float* y = Y + int64_t(g.slot_pos[size_t(t * k + s)]) * H;
        float* o = out + t * H;
        for (int64_t i = 0; i < H; ++i) o[i] += c * y[i];
      }
  }
  if (w.has_shared()) {
    const int64_t S = w.shared_up.rows;
    float* sg = scratch(4, size_t(T * S)).data();
    float* su = scratch(5, size_t(T * S)).data();
    float* sd = scratch(6, size_t(T * H)).data();
    std::vector<float> gate(static_cast<size_t>(T));
    linear_f32(pool, x, T, w.shared_gate, sg);
    linear_f32(pool, x, T, w.shared_up, su);
    for (int64_t i = 0; i < T * S; ++i) sg[i] = silu(sg[i]) * su[i];
    linear_f32(pool, sg, T, w.shared_down, sd);
    linear_f32(pool, x, T, w.shared_gate_w, gate.data());
    for (int64_t t = 0; t < T; ++t) {
      const float c = 1.0f / (1.0f + std::exp(-gate[size_t(t)]));
      for (int64_t i = 0; i < H; ++i) out[t * H + i] += c * sd[t * H + i];
    }
  }
  if (prof) {
    const int64_t t2 = now_ns();
    g_route_ns += t1 - t0;
    g_experts_ns += t2 - t1;
    ++g_calls;
  }
}

// The reference: per token, every chosen expert's rows dequantized and dotted in double precision. Slow
// and obviously right; tests hold moe_ffn_f32 to it.
void moe_ffn_reference_f32(const float* x, int64_t T, const MoEWeights& w, float* out) {
  const int E = w.num_experts, k = w.top_k;
  const int64_t H = w.router.cols;
  std::vector<float> row(static_cast<size_t>(std::max<int64_t>(H, std::max(w.gate[0].rows, w.shared_up.rows))));
  auto matvec = [&](const WeightMatrix& m, const float* v, float* o) {
    for (int64_t r = 0; r < m.rows; ++r) {
      weight_row_to_f32(m, r, row.data());
      double s = 0;
      for (int64_t c = 0; c < m.cols; ++c) s += double(row[size_t(c)]) * v[c];
      o[r] = float(s + weight_bias(m, r));
    }
  };
  auto swiglu_mlp = [&](const WeightMatrix& g, const WeightMatrix& u, const WeightMatrix& d, const float* v,
                        std::vector<double>& acc, double c) {
    std::vector<float> gv(static_cast<size_t>(g.rows)), uv(static_cast<size_t>(g.rows)), dv(static_cast<size_t>(H));
    matvec(g, v, gv.data());
    matvec(u, v, uv.data());
    for (int64_t i = 0; i < g.rows; ++i) gv[size_t(i)] = float(gv[size_t(i)] / (1.0 + std::exp(-double(gv[size_t(i)]))) * uv[size_t(i)]);
    matvec(d, gv.data(), dv.data());
    for (int64_t i = 0; i < H; ++i) acc[size_t(i)] += c * dv[size_t(i)];
  };
  std::vector<float> logits(static_cast<size_t>(E));
  std::vector<int> idx(static_cast<size_t>(k));
  std::vector<float> wt(static_cast<size_t>(k));
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * H;
    matvec(w.router, xt, logits.data());
    moe_route(logits.data(), E, k, w.norm_topk_prob, idx.data(), wt.data());
    std::vector<double> acc(size_t(H), 0.0);
    if (!moe_skip_experts())
      for (int s = 0; s < k; ++s) {
        const size_t e = size_t(idx[size_t(s)]);
        swiglu_mlp(w.gate[e], w.up[e], w.down[e], xt, acc, wt[size_t(s)]);
      }
    if (w.has_shared()) {
      float gl;
      matvec(w.shared_gate_w, xt, &gl);
      swiglu_mlp(w.shared_gate, w.shared_up, w.shared_down, xt, acc, 1.0 / (1.0 + std::exp(-double(gl))));
    }
    for (int64_t i = 0; i < H; ++i) out[t * H + i] = float(acc[size_t(i)]);
  }
}

}  // namespace cpu
}  // namespace anvil
