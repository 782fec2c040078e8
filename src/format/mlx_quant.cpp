#include "format/mlx_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace anvil {

static bool bits_supported(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

Status mlx_validate_quant_params(int64_t cols, int bits, int group_size) {
  if (!bits_supported(bits))
    return invalid_argument("quantization bits: expected one of 2, 3, 4, 5, 6, 8, got " + std::to_string(bits));
  if (group_size != 32 && group_size != 64 && group_size != 128)
    return invalid_argument("quantization group_size: expected one of 32, 64, 128, got " +
                            std::to_string(group_size));
  if (cols <= 0 || cols % group_size != 0)
    return invalid_argument("quantization: the number of columns (" + std::to_string(cols) +
                            ") must be a positive multiple of group_size " + std::to_string(group_size));
  return Status::ok();
}

int64_t mlx_packed_cols(int64_t cols, int bits) {
  if (!bits_supported(bits) || cols < 0) return -1;
  const int64_t total_bits = cols * bits;
  if (total_bits % 32 != 0) return -1;
  return total_bits / 32;
}

void mlx_pack_row(const uint8_t* q, int64_t n, int bits, uint32_t* out) {
  const int64_t words = (n * bits + 31) / 32;
  std::fill(out, out + words, 0u);
  const uint32_t mask = (1u << bits) - 1u;
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t bit = uint64_t(k) * uint64_t(bits);
    const uint64_t word = bit >> 5;
    const unsigned shift = unsigned(bit & 31);
    const uint64_t v = uint64_t(q[k] & mask) << shift;
    out[word] |= uint32_t(v);
    if (shift + unsigned(bits) > 32) out[word + 1] |= uint32_t(v >> 32);
  }
}

Status mlx_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size, DType sb_dtype,
                    uint32_t* q_out, void* scales_out, void* biases_out) {
  ANVIL_RETURN_IF_ERROR(mlx_validate_quant_params(cols, bits, group_size));
  if (rows < 0) return invalid_argument("quantization: rows must be >= 0, got " + std::to_string(rows));
  if (!is_float_dtype(sb_dtype))
    return invalid_argument("quantization scales/biases dtype: expected F32, F16 or BF16, got " +
                            std::string(dtype_name(sb_dtype)));

  const int64_t packed = mlx_packed_cols(cols, bits);
  const int64_t groups = cols / group_size;
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  std::vector<uint8_t> qrow(static_cast<size_t>(cols));

  for (int64_t r = 0; r < rows; ++r) {
    const float* wr = w + r * cols;
    for (int64_t g = 0; g < groups; ++g) {
      const float* wg = wr + g * group_size;
      float w_min = std::numeric_limits<float>::infinity();
      float w_max = -w_min;
      for (int j = 0; j < group_size; ++j) {
        w_min = std::min(w_min, wg[j]);
        w_max = std::max(w_max, wg[j]);
      }
      // The edge with the larger magnitude becomes the bias, and the scale is adjusted so that the
      // edge maps to an exact integer: then 0.0 is representable exactly (q = -q0).
      const bool min_side = std::fabs(w_min) > std::fabs(w_max);
      float scale = std::max((w_max - w_min) / n_bins, eps);
      scale = min_side ? scale : -scale;
      const float edge = min_side ? w_min : w_max;
      const float q0 = std::nearbyint(edge / scale);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      for (int j = 0; j < group_size; ++j) {
        float v = std::nearbyint((wg[j] - bias) / scale);
        v = std::min(std::max(v, 0.0f), n_bins);
        qrow[size_t(g * group_size + j)] = uint8_t(v);
      }
      store_float(scales_out, sb_dtype, size_t(r * groups + g), scale);
      store_float(biases_out, sb_dtype, size_t(r * groups + g), bias);
    }
    mlx_pack_row(qrow.data(), cols, bits, q_out + r * packed);
  }
  return Status::ok();
}

// fp-contract=off: MLX rounds the product before the add; an FMA (GCC contracts by default in C++
// when the target has one, e.g. with ANVIL_NATIVE) would differ from mx.dequantize by up to 1 ulp.
template <int kBits>
__attribute__((optimize("fp-contract=off"))) static void dequantize_row_bits(const uint32_t* q, const void* scales, const void* biases, DType sb_dtype,
                                int64_t cols, int group_size, float* out) {
  const int64_t groups = cols / group_size;
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = load_float(scales, sb_dtype, size_t(g));
    const float bias = load_float(biases, sb_dtype, size_t(g));
    const int64_t base = g * group_size;
    if constexpr (kBits == 4 || kBits == 8) {  // whole bytes: no word straddling, a byte-wise loop
      const uint8_t* p = reinterpret_cast<const uint8_t*>(q) + base * kBits / 8;
      float* o = out + base;
      if constexpr (kBits == 4) {
        for (int k = 0; k < group_size / 2; ++k) {
          const float p0 = scale * float(p[k] & 15), p1 = scale * float(p[k] >> 4);
          o[2 * k] = p0 + bias;
          o[2 * k + 1] = p1 + bias;
        }
      } else {
        for (int k = 0; k < group_size; ++k) {
          const float prod = scale * float(p[k]);
          o[k] = prod + bias;
        }
      }
      continue;
    }
    for (int j = 0; j < group_size; ++j) {
      const float qv = float(mlx_unpack_element(q, base + j, kBits));
      // Two roundings (product, then sum), as MLX does.
      const float prod = scale * qv;
      out[base + j] = prod + bias;
    }
  }
}

void mlx_dequantize_row(const uint32_t* q, const void* scales, const void* biases, DType sb_dtype, int64_t cols,
                        int bits, int group_size, float* out) {
  switch (bits) {
    case 2: dequantize_row_bits<2>(q, scales, biases, sb_dtype, cols, group_size, out); break;
    case 3: dequantize_row_bits<3>(q, scales, biases, sb_dtype, cols, group_size, out); break;
    case 4: dequantize_row_bits<4>(q, scales, biases, sb_dtype, cols, group_size, out); break;
    case 5: dequantize_row_bits<5>(q, scales, biases, sb_dtype, cols, group_size, out); break;
    case 6: dequantize_row_bits<6>(q, scales, biases, sb_dtype, cols, group_size, out); break;
    case 8: dequantize_row_bits<8>(q, scales, biases, sb_dtype, cols, group_size, out); break;
    default: break;  // unsupported bits: callers validate with mlx_validate_quant_params
  }
}

}  // namespace anvil
