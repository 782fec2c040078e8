// Mat-vec for decode-sized batches (T <= kGemvMaxTokens): out[T, N] = x[T, K] W^T, fp32 accumulation.
// Weight-bandwidth bound: every weight byte is read once per call, whatever T is.
//
// Work split: a chunk is 32 consecutive elements of one weight row (MLX groups are >= 32 and
// aligned, so a chunk has one scale and one bias). One warp owns R rows; its lanes stride over the
// row's chunks (lane c reads chunks c, c+32, ...), so a warp's loads are consecutive 16-byte pieces
// of each row (coalesced), and the x chunk a lane converts to fp32 serves all R rows.
// Affine quantization is applied per chunk as  s * dot(q, x) + b * sum(x)  (one multiply per chunk
// instead of one per element).
// Format codes (FMT): 2..8 = MLX affine bits; 16 = dense bf16; 17 = dense f16; 32 = dense f32.
// Dense matrices whose cols are not a multiple of 32 take the scalar kernel at the end.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/dequant.cuh"

namespace anvil::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block

struct Seg {
  DevMatrix w;
  void* out = nullptr;
  int64_t warp_begin = 0;  // first global warp of this matrix
};
struct GemvParams {
  Seg seg[3];
  int n_seg = 0;
  DevMatrix up;  // SWIGLU only: same format and shape as seg[0].w
  const uint16_t* x = nullptr;
  int T = 0;
  int64_t K = 0;
  bool out_f32 = false;
};

template <int FMT, int R, int TT, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvParams p) {
  pdl_begin();
  constexpr int W = chunk_words<FMT>();
  constexpr int M = SWIGLU ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  int si = 0;
  if (p.n_seg > 1 && gw >= p.seg[1].warp_begin) si = 1;
  if (p.n_seg > 2 && gw >= p.seg[2].warp_begin) si = 2;
  const DevMatrix& w0 = p.seg[si].w;
  const int64_t row0 = (gw - p.seg[si].warp_begin) * R;
  if (row0 >= w0.rows) return;
  const int64_t K = p.K, nchunks = K / 32;
  const int64_t groups = FMT <= 8 ? K / w0.group : 0;
  const int chunks_per_group = FMT <= 8 ? w0.group / 32 : 1;

  float acc[M][R][TT];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t) acc[m][r][t] = 0.0f;

  for (int64_t c = lane; c < nchunks; c += 32) {
    // All rows' weight words first: R*M independent loads in flight.
    uint32_t wq[M][R][W];
    float sc[M][R], bi[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const DevMatrix& wm = m == 0 ? w0 : p.up;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t row = min(row0 + r, wm.rows - 1);  // clamped: duplicates are computed, not stored
        load_words<W>(static_cast<const uint32_t*>(wm.data) + row * row_words<FMT>(K) + c * W, wq[m][r]);
        if constexpr (FMT <= 8) {
          const int64_t g = row * groups + c / chunks_per_group;
          sc[m][r] = load_any(wm.scales, g, wm.dtype);
          bi[m][r] = load_any(wm.biases, g, wm.dtype);
        } else {
          sc[m][r] = 1.0f, bi[m][r] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < p.T) {
        float xf[32];
        const float sx = load_x_chunk(p.x + t * K, c, xf);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 32; ++e) d = fmaf(chunk_elem<FMT, W>(wq[m][r], e), xf[e], d);
            if constexpr (FMT <= 8) acc[m][r][t] += sc[m][r] * d + bi[m][r] * sx;
            else acc[m][r][t] += d;
          }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      float v[M];
#pragma unroll
      for (int m = 0; m < M; ++m) v[m] = warp_sum(acc[m][r][t]);
      const int64_t row = row0 + r;
      if (lane == 0 && t < p.T && row < w0.rows) {
        if constexpr (SWIGLU) {
          const float g = v[0], u = v[1];
          store_elem<Elem::kBF16>(p.seg[0].out, t * w0.rows + row, g / (1.0f + __expf(-g)) * u);
        } else {
          float o = v[0];
          if (w0.bias) o += load_any(w0.bias, row, w0.bias_dtype);
          if (p.out_f32) store_elem<Elem::kF32>(p.seg[si].out, t * w0.rows + row, o);
          else store_elem<Elem::kBF16>(p.seg[si].out, t * w0.rows + row, o);
        }
      }
    }
  }
}

