// A read-only memory-mapped file. Weights are mapped, never copied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"

namespace anvil {

class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) file into a string: config.json, tokenizer.json.
Result<std::string> read_file(const std::string& path);
// Writes atomically: to a unique temporary beside path, fsync, rename, fsync the directory.
// A failure leaves the old file intact (and no temporary behind).
Status write_file_atomic(const std::string& path, const void* data, size_t size);

}  // namespace anvil
