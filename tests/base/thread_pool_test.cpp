// ThreadPool: every index of [0, n) is run exactly once, chunks respect the grain, and the
// spin-then-sleep hand-off neither loses a wake-up nor leaves a job unfinished, whether workers
// are spinning (back-to-back jobs), asleep (after an idle gap) or never spin at all.
#include <gtest/gtest.h>

#include <fstream>
#include <cstdlib>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include <sys/resource.h>

#include "base/thread_pool.h"

namespace anvil {
namespace {

void expect_exact_cover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    ASSERT_LE(0, b);
    ASSERT_LT(b, e);
    ASSERT_LE(e, n);
    if (e - b < grain) EXPECT_EQ(e, n) << "only the last chunk may be shorter than the grain";
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n " << n << " index " << i;
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int spin : {0, 50}) {
    ThreadPool pool(3, spin);
    for (int64_t n : {1, 2, 7, 100, 1001})
      for (int64_t grain : {1, 3, 64}) expect_exact_cover(pool, n, grain);
  }
}

TEST(ThreadPool, GrainLimitsChunkCount) {
  ThreadPool pool(4, 0);
  std::atomic<int> calls{0};
  pool.parallel_for(100, 40, [&](int64_t b, int64_t e) {
    EXPECT_TRUE(e - b >= 40 || e == 100);
    calls++;
  });
  EXPECT_LE(calls.load(), 3);
  calls = 0;
  pool.parallel_for(10, 100, [&](int64_t b, int64_t e) {  // one chunk: runs inline on the caller
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    calls++;
  });
  EXPECT_EQ(calls.load(), 1);
}

// Thousands of short jobs back to back (workers catch them while spinning), then jobs after idle
// gaps longer than the spin (workers must be woken from their sleep).
TEST(ThreadPool, ManyJobsAndIdleGaps) {
  for (int spin : {0, 20, 1000}) {
    ThreadPool pool(2, spin);
    int64_t total = 0;
    for (int j = 0; j < 5000; ++j) {
      std::atomic<int64_t> sum{0};
      pool.parallel_for(64, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sum += i;
      });
      ASSERT_EQ(sum.load(), 64 * 63 / 2) << "job " << j;
      total += sum.load();
    }
    EXPECT_EQ(total, int64_t(5000) * 2016);
    for (int j = 0; j < 3; ++j) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      expect_exact_cover(pool, 257, 1);
    }
  }
}

TEST(ThreadPool, OneThreadRunsInline) {
  ThreadPool pool(1);
  const auto self = std::this_thread::get_id();
  pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), self);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 1000);
  });
}

TEST(ThreadPool, SpinFromEnvironment) {
  ::setenv("ANVIL_SPIN_US", "7", 1);
  EXPECT_EQ(ThreadPool(2).spin_us(), 7);
  ::setenv("ANVIL_SPIN_US", "bogus", 1);
  EXPECT_EQ(ThreadPool(2).spin_us(), ThreadPool::kDefaultSpinUs);
  ::unsetenv("ANVIL_SPIN_US");
  EXPECT_EQ(ThreadPool(2).spin_us(), ThreadPool::kDefaultSpinUs);
  EXPECT_EQ(ThreadPool(2, 0).spin_us(), 0);
}
}  // namespace
}  // namespace anvil


