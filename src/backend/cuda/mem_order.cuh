// Internal to src/backend/cuda/ (and bench/cuda_grid_barrier.cu): GPU-scope loads, stores and
// reductions with an explicit memory order, as thin PTX wrappers. The persistent decode kernel's
// device-wide barriers use them, and so does the benchmark that measures barrier schemes (tagged
// words among them). Aligned scalar accesses of up to 8 bytes are single-copy atomic. The
// .relaxed/.acquire/.release forms exist from sm_70 on.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace anvil::cuda {

__device__ __forceinline__ unsigned ld_relaxed32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_acquire32(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long ld_relaxed64(const void* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed64(void* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Adds 1 to a counter with no return value: relaxed (no ordering of earlier stores), or release
// (earlier stores visible before the addition).
__device__ __forceinline__ void red_add1_relaxed(unsigned* p) {
  asm volatile("red.relaxed.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}
__device__ __forceinline__ void red_add1_release(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}

}  // namespace anvil::cuda
