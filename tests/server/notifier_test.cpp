// The Notifier (server/notifier.h): an event queued without notifying does not wake the job's
// waiter; flush() (or the Notifier's end) does, for every posted job. The deadlines below are
// generous on purpose: they only bound a hang, they measure nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/notifier.h"

using namespace anvil::server;
using namespace std::chrono_literals;

namespace {

// A thread that waits on the job (as an HTTP thread does) up to 30 s and records when it returns.
struct Waiter {
  std::shared_ptr<Job> job = std::make_shared<Job>(GenerationParams{});
  std::atomic<bool> returned{false};
  std::vector<JobEvent> got;
  std::thread t;
  void start() {
    t = std::thread([this] {
      job->wait(&got, 30s);
      returned.store(true);
    });
  }
  bool returned_within(std::chrono::milliseconds d) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (!returned.load() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(1ms);
    return returned.load();
  }
};

JobEvent delta(const char* text) { return JobEvent{JobEvent::kDelta, text, {}, {}, {}}; }

}  // namespace

TEST(Notifier, QuietPushWaitsForFlush) {
  Notifier n;
  Waiter w[3];
  for (auto& x : w) x.start();
  std::this_thread::sleep_for(200ms);  // time for the waiters to fall asleep on their jobs
  for (auto& x : w) {
    x.job->push(delta("a"), /*notify=*/false);
    x.job->push(delta("b"), /*notify=*/false);
    n.post(x.job);
    n.post(x.job);  // twice in a row: kept once
  }
  // Not woken by the pushes (a waiter still awake 200 ms after its start would see the events and
  // return: that would take a machine far slower than any seen here).
  std::this_thread::sleep_for(200ms);
  int early = 0;
  for (auto& x : w) early += x.returned.load();
  EXPECT_EQ(early, 0) << "a quiet push woke its waiter";
  n.flush();
  for (auto& x : w) {
    EXPECT_TRUE(x.returned_within(20s));
    x.t.join();
    ASSERT_EQ(x.got.size(), 2u);
    EXPECT_EQ(x.got[0].text, "a");
    EXPECT_EQ(x.got[1].text, "b");
  }
}

TEST(Notifier, ManyFlushesWakeEveryJob) {
  Notifier n;
  constexpr int kJobs = 64;
  std::vector<std::unique_ptr<Waiter>> w;
  for (int i = 0; i < kJobs; ++i) {
    w.push_back(std::make_unique<Waiter>());
    w.back()->start();
  }
  // One post and flush per job, in quick succession: flushes that find the previous batch still
  // pending append to it rather than waking the thread again.
  for (auto& x : w) {
    x->job->push(delta("x"), false);
    n.post(x->job);
    n.flush();
  }
  for (auto& x : w) {
    EXPECT_TRUE(x->returned_within(20s));
    x->t.join();
    EXPECT_EQ(x->got.size(), 1u);
  }
}

TEST(Notifier, DestructorWakesWhatWasPosted) {
  Waiter w;
  w.start();
  {
    Notifier n;
    w.job->push(JobEvent{JobEvent::kDone, {}, {}, "stop", {}}, false);
    n.post(w.job);  // never flushed explicitly
  }
  EXPECT_TRUE(w.returned_within(20s));
  w.t.join();
  ASSERT_EQ(w.got.size(), 1u);
  EXPECT_EQ(w.got[0].kind, JobEvent::kDone);
  EXPECT_TRUE(w.job->wait_ended(0ms));
}
