// Internal to src/backend/cuda/ (and bench/cuda_grid_barrier.cu): GPU-scope loads, stores and
// reductions with an explicit memory order, as thin PTX wrappers. The persistent decode kernel's
// device-wide barriers and tagged words use them, and so does the benchmark that measures those
// barriers. Aligned scalar accesses of up to 8 bytes are single-copy atomic; a vector access is one
// such access per element. The .relaxed/.acquire/.release forms exist from sm_70 on.
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
// Two consecutive u64 (16-byte aligned), each single-copy atomic.
__device__ __forceinline__ void ld_relaxed64x2(const void* p, unsigned long long& x, unsigned long long& y) {
  asm volatile("ld.relaxed.gpu.global.v2.u64 {%0, %1}, [%2];" : "=l"(x), "=l"(y) : "l"(p) : "memory");
}
// Four consecutive u32 (16-byte aligned), each single-copy atomic.
__device__ __forceinline__ uint4 ld_relaxed_v4(const void* p) {
  uint4 v;
  asm volatile("ld.relaxed.gpu.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed64(void* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ void st_relaxed32(void* p, unsigned v) {
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
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
