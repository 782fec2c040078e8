// Internal to src/backend/cuda/: device helpers shared by the kernel files (bf16 conversion, warp
// reductions, the KV page index). Activations are bf16 in memory; every kernel computes in fp32.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/trace.cuh"

namespace anvil::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }
// Low and high bf16 of a 32-bit word.
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <Elem E>
__device__ __forceinline__ float load_elem(const void* p, int64_t i) {
  if constexpr (E == Elem::kF32) return static_cast<const float*>(p)[i];
  else if constexpr (E == Elem::kF16) return __half2float(static_cast<const __half*>(p)[i]);
  else return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

template <Elem E>
__device__ __forceinline__ void store_elem(void* p, int64_t i, float v) {
  if constexpr (E == Elem::kF32) static_cast<float*>(p)[i] = v;
  else if constexpr (E == Elem::kF16) static_cast<__half*>(p)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float s = lane < nw ? part[lane] : 0.0f;
  return warp_sum(s);
}

// Element (page, layer, kv, head, slot, 0) of the paged cache (backend.h KVCacheView).
// Sliding-window attention (KVDev::window > 0): a query at position len - 1 attends to the keys
// window_lo(len) .. len - 1 (transformers' and mlx-lm's mask: the last `window` positions, itself
// included); without a window, 0 .. len - 1.
__device__ __forceinline__ int window_lo(int len, int window) { return window > 0 && len > window ? len - window : 0; }

__device__ __forceinline__ int64_t kv_row(int64_t page, int layer, int which, int head, int slot, int n_layers,
                                          int n_kv_heads, int page_size, int head_dim) {
  return ((((page * n_layers + layer) * 2 + which) * n_kv_heads + head) * int64_t(page_size) + slot) * head_dim;
}

// Programmatic dependent launch: every kernel is launched with programmatic stream serialization
// and begins with pdl_begin(): it lets the next kernel in the stream (or graph) be scheduled now,
// then waits until the previous kernel has finished and its writes are visible. What is gained is
// the next kernel's launch and block scheduling overlapping this one's tail. Before the wait a
// kernel may read only what no kernel of the step writes: weights, and the step's inputs the host
// wrote before launching it (positions, sequence ids, page table), and, in a decode step, the KV
// rows of earlier positions (the q4 mat-vecs, the norms, rope_kv and the split attention do).
// ANVIL_CUDA_NO_PDL=1 launches plainly. Without the launch attribute, griddepcontrol.wait returns
// at once.
// (With ANVIL_CUDA_TRACE, trace.h, pdl_launch marks a block's start and pdl_wait its release.)
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  trace::point(0);
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  trace::point(1);
}
// cp.async.bulk.prefetch.L2 of [p, p + bytes) (p 16-byte aligned, bytes a multiple of 16), with
// the evict_last L2 priority when keep. Measured on the H200 (session 26): one SM issues these at
// ~0.2 TB/s, and its block does not retire before they are done, so a kernel that issues many
// megabytes from a few blocks holds up the kernels after it (l2_prefetch.cu); issue a little from
// each of many blocks.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes, bool keep) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (keep) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p), "r"(bytes), "l"(policy)
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
  }
#endif
}
__device__ __forceinline__ void pdl_begin() {
  pdl_launch();
  pdl_wait();
}
// The wait first, then the next kernel's launch: for a kernel whose dependent reads, before its
// own wait, what this kernel's prerequisites wrote (the MoE down kernel reads the routing's expert
// ids, written two kernels before it, while the gate/up kernel between them runs: moe_stream.cu).
// The dependent starts only once every block of this kernel has passed its wait, so by then the
// kernels before this one are complete and their writes visible in L2 (read them with ld.global.cg:
// an SM's L1 may hold an older step's copy).
__device__ __forceinline__ void pdl_begin_late() {
  trace::point(0);  // (the start, as pdl_launch marks it)
  pdl_wait();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// PDL is used only while a decode graph is being captured (the backend sets the flag around the
// capture): there it gained 2-4% decode on the H200, while on eager prefill launches it cost 25-30%
// of pp512 (docs/benchmarks.md).
inline bool& pdl_in_capture() {
  static thread_local bool on = false;
  return on;
}
inline bool pdl_enabled() {
  static const bool allowed = [] {
    const char* e = std::getenv("ANVIL_CUDA_NO_PDL");
    return !(e && *e && *e != '0');
  }();
  return allowed && pdl_in_capture();
}

// ANVIL_CUDA_CARVEOUT=P (0-100, for measuring): every kernel launched through launch_kc asks for P%
// of the SM's unified L1 / shared memory as shared memory (cudaFuncAttributePreferredSharedMemoryCarveout;
// unset: the driver's choice per kernel). Why: under PDL a kernel's blocks become resident while the
// kernel before it still runs, in the shared memory it leaves; an SM whose split suits the running
// kernel (attention: 51 KB a block) may not hold the next one's blocks (qwen3-8b's o projection: two
// of 84 KB beside one attention block need 215 of the 228 KiB), and the split changes only on an idle
// SM. 100 keeps every SM at the largest split. Read at every launch (a decode graph's launches are
// captured once), so a test can compare both ways in one process; applied to a kernel when it
// changes.
inline cudaError_t apply_carveout(const void* fn) {
  static std::atomic<bool> ever{false};
  const char* e = std::getenv("ANVIL_CUDA_CARVEOUT");
  int p = -1;
  if (e && *e) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end == '\0' && v >= 0 && v <= 100) p = int(v);
  }
  if (p < 0 && !ever.load(std::memory_order_relaxed)) return cudaSuccess;  // never set: nothing to undo
  static std::mutex mu;
  static std::unordered_map<const void*, int> applied;
  std::lock_guard<std::mutex> lock(mu);
  ever.store(true, std::memory_order_relaxed);
  const auto it = applied.find(fn);
  if ((it == applied.end() ? -1 : it->second) == p) return cudaSuccess;
  applied[fn] = p;
  return cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, p);
}

// A launch with PDL when pdl_enabled(); with a cluster of more than one block (an int: blocks
// along x), in thread block clusters of that shape (each grid dimension a multiple of it).
template <typename... KArgs, typename... Args>
cudaError_t launch_kc(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, dim3 cluster,
                      Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x;
    attr[n].val.clusterDim.y = cluster.y;
    attr[n].val.clusterDim.z = cluster.z;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = unsigned(n);
  if (pdl_in_capture()) trace::note_launch(reinterpret_cast<const void*>(kernel));
  if (const cudaError_t e = apply_carveout(reinterpret_cast<const void*>(kernel)); e != cudaSuccess) return e;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
template <typename... KArgs, typename... Args>
cudaError_t launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  return launch_kc(kernel, grid, block, smem, s, dim3(1), std::forward<Args>(args)...);
}

}  // namespace anvil::cuda
