// How fast the H200 streams a q4 weight matrix into shared memory in the batch kernel's pattern
// (qgemm_batch.cu), by copy mechanism and by bytes per row per step. A measurement tool, not an
// engine kernel: each pattern's result is checked against a checksum of the matrix computed on the
// host (every weight byte read exactly once), and its time is reported with the bandwidth.
//
// The pattern: a block of 128 threads owns 64 rows and walks K in steps of BPS bytes per row
// through a ring of S stages in shared memory; with X > 0 a stage also holds X bytes of
// "activations" from a small L2-resident buffer (the batch kernel's permuted x: 8 KB per 128-element
// step at 32 tokens). K is split over gridDim.y so that there are at least two blocks per SM.
// Mechanisms: 1 cp.async (16 bytes per thread per copy, what the batch kernel does), 2 a TMA tensor
// copy of the stage's [64 rows][BPS bytes] box plus one 1D bulk copy of its activations, issued by
// one thread and completed on an mbarrier, 3 one 1D bulk copy per row (64 per stage, by one warp).
// Mode 0 is a plain grid-stride read of the matrix (16-byte loads), the ceiling for comparison.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a bench/cuda_read_patterns.cu -o rp && ./rp
// (from the repository root; the copy wrappers come from src/backend/cuda/async_copy.cuh)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../src/backend/cuda/async_copy.cuh"
#include "cuda_bench.h"


namespace {

constexpr int kThreads = 128;
constexpr int kRows = 64;       // rows per block
constexpr int kPad = 8 * 1024;  // shared memory standing in for the batch kernel's staged scales

// The copies and mbarriers: src/backend/cuda/async_copy.cuh (the persistent decode kernel's).
using anvil::cuda::async_copy16;
using anvil::cuda::bulk_copy;
using anvil::cuda::mbar_expect_tx;
using anvil::cuda::mbar_init;
using anvil::cuda::mbar_wait;
using anvil::cuda::tensor_copy;
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__global__ void plain_kernel(const uint4* w, int64_t n, uint4* out) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __ldcs(w + i + k * stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc.x ^= v[k].x, acc.y ^= v[k].y, acc.z ^= v[k].z, acc.w ^= v[k].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(w + i);
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  out[int64_t(blockIdx.x) * blockDim.x + threadIdx.x] = acc;
}

struct Args {
  const uint8_t* w;  // [rows][kb]
  int64_t kb;        // bytes per row
  const uint8_t* x;  // [steps][xb]
  int xb;            // activation bytes per stage (a multiple of 2,048)
  int sps;           // steps per split
  int steps;         // kb / BPS
  uint4* out;        // [blocks][128]: the XOR of the weights each thread read
  uint32_t* xsum;    // the activations' sum (kept live, not checked)
};

template <int MODE, int BPS, int S>
__global__ void __launch_bounds__(kThreads) ring_kernel(Args a, const __grid_constant__ CUtensorMap tm) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int WB = kRows * BPS;  // weight bytes per stage
  const int SB = WB + a.xb;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S * SB);  // one per slot
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  const int s0 = int(blockIdx.y) * a.sps;
  const int n = min(a.steps, s0 + a.sps) - s0;
  const int t = threadIdx.x;
  if (MODE != 1) {
    if (t == 0) {
      for (int i = 0; i < S; ++i) mbar_init(&bars[i], 1);
      anvil::cuda::mbar_init_fence();
    }
    __syncthreads();
  }
  auto issue = [&](int i) {  // step i into slot i % S
    uint8_t* st = smem + (i % S) * SB;
    const int step = s0 + i;
    if constexpr (MODE == 1) {
#pragma unroll
      for (int k = 0; k < WB / 16 / kThreads; ++k) {
        const int u = k * kThreads + t, r = u / (BPS / 16), c = u % (BPS / 16);
        async_copy16(st + u * 16, a.w + (row0 + r) * a.kb + int64_t(step) * BPS + c * 16);
      }
      for (int u = t; u < a.xb / 16; u += kThreads) async_copy16(st + WB + u * 16, a.x + int64_t(step) * a.xb + u * 16);
    } else if constexpr (MODE == 2) {
      if (t == 0) {
        mbar_expect_tx(&bars[i % S], uint32_t(SB));
        tensor_copy(st, &tm, step * BPS, int(row0), &bars[i % S]);
        if (a.xb) bulk_copy(st + WB, a.x + int64_t(step) * a.xb, uint32_t(a.xb), &bars[i % S]);
      }
    } else {
      if (t < 32) {
        if (t == 0) mbar_expect_tx(&bars[i % S], uint32_t(SB));
        __syncwarp();
        for (int r = t; r < kRows; r += 32)
          bulk_copy(st + r * BPS, a.w + (row0 + r) * a.kb + int64_t(step) * BPS, BPS, &bars[i % S]);
        if (t == 0 && a.xb) bulk_copy(st + WB, a.x + int64_t(step) * a.xb, uint32_t(a.xb), &bars[i % S]);
      }
    }
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < n) issue(i);
    if constexpr (MODE == 1) cp_commit();
  }
  uint4 acc = make_uint4(0, 0, 0, 0);
  uint32_t xs = 0;
  for (int i = 0; i < n; ++i) {
    if constexpr (MODE == 1) cp_wait<S - 2>();
    __syncthreads();  // stage i landed (MODE 1); every thread is done with stage i - 1
    if (i + S - 1 < n) {
      if constexpr (MODE != 1) {
        if (t == 0) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      }
      issue(i + S - 1);
    }
    if constexpr (MODE == 1) cp_commit();
    if constexpr (MODE != 1) mbar_wait(&bars[i % S], uint32_t((i / S) & 1));
    const uint4* st = reinterpret_cast<const uint4*>(smem + (i % S) * SB);
#pragma unroll
    for (int k = 0; k < WB / 16 / kThreads; ++k) {
      const uint4 v = st[k * kThreads + t];
      acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
    }
    for (int u = t; u < a.xb / 16; u += kThreads) xs += st[WB / 16 + u].x;
  }
  a.out[(int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * kThreads + t] = acc;
  if (xs == 0x9e3779b9u) atomicAdd(a.xsum, 1u);  // keeps the activation reads
}

