// How long the chosen experts' weights of one MoE decode layer take to reach shared memory once the
// routing is known, in isolation: the question behind session 42's timeline of qwen3-30b-a3b-16L
// (docs/benchmarks.md), where the streamed expert gate/up kernel (moe_stream.cu) had every block's
// first step staged only ~11 us after its PDL wait on an H100, for 14.2 MB (gate and up of 8 experts:
// ~1.3 TB/s), with the down kernel's 7.1 MB of early copies in flight beside it.
//
// A measurement tool, not an engine kernel. The shapes are one qwen3-30b-a3b layer at q4g64: 128
// experts of F = 768 rows, H = 2,048, 8 chosen per token. L layers of experts (default 16: ~3.4 GB,
// far more than L2), each launch a new layer and 8 random distinct experts, so every byte comes
// from DRAM. Each block records %globaltimer when it starts, when its copies have landed and when it
// ends; a launch's time is from its first block's start to its last block's end (launches run one
// at a time, synchronized). Every fetched word is XORed and checked against the same XOR read by a
// plain kernel.
//
// What varies:
//   alloc  separate: one cudaMalloc per array (weights, scales, biases of each matrix), as the
//          engine's upload does; slab: one allocation with each expert's arrays side by side
//   pick   random: 8 random distinct experts of the layer; adjacent: experts 8j..8j+7
//   mech   cp.async: the engine's pattern (each lane 16 bytes of rows g and g+8 per 128-element
//          step, 4 warps x 4 steps, scales and biases in 4-byte pieces); bulk: one thread issues a
//          16 KB 1D bulk copy per matrix (the tile's 16 rows are contiguous) and one per scale and
//          bias array, completing on an mbarrier
//   down   the down projection's 128 blocks (16 rows x the 8 slots, 48 KB each) in the same launch
//   warm   a kernel that reads one word per 64 KB of every expert of the layer runs first (TLB)
// and a plain read of the same number of contiguous bytes by the same number of blocks, the
// ceiling for a launch of this size.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/cuda_expert_fetch.cu -o ef && ./ef [L]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../src/backend/cuda/async_copy.cuh"
#include "cuda_bench.h"

namespace {

constexpr int kE = 128, kK = 8, kF = 768, kH = 2048, kG = 64;
constexpr int64_t kRowB = kH / 2;                       // gate/up bytes per row
constexpr int64_t kMatB = int64_t(kF) * kRowB;          // 786,432
constexpr int64_t kScB = int64_t(kF) * (kH / kG) * 2;   // 49,152: one scale (or bias) array
constexpr int64_t kDRowB = kF / 2;                      // down bytes per row (384)
constexpr int64_t kDMatB = int64_t(kH) * kDRowB;        // 786,432
constexpr int kTiles = kF / 16;                         // 48 gate/up blocks per expert
constexpr int kDTiles = kH / 16;                        // 128 down blocks
constexpr int kThreads = 128;

struct Expert {
  const uint8_t* g;  // gate [F][H/2]
  const uint8_t* u;
  const uint8_t* gs;  // [F][H/64] bf16
  const uint8_t* gb;
  const uint8_t* us;
  const uint8_t* ub;
  const uint8_t* d;   // down [H][F/2]
};

struct Args {
  const Expert* ex;     // [E] of this layer
  const int* idx;       // [8]
  uint4* out;           // [blocks][threads]
  uint64_t* times;      // [blocks][3]
  int down;             // 1: 128 down blocks after the 384 gate/up blocks
};

__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void cp16(void* dst, const void* src) { anvil::cuda::async_copy16(dst, src); }
__device__ __forceinline__ void cp4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(anvil::cuda::smem_u32(dst)), "l"(src) : "memory");
}

// Thread 0: the block's mbarrier initialized, expecting `bytes` of bulk copies.
__device__ __forceinline__ void bar_begin(uint64_t* bar, unsigned bytes) {
  anvil::cuda::mbar_init(bar, 1);
  anvil::cuda::mbar_init_fence();
  anvil::cuda::mbar_expect_tx(bar, bytes);
}