// Any dense dtype and any cols (the odd-size fallback): one warp per row, one element per lane step.
template <bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_scalar_kernel(GemvParams p) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t gw = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  int si = 0;
  if (p.n_seg > 1 && gw >= p.seg[1].warp_begin) si = 1;
  if (p.n_seg > 2 && gw >= p.seg[2].warp_begin) si = 2;
  const DevMatrix& w0 = p.seg[si].w;
  const int64_t row = gw - p.seg[si].warp_begin;
  if (row >= w0.rows) return;
  for (int t = 0; t < p.T; ++t) {
    float a = 0.0f, b = 0.0f;
    for (int64_t k = lane; k < p.K; k += 32) {
      const float xv = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p.x)[t * p.K + k]);
      a = fmaf(load_any(w0.data, row * p.K + k, w0.dtype), xv, a);
      if constexpr (SWIGLU) b = fmaf(load_any(p.up.data, row * p.K + k, p.up.dtype), xv, b);
    }
    a = warp_sum(a);
    if constexpr (SWIGLU) b = warp_sum(b);
    if (lane == 0) {
      if constexpr (SWIGLU) {
        store_elem<Elem::kBF16>(p.seg[0].out, t * w0.rows + row, a / (1.0f + __expf(-a)) * b);
      } else {
        if (w0.bias) a += load_any(w0.bias, row, w0.bias_dtype);
        if (p.out_f32) store_elem<Elem::kF32>(p.seg[si].out, t * w0.rows + row, a);
        else store_elem<Elem::kBF16>(p.seg[si].out, t * w0.rows + row, a);
      }
    }
  }
}

int fmt_of(const DevMatrix& w) {
  if (w.bits) return w.bits;
  if (w.cols % 32 != 0) return 0;  // scalar kernel
  switch (w.dtype) {
    case Elem::kBF16: return 16;
    case Elem::kF16: return 17;
    default: return 32;
  }
}

// Rows per warp: more rows share each x conversion, fewer leave SMs idle on narrow matrices.
// ANVIL_GEMV_BF16_R=1|2|4 forces the rows per warp of one-token bf16 launches (for measuring; the
// bf16 decode's mat-vecs ran at ~2.5 TB/s on the H200, 60% of the copy bandwidth).
int forced_bf16_rows() {
  static const int r = [] {
    const char* e = std::getenv("ANVIL_GEMV_BF16_R");
    const int v = e ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 ? v : 0;
  }();
  return r;
}
int pick_rows(int fmt, int64_t total_rows, int T) {
  if (T > 1 || fmt == 0 || fmt == 17 || fmt == 32) return 1;
  if (fmt == 16 && forced_bf16_rows()) return forced_bf16_rows();
  const int64_t want_warps = 132 * 16;  // ~16 resident warps per SM
  if (fmt != 16 && total_rows >= 4 * want_warps) return 4;
  if (total_rows >= 2 * want_warps) return 2;
  return 1;
}

template <int FMT, int R, int TT, bool SW>
cudaError_t launch_t(GemvParams& p, int64_t warps, cudaStream_t s) {
  const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
  launch_k(gemv_kernel<FMT, R, TT, SW>, dim3(blocks), dim3(kWarps * 32), 0, s, p);
  return cudaGetLastError();
}

template <int FMT, bool SW>
cudaError_t launch_fmt(GemvParams& p, int R, int64_t warps, cudaStream_t s) {
  if (p.T > 1) return launch_t<FMT, 1, kGemvMaxTokens, SW>(p, warps, s);
  if constexpr (FMT == 4 || FMT == 8 || FMT == 16) {
    if (R == 4) return launch_t<FMT, 4, 1, SW>(p, warps, s);
  }
  if constexpr (FMT == 4 || FMT == 8 || FMT == 16) {
    if (R == 2) return launch_t<FMT, 2, 1, SW>(p, warps, s);
  }
  return launch_t<FMT, 1, 1, SW>(p, warps, s);
}

template <bool SW>
cudaError_t dispatch(GemvParams& p, int fmt, int R, int64_t warps, cudaStream_t s) {
  switch (fmt) {
    case 2: return launch_fmt<2, SW>(p, R, warps, s);
    case 3: return launch_fmt<3, SW>(p, R, warps, s);
    case 4: return launch_fmt<4, SW>(p, R, warps, s);
    case 5: return launch_fmt<5, SW>(p, R, warps, s);
    case 6: return launch_fmt<6, SW>(p, R, warps, s);
    case 8: return launch_fmt<8, SW>(p, R, warps, s);
    case 16: return launch_fmt<16, SW>(p, R, warps, s);
    case 17: return launch_fmt<17, SW>(p, R, warps, s);
    case 32: return launch_fmt<32, SW>(p, R, warps, s);
    default: {
      const unsigned blocks = unsigned((warps + kWarps - 1) / kWarps);
      launch_k(gemv_scalar_kernel<SW>, dim3(blocks), dim3(kWarps * 32), 0, s, p);
      return cudaGetLastError();
    }
  }
}

}  // namespace

bool gemv_fusable(const DevMatrix& a, const DevMatrix& b) {
  return a.bits == b.bits && a.group == b.group && a.dtype == b.dtype && a.cols == b.cols && fmt_of(a) == fmt_of(b);
}

