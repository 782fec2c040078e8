#include "server/http_threads.h"

#include <algorithm>

namespace anvil::server {

HttpThreads::HttpThreads(size_t initial, size_t max_threads) : max_threads_(std::max(max_threads, initial)) {
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < initial; ++i) start_thread();
}

HttpThreads::~HttpThreads() { shutdown(); }

void HttpThreads::start_thread() {
  threads_.emplace_back([this] { work(); });
  ++idle_;  // counted idle from the start, so that one connection does not start two threads
}

void HttpThreads::enqueue(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    jobs_.push_back(std::move(fn));
    // Invariant 1: every waiting connection has an idle thread to take it, while the cap allows.
    while (!shutdown_ && jobs_.size() > idle_ && threads_.size() < max_threads_) start_thread();
  }
  cv_.notify_one();
}

void HttpThreads::shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lk(mu_);
    shutdown_ = true;
    threads.swap(threads_);  // (no thread is started after this: enqueue() comes only before shutdown)
  }
  cv_.notify_all();
  for (auto& t : threads) t.join();
}

size_t HttpThreads::threads() const {
  std::lock_guard<std::mutex> lk(mu_);
  return threads_.size();
}

void HttpThreads::work() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return !jobs_.empty() || shutdown_; });
    if (jobs_.empty()) break;  // shutting down, nothing left (invariant 3)
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    --idle_;
    lk.unlock();
    fn();
    lk.lock();
    ++idle_;
  }
}

}  // namespace anvil::server
