// NumPy .npy files (format 1.0 written; 1.0, 2.0 and 3.0 read), little-endian, C order.
// Used to exchange reference tensors with Python (numpy.save / numpy.load) in tests and tools.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace anvil {

struct NpyArray {
  std::vector<int64_t> shape;  // () for a scalar
  std::string descr;           // numpy dtype string: "<f4", "<i4", "<f2", "<i8", ...
  std::vector<uint8_t> bytes;  // numel * itemsize bytes, C order

  int64_t numel() const;
  // Typed views; nullptr when descr is not that type.
  const float* f32() const;
  const int32_t* i32() const;
  const int64_t* i64() const;
  // Every element converted to float (f4, f2, f8, i4, i8, u1, ...).
  std::vector<float> to_f32() const;
};

Status write_npy(const std::string& path, const float* data, std::vector<int64_t> shape);
Status write_npy(const std::string& path, const int32_t* data, std::vector<int64_t> shape);
// The bytes of a .npy file as numpy.save writes them (header padded to 64 bytes).
std::vector<uint8_t> npy_bytes(const std::string& descr, const void* data, const std::vector<int64_t>& shape);

Result<NpyArray> read_npy(const std::string& path);
// Parses a .npy file already in memory; `label` names it in errors.
Result<NpyArray> parse_npy(const uint8_t* data, size_t size, const std::string& label);

}  // namespace anvil
