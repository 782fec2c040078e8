// Shared by the standalone CUDA measurement tools in bench/ (cuda_read_patterns.cu,
// cuda_grid_barrier.cu, cuda_expert_fetch.cu): a CUDA runtime call that must succeed, or the tool
// exits naming it; the XOR checksums their reads are checked with.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// The XOR of n 16-byte words in device memory (each tool's per-thread checksums).
inline uint4 xor_reduce(const uint4* d, int64_t n) {
  std::vector<uint4> h(static_cast<size_t>(n));
  CK(cudaMemcpy(h.data(), d, size_t(n) * sizeof(uint4), cudaMemcpyDeviceToHost));
  uint4 s = make_uint4(0, 0, 0, 0);
  for (const uint4& v : h) s.x ^= v.x, s.y ^= v.y, s.z ^= v.z, s.w ^= v.w;
  return s;
}
inline bool same(uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }
// A 64-bit mixer (murmur3's finalizer) for the tools' fill patterns.
inline uint64_t mix(uint64_t v) {
  v ^= v >> 33, v *= 0xff51afd7ed558ccdULL, v ^= v >> 33, v *= 0xc4ceb9fe1a85ec53ULL, v ^= v >> 33;
  return v;
}
