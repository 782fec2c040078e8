// Internal to src/backend/cuda/: the host side of the CUDA moe_ffn. It checks a layer's MoEWeights
// against what the kernels take, keeps each layer's device table of per-expert pointers, owns the
// workspace, and enqueues the kernels of moe.h. The backend (cuda_backend.cpp) calls prepare() then,
// route(), then (when the shared expert is not fused) its dense ops into the plan's buffers, then
// experts().
//
// Graph safety: prepare() never enqueues on the compute stream (tables and zeroed counters go through a
// private stream it waits for), buffers are only ever retired, not freed, while the runner lives (a
// captured graph may still use them), and every launch shape depends only on T and the weights' shapes.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/moe.h"

namespace anvil::cuda {

// The most tokens one pass takes; the backend splits a longer batch (bounds the prefill workspace:
// T*k rows of fp32 expert outputs).
constexpr int64_t kMoEMaxChunk = 1024;

struct MoEPlan {
  int64_t T = 0, H = 0, F = 0, S = 0;
  bool decode = false;        // T <= kMoEDecodeMaxTokens: the mat-vec kernels, 3 launches
  bool skip_experts = false;  // ANVIL_MOE_SKIP_EXPERTS
  bool shared = false;        // the layer has a shared expert
  bool shared_fusable = false;  // ... of the routed experts' formats (a table entry of its own)
  bool shared_fused = false;    // ... computed inside moe_gate_up / moe_down (fusable, at decode)
  bool stream = false;  // decode through the streamed q4 expert kernels (moe_stream.cu; ANVIL_MOE_STREAM=0: off)
  // Not fused: the caller writes silu(shared_gate x) * shared_up x into shared_h (bf16 [T, S]) and
  // shared_down of that into shared_out (bf16 [T, H]) before run().
  void* shared_h = nullptr;
  void* shared_out = nullptr;
  // Device tables [gate | up | down], E + 1 entries each (entry E: the shared expert when fusable).
  const ExpertPtrs* tables = nullptr;
  MoEMats gate, up, down;
  // Workspace: the bytes of each part below (logits .. y, in that order; 0 = unused), 256-aligned in one buffer.
  static constexpr int kParts = 13;
  size_t part_bytes[kParts] = {};
  size_t workspace_bytes = 0;
  // Workspace carve-up (device; prepare() only).
  float* logits = nullptr;
  int* counters = nullptr;
  int32_t* idx = nullptr;
  float* wt = nullptr;
  float* coef = nullptr;
  void* h = nullptr;   // bf16 [T*k, F]
  void* hs = nullptr;  // bf16 [T, S] (fused shared expert)
  int32_t *offsets = nullptr, *tile_start = nullptr, *order = nullptr, *pos_of = nullptr;
  float* y = nullptr;  // f32 [T*k, H] (prefill)
};

// Host only (no CUDA call, so it is testable anywhere): validates `w` for T tokens (1 <= T <=
// kMoEMaxChunk) — experts and router 2..6- or 8-bit MLX or dense bf16/f16/f32, one format for all gate/up and one
// for all down, widths multiples of 32, no biases — and fills the path (decode, shared expert fused) and
// the workspace sizes of *plan. Errors name the matrix and what was expected.
Status moe_plan(const MoEWeights& w, int64_t T, MoEPlan* plan);

class MoERunner {
 public:
  MoERunner() = default;
  MoERunner(const MoERunner&) = delete;
  MoERunner& operator=(const MoERunner&) = delete;
  ~MoERunner();

  // moe_plan(), then the device side of *plan: the layer's pointer table (uploaded once per layer) and
  // the workspace sized for T.
  Status prepare(const MoEWeights& w, int64_t T, MoEPlan* plan);
  // Enqueues the routing of x [T, H] (bf16) on `s` (ids, weights and the shared expert's gate into the
  // plan's workspace), then the experts and the weighted sum into out [T, H] (bf16). Each adds the kernels
  // it launched to *launches. Two calls so a profiler can time them apart.
  Status route(const void* x, const MoEWeights& w, const MoEPlan& plan, cudaStream_t s, uint64_t* launches);
  // xplanes (T == 1, or null): x as the one-token integer path's int16 planes (rmsnorm wrote them).
  Status experts(const void* x, const MoEWeights& w, const MoEPlan& plan, void* out, cudaStream_t s,
                 uint64_t* launches, const void* xplanes = nullptr);

 private:
  Status grow(void** buf, size_t* have, size_t need, bool zero);
  Status side_stream();

  struct Table {
    std::vector<ExpertPtrs> host;
    ExpertPtrs* dev = nullptr;
  };
  std::unordered_map<const void*, Table> tables_;  // keyed by the router's device data
  void* ws_ = nullptr;
  size_t ws_bytes_ = 0;
  void* counters_ = nullptr;
  size_t counters_bytes_ = 0;
  std::vector<void*> retired_;
  cudaStream_t side_ = nullptr;
};

}  // namespace anvil::cuda
