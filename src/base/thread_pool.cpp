#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include <sys/resource.h>

namespace anvil {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

int spin_from_env() {
  const char* e = std::getenv("ANVIL_SPIN_US");
  if (!e || !*e) return ThreadPool::kDefaultSpinUs;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return (end && *end == '\0' && v >= 0) ? int(std::min<long>(v, 1000000)) : ThreadPool::kDefaultSpinUs;
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, int spin_us)
    : n_threads_(std::max(1, n_threads)), spin_us_(spin_us >= 0 ? spin_us : spin_from_env()) {
  worker_switches_ = std::make_unique<std::atomic<long>[]>(size_t(n_threads_));
  for (int i = 0; i < n_threads_; ++i) worker_switches_[size_t(i)].store(0, std::memory_order_relaxed);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true, std::memory_order_release);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : int(n);
}

template <class Pred>
bool ThreadPool::spin(Pred done) const {
  if (done()) return true;
  if (spin_us_ <= 0 || !spin_enabled_.load(std::memory_order_relaxed)) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
  for (int i = 1;; ++i) {
    cpu_relax();
    if (done()) return true;
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

namespace {
long thread_involuntary_switches() {
  rusage ru{};
  return getrusage(RUSAGE_THREAD, &ru) == 0 ? ru.ru_nivcsw : 0;
}
}  // namespace

long ThreadPool::involuntary_switches() const {
  long sum = thread_involuntary_switches();  // the caller's, now (slot 0 is unused)
  for (int i = 1; i < n_threads_; ++i) sum += worker_switches_[size_t(i)].load(std::memory_order_relaxed);
  return sum;
}

void ThreadPool::check_contention() {
  const auto now = std::chrono::steady_clock::now();
  const long switches = involuntary_switches();
  if (last_switches_ >= 0) {
    const double dt = std::chrono::duration<double>(now - last_check_).count();
    spin_enabled_.store(!contended(switches - last_switches_, dt, n_threads_), std::memory_order_relaxed);
  }
  last_switches_ = switches;
  last_check_ = now;
}

void ThreadPool::run_chunks() {
  for (;;) {
    const int c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= job_chunks_) return;
    const int64_t b = c * job_chunk_, e = std::min(job_n_, b + job_chunk_);
    if (b < e) (*job_)(b, e);
  }
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  unsigned jobs = 0;
  for (;;) {
    auto started = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin(started)) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_start_.wait(lk, started);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks();
    if (spin_us_ > 0 && (++jobs & 63) == 0)
      worker_switches_[size_t(index)].store(thread_involuntary_switches(), std::memory_order_relaxed);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lk(mu_);  // pairs with the caller's predicate check in cv_done_.wait
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t max_chunks = (n + grain - 1) / grain;
  const int threads = int(std::min<int64_t>(n_threads_, max_chunks));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  if (spin_us_ > 0 && ++jobs_since_check_ >= 256) {
    jobs_since_check_ = 0;
    check_contention();
  }
  // Up to 4 chunks per thread, each at least `grain` long.
  const int64_t target = int64_t(n_threads_) * 4;
  const int64_t chunk = std::max(grain, (n + target - 1) / target);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  job_chunks_ = int((n + chunk - 1) / chunk);
  next_chunk_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // Under the mutex so a worker between its predicate check and its sleep cannot miss the bump.
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_start_.notify_all();
  run_chunks();
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin(done)) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, done);
  }
  job_ = nullptr;
}

}  // namespace anvil
