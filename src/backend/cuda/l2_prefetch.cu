// Weights pulled into L2 ahead of the kernels that read them (ANVIL_CUDA_L2_PREFETCH, off by default;
// Backend::prefetch_weights). In a batch-1 decode layer the memory system is nearly idle while
// rope_kv, decode attention and its merge run (~13 us per qwen3-8b layer on the H200, the timeline of
// benchmarks.md session 15), and the mat-vecs after them stream their weights from HBM only once
// they start: the o projection's blocks and gate/up's first wave fetch during the kernels before
// them (PDL), its second wave not until the first wave leaves. This kernel sits in the stream after
// the q/k/v mat-vec and issues cp.async.bulk.prefetch.L2 over byte ranges of the matrices named by
// the model (the backend picks which: all of o, then the tails of gate and up, the rows their
// second wave reads), then exits; the prefetches proceed in the memory system while the next
// kernels run. A prefetch reads memory and writes nothing the kernels see: results are unchanged.
//
// Where the prefetches are issued: after the wait for the previous kernel (the default: they do
// not compete with the q/k/v mat-vec's own weights), or before it (early = 1). The kernel waits
// either way before it exits, so the kernel after it still sees everything before it complete.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/qgemv_tc.cuh"

namespace anvil::cuda {
namespace {

// Bytes per prefetch instruction. Session 26 on the H200: with 64 KB pieces from at most 8 blocks
// of 128 threads, qwen3-8b q4g64 decode fell from 448 to 285 tok/s at 16 MB per layer (264 at 48):
// one SM issues bulk prefetches at ~0.2 TB/s and its blocks retire only when they are done, so the
// kernel held the chain up for ~35 us per layer. Now one block of one warp per SM, 16 KB pieces.
constexpr uint32_t kPiece = 16 * 1024;

// keep: the lines come in with the evict_last priority, so that the streaming copies of the kernels
// in between (the first wave of gate/up reads ~39 MB on qwen3-8b) evict other lines first.
__device__ void issue(const L2Ranges& r, bool keep) {
  // Pieces of kPiece bytes over all ranges.
  int64_t first[L2Ranges::kMax + 1];
  first[0] = 0;
  for (int i = 0; i < r.n; ++i) first[i + 1] = first[i] + int64_t((r.bytes[i] + kPiece - 1) / kPiece);
  const int64_t total = first[r.n];
  // Piece q to block q % grid: spread over every block (SM) even when the pieces are few.
  for (int64_t q = int64_t(threadIdx.x) * gridDim.x + blockIdx.x; q < total; q += int64_t(gridDim.x) * blockDim.x) {
    int i = 0;
    while (q >= first[i + 1]) ++i;
    const uint64_t off = uint64_t(q - first[i]) * kPiece;
    const uint64_t left = r.bytes[i] - off;
    prefetch_l2_bulk(static_cast<const uint8_t*>(r.ptr[i]) + off, uint32_t(left < kPiece ? left : kPiece), keep);
  }
}

__global__ void l2_prefetch_kernel(L2Ranges r, int early, int keep) {
  pdl_launch();
  if (early) issue(r, keep != 0);
  pdl_wait();
  if (!early) issue(r, keep != 0);
}

}  // namespace

cudaError_t l2_prefetch(const L2Ranges& r, bool early, bool keep, cudaStream_t s, bool pdl) {
  if (r.n <= 0) return cudaSuccess;
  int64_t pieces = 0;
  for (int i = 0; i < r.n; ++i) pieces += int64_t((r.bytes[i] + kPiece - 1) / kPiece);
  const unsigned blocks = unsigned(std::min<int64_t>(tc::sm_count(), pieces));
  // Without PDL (a forked launch): its dependency on the kernel it was forked after stays a full one,
  // so it starts once that kernel is done, not while it (or the one before it) still streams.
  const bool was = pdl_in_capture();
  if (!pdl) pdl_in_capture() = false;
  launch_k(l2_prefetch_kernel, dim3(blocks < 1 ? 1 : blocks), dim3(32), 0, s, r, early ? 1 : 0, keep ? 1 : 0);
  pdl_in_capture() = was;
  return cudaGetLastError();
}

}  // namespace anvil::cuda
