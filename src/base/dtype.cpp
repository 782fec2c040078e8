#include "base/dtype.h"

#include <cmath>

namespace anvil {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: case DType::kU32: return 4;
    case DType::kF16: case DType::kBF16: case DType::kI16: case DType::kU16: return 2;
    case DType::kF64: case DType::kI64: case DType::kU64: return 8;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}

static constexpr struct { DType t; std::string_view name; } kNames[] = {
    {DType::kF32, "F32"}, {DType::kF16, "F16"}, {DType::kBF16, "BF16"}, {DType::kF64, "F64"},
    {DType::kI8, "I8"},   {DType::kU8, "U8"},   {DType::kI16, "I16"},   {DType::kU16, "U16"},
    {DType::kI32, "I32"}, {DType::kU32, "U32"}, {DType::kI64, "I64"},   {DType::kU64, "U64"},
    {DType::kBool, "BOOL"}};

std::string_view dtype_name(DType t) {
  for (auto& n : kNames)
    if (n.t == t) return n.name;
  return "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  for (auto& n : kNames)
    if (n.name == name) { *out = n.t; return true; }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do { mant <<= 1; ++e; } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      u = sign | uint32_t(127 - 15 - e) << 23 | mant << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00;               // NaN
  if (absu >= 0x477ff000u) return sign | 0x7c00;             // overflow -> inf (>= 65520)
  if (absu < 0x38800000u) {                                   // subnormal or zero in f16
    float a;
    std::memcpy(&a, &absu, 4);
    // 2^-24 is the f16 subnormal unit; nearbyint rounds half to even.
    return sign | uint16_t(std::nearbyint(a * 16777216.0f));
  }
  uint32_t mant_round = absu + 0xfffu + ((absu >> 13) & 1u);
  return sign | uint16_t(((mant_round >> 13) - (112u << 10)) & 0xffff);
}

}  // namespace anvil
