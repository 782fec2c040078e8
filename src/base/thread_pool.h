// A fixed pool of worker threads for data-parallel kernels: parallel_for splits [0, n) into
// contiguous chunks, hands them out to the workers and the calling thread, and returns when all
// are done.
//
// Decode calls parallel_for a few hundred times per token, each job lasting 20-200 us, so the
// hand-off must cost far less than a job. Two things keep it cheap:
//  - Spin, then sleep: an idle worker (and the caller waiting for the last chunk) polls an atomic
//    for up to spin_us microseconds before it blocks on a condition variable. Back-to-back jobs
//    then start without a futex wake-up; a pool left idle (between requests) costs no CPU.
//    Spinning only pays while the pool has the cores to itself: with another busy process on the
//    machine a spinning thread takes CPU time from the thread doing the work (measured: +26% decode
//    idle, -30% next to one busy process). Every 256 jobs the caller sums the involuntary context
//    switches of the pool's own threads (each reads its getrusage(RUSAGE_THREAD) every 64 jobs);
//    above kContendedSwitchesPerThreadPerSec per thread the pool stops spinning until the rate
//    falls again (2 threads: ~30/s in all when idle, >1000/s next to a busy process). The
//    threshold is per thread: a machine's background preemptions land on as many of the pool's
//    threads as it has, so a fixed total (200/s until 2026-12-01) would switch spinning off on an
//    idle many-core machine (16 threads at ~15/s each are already 240/s) and leave every job a
//    futex wake-up. Only the pool's threads count: other threads of the process (a server's HTTP
//    or writer threads) being preempted says nothing about whether the pool's spinning steals CPU
//    from its own work.
//  - Dynamic chunks: chunks are claimed from an atomic counter, up to 4 per thread, so a thread
//    that was preempted or started late (a shared machine) does not leave the others idle at the
//    end of every job. Each output element is still computed by exactly one chunk, so results do
//    not depend on the thread count or on who ran what.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace anvil {

// A non-owning reference to a callable fn(begin, end). parallel_for is synchronous, so the caller's
// callable outlives the job; building a std::function instead would allocate for every lambda whose
// captures exceed its small buffer (decode calls parallel_for hundreds of times per token).
class RangeFn {
 public:
  template <class F>
    requires(!std::is_same_v<std::decay_t<F>, RangeFn> && std::is_invocable_v<F&, int64_t, int64_t>)
  RangeFn(F&& f)  // NOLINT: implicit, so call sites pass lambdas as before
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(o))(b, e); }) {}
  void operator()(int64_t b, int64_t e) const { call_(obj_, b, e); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};

class ThreadPool {
 public:
  // n_threads counts the caller: 1 means everything runs inline. spin_us < 0 means the default:
  // the ANVIL_SPIN_US environment variable if set, else kDefaultSpinUs.
  explicit ThreadPool(int n_threads, int spin_us = -1);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  int spin_us() const { return spin_us_; }
  // False while contention for the CPUs has switched spinning off (see above).
  bool spinning() const { return spin_us_ > 0 && spin_enabled_.load(std::memory_order_relaxed); }
  // The contention rule: involuntary context switches of a pool of `threads` threads over an
  // interval of `seconds`.
  static bool contended(long involuntary_switches, double seconds, int threads) {
    return involuntary_switches > 8 &&
           double(involuntary_switches) > kContendedSwitchesPerThreadPerSec * double(std::max(1, threads)) * seconds;
  }
  static constexpr double kContendedSwitchesPerThreadPerSec = 100.0;
  // Involuntary context switches of the pool's threads (the calling thread's now, the workers' as
  // of their last report), the count the contention rule reads. Call from the parallel_for caller.
  long involuntary_switches() const;
  // fn(begin, end) over chunks of [0, n); chunks are at least `grain` long.
  void parallel_for(int64_t n, int64_t grain, RangeFn fn);

  // The number of threads to use by default: the online CPU count.
  static int default_threads();
  static constexpr int kDefaultSpinUs = 100;

 private:
  void worker(int index);
  void run_chunks();
  void check_contention();
  // Polls done() for up to spin_us_; true if it became true.
  template <class Pred>
  bool spin(Pred done) const;

  int n_threads_;
  int spin_us_;
  std::vector<std::thread> workers_;
  std::unique_ptr<std::atomic<long>[]> worker_switches_;  // per worker, its RUSAGE_THREAD ru_nivcsw
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  // The current job; written by the caller before generation_ is bumped (release), read by the
  // workers after they see the new generation (acquire).
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  int job_chunks_ = 0;
  std::atomic<int> next_chunk_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers that have not finished the current generation
  std::atomic<bool> stop_{false};
  std::atomic<bool> spin_enabled_{true};
  int jobs_since_check_ = 0;
  long last_switches_ = -1;
  std::chrono::steady_clock::time_point last_check_;
};

}  // namespace anvil
