// Internal to src/backend/cuda/: the device side of the graph timeline (trace.h). With
// ANVIL_CUDA_TRACE defined, trace::point(phase) makes thread 0 of the block append a record to the
// buffer the host bound; otherwise it is nothing. pdl_launch() marks phase 0 and pdl_wait() phase 1
// (cuda_common.cuh), so every kernel has those two.
#pragma once
#include "backend/cuda/trace.h"

namespace anvil::cuda::trace {

#if defined(ANVIL_CUDA_TRACE)
namespace {
__constant__ Rec* g_trace_buf = nullptr;
cudaError_t bind_this_unit(void* p) { return cudaMemcpyToSymbol(g_trace_buf, &p, sizeof p); }
struct Register {
  Register() { add_binder(&bind_this_unit); }
};
const Register g_trace_register;
}  // namespace

__device__ __forceinline__ void point(int phase) {
  if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0) return;
  Rec* b = g_trace_buf;
  const uint32_t block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (!b || block >= uint32_t(kBlocks)) return;
  uint64_t t, g;
  uint32_t sm;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  Rec& r = b[(g % kSlots) * kBlocks + block];
  r.grid = g + 1;
  r.t[phase] = t;
  r.sm = sm;
}
#else
__device__ __forceinline__ void point(int) {}
#endif

}  // namespace anvil::cuda::trace
