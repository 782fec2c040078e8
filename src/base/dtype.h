// Element types and the 16-bit float conversions every backend shares.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace anvil {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI8, kU8, kI16, kU16, kI32, kU32, kI64, kU64, kBool };

// Bytes per element.
size_t dtype_size(DType t);
// safetensors spelling: "F32", "BF16", "U32", ...
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; false when unknown.
bool dtype_from_name(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Reads element i of a float-like array (F32, F16, BF16) as float.
inline float load_float(const void* p, DType t, size_t i) {
  switch (t) {
    // memcpy loads: p may point into a mapped checkpoint at any byte offset (reading through a
    // misaligned float* or uint16_t* is undefined behaviour); the compiler emits a plain load.
    case DType::kF32: {
      float v;
      std::memcpy(&v, static_cast<const uint8_t*>(p) + i * 4, 4);
      return v;
    }
    case DType::kBF16:
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, static_cast<const uint8_t*>(p) + i * 2, 2);
      return t == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
    default: return 0.0f;
  }
}
inline void store_float(void* p, DType t, size_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    default: break;
  }
}
inline bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

}  // namespace anvil
