#include "server/session_locks.h"

namespace anvil::server {

SessionLocks::Acquire SessionLocks::acquire(const std::string& name, std::shared_ptr<Holder> holder,
                                            std::chrono::milliseconds patience) {
  const auto deadline = std::chrono::steady_clock::now() + patience;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    auto it = held_.find(name);
    if (it == held_.end()) {
      held_.emplace(name, std::move(holder));
      return Acquire::kAcquired;
    }
    if (!it->second || !it->second->leaving()) return Acquire::kBusy;
    if (std::chrono::steady_clock::now() >= deadline) return Acquire::kTimedOut;
    released_.wait_until(lk, deadline);
  }
}

void SessionLocks::release(const std::string& name) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    held_.erase(name);
  }
  released_.notify_all();
}

bool SessionLocks::busy(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  return held_.count(name) > 0;
}

}  // namespace anvil::server
