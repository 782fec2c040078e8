// What a phase boundary of the persistent decode kernel (src/backend/cuda/persist_decode.cu) costs
// on this GPU, by synchronization scheme: a measurement tool, not an engine kernel. Session 29's
// timeline had 2-3.4 us from the last block's arrival to the next phase's start, five times per
// layer; this separates the barrier's own latency from the rest.
//
// One block per SM (cooperative launch), kCW consumer warps (+ optionally a warp streaming a large
// buffer from DRAM, as the kernel's producer does). Each round: every block writes its slice of an
// N-word vector (round r's values, derived from r and the index), synchronizes with the others by
// scheme M, then reads the whole vector and checks every word (as the kernel's staging reads the
// split sums). Double-buffered by round parity: no block can get two rounds ahead of another,
// since each round's read needs every block's write of that round.
// Schemes:
//   0  __threadfence + atomicAdd on a counter per round, thread 0 spins with ld.acquire.gpu (the
//      kernel's barrier), then the data read;
//   1  red.release.gpu on the counter instead of fence + atomicAdd (ANVIL_CUDA_PERSIST_RED=1);
//   2  no counter: each word carries its round in its high half (a 64-bit {value, round + 1}
//      store, single-copy atomic), readers re-load the words whose tag is not yet the round's;
//   4  tagged words and a counter without a fence (a relaxed atomicAdd after the stores, a relaxed
//      spin on it): the counter says "probably written", the tags say which words are, and
//      readers re-load the few that are not yet;
//   5  scheme 2 with a 64 ns back-off between the re-loads of a stale word (less polling traffic);
//   3  cooperative_groups grid.sync() as a reference (blocks of the consumer warps only, and
//      only with the memory system idle: grid.sync needs every thread of the block).
// Printed: us per round (mean over R rounds, measured with cudaEvents), and the words that failed
// the check (must be 0 for every scheme).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/cuda_grid_barrier.cu -o gb && ./gb
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "../src/backend/cuda/mem_order.cuh"
#include "cuda_bench.h"

