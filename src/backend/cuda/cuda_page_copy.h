// Copies between KV pages in device memory and pinned host staging for the durable KV store
// (src/kvstore/), on streams of their own so that neither a save nor a restore stalls the decode
// stream, and ordered against it with events:
//
//   save (the store's writer thread):   compute --fence--> d2h stream: cudaMemcpy2DAsync -> pinned
//     The fence is an event the engine's thread records on the compute stream when it hands the
//     page to the store (record_fence), right after enqueuing the step that completed the page, so
//     the copy runs after the kernels that wrote it and not after work enqueued later: a long
//     prefill enqueues its chunks far ahead of the GPU, and an event recorded by the writer at copy
//     time would hold every copy until the whole prefill ran (measured on the H200: nothing written
//     during a 16k-token prefill, the queue full, the rest dropped). Fences live in a ring of
//     events; one re-recorded before its copy was queued only waits longer (a later point of the
//     same stream), never less. Without a fence (0) the writer records the event itself, as before.
//     The compute stream never waits for the copy; the page stays retained by the store until
//     wait_host_copies() has returned.
//   restore (the engine's thread):      compute --event--> h2d stream: cudaMemcpyAsync <- pinned
//                                       h2d stream --event--> compute
//     The first event keeps the copy behind kernels still reading the (reused) pool page; the second
//     keeps every later kernel behind the copy. wait_device_copies() waits for the h2d stream only;
//     wait_device_copies_from(src) for the last copy from one staging buffer (an event per buffer).
//     Several restore threads may queue copies and wait at once (each from staging of its own).
//
// A graph capture on the compute stream (relaxed mode) would take in an event recorded on it from
// another thread, so the capture holds capture_mu() and the writer records its event under it.
//
// Verified on the H200 (tests/cuda/cuda_kvstore_test.cpp and the benchmarks in docs/benchmarks.md,
// run by scripts/cuda_check.sh's store section); ANVIL_CUDA_PAGE_STORE=0 turns the store off on CUDA.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "base/status.h"

namespace anvil::cuda {

class PageCopier {
 public:
  PageCopier() = default;
  PageCopier(const PageCopier&) = delete;
  PageCopier& operator=(const PageCopier&) = delete;
  ~PageCopier();

  // Creates the two copy streams and their events lazily, on the device of `compute`.
  Status init(int device, cudaStream_t compute);

  Result<void*> alloc_host(size_t bytes);
  void free_host(void* p);

  // Engine thread: a fence after everything enqueued on the compute stream so far (0 if none could
  // be recorded: the copy then falls back to an event of its own).
  uint64_t record_fence();
  // Writer thread.
  Status copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                               size_t rows, uint64_t after_fence);
  Status wait_host_copies();
  // Engine thread.
  Status copy_to_device_async(void* dst, const void* src, size_t bytes);
  Status wait_device_copies();
  // The last copy queued from `src` (an event recorded after it on the h2d stream; each restore
  // thread copies from staging of its own, so only that thread re-records it).
  Status wait_device_copies_from(const void* src);

  std::mutex& capture_mu() { return capture_mu_; }

 private:
  Status check(cudaError_t e, const char* what);
  Status ready();

  int device_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t d2h_ = nullptr, h2d_ = nullptr;
  cudaEvent_t d2h_after_ = nullptr;                            // compute -> d2h (writer thread)
  cudaEvent_t h2d_after_ = nullptr, compute_after_ = nullptr;  // compute -> h2d, h2d -> compute
  static constexpr size_t kFences = 512;
  std::array<cudaEvent_t, kFences> fences_{};
  std::atomic<uint64_t> fence_next_{0};
  std::mutex capture_mu_;
  std::mutex init_mu_;
  std::mutex h2d_mu_;  // copy_to_device_async / wait_device_copies from several restore threads
  std::unordered_map<const void*, cudaEvent_t> h2d_done_;  // per staging buffer, under h2d_mu_
  bool ready_ = false;
  Status d2h_error_, h2d_error_;  // first failure of each direction; sticky
};

}  // namespace anvil::cuda
