// TEST-ONLY minimal safetensors reader for the frozen fixtures in tests/data/quant/.
// It exists because src/format/safetensors.cpp is being written in parallel on another branch;
// once that lands, replace this with anvil::SafetensorsFile::open (same data, validated parsing).
// It trusts the (committed, script-generated) file: no overlap or bounds checks beyond the basics.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace anvil::fixture {

struct FixtureTensor {
  std::string dtype;  // "F32", "BF16", "U32", ...
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  template <typename T>
  std::vector<T> as() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};

// Returns false (and leaves `out` empty) when the file is missing or malformed.
inline bool read_fixture_safetensors(const std::string& path, std::map<std::string, FixtureTensor>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (file.size() < 8) return false;
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (8 + n > file.size()) return false;
  auto header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + int64_t(n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return false;
  const size_t data0 = 8 + n;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    FixtureTensor t;
    t.dtype = info.at("dtype").get<std::string>();
    t.shape = info.at("shape").get<std::vector<int64_t>>();
    const auto off = info.at("data_offsets").get<std::vector<uint64_t>>();
    if (off.size() != 2 || off[0] > off[1] || data0 + off[1] > file.size()) return false;
    t.bytes.assign(file.begin() + int64_t(data0 + off[0]), file.begin() + int64_t(data0 + off[1]));
    (*out)[name] = std::move(t);
  }
  return true;
}

}  // namespace anvil::fixture
