// HttpThreads, the HTTP library's task queue: a connection never waits while the cap allows another
// thread, threads stay within the cap, and shutdown() runs what was handed over before joining.
#include "server/http_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

using anvil::server::HttpThreads;

namespace {

// Tasks that block until released, counting how many run at once.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int running = 0, ran = 0;
  std::function<void()> task() {
    return [this] {
      std::unique_lock<std::mutex> lk(mu);
      ++running;
      cv.notify_all();
      cv.wait(lk, [&] { return open; });
      --running;
      ++ran;
    };
  }
  bool wait_running(int n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] { return running == n; });
  }
  void release() {
    std::lock_guard<std::mutex> lk(mu);
    open = true;
    cv.notify_all();
  }
};

}  // namespace

TEST(HttpThreads, GrowsSoThatNoTaskWaitsUpToTheCap) {
  HttpThreads pool(2, 40);
  EXPECT_EQ(pool.threads(), 2u);
  Gate g;
  for (int i = 0; i < 30; ++i) pool.enqueue(g.task());
  EXPECT_TRUE(g.wait_running(30)) << "tasks waited for a thread while the cap allowed more";
  EXPECT_EQ(pool.threads(), 30u);
  g.release();
  pool.shutdown();
  EXPECT_EQ(g.ran, 30);
}

TEST(HttpThreads, BeyondTheCapTasksWaitAndShutdownRunsThem) {
  HttpThreads pool(1, 4);
  Gate g;
  for (int i = 0; i < 10; ++i) pool.enqueue(g.task());
  EXPECT_TRUE(g.wait_running(4));
  EXPECT_EQ(pool.threads(), 4u);
  g.release();
  pool.shutdown();  // the 6 waiting ones run before the threads are joined
  EXPECT_EQ(g.ran, 10);
}

TEST(HttpThreads, IdleThreadsAreReusedBeforeNewOnesStart) {
  HttpThreads pool(3, 100);
  std::atomic<int> done{0};
  for (int i = 0; i < 50; ++i) {
    pool.enqueue([&] { done++; });
    while (done.load() <= i) std::this_thread::yield();  // one at a time: an idle thread is always there
  }
  EXPECT_EQ(pool.threads(), 3u);
  pool.shutdown();
}
