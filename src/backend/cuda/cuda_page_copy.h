// Copies between KV pages in device memory and pinned host staging for the durable KV store
// (src/kvstore/), on streams of their own so that neither a save nor a restore stalls the decode
// stream, and ordered against it with events:
//
//   save (the store's writer thread):   compute --event--> d2h stream: cudaMemcpy2DAsync -> pinned
//     The event is recorded on the compute stream when the writer queues the copy, so the copy runs
//     after every kernel enqueued before it, in particular the steps that wrote the page (the decode
//     thread enqueued them before it handed the page to the store). The compute stream never waits
//     for the copy; the page stays retained by the store until wait_host_copies() has returned.
//   restore (the engine's thread):      compute --event--> h2d stream: cudaMemcpyAsync <- pinned
//                                       h2d stream --event--> compute
//     The first event keeps the copy behind kernels still reading the (reused) pool page; the second
//     keeps every later kernel behind the copy. wait_device_copies() waits for the h2d stream only.
//
// A graph capture on the compute stream (relaxed mode) would take in an event recorded on it from
// another thread, so the capture holds capture_mu() and the writer records its event under it.
//
// EXPERIMENTAL, UNVERIFIED: compiled, never run on a GPU yet. CudaBackend::supports_page_store()
// returns true only with ANVIL_CUDA_PAGE_STORE=1; scripts/cuda_check.sh's store section tests it.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>

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

  // Writer thread.
  Status copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                               size_t rows);
  Status wait_host_copies();
  // Engine thread.
  Status copy_to_device_async(void* dst, const void* src, size_t bytes);
  Status wait_device_copies();

  std::mutex& capture_mu() { return capture_mu_; }

 private:
  Status check(cudaError_t e, const char* what);
  Status ready();

  int device_ = 0;
  cudaStream_t compute_ = nullptr;
  cudaStream_t d2h_ = nullptr, h2d_ = nullptr;
  cudaEvent_t d2h_after_ = nullptr;                            // compute -> d2h (writer thread)
  cudaEvent_t h2d_after_ = nullptr, compute_after_ = nullptr;  // compute -> h2d, h2d -> compute
  std::mutex capture_mu_;
  std::mutex init_mu_;
  bool ready_ = false;
  Status d2h_error_, h2d_error_;  // first failure of each direction; sticky
};

}  // namespace anvil::cuda
