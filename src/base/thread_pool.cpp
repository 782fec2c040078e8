#include "base/thread_pool.h"

#include <algorithm>

namespace anvil {

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n, chunk;
    int chunks;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunk = job_chunk_;
      chunks = job_chunks_;
    }
    // Chunk c goes to thread c % n_threads_; the caller is thread 0.
    for (int c = index; c < chunks; c += n_threads_) {
      int64_t b = c * chunk, e = std::min(n, b + chunk);
      if (b < e) (*job)(b, e);
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t max_chunks = (n + grain - 1) / grain;
  int threads = int(std::min<int64_t>(n_threads_, max_chunks));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  int64_t chunk = (n + n_threads_ - 1) / n_threads_;
  chunk = std::max(chunk, grain);
  int chunks = int((n + chunk - 1) / chunk);
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_chunks_ = chunks;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  cv_start_.notify_all();
  for (int c = 0; c < chunks; c += n_threads_) {
    int64_t b = c * chunk, e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  job_ = nullptr;
}

}  // namespace anvil