namespace anvil {
namespace {

TEST(ThreadPool, ContentionRule) {
  EXPECT_FALSE(ThreadPool::contended(0, 0.05, 2));
  EXPECT_FALSE(ThreadPool::contended(3, 0.001, 2));     // a few switches: never enough on their own
  EXPECT_FALSE(ThreadPool::contended(30, 1.0, 2));      // 2 threads on an idle machine: ~30/s
  EXPECT_TRUE(ThreadPool::contended(60, 0.05, 2));      // 1200/s: another busy process
  EXPECT_FALSE(ThreadPool::contended(60, 1.0, 2));
  // Per thread: 16 threads with an idle machine's ~15/s each are not contended (a fixed 200/s total
  // would have switched spinning off), 16 threads preempted ~600 times/s each are.
  EXPECT_FALSE(ThreadPool::contended(240, 1.0, 16));
  EXPECT_TRUE(ThreadPool::contended(240, 1.0, 2));
  EXPECT_TRUE(ThreadPool::contended(480, 0.05, 16));
}

// With more busy threads than cores the pool stops spinning; once they are gone it spins again.
// The share of all CPUs' time that processes other than this one used over `seconds`
// (from /proc/stat and /proc/self/stat); 0 when those files cannot be read.
double other_processes_cpu_share(double seconds) {
  auto machine_busy = [](long long* total) {
    std::ifstream f("/proc/stat");
    std::string cpu;
    long long v[10] = {0}, sum = 0;
    f >> cpu;
    for (auto& x : v) { f >> x; sum += x; }
    *total = sum;
    return sum - v[3] - v[4];  // minus idle and iowait
  };
  auto self_busy = [] {
    std::ifstream f("/proc/self/stat");
    std::string tok;
    long long utime = 0, stime = 0;
    for (int i = 1; i <= 15 && f >> tok; ++i) {
      if (i == 14) utime = std::atoll(tok.c_str());
      if (i == 15) stime = std::atoll(tok.c_str());
    }
    return utime + stime;
  };
  long long t0 = 0, t1 = 0;
  const long long b0 = machine_busy(&t0), s0 = self_busy();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const long long b1 = machine_busy(&t1), s1 = self_busy();
  if (t1 <= t0) return 0.0;
  return std::max(0.0, double((b1 - b0) - (s1 - s0)) / double(t1 - t0));
}

TEST(ThreadPool, StopsSpinningUnderContention) {
  ThreadPool pool(2, 100);
  ASSERT_TRUE(pool.spinning());
  auto run_jobs_until = [&](bool want, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      for (int j = 0; j < 256; ++j) {
        std::atomic<int64_t> sum{0};
        pool.parallel_for(256, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) sum += i;
        });
        EXPECT_EQ(sum.load(), 256 * 255 / 2);
      }
      if (pool.spinning() == want) return true;
    }
    return false;
  };
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  const int n_hogs = 2 * int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < n_hogs; ++i)
    hogs.emplace_back([&] {
      volatile uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  const long switches0 = pool.involuntary_switches();
  const auto t0 = std::chrono::steady_clock::now();
  const bool stopped = run_jobs_until(false, 10.0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long switches = pool.involuntary_switches() - switches0;
  stop = true;
  for (auto& t : hogs) t.join();
  if (!stopped && !ThreadPool::contended(switches, seconds, pool.size()))
    // The pool obeys its rule; whether busy threads push its threads' involuntary switches over the
    // threshold depends on the kernel's scheduler (slice length). Here they did not, so the rule
    // rightly never fired: say so with the figure instead of failing.
    GTEST_SKIP() << "next to " << n_hogs << " busy threads the kernel preempted the pool's threads only "
                 << int(double(switches) / seconds) << " times/s (threshold "
                 << int(ThreadPool::kContendedSwitchesPerThreadPerSec * pool.size())
                 << "/s): the contention rule cannot fire here";
  EXPECT_TRUE(stopped) << "the pool kept spinning next to " << n_hogs << " busy threads although its threads were "
                       << "preempted " << int(double(switches) / seconds) << " times/s";
  if (run_jobs_until(true, 10.0)) return;
  // Resuming needs an idle machine. When other processes keep the CPUs busy (a shared developer
  // machine), not resuming is the right behaviour, so say so instead of failing.
  const double others = other_processes_cpu_share(1.0);
  if (others > 0.25)
    GTEST_SKIP() << "other processes used " << int(others * 100)
                 << "% of the CPUs: the machine is not idle, so the pool rightly keeps sleeping";
  ADD_FAILURE() << "the pool did not resume spinning once the machine was idle (others used " << int(others * 100)
                << "% of the CPUs)";
}

// Busy threads of the same process that are not the pool's (a server's HTTP or writer threads) do
// not count as contention: only the pool's own threads' involuntary switches do.
TEST(ThreadPool, CountsOnlyItsOwnThreadsSwitches) {
  // The pool's threads sleep while other threads of this process compete for the CPUs: the
  // process-wide count (what the pool used to read) grows, the pool's own must not.
  ThreadPool pool(4, 0);
  pool.parallel_for(64, 1, [](int64_t, int64_t) {});
  auto process_switches = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return long(ru.ru_nivcsw);
  };
  const long pool0 = pool.involuntary_switches(), proc0 = process_switches();
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  const int n_hogs = 4 * int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < n_hogs; ++i)
    hogs.emplace_back([&] {
      volatile uint64_t x = 0;
      while (!stop.load(std::memory_order_relaxed)) x = x + 1;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  for (auto& t : hogs) t.join();
  const long pool_delta = pool.involuntary_switches() - pool0, proc_delta = process_switches() - proc0;
  ASSERT_GT(proc_delta, 20) << "the busy threads were not preempted: nothing to tell apart";
  EXPECT_LE(pool_delta, 3) << "the pool counted other threads' switches (process: " << proc_delta << ")";
}

}  // namespace
}  // namespace anvil
