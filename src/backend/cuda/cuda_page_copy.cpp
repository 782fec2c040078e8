// See cuda_page_copy.h: the store's device<->host page copies on their own streams, event-ordered
// against the compute stream.
#include "backend/cuda/cuda_page_copy.h"

#include <string>

namespace anvil::cuda {

PageCopier::~PageCopier() {
  if (d2h_) cudaStreamSynchronize(d2h_);
  if (h2d_) cudaStreamSynchronize(h2d_);
  for (cudaEvent_t e : {d2h_after_, h2d_after_, compute_after_})
    if (e) cudaEventDestroy(e);
  for (cudaEvent_t e : fences_)
    if (e) cudaEventDestroy(e);
  for (auto& [src, e] : h2d_done_) cudaEventDestroy(e);
  if (d2h_) cudaStreamDestroy(d2h_);
  if (h2d_) cudaStreamDestroy(h2d_);
}

Status PageCopier::check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  cudaGetLastError();
  return internal_error(std::string("cuda kv page copy: ") + what + ": " + cudaGetErrorString(e));
}

Status PageCopier::init(int device, cudaStream_t compute) {
  device_ = device;
  compute_ = compute;
  return Status::ok();
}

// Streams and events are made on first use (most runs never touch the store), by whichever thread
// comes first; cudaSetDevice because the writer thread starts on device 0.
Status PageCopier::ready() {
  std::lock_guard<std::mutex> lk(init_mu_);
  ANVIL_RETURN_IF_ERROR(check(cudaSetDevice(device_), "cudaSetDevice"));
  if (ready_) return Status::ok();
  ANVIL_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking), "d2h stream"));
  ANVIL_RETURN_IF_ERROR(check(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking), "h2d stream"));
  for (cudaEvent_t* e : {&d2h_after_, &h2d_after_, &compute_after_})
    ANVIL_RETURN_IF_ERROR(check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "event"));
  for (cudaEvent_t& e : fences_) ANVIL_RETURN_IF_ERROR(check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event"));
  ready_ = true;
  return Status::ok();
}

Result<void*> PageCopier::alloc_host(size_t bytes) {
  ANVIL_RETURN_IF_ERROR(ready());
  void* p = nullptr;
  cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 1);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::kOutOfMemory, "cuda kv page copy: could not pin " + std::to_string(bytes) +
                                                " bytes of host staging (" + cudaGetErrorString(e) + ")");
  }
  return p;
}

void PageCopier::free_host(void* p) {
  if (p) cudaFreeHost(p);
}

uint64_t PageCopier::record_fence() {
  if (!ready().is_ok()) return 0;
  // Never into a graph being captured (the capture holds the lock on this same thread: try_lock).
  std::unique_lock<std::mutex> lk(capture_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return 0;
  const uint64_t id = fence_next_.load(std::memory_order_relaxed) + 1;
  if (cudaEventRecord(fences_[id % kFences], compute_) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  fence_next_.store(id, std::memory_order_release);
  return id;
}

Status PageCopier::copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                         size_t rows, uint64_t after_fence) {
  if (!d2h_error_.is_ok()) return d2h_error_;
  Status st = ready();
  cudaEvent_t after = d2h_after_;
  if (st.is_ok() && after_fence != 0 && after_fence <= fence_next_.load(std::memory_order_acquire)) {
    after = fences_[after_fence % kFences];  // recorded at that point or, if re-recorded since, later
  } else if (st.is_ok()) {
    std::lock_guard<std::mutex> lk(capture_mu_);  // never recorded into a graph being captured
    st = check(cudaEventRecord(d2h_after_, compute_), "record compute event");
  }
  if (st.is_ok()) st = check(cudaStreamWaitEvent(d2h_, after, 0), "d2h wait");
  if (st.is_ok() && rows && width)
    st = check(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToHost, d2h_),
               "cudaMemcpy2DAsync device->host");
  if (!st.is_ok()) d2h_error_ = st;
  return st;
}

Status PageCopier::wait_host_copies() {
  if (!d2h_error_.is_ok()) return d2h_error_;
  if (!d2h_) return Status::ok();
  Status st = check(cudaSetDevice(device_), "cudaSetDevice");
  if (st.is_ok()) st = check(cudaStreamSynchronize(d2h_), "device->host copy");
  if (!st.is_ok()) d2h_error_ = st;
  return st;
}

Status PageCopier::copy_to_device_async(void* dst, const void* src, size_t bytes) {
  std::lock_guard<std::mutex> lk(h2d_mu_);  // restore threads queue copies concurrently
  if (!h2d_error_.is_ok()) return h2d_error_;
  Status st = ready();
  if (st.is_ok()) st = check(cudaEventRecord(h2d_after_, compute_), "record compute event");
  if (st.is_ok()) st = check(cudaStreamWaitEvent(h2d_, h2d_after_, 0), "h2d wait");
  if (st.is_ok() && bytes)
    st = check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, h2d_), "cudaMemcpyAsync host->device");
  if (st.is_ok()) {
    auto it = h2d_done_.find(src);
    if (it == h2d_done_.end()) {
      cudaEvent_t e = nullptr;
      st = check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
      if (st.is_ok()) it = h2d_done_.emplace(src, e).first;
    }
    if (st.is_ok()) st = check(cudaEventRecord(it->second, h2d_), "record staging event");
  }
  if (st.is_ok()) st = check(cudaEventRecord(compute_after_, h2d_), "record h2d event");
  if (st.is_ok()) st = check(cudaStreamWaitEvent(compute_, compute_after_, 0), "compute wait");
  if (!st.is_ok()) h2d_error_ = st;
  return st;
}

Status PageCopier::wait_device_copies_from(const void* src) {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lk(h2d_mu_);
    if (!h2d_error_.is_ok()) return h2d_error_;
    auto it = h2d_done_.find(src);
    if (it == h2d_done_.end()) return Status::ok();  // nothing was ever copied from it
    e = it->second;
  }
  // Outside the lock; only the thread that owns `src` records this event.
  Status st = check(cudaSetDevice(device_), "cudaSetDevice");
  if (st.is_ok()) st = check(cudaEventSynchronize(e), "host->device copy");
  if (!st.is_ok()) {
    std::lock_guard<std::mutex> lk(h2d_mu_);
    h2d_error_ = st;
  }
  return st;
}

Status PageCopier::wait_device_copies() {
  cudaStream_t h2d;
  {
    std::lock_guard<std::mutex> lk(h2d_mu_);
    if (!h2d_error_.is_ok()) return h2d_error_;
    h2d = h2d_;
  }
  if (!h2d) return Status::ok();
  // Outside the lock: other restore threads keep queueing while this one waits.
  Status st = check(cudaStreamSynchronize(h2d), "host->device copy");
  if (!st.is_ok()) {
    std::lock_guard<std::mutex> lk(h2d_mu_);
    h2d_error_ = st;
  }
  return st;
}

}  // namespace anvil::cuda
