// Weights into L2 ahead of the mat-vec that reads them (Backend::prefetch_weights;
// ANVIL_CUDA_L2PF=1, written 2026-12-01 and not yet run on a GPU, so off by default).
//
// Why: at batch 1 a qwen3-8b q4g64 decode layer spends ~25 us in kernels that read almost nothing
// from DRAM (the norms, rope_kv, attention), and each mat-vec then starts cold: its blocks can keep
// only their rings' bytes in flight, so the small matrices (q/k/v 14 MB in 12 us, o 9.5 MB in 9 us on
// the H200) run at a quarter of the copy rate. The transformer names the matrices its next ops read
// before those latency-bound kernels; this kernel asks the memory system for them with
// cp.async.bulk.prefetch.L2 (a hint: no data comes back, nothing waits for it), so DRAM streams
// them into L2 while the latency-bound kernels run and the mat-vec reads L2.
//
// The kernel is one small block in the stream's order. In a decode graph (PDL) it lets its
// successor launch at once and then waits for its predecessor before it ends, so the chain of
// dependencies stays intact: the next kernel's griddepcontrol.wait still covers every earlier one.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace anvil::cuda {
namespace {

constexpr uint32_t kChunk = 32u << 10;  // bytes per prefetch instruction

__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

__global__ void l2_prefetch_kernel(L2Ranges r) {
  pdl_launch();
  const uint32_t nthreads = blockDim.x * gridDim.x, tid = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < r.n; ++i) {
    // The 16-byte-aligned inside of the range (the instruction needs both ends aligned).
    const uintptr_t b = (reinterpret_cast<uintptr_t>(r.ptr[i]) + 15) & ~uintptr_t(15);
    const uintptr_t e = (reinterpret_cast<uintptr_t>(r.ptr[i]) + r.bytes[i]) & ~uintptr_t(15);
    if (e <= b) continue;
    const uint64_t len = e - b;
    for (uint64_t off = uint64_t(tid) * kChunk; off < len; off += uint64_t(nthreads) * kChunk)
      prefetch_l2(reinterpret_cast<const void*>(b + off), uint32_t(len - off < kChunk ? len - off : kChunk));
  }
  pdl_wait();
}

}  // namespace

cudaError_t l2_prefetch(const L2Ranges& r, cudaStream_t s) {
  if (r.n <= 0) return cudaSuccess;
  launch_k(l2_prefetch_kernel, dim3(1), dim3(128), 0, s, r);
  return cudaGetLastError();
}

}  // namespace anvil::cuda
