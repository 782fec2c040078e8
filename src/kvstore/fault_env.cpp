#include "kvstore/fault_env.h"

#include <algorithm>

namespace anvil {

class FaultAppendFile : public AppendFile {
 public:
  FaultAppendFile(FaultEnv* env, std::string path, std::unique_ptr<AppendFile> base)
      : env_(env), path_(std::move(path)), base_(std::move(base)) {}
  Status append(const void* data, size_t n) override {
    {
      std::unique_lock<std::mutex> lk(env_->mu_);
      ++env_->waiting_;
      env_->cv_.wait(lk, [&] { return !env_->held_; });
      --env_->waiting_;
    }
    size_t allowed = n;
    Status fail;
    if (env_->short_next_.exchange(false)) {
      allowed = n / 2;
      fail = io_error("write " + path_ + ": injected short write (EIO)");
    }
    int64_t left = env_->space_left_.load();
    if (left >= 0 && int64_t(allowed) > left) {
      allowed = size_t(left);
      fail = io_error("write " + path_ + ": No space left on device (injected)");
    }
    if (left >= 0) env_->space_left_ -= int64_t(allowed);
    if (allowed > 0) ANVIL_RETURN_IF_ERROR(base_->append(data, allowed));
    return fail;
  }
  Status sync() override {
    if (env_->fail_syncs_.load() > 0) {
      --env_->fail_syncs_;
      return io_error("fdatasync " + path_ + ": injected failure (EIO)");
    }
    ANVIL_RETURN_IF_ERROR(base_->sync());
    ++env_->syncs_;
    std::lock_guard<std::mutex> lk(env_->mu_);
    env_->synced_[path_] = base_->size();
    return Status::ok();
  }
  // A hint: bytes are durable only once sync() returns, so crash() still drops everything after it.
  void start_writeback() override {
    ++env_->writebacks_;
    base_->start_writeback();
  }
  Status truncate(uint64_t size) override {
    ANVIL_RETURN_IF_ERROR(base_->truncate(size));
    std::lock_guard<std::mutex> lk(env_->mu_);
    auto& s = env_->synced_[path_];
    s = std::min(s, size);
    return Status::ok();
  }
  uint64_t size() const override { return base_->size(); }
  bool try_lock() override { return base_->try_lock(); }

 private:
  FaultEnv* env_;
  std::string path_;
  std::unique_ptr<AppendFile> base_;
};

Result<std::unique_ptr<AppendFile>> FaultEnv::open_append(const std::string& path) {
  ANVIL_ASSIGN_OR_RETURN(auto f, base_->open_append(path));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!synced_.count(path)) synced_[path] = f->size();  // what existed before is durable
  }
  return std::unique_ptr<AppendFile>(new FaultAppendFile(this, path, std::move(f)));
}

Status FaultEnv::truncate(const std::string& path, uint64_t size) {
  ANVIL_RETURN_IF_ERROR(base_->truncate(path, size));
  std::lock_guard<std::mutex> lk(mu_);
  auto it = synced_.find(path);
  if (it != synced_.end()) it->second = std::min(it->second, size);
  return Status::ok();
}

Status FaultEnv::remove(const std::string& path) {
  ANVIL_RETURN_IF_ERROR(base_->remove(path));
  std::lock_guard<std::mutex> lk(mu_);
  synced_.erase(path);
  return Status::ok();
}

int FaultEnv::appends_waiting() {
  std::lock_guard<std::mutex> lk(mu_);
  return waiting_;
}

void FaultEnv::hold_appends(bool on) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    held_ = on;
  }
  cv_.notify_all();
}

Status FaultEnv::crash() {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& [path, len] : synced_) {
    if (!base_->exists(path)) continue;
    ANVIL_ASSIGN_OR_RETURN(uint64_t size, base_->file_size(path));
    if (size > len) ANVIL_RETURN_IF_ERROR(base_->truncate(path, len));
  }
  return Status::ok();
}

}  // namespace anvil
