// The CPU backend's extras beyond backend.h: what the CLI (anvil bench / inspect) and the tests
// need to know about the host. make_cpu_backend() itself is declared in backend/backend.h.
#pragma once
#include <cstddef>

#include "base/thread_pool.h"

namespace anvil {

// True when this CPU has AVX2 and FMA (the run-time-selected SIMD kernels).
bool cpu_has_avx2();
// Forces the portable scalar kernels even where AVX2 exists (tests compare both paths).
// The environment variable ANVIL_CPU_SCALAR=1 sets it at start-up.
void cpu_set_force_scalar(bool on);
// True when the AVX2 kernels are in use: cpu_has_avx2() and not forced scalar.
bool cpu_use_avx2();

// This machine's memory read bandwidth in GB/s (1e9 bytes/s): all of `pool`'s threads read a
// buffer of `bytes` (make it far larger than the last-level cache, e.g. 1 GiB); best of a few runs.
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes);

}  // namespace anvil
