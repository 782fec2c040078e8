// FaultEnv: an Env over the real file system that injects the failures a store must survive, for
// tests (leveldb's fault_injection_test idea):
//  - short writes: an append writes only part of its bytes, then fails (EIO);
//  - ENOSPC: appends past a byte budget write what fits, then fail "no space left on device";
//  - failed fsync: sync() fails (the bytes' durability is unknown, as after a real EIO);
//  - crash: every file this Env wrote is cut back to its last synced length, as a power cut
//    would leave it (bytes appended after the last successful sync are lost).
#pragma once
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>

#include "kvstore/env.h"

namespace anvil {

class FaultEnv : public Env {
 public:
  explicit FaultEnv(Env* base = Env::posix()) : base_(base) {}

  // The next append writes half its bytes and fails.
  void fail_next_append_short() { short_next_ = true; }
  // Appends may write `bytes` more in total; then ENOSPC. (-1: unlimited.)
  void set_space_left(int64_t bytes) { space_left_ = bytes; }
  // The next n syncs fail.
  void fail_syncs(int n) { fail_syncs_ = n; }
  // While held, appends wait (a stalled disk: the store's queue fills up behind it).
  void hold_appends(bool on);
  // How many appends wait on the hold right now (a test waits for the writer to be stuck).
  int appends_waiting();
  // Drops every unsynced byte of every file written through this Env.
  Status crash();

  int64_t syncs() const { return syncs_; }
  int64_t writebacks() const { return writebacks_; }  // start_writeback hints (they change nothing here)

  Result<std::unique_ptr<AppendFile>> open_append(const std::string& path) override;
  Result<std::unique_ptr<ReadFile>> open_read(const std::string& path) override { return base_->open_read(path); }
  bool exists(const std::string& path) override { return base_->exists(path); }
  Result<uint64_t> file_size(const std::string& path) override { return base_->file_size(path); }
  Status truncate(const std::string& path, uint64_t size) override;
  Status remove(const std::string& path) override;
  Status create_dirs(const std::string& path) override { return base_->create_dirs(path); }
  Result<std::vector<std::string>> list_dir(const std::string& path) override { return base_->list_dir(path); }
  Status sync_dir(const std::string& path) override { return base_->sync_dir(path); }
  bool locked_by_other(const std::string& path) override { return base_->locked_by_other(path); }

 private:
  friend class FaultAppendFile;
  Env* base_;
  std::atomic<bool> short_next_{false};
  std::atomic<int64_t> space_left_{-1};
  std::atomic<int> fail_syncs_{0};
  std::atomic<int64_t> syncs_{0}, writebacks_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  int waiting_ = 0;
  std::map<std::string, uint64_t> synced_;  // path -> length known durable
};

}  // namespace anvil
