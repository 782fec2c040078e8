// Internal to src/backend/cuda/: the end of a split-KV attention block (attention.cu's split kernel,
// attention_decode_tc.cu): merging its W warps' online-softmax states and writing the result.
#pragma once
#include <cfloat>

#include "backend/cuda/cuda_common.cuh"

namespace anvil::cuda {

// The splits of a launch that hold positions for a context of len: at least kMinSplitPositions
// each (a 16-position tile for each of a block's 4 warps), at most the launch's n_splits. The launch
// shape comes from the page table's capacity (so a captured graph stays valid as the context grows);
// this count comes from the context itself, so a short context is not spread over dozens of blocks
// of one near-empty tile each and their partials (qwen3-0.6b decode at 512 tokens: 66 splits of 8
// positions, two waves of blocks, ~14 us per layer). Blocks s >= live_splits exit at once, the
// combine reads only the live partials, and with one live split its block writes the output.
// len: the positions the query attends to (with a sliding window, at most the window: window_lo).
constexpr int kMinSplitPositions = 64;
__device__ __forceinline__ int live_splits(int len, int n_splits) {
  return max(1, min(n_splits, (len + kMinSplitPositions - 1) / kMinSplitPositions));
}

// For each of the block's G heads and each of the D dims (threads of the block striding over them):
// the warps' states (m_w, l_w, acc_w) merged into (M, L, A) with weights exp2(m_w - M) (0 for an empty
// warp), handed to sink(g, d, M, L, A). m(w, g), l(w, g), acc(w, g, d) read the states from shared
// memory, published and synchronized by the caller.
template <int W, class Mf, class Lf, class Af, class Sink>
__device__ __forceinline__ void merge_warps(int G, int D, Mf&& m, Lf&& l, Af&& acc, Sink&& sink) {
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float M = -FLT_MAX;
    for (int w = 0; w < W; ++w) M = fmaxf(M, m(w, g));
    float L = 0.0f, A = 0.0f;
    for (int w = 0; w < W; ++w) {
      const float c = l(w, g) > 0.0f ? exp2f(m(w, g) - M) : 0.0f;
      L += l(w, g) * c;
      A += acc(w, g, d) * c;
    }
    sink(g, d, M, L, A);
  }
}

// merge_warps, written either as the bf16 output A / L of head th0 + g (out non-null: one split) or
// as this split's partial [M, L, A[D]] in ws ([head][split][D + 2]).
template <int W, class Mf, class Lf, class Af>
__device__ __forceinline__ void merge_warps_store(int G, int D, Mf&& m, Lf&& l, Af&& acc, int64_t th0,
                                                  __nv_bfloat16* out, float* ws, int n_splits, int s) {
  merge_warps<W>(G, D, m, l, acc, [&](int g, int d, float M, float L, float A) {
    const int64_t th = th0 + g;
    if (out) {
      out[th * D + d] = __float2bfloat16_rn(L > 0.0f ? A / L : 0.0f);
      return;
    }
    float* part = ws + (th * n_splits + s) * (D + 2);
    if (d == 0) part[0] = M, part[1] = L;
    part[2 + d] = A;
  });
}

}  // namespace anvil::cuda
