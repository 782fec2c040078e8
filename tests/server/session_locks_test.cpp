// SessionLocks (server/session_locks.h): a session held by a live request is refused at once; one
// held by a request on its way out (its client gone) is waited for, up to the patience, and taken
// as soon as it is let go. The long deadlines only bound a hang; the short ones are the patience.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "server/session_locks.h"

using namespace anvil::server;
using namespace std::chrono_literals;
using Acquire = SessionLocks::Acquire;

namespace {
struct FakeHolder : SessionLocks::Holder {
  std::atomic<bool> gone{false};
  std::atomic<int> asked{0};
  bool leaving() override {
    ++asked;
    return gone.load();
  }
};
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST(SessionLocks, ALiveHolderIsRefusedAtOnce) {
  SessionLocks locks;
  auto first = std::make_shared<FakeHolder>();
  ASSERT_EQ(locks.acquire("s", first), Acquire::kAcquired);
  EXPECT_TRUE(locks.busy("s"));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(locks.acquire("s", std::make_shared<FakeHolder>(), 10s), Acquire::kBusy);
  EXPECT_LT(seconds_since(t0), 1.0) << "a live holder was waited for";
  EXPECT_EQ(first->asked.load(), 1);
  // Another name is free; a holder that says nothing (a DELETE's) counts as live.
  EXPECT_EQ(locks.acquire("t", nullptr), Acquire::kAcquired);
  EXPECT_EQ(locks.acquire("t", std::make_shared<FakeHolder>(), 10s), Acquire::kBusy);
  locks.release("s");
  EXPECT_FALSE(locks.busy("s"));
  EXPECT_EQ(locks.acquire("s", nullptr), Acquire::kAcquired);
}

TEST(SessionLocks, ALeavingHolderIsWaitedForUntilItLetsGo) {
  SessionLocks locks;
  auto first = std::make_shared<FakeHolder>();
  ASSERT_EQ(locks.acquire("s", first), Acquire::kAcquired);
  first->gone = true;
  std::atomic<bool> released{false};
  std::thread t([&] {
    std::this_thread::sleep_for(100ms);
    released = true;
    locks.release("s");
  });
  const auto next = std::make_shared<FakeHolder>();
  EXPECT_EQ(locks.acquire("s", next, 30s), Acquire::kAcquired);
  EXPECT_TRUE(released.load()) << "taken before the holder let go";
  t.join();
  // The new holder holds it now: live, so the next is refused at once.
  EXPECT_EQ(locks.acquire("s", std::make_shared<FakeHolder>(), 10s), Acquire::kBusy);
}

TEST(SessionLocks, ALeavingHolderThatNeverLetsGoTimesOut) {
  SessionLocks locks;
  auto first = std::make_shared<FakeHolder>();
  ASSERT_EQ(locks.acquire("s", first), Acquire::kAcquired);
  first->gone = true;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(locks.acquire("s", std::make_shared<FakeHolder>(), 150ms), Acquire::kTimedOut);
  const double waited = seconds_since(t0);
  EXPECT_GE(waited, 0.14);
  EXPECT_LT(waited, 5.0);
  EXPECT_TRUE(locks.busy("s"));
}

// Two waiters for one leaving holder: the first to wake takes the session; the other then finds a
// live holder and is refused, rather than waiting out its patience.
TEST(SessionLocks, OfTwoWaitersTheSecondIsRefusedOnceTheFirstHoldsIt) {
  SessionLocks locks;
  auto first = std::make_shared<FakeHolder>();
  ASSERT_EQ(locks.acquire("s", first), Acquire::kAcquired);
  first->gone = true;
  std::atomic<int> acquired{0}, busy{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < 2; ++i)
    ts.emplace_back([&] {
      const Acquire a = locks.acquire("s", std::make_shared<FakeHolder>(), 30s);
      (a == Acquire::kAcquired ? acquired : busy)++;
    });
  std::this_thread::sleep_for(100ms);
  const auto t0 = std::chrono::steady_clock::now();
  locks.release("s");
  for (auto& t : ts) t.join();
  EXPECT_EQ(acquired.load(), 1);
  EXPECT_EQ(busy.load(), 1);
  EXPECT_LT(seconds_since(t0), 5.0);
}
