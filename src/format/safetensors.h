// safetensors: read (mmap, zero-copy, every header field validated) and write.
//
// File layout: u64 little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to the start of the data section.
// Validation: N <= kMaxHeaderBytes and within the file; JSON well-formed; dtype known; shape
// non-negative; end - begin == product(shape) * dtype_size; offsets inside the data section; no two
// tensors overlap. Errors name the file and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/mmap_file.h"
#include "base/status.h"

namespace anvil {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;  // 100 MiB

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  // Points into the mapped file. Not necessarily aligned to dtype_size: the offsets are whatever
  // the writer chose (the reference writer and ours order wider types first, so they usually are).
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the file it came from, for error messages

  int64_t numel() const;
  std::string shape_string() const;  // "[4, 8]"
};

class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // Parses a buffer already in memory (the caller keeps it alive); `label` names it in errors.
  static Result<std::unique_ptr<SafetensorsFile>> parse(const uint8_t* data, size_t size, const std::string& label);

  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// All safetensors files of a model directory: model.safetensors, or the shards listed by
// model.safetensors.index.json (every listed shard must exist and hold the tensors the index maps
// to it), or every *.safetensors file when there is neither.
class Checkpoint {
 public:
  static Result<std::unique_ptr<Checkpoint>> open(const std::string& dir);
  const TensorView* find(const std::string& name) const;
  std::vector<std::string> names() const;  // sorted
  const std::string& dir() const { return dir_; }
  size_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> by_name_;
};

class SafetensorsWriter {
 public:
  // Copies `nbytes` from data; nbytes must equal product(shape) * dtype_size(dtype).
  Status add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t nbytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  std::vector<uint8_t> to_buffer() const;
  Status write_file(const std::string& path) const;  // atomic (tmp + rename)

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace anvil