static bool use_tc(const DevMatrix& w) {
  const char* e = std::getenv("ANVIL_CUDA_NO_TC");
  return gemv_tc_ok(w) && !(e && *e && *e != '0');
}

bool gemv_uses_tc(const DevMatrix& w) { return use_tc(w); }

namespace {

// Launches of at most `per` tokens (the tensor-core q4 kernel takes kTcMaxTokens, the CUDA-core
// ones kGemvMaxTokens); each launch's x and outputs start at its first token.
template <typename F>
cudaError_t in_chunks(int T, int per, const void* x, int64_t K, F&& launch) {
  for (int t0 = 0; t0 < T; t0 += per) {
    const int n = std::min(per, T - t0);
    cudaError_t e = launch(t0, n, static_cast<const uint8_t*>(x) + size_t(t0) * size_t(K) * 2);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t gemv_one(const DevMatrix* ws, void* const* outs, int n, const void* x, int T, bool out_f32, cudaStream_t s,
                     const GemvScratch* scratch);

cudaError_t gemv_swiglu_one(const DevMatrix& gate, const DevMatrix& up, const void* x, int T, void* out, cudaStream_t s,
                            const GemvScratch* scratch);

}  // namespace

cudaError_t gemv(const DevMatrix* ws, void* const* outs, int n, const void* x, int T, bool out_f32, cudaStream_t s,
                 const GemvScratch* scratch) {
  const int per = use_tc(ws[0]) ? kTcMaxTokens : kGemvMaxTokens;
  if (T <= per) return gemv_one(ws, outs, n, x, T, out_f32, s, scratch);
  return in_chunks(T, per, x, ws[0].cols, [&](int t0, int m, const void* xc) {
    void* o[3];
    for (int i = 0; i < n; ++i) o[i] = static_cast<uint8_t*>(outs[i]) + size_t(t0) * size_t(ws[i].rows) * (out_f32 ? 4 : 2);
    return gemv_one(ws, o, n, xc, m, out_f32, s, scratch);
  });
}

cudaError_t gemv_swiglu(const DevMatrix& gate, const DevMatrix& up, const void* x, int T, void* out,
                        cudaStream_t s, const GemvScratch* scratch) {
  const int per = use_tc(gate) ? kTcMaxTokens : kGemvMaxTokens;
  if (T <= per) return gemv_swiglu_one(gate, up, x, T, out, s, scratch);
  return in_chunks(T, per, x, gate.cols, [&](int t0, int m, const void* xc) {
    return gemv_swiglu_one(gate, up, xc, m, static_cast<uint8_t*>(out) + size_t(t0) * size_t(gate.rows) * 2, s,
                           scratch);
  });
}

namespace {

cudaError_t gemv_one(const DevMatrix* ws, void* const* outs, int n, const void* x, int T, bool out_f32, cudaStream_t s,
                     const GemvScratch* scratch) {
  if (use_tc(ws[0])) return gemv_tc(ws, outs, n, nullptr, x, T, out_f32, s, scratch);
  if (gemv_bf16_takes(ws, n, nullptr, x, T)) return gemv_bf16(ws, outs, n, nullptr, x, out_f32, s);
  GemvParams p;
  p.x = static_cast<const uint16_t*>(x);
  p.T = T;
  p.K = ws[0].cols;
  p.out_f32 = out_f32;
  int64_t total_rows = 0;
  for (int i = 0; i < n; ++i) total_rows += ws[i].rows;
  const int fmt = fmt_of(ws[0]);
  const int R = pick_rows(fmt, total_rows, T);
  int64_t warps = 0;
  for (int i = 0; i < n; ++i) {
    p.seg[i].w = ws[i];
    p.seg[i].out = outs[i];
    p.seg[i].warp_begin = warps;
    warps += (ws[i].rows + R - 1) / R;
  }
  p.n_seg = n;
  return dispatch<false>(p, fmt, R, warps, s);
}

cudaError_t gemv_swiglu_one(const DevMatrix& gate, const DevMatrix& up, const void* x, int T, void* out, cudaStream_t s,
                            const GemvScratch* scratch) {
  if (use_tc(gate)) return gemv_tc(&gate, &out, 1, &up, x, T, false, s, scratch);
  if (gemv_bf16_takes(&gate, 1, &up, x, T)) return gemv_bf16(&gate, &out, 1, &up, x, false, s);
  GemvParams p;
  p.x = static_cast<const uint16_t*>(x);
  p.T = T;
  p.K = gate.cols;
  p.seg[0].w = gate;
  p.seg[0].out = out;
  p.n_seg = 1;
  p.up = up;
  const int fmt = fmt_of(gate);
  const int R = pick_rows(fmt, gate.rows * 2, T) > 1 ? 2 : 1;
  const int64_t warps = (gate.rows + R - 1) / R;
  return dispatch<true>(p, fmt, R, warps, s);
}

}  // namespace

}  // namespace anvil::cuda
