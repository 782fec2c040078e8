#include "kvstore/env.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace anvil {
namespace {

Status errno_status(const std::string& what, const std::string& path, int err) {
  return io_error(what + " " + path + ": " + std::strerror(err));
}

class PosixAppendFile : public AppendFile {
 public:
  PosixAppendFile(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixAppendFile() override { ::close(fd_); }
  Status append(const void* data, size_t n) override {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
      ssize_t w = ::pwrite(fd_, p, n, off_t(size_));
      if (w < 0) {
        if (errno == EINTR) continue;
        return errno_status("write", path_, errno);
      }
      p += w;
      n -= size_t(w);
      size_ += uint64_t(w);
    }
    return Status::ok();
  }
  Status sync() override {
    if (::fdatasync(fd_) != 0) return errno_status("fdatasync", path_, errno);
    wb_from_ = size_;
    return Status::ok();
  }
  void start_writeback() override {
    if (size_ <= wb_from_) return;
#ifdef __linux__
    // Errors are ignored: a hint only (sync() reports any real failure).
    (void)::sync_file_range(fd_, off_t(wb_from_), off_t(size_ - wb_from_), SYNC_FILE_RANGE_WRITE);
#endif
    wb_from_ = size_;
  }
  Status truncate(uint64_t size) override {
    if (::ftruncate(fd_, off_t(size)) != 0) return errno_status("truncate", path_, errno);
    size_ = size;
    wb_from_ = std::min(wb_from_, size_);
    return Status::ok();
  }
  uint64_t size() const override { return size_; }
  bool try_lock() override { return ::flock(fd_, LOCK_EX | LOCK_NB) == 0; }

 private:
  std::string path_;
  int fd_;
  uint64_t size_;
  uint64_t wb_from_ = 0;  // bytes below this were handed to start_writeback or sync
};

class PosixReadFile : public ReadFile {
 public:
  PosixReadFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixReadFile() override { ::close(fd_); }
  Status read_at(uint64_t offset, void* dst, size_t n) const override {
    uint8_t* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      ssize_t r = ::pread(fd_, p, n, off_t(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return errno_status("read", path_, errno);
      }
      if (r == 0) return corrupt(path_ + ": file ends before offset " + std::to_string(offset + n));
      p += r;
      n -= size_t(r);
      offset += uint64_t(r);
    }
    return Status::ok();
  }
  Result<uint64_t> size() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return errno_status("stat", path_, errno);
    return uint64_t(st.st_size);
  }

 private:
  std::string path_;
  int fd_;
};

class PosixEnv : public Env {
 public:
  Result<std::unique_ptr<AppendFile>> open_append(const std::string& path) override {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return errno_status("open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      return errno_status("stat", path, e);
    }
    return std::unique_ptr<AppendFile>(new PosixAppendFile(path, fd, uint64_t(st.st_size)));
  }
  Result<std::unique_ptr<ReadFile>> open_read(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? not_found(path + ": no such file") : errno_status("open", path, errno);
    return std::unique_ptr<ReadFile>(new PosixReadFile(path, fd));
  }
  bool exists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }
  Result<uint64_t> file_size(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return errno_status("stat", path, errno);
    return uint64_t(st.st_size);
  }
  Status truncate(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), off_t(size)) != 0) return errno_status("truncate", path, errno);
    return Status::ok();
  }
  Status remove(const std::string& path) override {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_status("remove", path, errno);
    return Status::ok();
  }
  Status create_dirs(const std::string& path) override {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return io_error("create directory " + path + ": " + ec.message());
    return Status::ok();
  }
  Result<std::vector<std::string>> list_dir(const std::string& path) override {
    std::error_code ec;
    std::vector<std::string> out;
    for (auto it = std::filesystem::directory_iterator(path, ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec))
      out.push_back(it->path().filename().string());
    if (ec) return io_error("list " + path + ": " + ec.message());
    return out;
  }
  Status sync_dir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return errno_status("open directory", path, errno);
    int r = ::fsync(fd);
    int e = errno;
    ::close(fd);
    if (r != 0) return errno_status("fsync directory", path, e);
    return Status::ok();
  }
  bool locked_by_other(const std::string& path) override {
    // flock locks belong to the open file description: a fresh open() conflicts even with this
    // process's own lock, so the store remembers its own segments and never asks about them.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool held = ::flock(fd, LOCK_EX | LOCK_NB) != 0;
    ::close(fd);  // closing drops the probe lock if we got it
    return held;
  }
};

}  // namespace

Env* Env::posix() {
  static PosixEnv env;
  return &env;
}

}  // namespace anvil
