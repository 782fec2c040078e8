// MLX affine quantization: bit packing, quantize (bit-exact with mlx.core.quantize) and dequantize.
//
// A quantized matrix W [rows, cols] is stored as
//   q       uint32 [rows, cols * bits / 32]   each row a little-endian bit stream: element k occupies
//                                             bits [k*bits, (k+1)*bits) (3/5/6-bit elements can
//                                             straddle two words)
//   scales  sb_dtype [rows, cols / group_size]
//   biases  sb_dtype [rows, cols / group_size]
// and W[r][c] = scales[r][c / group_size] * q[r][c] + biases[r][c / group_size]. Scales can be negative.
//
// Supported: bits in {2, 3, 4, 5, 6, 8}, group_size in {32, 64, 128}, scales/biases F32, F16 or BF16.
#pragma once
#include <cstdint>
#include <cstring>

#include "base/dtype.h"
#include "base/status.h"

namespace anvil {

// Checks bits, group_size and that cols is a positive multiple of group_size. The message names
// the offending parameter and the accepted values.
Status mlx_validate_quant_params(int64_t cols, int bits, int group_size);

// uint32 words per packed row: cols * bits / 32. Returns -1 when bits is not supported or the
// product is not a whole number of words (cols must be a multiple of 32 / gcd(bits, 32)).
int64_t mlx_packed_cols(int64_t cols, int bits);

// Packs n values (each < 2^bits; higher bits are ignored) into ceil(n * bits / 32) words of `out`.
// Padding bits of the last word are zero.
void mlx_pack_row(const uint8_t* q, int64_t n, int bits, uint32_t* out);

// Element k of a packed row.
inline uint32_t mlx_unpack_element(const uint32_t* row, int64_t k, int bits) {
  const uint64_t bit = uint64_t(k) * uint64_t(bits);
  const uint64_t word = bit >> 5;
  const unsigned shift = unsigned(bit & 31);
  // memcpy loads: a row in a mapped checkpoint need not be 4-byte aligned.
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row) + word * 4;
  uint32_t w0;
  std::memcpy(&w0, bytes, 4);
  uint64_t v = w0 >> shift;
  // Only a straddling element reads the next word, which then exists.
  if (shift + unsigned(bits) > 32) {
    uint32_t w1;
    std::memcpy(&w1, bytes + 4, 4);
    v |= uint64_t(w1) << (32 - shift);
  }
  return uint32_t(v) & ((1u << bits) - 1u);
}

// Quantizes w [rows, cols] (row-major float32) the way mlx.core.quantize(mode="affine") does, per
// group of `group_size` consecutive elements of a row:
//   scale = max((max - min) / (2^bits - 1), 1e-7), negated unless |min| > |max|;
//   edge  = |min| > |max| ? min : max;  q0 = round_half_even(edge / scale);
//   if q0 != 0: scale = edge / q0, bias = edge  (so that 0.0 is exactly representable)
//   else:       bias = 0
//   q = clamp(round_half_even((w - bias) / scale), 0, 2^bits - 1)
// All arithmetic is float32, q uses the float32 scale/bias, and scale/bias are then rounded to
// sb_dtype (round to nearest even). For float32 input (and for bf16/f16 input passed as the exact
// float values) q, scales and biases equal mlx.core.quantize bit for bit (tests/quant).
// Outputs: q_out [rows, mlx_packed_cols(cols, bits)], scales_out / biases_out [rows, cols / group_size]
// in sb_dtype.
Status mlx_quantize(const float* w, int64_t rows, int64_t cols, int bits, int group_size, DType sb_dtype,
                    uint32_t* q_out, void* scales_out, void* biases_out);

// Dequantizes one row: out[c] = scale * q + bias in float32 (product rounded, then the sum: no
// FMA), scale/bias read from sb_dtype. This equals mx.dequantize on float32 scales/biases bit for
// bit. (mx.dequantize with bf16 scales returns bf16 and rounds the product to bf16 before the add;
// our float result rounded to bf16 is within half a bf16 ulp of |scale*q| plus one ulp of the result.)
// q: the packed row [cols * bits / 32]; scales/biases: the row's [cols / group_size]; out: [cols].
// This is the engine's dequantizer too (the CPU backend's weight_row_to_f32): one implementation,
// tested against MLX. No alignment is required of q, scales or biases.
void mlx_dequantize_row(const uint32_t* q, const void* scales, const void* biases, DType sb_dtype, int64_t cols,
                        int bits, int group_size, float* out);

}  // namespace anvil