using EncodeFn = PFN_cuTensorMapEncodeTiled_v12000;
EncodeFn encode_fn() {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
  if (!f || q != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
    std::exit(1);
  }
  return reinterpret_cast<EncodeFn>(f);
}

CUtensorMap make_map(const uint8_t* w, int64_t rows, int64_t kb, int bps) {
  static EncodeFn enc = encode_fn();
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(kb), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(kb)};
  const cuuint32_t box[2] = {cuuint32_t(bps), cuuint32_t(kRows)};
  const cuuint32_t es[2] = {1, 1};
  const CUresult r = enc(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(w), dims, strides, box, es,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    std::exit(1);
  }
  return m;
}

struct Matrix {
  const char* name;
  int64_t rows, kb;
};

struct Bufs {
  std::vector<uint8_t*> w;  // copies, so that consecutive launches read cold data
  std::vector<uint4> sum;   // the host's XOR of each copy
  uint8_t* x = nullptr;
};


Bufs make_bufs(const Matrix& m, int64_t xbytes) {
  Bufs b;
  const int64_t bytes = m.rows * m.kb;
  const int copies = int(std::max<int64_t>(2, (640ll << 20) / bytes + 1));
  std::vector<uint64_t> h(size_t(bytes / 8));
  for (int c = 0; c < copies; ++c) {
    uint4 s = make_uint4(0, 0, 0, 0);
    for (size_t i = 0; i < h.size(); ++i) h[i] = mix(i * 131 + uint64_t(c) * 0x1234567ULL + uint64_t(m.kb));
    const uint32_t* u = reinterpret_cast<const uint32_t*>(h.data());
    for (size_t i = 0; i < h.size() * 2; i += 4) s.x ^= u[i], s.y ^= u[i + 1], s.z ^= u[i + 2], s.w ^= u[i + 3];
    uint8_t* d = nullptr;
    CK(cudaMalloc(&d, size_t(bytes)));
    CK(cudaMemcpy(d, h.data(), size_t(bytes), cudaMemcpyHostToDevice));
    b.w.push_back(d);
    b.sum.push_back(s);
  }
  CK(cudaMalloc(&b.x, size_t(xbytes)));
  CK(cudaMemset(b.x, 1, size_t(xbytes)));
  return b;
}


int g_sms = 0;
uint4* g_out = nullptr;
uint32_t* g_xsum = nullptr;
constexpr int kReps = 30;

void report(const Matrix& m, const char* what, int blocks_per_sm, int64_t grid, float us, int64_t xread, bool ok) {
  const double wb = double(m.rows * m.kb);
  std::printf("%-8s %-28s %3d/SM %6lld blocks %8.2f us  %7.0f GB/s weights  %7.0f GB/s with x  %s\n", m.name, what,
              blocks_per_sm, (long long)grid, us, wb / us * 1e-3, (wb + double(xread)) / us * 1e-3,
              ok ? "ok" : "CHECKSUM MISMATCH");
}

