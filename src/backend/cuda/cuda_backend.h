// The CUDA backend: bf16 activations in device memory, weights uploaded once, every op one or two
// kernels on one stream, decode steps captured as CUDA graphs (backend.h graph_*). Kernels live in
// one .cu per op family beside this file; cuda_backend.cpp (host code) maps the Backend interface onto them.
// Plain C++ header: the CLI and the tests include it without CUDA headers.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"

namespace anvil {

// A backend on CUDA device `device`, or an error that says what is missing: the driver, a GPU, or
// kernels for this GPU's architecture (the build's ANVIL_CUDA_ARCHS).
Result<std::unique_ptr<Backend>> make_cuda_backend(int device = 0);

// Device `device`'s free and total memory in bytes.
Status cuda_memory_info(int device, size_t* free_bytes, size_t* total_bytes);

// The device's copy bandwidth in GB/s (1e9 bytes/s), counting bytes read plus bytes written, from
// device-to-device copies of `bytes` (best of a few, after a warm-up).
Result<double> cuda_copy_bandwidth_gbs(Backend& cuda_backend, size_t bytes);

// Per-op-family timing without host synchronization (the per-family figures in docs/benchmarks.md
// came from it; `anvil bench --profile` now uses the generic ProfilingBackend, which synchronizes
// around every op): while on, graphs are off and every op is bracketed
// by CUDA events. cuda_profile_report() synchronizes and returns (family, milliseconds) totals
// since profiling was turned on, largest first.
void cuda_set_profiling(Backend& cuda_backend, bool on);
std::vector<std::pair<std::string, double>> cuda_profile_report(Backend& cuda_backend);

}  // namespace anvil
