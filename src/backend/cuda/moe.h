// Internal to src/backend/cuda/: the mixture-of-experts kernels (moe.cu) that Backend::moe_ffn runs
// (moe_runner.cpp plans the calls). Plain C++, no device code.
//
// Decode (T <= kMoEDecodeMaxTokens tokens), three launches per MoE layer, no host synchronisation:
//   moe_route      router logits -> fp32 softmax -> top-k (ties: lower index) -> optional renormalization,
//                  plus the shared expert's sigmoid gate; the chosen ids stay in device memory
//   moe_gate_up    h[a] = silu(gate_e x_t) * up_e x_t for every (token t, slot s) pair a = t*k + s with
//                  e = idx[a], plus the shared expert (slot "E") in the same launch
//   moe_down       out[t] = sum_s wt[a] * down_e h[a]  (+ c_t * shared_down hs[t]), the weighted sum in
//                  top-k order folded into the down projection
// Prefill (more tokens): moe_route, then moe_group (a histogram and scan of the T*k assignments into
// per-expert row lists, one block), then two grouped GEMMs over (expert, tile of its rows) and
// moe_combine (the weighted sum per token in top-k order). Every launch shape depends only on
// (T, the weights' shapes), never on the routing.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_kernels.h"

namespace anvil::cuda {

constexpr int kMoEDecodeMaxTokens = 8;  // up to this many tokens: the per-pair mat-vec kernels
constexpr int kMoEMaxExperts = 512;     // the routing kernel's shared memory holds one row of E probabilities per warp
constexpr int kMoEMaxTopK = 32;

// One expert matrix's device pointers; the shape and format are those of its MoEMats.
struct ExpertPtrs {
  const void* data = nullptr;
  const void* scales = nullptr;  // quantized only
  const void* biases = nullptr;
};

// A set of expert matrices of one format: ptrs[0..E) the routed experts, ptrs[E] the shared expert
// when it is fused (its rows or cols may differ: shared_rows / shared_cols).
struct MoEMats {
  const ExpertPtrs* ptrs = nullptr;  // device memory
  int64_t rows = 0, cols = 0;
  int fmt = 0;  // dequant.cuh format code: 2..6 or 8 (MLX affine), 16 bf16, 17 f16, 32 f32
  int group = 0;
  Elem dtype = Elem::kBF16;  // scales/biases (quantized) or elements (dense)
};

// The format code of a weight (bits for MLX affine, 16/17/32 for dense bf16/f16/f32).
inline int moe_fmt(int bits, Elem dtype) {
  if (bits) return bits;
  return dtype == Elem::kBF16 ? 16 : dtype == Elem::kF16 ? 17 : 32;
}
// Formats the MoE kernels are compiled for (experts and router): MLX affine 2, 3, 4, 5, 6 and 8
// bits (every width mlx-lm writes) and dense bf16/f16/f32.
inline bool moe_fmt_supported(int fmt) { return (fmt >= 2 && fmt <= 6) || fmt == 8 || fmt == 16 || fmt == 17 || fmt == 32; }

struct MoERouteArgs {
  const void* x = nullptr;  // bf16 [T, H]
  int T = 0;
  int64_t H = 0;
  DevMatrix router;        // [E, H], format moe_fmt(router.bits, router.dtype)
  DevMatrix shared_gate;   // [1, H] or data == nullptr (no shared expert); any bits 2..8 or dense
  int E = 0, k = 0;
  bool norm_topk = false;
  float* logits = nullptr;  // workspace [T, E]
  int* counters = nullptr;  // [ceil(T / 8)], zero between launches (the kernel leaves them zero)
  int32_t* idx = nullptr;   // [T, k]
  float* wt = nullptr;      // [T, k]
  float* shared_coef = nullptr;  // [T]: sigmoid(x_t . shared_gate); written when shared_gate.data
  bool early = false;            // set by moe_route (ANVIL_MOE_ROUTE_EARLY): router rows read before the PDL wait
};
cudaError_t moe_route(const MoERouteArgs& a, cudaStream_t s);

struct MoEGateUpArgs {
  const void* x = nullptr;  // bf16 [T, H]
  int T = 0, k = 0, E = 0;
  const int32_t* idx = nullptr;  // [T, k]
  MoEMats gate, up;              // rows F, cols H; same format
  bool routed = true;            // false: only the shared expert (ANVIL_MOE_SKIP_EXPERTS)
  int64_t shared_rows = 0;       // S > 0: also the shared expert, ptrs[E], into hs
  void* h = nullptr;             // bf16 [T*k, F]
  void* hs = nullptr;            // bf16 [T, S]
  bool stream = false;           // the streamed q4 kernel (moe_stream.cu) may take the routed experts
  bool late_trigger = false;     // pdl_begin_late: the next kernel (moe_down with early) may start
                                 // reading idx / wt before its wait
  const void* xplanes = nullptr; // T == 1: x as the integer path's int16 planes (rmsnorm wrote them),
                                 // copied by the streamed INT kernel instead of staging x; or null
};
cudaError_t moe_gate_up(const MoEGateUpArgs& a, cudaStream_t s);

struct MoEDownArgs {
  const void* h = nullptr;   // bf16 [T*k, F]
  const void* hs = nullptr;  // bf16 [T, S] (fused shared expert)
  int T = 0, k = 0, E = 0;
  int n_slots = 0;           // k, or 0 to skip the routed experts
  const int32_t* idx = nullptr;
  const float* wt = nullptr;
  MoEMats down;                      // rows H, cols F
  int64_t shared_cols = 0;           // S > 0: fused shared expert, ptrs[E] with cols S
  const float* shared_coef = nullptr;       // [T] (with a shared expert, fused or not)
  const void* shared_out = nullptr;  // bf16 [T, H]: the unfused shared expert's output, or null
  void* out = nullptr;               // bf16 [T, H]
  bool stream = false;               // the streamed q4 kernel (moe_stream.cu) may take it
  // The previous kernel is moe_gate_up with late_trigger: the streamed kernel reads idx / wt and
  // copies its experts' weights and scales before its wait (ANVIL_MOE_DOWN_EARLY=0: never).
  bool early = false;
};
cudaError_t moe_down(const MoEDownArgs& a, cudaStream_t s);

// ---- moe_stream.cu: the streamed q4 expert kernels of a decode step ----
// Whether they take matrices of this shape and format: 4-bit MLX, group 32/64/128, cols a multiple
// of 128 with an even number of groups per row, and the block's shared memory within bounds.
// slots = 0: gate/up (x of cols); else down over slots * cols. The caller also checks that every
// expert's weights are 16-byte and its scales and biases 4-byte aligned, that x and h are 16-byte
// aligned and that no shared expert is fused; moe_gate_up / moe_down then use them when
// `stream` is set and every slot is routed.
bool moe_stream_shape_ok(const MoEMats& m, int64_t slots);
cudaError_t moe_stream_gate_up(const MoEGateUpArgs& a, cudaStream_t s);
cudaError_t moe_stream_down(const MoEDownArgs& a, cudaStream_t s);

// ---- prefill ----
// Tiles of kMoETileRows rows: the grouped GEMMs' row tile, and the unit of tile_start.
constexpr int kMoETileRows = 64;
// The most (expert, row tile) pairs A assignments over E experts can need: the grouped GEMMs' grid.
inline int moe_max_tiles(int A, int E) { return (A + kMoETileRows - 1) / kMoETileRows + (A < E ? A : E); }

struct MoEGroupArgs {
  const int32_t* idx = nullptr;  // [A] expert of assignment a = t*k + s
  int A = 0, E = 0;
  int32_t* offsets = nullptr;     // [E + 1]: expert e's rows are positions [offsets[e], offsets[e+1])
  int32_t* tile_start = nullptr;  // [E + 1]: expert e's row tiles are grid tiles [tile_start[e], tile_start[e+1])
  int32_t* order = nullptr;       // [A]: order[pos] = a
  int32_t* pos_of = nullptr;      // [A]: pos_of[a] = pos
};
cudaError_t moe_group(const MoEGroupArgs& a, cudaStream_t s);

struct MoEGroupedArgs {
  const void* x = nullptr;  // gate/up: bf16 x [T, H], rows gathered through order[pos] / k;
                            // down: bf16 h [A, F] already in sorted order
  int A = 0, E = 0, k = 0;
  const int32_t* offsets = nullptr;
  const int32_t* tile_start = nullptr;
  const int32_t* order = nullptr;  // gate/up only
  MoEMats w, up;                   // gate/up: w = gate and up; down: w = down
  void* out = nullptr;             // gate/up: bf16 h [A, F]; down: f32 y [A, H]
};
cudaError_t moe_grouped_gate_up(const MoEGroupedArgs& a, cudaStream_t s);
cudaError_t moe_grouped_down(const MoEGroupedArgs& a, cudaStream_t s);

struct MoECombineArgs {
  const float* y = nullptr;  // f32 [A, H], sorted order
  const int32_t* pos_of = nullptr;
  const float* wt = nullptr;
  int T = 0, k = 0, n_slots = 0;
  int64_t H = 0;
  const float* shared_coef = nullptr;
  const void* shared_out = nullptr;  // bf16 [T, H] or null
  void* out = nullptr;               // bf16 [T, H]
};
cudaError_t moe_combine(const MoECombineArgs& a, cudaStream_t s);

}  // namespace anvil::cuda
