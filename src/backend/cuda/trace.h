// Internal to src/backend/cuda/: a timeline of one replayed decode graph, block by block, for
// measuring where a step's time goes inside the graph (not a profiler's isolated kernels).
//
// A build with -DCMAKE_CUDA_FLAGS=-DANVIL_CUDA_TRACE (scripts/cuda_check.sh trace) compiles trace
// points into the kernels (trace.cuh: thread 0 of every block records the global timer, its SM and
// the launch's %gridid at the kernel's start, after its PDL wait and, in the kernels that mark
// them, at phases inside and at its end). At run time ANVIL_CUDA_TRACE=PATH arms it: the backend
// records the names of the kernels each graph captures, and at the ANVIL_CUDA_TRACE_STEP-th replay
// (default 20) of each graph it clears the buffer, replays, synchronizes and writes PATH.<graph
// key>.txt (the names, then one line per record) for scripts/trace_summary.py. Ordinary builds
// have no trace points (the kernels are unchanged); arming one warns that nothing will be recorded.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace anvil::cuda::trace {

// The buffer: one record per (launch, block), the launch's slot being its %gridid modulo kSlots
// (a graph's launches have consecutive grid ids, so a replay of up to kSlots kernels fills distinct
// slots), blocks beyond kBlocks not recorded. Kernels write it unconditionally with plain stores
// (no atomics or loads on their critical path); the host clears it before the traced replay, so
// what is non-zero afterwards is that replay's.
constexpr int kSlots = 1024;  // (a 64-sequence step launches ~600 kernels)
constexpr int kBlocks = 1024;
constexpr int kPhases = 10;  // 0 start, 1 after the PDL wait, 2..8 kernel-specific, 9 end
struct Rec {
  uint64_t grid;  // %gridid + 1 (0: not written)
  uint64_t t[kPhases];  // %globaltimer (ns) at each phase, 0 where not reached
  uint32_t sm;
  uint32_t pad;
};
constexpr size_t kBufBytes = size_t(kSlots) * kBlocks * sizeof(Rec);

// Each translation unit with trace points registers how to point its copy of the device-side
// buffer pointer at the buffer (device globals are per translation unit without relocatable code).
using Binder = cudaError_t (*)(void*);
void add_binder(Binder b);

// Whether ANVIL_CUDA_TRACE is set (read once).
bool armed();
// During a graph capture: the kernel a launch runs (its name is kept for the capture's graph).
void note_launch(const void* fn);
void capture_begin();
void capture_end(uint64_t key);
// Around a graph replay: returns whether this replay is the traced one (then after_launch waits
// for it and writes the file).
bool before_launch(uint64_t key, cudaStream_t s);
void after_launch(uint64_t key, cudaStream_t s);

}  // namespace anvil::cuda::trace
