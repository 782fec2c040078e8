// Notifier: wakes the HTTP threads that wait on jobs, on a thread of its own, so that the scheduler
// thread does not pay for the wake-ups between two forward passes.
//
// Why: each step hands one event to every running job, and waking the job's HTTP thread is a futex
// system call that costs several microseconds when a thread waits (a context switch where cores are
// few). Measured on the CPU backend with the device-sampler path (ANVIL_CUDA_DEVICE_SAMPLER=1), 32
// streams, 2 cores: 0.36 of the 0.45 ms of host work per step was Job::push's notify; on a GPU the
// device waits through all of it. Now the scheduler only queues the event under the job's mutex
// (Job::push(e, false)), posts the job here, and flush() hands the step's jobs over with one wake-up;
// this thread then wakes their HTTP threads while the next forward pass runs.
//
// Invariants
//  1. post() and flush() are called from one thread (the scheduler's) at a time.
//  2. Every job posted before a flush() is notified after that flush(), at least once; a job posted
//     twice may be notified twice (harmless: waiters re-check their predicate).
//  3. The destructor notifies everything flushed before it, then joins the thread.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "server/job.h"

namespace anvil::server {

class Notifier {
 public:
  Notifier();
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // Remembers a job that has new events (pushed without notifying). Cheap: no lock, no system call.
  void post(const std::shared_ptr<Job>& job);
  // Hands the posted jobs to the notifier thread (one lock and at most one wake-up).
  void flush();

 private:
  void loop();

  std::vector<std::shared_ptr<Job>> posted_;  // the caller's thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<Job>> handed_;  // guarded by mu_
  bool stop_ = false;                         // guarded by mu_
  std::thread thread_;
};

}  // namespace anvil::server