namespace {

using namespace anvil::cuda;

constexpr int kCW = 8;
constexpr int kCT = kCW * 32;

struct Args {
  int scheme = 0, rounds = 0, n = 0;  // n: words in the vector
  bool load = false;                  // a warp per block streams `big` meanwhile
  unsigned* counters = nullptr;       // [rounds]
  uint32_t* vec32 = nullptr;          // [2][n] (schemes 0, 1, 3)
  unsigned long long* vec64 = nullptr;  // [2][n] (schemes 2, 4, 5)
  const uint4* big = nullptr;
  size_t big_n = 0;                   // uint4s
  volatile int* stop = nullptr;       // the consumers' end, for the streaming warp
  unsigned long long* bad = nullptr;  // words that failed the check
  unsigned long long* sink = nullptr;
};

__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, %0;" ::"n"(kCT) : "memory"); }
__device__ __forceinline__ uint32_t value(int r, int i) { return uint32_t(r) * 2654435761u + uint32_t(i); }

__global__ void __launch_bounds__(kCT + 32, 1) grid_barrier_kernel(Args a) {
  const int S = gridDim.x, s = blockIdx.x, tid = threadIdx.x;
  if (tid >= kCT) {
    // The streaming warp: 16-byte loads over `big`, as long as the consumers run.
    if (!a.load) return;
    unsigned long long acc = 0;
    size_t i = (size_t(s) * 32 + (tid - kCT));
    while (!*a.stop) {
#pragma unroll 8
      for (int k = 0; k < 8; ++k) {
        const uint4 v = __ldcg(a.big + i);
        acc += v.x ^ v.w;
        i += size_t(S) * 32;
        if (i >= a.big_n) i -= a.big_n;
      }
    }
    if (acc == 0x12345) *a.sink = acc;  // (keeps the loads)
    return;
  }
  const int w0 = int(int64_t(s) * a.n / S), w1 = int(int64_t(s + 1) * a.n / S);
  unsigned long long bad = 0;
  for (int r = 0; r < a.rounds; ++r) {
    const int buf = r & 1;
    if (a.scheme == 2 || a.scheme == 4 || a.scheme == 5) {
      unsigned long long* v = a.vec64 + size_t(buf) * a.n;
      for (int i = w0 + tid; i < w1; i += kCT)
        st_relaxed64(v + i, (static_cast<unsigned long long>(r + 1) << 32) | value(r, i));
      if (a.scheme == 4) {
        cbar();
        if (tid == 0) {
          red_add1_relaxed(a.counters + r);
          while (ld_relaxed32(a.counters + r) < unsigned(S)) {
          }
        }
        cbar();
      }
      // Readers: every word, re-loading those not yet tagged with this round.
      for (int i = tid; i < a.n; i += kCT) {
        unsigned long long x = ld_relaxed64(v + i);
        while (unsigned(x >> 32) != unsigned(r + 1)) {
          if (a.scheme == 5) __nanosleep(64);
          x = ld_relaxed64(v + i);
        }
        bad += uint32_t(x) != value(r, i);
      }
      cbar();  // (as the staging ends: the block's threads together)
      continue;
    }
    uint32_t* v = a.vec32 + size_t(buf) * a.n;
    for (int i = w0 + tid; i < w1; i += kCT) v[i] = value(r, i);
    if (a.scheme == 3) {
      cooperative_groups::this_grid().sync();
    } else {
      cbar();
      if (tid == 0) {
        if (a.scheme == 1) {
          red_add1_release(a.counters + r);
        } else {
          __threadfence();
          atomicAdd(a.counters + r, 1u);
        }
        while (ld_acquire32(a.counters + r) < unsigned(S)) {
        }
      }
      cbar();
    }
    for (int i = tid; i < a.n; i += kCT) bad += __ldcg(v + i) != value(r, i);
    cbar();  // (no block writes round r + 2 into this buffer before its own threads read round r)
  }
  if (bad) atomicAdd(a.bad, bad);
  // The streaming warp stops once every consumer block is done.
  cbar();
  if (tid == 0 && atomicAdd(a.counters + a.rounds, 1u) == unsigned(S - 1)) *a.stop = 1;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int n = argc > 2 ? std::atoi(argv[2]) : 4096;
  int dev = 0, sms = 0, coop = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  if (!coop) {
    std::fprintf(stderr, "no cooperative launch on this device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device %s, %d SMs; %d rounds, a vector of %d words (%d per block)\n", prop.name, sms, rounds, n, n / sms);
  Args a;
  a.rounds = rounds, a.n = n;
  CK(cudaMalloc(&a.counters, size_t(rounds + 1) * 4));
  CK(cudaMalloc(&a.vec32, size_t(2) * n * 4));
  CK(cudaMalloc(&a.vec64, size_t(2) * n * 8));
  a.big_n = (size_t(1) << 30) / 16;  // 1 GiB: far past L2
  CK(cudaMalloc(const_cast<uint4**>(&a.big), a.big_n * 16));
  CK(cudaMemset(const_cast<uint4*>(a.big), 1, a.big_n * 16));
  int* stop = nullptr;
  CK(cudaMalloc(&stop, 4));
  a.stop = stop;
  CK(cudaMalloc(&a.bad, 8));
  CK(cudaMalloc(&a.sink, 8));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const char* names[6] = {"fence + atomicAdd, acquire spin", "red.release, acquire spin",
                          "tagged words, no counter",        "cooperative_groups grid.sync",
                          "tagged words + unfenced counter", "tagged words, 64 ns back-off"};
  int fails = 0;
  for (int load = 0; load < 2; ++load) {
    for (int scheme = 0; scheme < 6; ++scheme) {
      // grid.sync() needs every thread of the block: launched without the streaming warp, and only
      // with the memory system idle.
      if (scheme == 3 && load) continue;
      a.scheme = scheme, a.load = load != 0;
      const int threads = scheme == 3 ? kCT : kCT + 32;
      double best = 1e30;
      unsigned long long bad_total = 0;
      for (int rep = 0; rep < 3; ++rep) {
        CK(cudaMemset(a.counters, 0, size_t(rounds + 1) * 4));
        CK(cudaMemset(a.vec32, 0xff, size_t(2) * n * 4));
        CK(cudaMemset(a.vec64, 0, size_t(2) * n * 8));
        CK(cudaMemset(stop, 0, 4));
        CK(cudaMemset(a.bad, 0, 8));
        void* params[] = {&a};
        CK(cudaEventRecord(e0));
        CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(grid_barrier_kernel), dim3(sms), dim3(threads), params,
                                       0, nullptr));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        unsigned long long bad = 0;
        CK(cudaMemcpy(&bad, a.bad, 8, cudaMemcpyDeviceToHost));
        bad_total += bad;
        if (ms * 1000.0 / rounds < best) best = ms * 1000.0 / rounds;
      }
      std::printf("%-34s %s  %6.3f us per round  (%llu bad words)\n", names[scheme],
                  load ? "with a DRAM-streaming warp per SM" : "idle memory system              ", best, bad_total);
      fails += bad_total != 0;
    }
  }
  return fails ? 2 : 0;
}
