#include "server/notifier.h"

namespace anvil::server {

Notifier::Notifier() : thread_([this] { loop(); }) {}

Notifier::~Notifier() {
  flush();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Notifier::post(const std::shared_ptr<Job>& job) {
  if (!posted_.empty() && posted_.back() == job) return;  // the same job's next event of this step
  posted_.push_back(job);
}

void Notifier::flush() {
  if (posted_.empty()) return;
  bool was_empty;
  {
    std::lock_guard<std::mutex> lk(mu_);
    was_empty = handed_.empty();
    handed_.insert(handed_.end(), posted_.begin(), posted_.end());
  }
  posted_.clear();
  if (was_empty) cv_.notify_one();  // otherwise the thread has been woken already and will see these too
}

void Notifier::loop() {
  std::vector<std::shared_ptr<Job>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !handed_.empty(); });
      if (handed_.empty()) return;  // stop_, and nothing left (the destructor flushed first)
      batch.swap(handed_);
    }
    for (auto& job : batch) job->notify();
    batch.clear();  // drops the references here, not under the lock
  }
}

}  // namespace anvil::server
