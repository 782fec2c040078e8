// Internal to src/backend/cuda/ (and bench/cuda_read_patterns.cu): Hopper's asynchronous copies into
// shared memory and the mbarriers they complete on, as thin PTX wrappers. The instructions exist
// from sm_90 on; compiled for older targets the wrappers do nothing (their callers must not run
// there: the persistent decode kernel's host side checks the compute capability).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace anvil::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define ANVIL_SM90_ASM(...) asm volatile(__VA_ARGS__)
#else
#define ANVIL_SM90_ASM(...) \
  do {                      \
  } while (0)
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* b, unsigned count) {
  ANVIL_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
// After a block's mbar_init calls, before any other thread or the async proxy uses the barriers.
__device__ __forceinline__ void mbar_init_fence() {
  ANVIL_SM90_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
}
// This thread's arrival, announcing `bytes` of copies that complete the phase with their transactions.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, unsigned bytes) {
  ANVIL_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  ANVIL_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
// Until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* b, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
// [dst, dst + bytes) from global memory (16-byte aligned, bytes a multiple of 16), completing on b.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* b) {
  ANVIL_SM90_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b))
                 : "memory");
}
// The 2D box of a tensor map (a CUtensorMap in global or parameter memory, written before the
// launch) at (x, y), into dst (128-byte aligned), completing on b.
__device__ __forceinline__ void tensor_copy(void* dst, const void* tmap, int x, int y, uint64_t* b) {
  ANVIL_SM90_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          smem_u32(dst)),
      "l"(tmap), "r"(x), "r"(y), "r"(smem_u32(b))
      : "memory");
}
// The same box pulled into L2 only.
__device__ __forceinline__ void tensor_prefetch_l2(const void* tmap, int x, int y) {
  ANVIL_SM90_ASM("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(tmap), "r"(x), "r"(y)
                 : "memory");
}
// 16 bytes through cp.async (tracked per thread: commit groups, or async_arrive).
__device__ __forceinline__ void async_copy16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
// An arrival on b once this thread's earlier cp.async copies have landed (not counted in advance).
__device__ __forceinline__ void async_arrive(uint64_t* b) {
  ANVIL_SM90_ASM("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b)) : "memory");
}

#undef ANVIL_SM90_ASM

}  // namespace anvil::cuda