// Shared memory: gate/up 32 KB of weights + 4 KB of scales and biases; down 48 KB.
constexpr int kSmem = 49152 + 4096;

template <int MECH>
__global__ void __launch_bounds__(kThreads) fetch_kernel(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t bar;
  const uint64_t t0 = gtimer();
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, g = lane >> 2, c = lane & 3;
  const int b = blockIdx.x;
  int nbytes = 0;
  if (b < kK * kTiles) {
    const int pair = b / kTiles, r0 = (b % kTiles) * 16;
    const Expert e = a.ex[a.idx[pair]];
    nbytes = 32768 + 4096;
    if (MECH == 1) {
      // 16 steps of 128 elements (64 bytes per row) over 4 warps; per step and lane 16 bytes of
      // rows g and g+8 of gate and up (the engine's ring slot layout).
      for (int i = 0; i < 4; ++i) {
        const int step = warp + 4 * i;
        uint8_t* slot = smem + (warp * 4 + i) * 2048;
        const int64_t off = step * 64 + c * 16;
        cp16(slot + lane * 16, e.g + (r0 + g) * kRowB + off);
        cp16(slot + 512 + lane * 16, e.g + (r0 + g + 8) * kRowB + off);
        cp16(slot + 1024 + lane * 16, e.u + (r0 + g) * kRowB + off);
        cp16(slot + 1536 + lane * 16, e.u + (r0 + g + 8) * kRowB + off);
      }
      // Scales and biases: 16 rows x 32 groups x 2 bytes = 1 KB per array, in 4-byte pieces.
      const uint8_t* arr[4] = {e.gs, e.gb, e.us, e.ub};
      for (int i = t; i < 4 * 256; i += kThreads) {
        const int k = i >> 8, p = i & 255;
        cp4(smem + 32768 + k * 1024 + p * 4, arr[k] + r0 * 64 + p * 4);
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
      __syncthreads();
    } else {
      if (t == 0) {
        bar_begin(&bar, 32768 + 4096);
        anvil::cuda::bulk_copy(smem, e.g + r0 * kRowB, 16384, &bar);
        anvil::cuda::bulk_copy(smem + 16384, e.u + r0 * kRowB, 16384, &bar);
        anvil::cuda::bulk_copy(smem + 32768, e.gs + r0 * 64, 1024, &bar);
        anvil::cuda::bulk_copy(smem + 33792, e.gb + r0 * 64, 1024, &bar);
        anvil::cuda::bulk_copy(smem + 34816, e.us + r0 * 64, 1024, &bar);
        anvil::cuda::bulk_copy(smem + 35840, e.ub + r0 * 64, 1024, &bar);
      }
      __syncthreads();
      anvil::cuda::mbar_wait(&bar, 0);
    }
  } else {
    // down: 16 rows (contiguous, 6 KB) of each of the 8 slots' experts.
    const int r0 = (b - kK * kTiles) * 16;
    nbytes = 8 * 16 * int(kDRowB);
    if (MECH == 1) {
      for (int s = 0; s < kK; ++s) {
        const uint8_t* src = a.ex[a.idx[s]].d + r0 * kDRowB;
        for (int i = t; i < 16 * int(kDRowB) / 16; i += kThreads) cp16(smem + s * 6144 + i * 16, src + i * 16);
      }
      asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
      __syncthreads();
    } else {
      if (t == 0) {
        bar_begin(&bar, unsigned(nbytes));
        for (int s = 0; s < kK; ++s)
          anvil::cuda::bulk_copy(smem + s * 6144, a.ex[a.idx[s]].d + r0 * kDRowB, 6144, &bar);
      }
      __syncthreads();
      anvil::cuda::mbar_wait(&bar, 0);
    }
  }
  const uint64_t t1 = gtimer();
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int i = t; i < nbytes / 16; i += kThreads) {
    const uint4 v = reinterpret_cast<const uint4*>(smem)[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  a.out[int64_t(b) * kThreads + t] = acc;
  __syncthreads();
  if (t == 0) {
    a.times[b * 3 + 0] = t0;
    a.times[b * 3 + 1] = t1;
    a.times[b * 3 + 2] = gtimer();
  }
}

// The same bytes read back with plain loads, for the checksum.
__global__ void check_kernel(Args a, int blocks) {
  const int b = blockIdx.x, t = threadIdx.x;
  uint4 acc = make_uint4(0, 0, 0, 0);
  auto x = [&](const uint8_t* p, int bytes) {
    for (int i = t; i < bytes / 16; i += kThreads) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
    }
  };
  if (b < kK * kTiles) {
    const int pair = b / kTiles, r0 = (b % kTiles) * 16;
    const Expert e = a.ex[a.idx[pair]];
    x(e.g + r0 * kRowB, 16384), x(e.u + r0 * kRowB, 16384);
    x(e.gs + r0 * 64, 1024), x(e.gb + r0 * 64, 1024), x(e.us + r0 * 64, 1024), x(e.ub + r0 * 64, 1024);
  } else if (b < blocks) {
    const int r0 = (b - kK * kTiles) * 16;
    for (int s = 0; s < kK; ++s) x(a.ex[a.idx[s]].d + r0 * kDRowB, 6144);
  }
  a.out[int64_t(b) * kThreads + t] = acc;
}

// One word per 64 KB of every array of every expert of the layer (the TLB's entries, ~nothing of L2).
__global__ void warm_kernel(const Expert* ex, uint32_t* sink) {
  const Expert e = ex[blockIdx.x];
  const uint8_t* arr[7] = {e.g, e.u, e.gs, e.gb, e.us, e.ub, e.d};
  const int64_t len[7] = {kMatB, kMatB, kScB, kScB, kScB, kScB, kDMatB};
  uint32_t s = 0;
  for (int k = 0; k < 7; ++k)
    for (int64_t o = int64_t(threadIdx.x) * 65536; o < len[k]; o += int64_t(blockDim.x) * 65536)
      s += *reinterpret_cast<const volatile uint32_t*>(arr[k] + o);
  if (s == 0x9e3779b9u) atomicAdd(sink, 1u);
}

// The ceiling: `bytes` contiguous bytes by `blocks` blocks of 128 threads, 16-byte loads.
__global__ void plain_kernel(const uint4* w, int64_t n, uint4* out, uint64_t* times) {
  const uint64_t t0 = gtimer();
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int64_t per = (n + gridDim.x - 1) / gridDim.x, lo = per * blockIdx.x, hi = min(n, lo + per);
  for (int64_t i = lo + threadIdx.x; i < hi; i += kThreads) {
    const uint4 v = __ldcs(w + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  out[int64_t(blockIdx.x) * kThreads + threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) times[blockIdx.x * 3] = t0, times[blockIdx.x * 3 + 1] = t0, times[blockIdx.x * 3 + 2] = gtimer();
}


struct Span {
  double total, staged_med, start_spread;
};
Span span(const uint64_t* dt, int blocks) {
  std::vector<uint64_t> h(size_t(blocks) * 3);
  CK(cudaMemcpy(h.data(), dt, h.size() * 8, cudaMemcpyDeviceToHost));
  uint64_t s0 = ~0ull, s1 = 0, e = 0;
  std::vector<double> st;
  for (int b = 0; b < blocks; ++b) s0 = std::min(s0, h[b * 3]), s1 = std::max(s1, h[b * 3]), e = std::max(e, h[b * 3 + 2]);
  for (int b = 0; b < blocks; ++b) st.push_back(double(h[b * 3 + 1] - s0) * 1e-3);
  std::sort(st.begin(), st.end());
  return {double(e - s0) * 1e-3, st[st.size() / 2], double(s1 - s0) * 1e-3};
}

__global__ void fill_kernel(uint64_t* p, int64_t n, uint64_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t v = uint64_t(i) * 0x9e3779b97f4a7c15ULL + seed;
    v ^= v >> 31, v *= 0xbf58476d1ce4e5b9ULL, v ^= v >> 29;
    p[i] = v;
  }
}
void fill(void* p, int64_t bytes, uint64_t seed) {
  fill_kernel<<<1024, 256>>>(static_cast<uint64_t*>(p), bytes / 8, mix(seed));
  CK(cudaGetLastError());
}

}  // namespace

int main(int argc, char** argv) {
  const int L = argc > 1 ? std::atoi(argv[1]) : 16;
  const int reps = 48;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB; %d layers of %d experts (F %d, H %d, q4g%d)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, L, kE, kF, kH, kG);
  const int64_t per_expert = 2 * kMatB + 4 * kScB + kDMatB;
  // Two allocations of every layer's experts: one cudaMalloc per array, and one slab.
  std::vector<std::vector<Expert>> sep(static_cast<size_t>(L), std::vector<Expert>(size_t{kE}));
  std::vector<std::vector<Expert>> slab = sep;
  uint64_t seed = 1;
  auto alloc = [&](int64_t bytes) {
    uint8_t* p = nullptr;
    CK(cudaMalloc(&p, size_t(bytes)));
    fill(p, bytes, seed++);
    return p;
  };
  for (int l = 0; l < L; ++l) {
    uint8_t* s = alloc(per_expert * kE);
    for (int e = 0; e < kE; ++e) {
      Expert& x = sep[l][e];
      x.g = alloc(kMatB), x.u = alloc(kMatB), x.gs = alloc(kScB), x.gb = alloc(kScB), x.us = alloc(kScB),
      x.ub = alloc(kScB), x.d = alloc(kDMatB);
      uint8_t* q = s + per_expert * e;
      Expert& y = slab[l][e];
      y.g = q, y.u = q + kMatB, y.gs = q + 2 * kMatB, y.gb = y.gs + kScB, y.us = y.gb + kScB, y.ub = y.us + kScB,
      y.d = y.ub + kScB;
    }
  }
  CK(cudaDeviceSynchronize());
  std::printf("allocated %.2f GB twice\n", double(per_expert) * kE * L * 1e-9);
  Expert* d_ex = nullptr;
  int* d_idx = nullptr;
  uint4* d_out = nullptr;
  uint64_t* d_t = nullptr;
  uint32_t* d_sink = nullptr;
  CK(cudaMalloc(&d_ex, sizeof(Expert) * kE * size_t(L) * 2));
  CK(cudaMalloc(&d_idx, sizeof(int) * kK * size_t(reps)));
  CK(cudaMalloc(&d_out, size_t(1024) * kThreads * 16));
  CK(cudaMalloc(&d_t, size_t(1024) * 3 * 8));
  CK(cudaMalloc(&d_sink, 4));
  for (int l = 0; l < L; ++l) {
    CK(cudaMemcpy(d_ex + size_t(l) * kE, sep[l].data(), sizeof(Expert) * kE, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ex + size_t(L + l) * kE, slab[l].data(), sizeof(Expert) * kE, cudaMemcpyHostToDevice));
  }
  CK(cudaFuncSetAttribute(fetch_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CK(cudaFuncSetAttribute(fetch_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  std::mt19937 rng(42);
  std::vector<int> picks(size_t(reps) * kK);

  auto run = [&](const char* alloc_name, int slab_mode, bool adjacent, int mech, int down, bool warm) {
    for (int r = 0; r < reps; ++r) {
      std::vector<int> all(kE);
      for (int e = 0; e < kE; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      const int base = int(rng() % (kE / kK)) * kK;
      for (int s = 0; s < kK; ++s) picks[size_t(r) * kK + s] = adjacent ? base + s : all[s];
    }
    CK(cudaMemcpy(d_idx, picks.data(), sizeof(int) * picks.size(), cudaMemcpyHostToDevice));
    const int blocks = kK * kTiles + (down ? kDTiles : 0);
    std::vector<double> tot, stg, spr;
    bool ok = true;
    for (int r = 0; r < reps; ++r) {
      const int l = (r * 7 + 3) % L;  // a different layer each time: the previous launch's bytes are not in L2
      Args a{d_ex + size_t(slab_mode * L + l) * kE, d_idx + r * kK, d_out, d_t, down};
      if (warm) warm_kernel<<<kE, 32>>>(a.ex, d_sink);
      if (mech == 1) fetch_kernel<1><<<blocks, kThreads, kSmem>>>(a);
      else fetch_kernel<2><<<blocks, kThreads, kSmem>>>(a);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      const Span s = span(d_t, blocks);
      tot.push_back(s.total), stg.push_back(s.staged_med), spr.push_back(s.start_spread);
      if (r < 2) {
        const uint4 got = xor_reduce(d_out, int64_t(blocks) * kThreads);
        check_kernel<<<blocks, kThreads>>>(a, blocks);
        CK(cudaGetLastError());
        const uint4 want = xor_reduce(d_out, int64_t(blocks) * kThreads);
        ok = ok && same(got, want);
      }
    }
    std::sort(tot.begin(), tot.end()), std::sort(stg.begin(), stg.end()), std::sort(spr.begin(), spr.end());
    const double bytes = double(kK) * kTiles * (32768 + 4096) + (down ? double(kDTiles) * kK * 16 * kDRowB : 0.0);
    const double med = tot[tot.size() / 2];
    std::printf("%-8s %-8s %-8s %-5s %-4s  %7.2f us (min %6.2f, max %6.2f)  staged (median block) %6.2f us  "
                "starts within %5.2f us  %6.0f GB/s  %.1f MB  %s\n",
                alloc_name, adjacent ? "adjacent" : "random", mech == 1 ? "cp.async" : "bulk", down ? "+down" : "",
                warm ? "warm" : "", med, tot.front(), tot.back(), stg[stg.size() / 2], spr[spr.size() / 2],
                bytes / med * 1e-3, bytes * 1e-6, ok ? "ok" : "CHECKSUM MISMATCH");
  };
  // The ceiling: the same bytes contiguous, cold, by as many blocks.
  {
    const int64_t bytes = int64_t(kK) * kTiles * (32768 + 4096);
    const int nb = 16;
    std::vector<uint8_t*> bufs;
    for (int i = 0; i < nb; ++i) bufs.push_back(alloc(bytes));
    CK(cudaDeviceSynchronize());
    std::vector<double> tot;
    for (int r = 0; r < reps; ++r) {
      plain_kernel<<<kK * kTiles, kThreads>>>(reinterpret_cast<const uint4*>(bufs[r % nb]), bytes / 16, d_out, d_t);
      CK(cudaDeviceSynchronize());
      tot.push_back(span(d_t, kK * kTiles).total);
    }
    std::sort(tot.begin(), tot.end());
    std::printf("plain contiguous read of %.1f MB by %d blocks: %.2f us (min %.2f)  %.0f GB/s\n", bytes * 1e-6,
                kK * kTiles, tot[tot.size() / 2], tot.front(), bytes / tot[tot.size() / 2] * 1e-3);
    for (uint8_t* p : bufs) CK(cudaFree(p));
  }
  for (int mech : {1, 2})
    for (int slab_mode : {0, 1})
      for (bool adjacent : {false, true}) run(slab_mode ? "slab" : "separate", slab_mode, adjacent, mech, 0, false);
  for (int mech : {1, 2}) {
    run("separate", 0, false, mech, 1, false);
    run("separate", 0, false, mech, 0, true);
    run("separate", 0, false, mech, 1, true);
  }
  return 0;
}
