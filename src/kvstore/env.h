// The file layer under the durable KV store (the leveldb Env idea): every byte the store writes or
// reads goes through Env, so tests can substitute FaultEnv (fault_env.h) and inject short writes,
// failed fsyncs, ENOSPC and crashes that drop unsynced bytes. The SQLite catalog does its own I/O;
// the store orders it after Env syncs (data durable before metadata).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace anvil {

// An append-only file (a segment being written).
class AppendFile {
 public:
  virtual ~AppendFile() = default;
  // Appends all n bytes or returns an error (after which some prefix may have been written).
  virtual Status append(const void* data, size_t n) = 0;
  // Makes every appended byte durable (fdatasync).
  virtual Status sync() = 0;
  // A hint: starts writing the bytes appended since the last call to the disk, without waiting
  // for them (Linux sync_file_range, SYNC_FILE_RANGE_WRITE), so that the next sync() finds less to
  // write. Changes nothing else: sync() alone makes bytes durable. Default: nothing.
  virtual void start_writeback() {}
  // Cuts the file back to `size` bytes (dropping a failed batch); later appends continue there.
  virtual Status truncate(uint64_t size) = 0;
  virtual uint64_t size() const = 0;
  // Takes an exclusive advisory lock (flock) without waiting; false when another process holds it.
  virtual bool try_lock() = 0;
};

// A file opened for positional reads.
class ReadFile {
 public:
  virtual ~ReadFile() = default;
  // Reads exactly n bytes at offset or fails (a short file is an error naming the file).
  virtual Status read_at(uint64_t offset, void* dst, size_t n) const = 0;
  virtual Result<uint64_t> size() const = 0;
};

class Env {
 public:
  virtual ~Env() = default;
  // Opens (creating if missing) for appending at the current end.
  virtual Result<std::unique_ptr<AppendFile>> open_append(const std::string& path) = 0;
  virtual Result<std::unique_ptr<ReadFile>> open_read(const std::string& path) = 0;
  virtual bool exists(const std::string& path) = 0;
  virtual Result<uint64_t> file_size(const std::string& path) = 0;
  virtual Status truncate(const std::string& path, uint64_t size) = 0;
  virtual Status remove(const std::string& path) = 0;
  virtual Status create_dirs(const std::string& path) = 0;
  virtual Result<std::vector<std::string>> list_dir(const std::string& path) = 0;  // file names only
  // fsyncs a directory, so a created or removed file's name is durable.
  virtual Status sync_dir(const std::string& path) = 0;
  // True when a process other than this one holds path's flock (the file is some live writer's).
  virtual bool locked_by_other(const std::string& path) = 0;

  // The real file system.
  static Env* posix();
};

}  // namespace anvil
