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
// True when the quantized mat-vec also uses its AVX-512 VNNI form (bit for bit the AVX2 kernel's
// results, more multiply-adds per instruction): cpu_use_avx2(), the CPU has AVX-512 F/BW/VL/VNNI, and
// it is not switched off (ANVIL_CPU_AVX512=0 at start-up, or cpu_set_avx512(false) in tests).
bool cpu_use_avx512();
void cpu_set_avx512(bool on);

// This machine's memory read bandwidth in GB/s (1e9 bytes/s): all of `pool`'s threads read a
// buffer of `bytes` (make it far larger than the last-level cache, e.g. 1 GiB); best of a few runs.
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes);

// Mixture of experts: where the CPU's moe_ffn spends its time, for `anvil bench --profile`. Counting is
// off until cpu_moe_profile(true); the totals accumulate over every call since the last reset.
struct MoEPhaseTimes {
  double route_s = 0;    // router linear + softmax + top-k
  double experts_s = 0;  // the chosen experts' FFNs, the weighted sum and the shared expert
  int64_t calls = 0;
};
void cpu_moe_profile(bool on);
MoEPhaseTimes cpu_moe_phase_times();
void cpu_moe_profile_reset();
// The same counters for a device backend's moe_ffn (CUDA): while counting is on, it synchronizes around its
// routing kernel and reports both phases here.
bool moe_phase_profiling();
void moe_phase_add(double route_s, double experts_s);
// ANVIL_MOE_SKIP_EXPERTS=1 (read once at start-up; off by default): moe_ffn computes the router and the
// shared expert but skips the routed experts, as if their output were zero. For attribution only: it
// changes the model's output.
bool moe_skip_experts();

}  // namespace anvil
