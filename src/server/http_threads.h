// The HTTP threads: the task queue cpp-httplib runs its connections on, one thread per connection
// for as long as the connection stays open (its requests, then its keep-alive wait), which grows
// instead of making connections wait.
//
// Why: the library's own ThreadPool has a fixed number of threads, and a connection that finds
// them all busy waits in its queue, unanswered, until one is free. Idle keep-alive connections (the
// openai SDKs keep every connection they opened) hold their thread for the keep-alive timeout
// (5 s), a client that stopped sending a request midway for the read timeout (30 s): a burst of
// clients beyond the pool saw 5-second waits, even for the 503 that admission control meant to give
// them at once, and a dozen stalled connections made /health itself wait 30 s.
//
// Invariants
//  1. A connection is handed to an idle thread if there is one; else a new thread is started for
//     it, up to max_threads; only beyond that does it wait for a thread.
//  2. Threads, once started, stay until shutdown() (they sleep while idle).
//  3. shutdown() runs every connection already handed over, then joins every thread.
#pragma once
#include <httplib.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anvil::server {

class HttpThreads : public httplib::TaskQueue {
 public:
  // Starts `initial` threads now; grows up to `max_threads` (>= initial) as connections need.
  HttpThreads(size_t initial, size_t max_threads);
  ~HttpThreads() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  size_t threads() const;

 private:
  void start_thread();  // mu_ held
  void work();

  const size_t max_threads_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  size_t idle_ = 0;                         // guarded by mu_: threads waiting for a connection
  bool shutdown_ = false;                   // guarded by mu_
  std::vector<std::thread> threads_;        // guarded by mu_
};

}  // namespace anvil::server