void run_plain(const Matrix& m, Bufs& b) {
  const int64_t n = m.rows * m.kb / 16;
  const int grid = g_sms * 8, threads = 256;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  plain_kernel<<<grid, threads>>>(reinterpret_cast<const uint4*>(b.w[0]), n, g_out);
  CK(cudaDeviceSynchronize());
  const bool ok = same(xor_reduce(g_out, int64_t(grid) * threads), b.sum[0]);
  CK(cudaEventRecord(e0));
  for (int r = 0; r < kReps; ++r)
    plain_kernel<<<grid, threads>>>(reinterpret_cast<const uint4*>(b.w[(r + 1) % b.w.size()]), n, g_out);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  report(m, "plain 16-byte loads", 8, grid, ms * 1000 / kReps, 0, ok);
}

template <int MODE, int BPS, int S>
void run_ring(const Matrix& m, Bufs& b, int xb) {
  const int steps = int(m.kb / BPS);
  const int64_t rblocks = m.rows / kRows;
  const int splits = int(std::min<int64_t>(steps, (2 * g_sms + rblocks - 1) / rblocks));
  const int sps = (steps + splits - 1) / splits;
  const int gy = (steps + sps - 1) / sps;
  const size_t smem = size_t(S) * (kRows * BPS + xb) + kPad;
  auto k = ring_kernel<MODE, BPS, S>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  int bps = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, k, kThreads, smem));
  std::vector<CUtensorMap> maps;
  for (uint8_t* w : b.w) maps.push_back(make_map(w, m.rows, m.kb, BPS));
  Args a{nullptr, m.kb, b.x, xb, sps, steps, g_out, g_xsum};
  const dim3 grid(static_cast<unsigned>(rblocks), static_cast<unsigned>(gy));
  a.w = b.w[0];
  k<<<grid, kThreads, smem>>>(a, maps[0]);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  const bool ok = same(xor_reduce(g_out, int64_t(rblocks) * gy * kThreads), b.sum[0]);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  for (int r = 0; r < kReps; ++r) {
    const size_t c = (r + 1) % b.w.size();
    a.w = b.w[c];
    k<<<grid, kThreads, smem>>>(a, maps[c]);
  }
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  static const char* names[] = {"", "cp.async", "TMA 2D box", "1D bulk per row"};
  char what[96];
  std::snprintf(what, sizeof what, "%s %dB/row S%d x%dK", names[MODE], BPS, S, xb / 1024);
  report(m, what, bps, int64_t(rblocks) * gy, ms * 1000 / kReps, rblocks * int64_t(steps) * xb, ok);
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, g_sms, prop.l2CacheSize >> 20);
  CK(cudaMalloc(&g_out, size_t(64) << 20));
  CK(cudaMalloc(&g_xsum, 4));
  // qwen3-8b q4 shapes (bytes per row = K / 2): gate+up, q/k/v, down.
  const Matrix mats[] = {{"gate/up", 24576, 2048}, {"q/k/v", 6144, 2048}, {"down", 4096, 6144}};
  for (const Matrix& m : mats) {
    Bufs b = make_bufs(m, (m.kb / 64) * 16384 + 65536);
    run_plain(m, b);
    run_ring<1, 64, 6>(m, b, 0);
    run_ring<1, 64, 6>(m, b, 8192);
    run_ring<1, 64, 4>(m, b, 8192);
    run_ring<1, 128, 4>(m, b, 0);
    run_ring<1, 128, 4>(m, b, 16384);
    run_ring<1, 256, 3>(m, b, 0);
    run_ring<2, 64, 6>(m, b, 0);
    run_ring<2, 64, 6>(m, b, 8192);
    run_ring<2, 64, 8>(m, b, 8192);
    run_ring<2, 128, 4>(m, b, 0);
    run_ring<2, 128, 4>(m, b, 16384);
    run_ring<2, 128, 6>(m, b, 16384);
    run_ring<2, 256, 3>(m, b, 0);
    run_ring<2, 256, 4>(m, b, 0);
    run_ring<3, 64, 6>(m, b, 8192);
    run_ring<3, 128, 4>(m, b, 16384);
    for (uint8_t* w : b.w) CK(cudaFree(w));
    CK(cudaFree(b.x));
  }
  return 0;
}
