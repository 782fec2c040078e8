// MLX affine quantization: packing layout, bit-exact agreement with mlx.core.quantize/dequantize (the
// dequantizer checked is the one the engine runs: the CPU backend's weight_row_to_f32)
// (fixtures frozen by scripts/make_quant_fixtures.py), round-trip error bounds, parameter errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "format/safetensors.h"
#include "format/mlx_quant.h"
#include "backend/cpu/cpu_kernels.h"

using namespace anvil;

namespace {

// Reference packing: one bit at a time into a little-endian bit stream (bit i of the stream is bit
// i%32 of word i/32). Independent of the word arithmetic in mlx_pack_row.
std::vector<uint32_t> naive_pack(const std::vector<uint8_t>& q, int bits) {
  std::vector<uint32_t> out((q.size() * bits + 31) / 32, 0u);
  for (size_t k = 0; k < q.size(); ++k)
    for (int b = 0; b < bits; ++b)
      if ((q[k] >> b) & 1u) {
        const size_t i = k * bits + b;
        out[i / 32] |= 1u << (i % 32);
      }
  return out;
}

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place between two finite floats of the same sign region.
int64_t ulp_distance(float a, float b) {
  auto key = [](float f) {
    int64_t u = int64_t(f32_bits(f));
    return u & 0x80000000 ? int64_t(0x80000000) - u : u;
  };
  return std::llabs(key(a) - key(b));
}

constexpr int kAllBits[] = {2, 3, 4, 5, 6, 8};
constexpr int kAllGroups[] = {32, 64, 128};

}  // namespace

TEST(MlxPack, RoundTripAllBitsRandomValues) {
  std::mt19937 rng(7);
  for (int bits : kAllBits) {
    for (int64_t n : {32, 96, 256, 37, 1}) {  // 37 and 1: a partial last word
      std::vector<uint8_t> q(static_cast<size_t>(n));
      for (auto& v : q) v = uint8_t(rng() & ((1u << bits) - 1u));
      std::vector<uint32_t> packed(size_t((n * bits + 31) / 32), 0xdeadbeefu);
      mlx_pack_row(q.data(), n, bits, packed.data());
      EXPECT_EQ(packed, naive_pack(q, bits)) << "bits=" << bits << " n=" << n;
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(mlx_unpack_element(packed.data(), k, bits), q[size_t(k)]) << "bits=" << bits << " k=" << k;
    }
  }
}

TEST(MlxPack, LayoutLowBitsFirstAndStraddling) {
  // 4-bit: the low nibble of each byte is the earlier element.
  std::vector<uint8_t> q4 = {1, 2, 3, 4, 5, 6, 7, 8};
  uint32_t w4 = 0;
  mlx_pack_row(q4.data(), 8, 4, &w4);
  EXPECT_EQ(w4, 0x87654321u);
  // 3-bit: element 10 occupies stream bits 30..32, i.e. two bits of word 0 and one bit of word 1.
  std::vector<uint8_t> q3(32, 0);
  q3[10] = 0b111;
  uint32_t w3[3];
  mlx_pack_row(q3.data(), 32, 3, w3);
  EXPECT_EQ(w3[0], 0xC0000000u);
  EXPECT_EQ(w3[1], 0x1u);
  EXPECT_EQ(w3[2], 0u);
  EXPECT_EQ(mlx_unpack_element(w3, 10, 3), 7u);
  // Values wider than `bits` are masked, not spilled into the neighbour.
  std::vector<uint8_t> q2 = {0xFF, 0};
  uint32_t w2 = 0;
  mlx_pack_row(q2.data(), 2, 2, &w2);
  EXPECT_EQ(w2, 0x3u);
}

TEST(MlxQuant, PackedColsAndParameterErrors) {
  EXPECT_EQ(mlx_packed_cols(64, 4), 8);
  EXPECT_EQ(mlx_packed_cols(32, 3), 3);
  EXPECT_EQ(mlx_packed_cols(64, 6), 12);
  EXPECT_EQ(mlx_packed_cols(33, 3), -1);  // 99 bits: not whole words
  EXPECT_EQ(mlx_packed_cols(16, 3), -1);
  EXPECT_EQ(mlx_packed_cols(64, 7), -1);  // unsupported bits

  std::vector<float> w(64, 0.5f);
  std::vector<uint32_t> q(64);
  std::vector<float> s(8), b(8);
  auto msg = [&](int64_t cols, int bits, int group, DType dt) {
    Status st = mlx_quantize(w.data(), 1, cols, bits, group, dt, q.data(), s.data(), b.data());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    return st.message();
  };
  EXPECT_NE(msg(64, 7, 32, DType::kF32).find("bits"), std::string::npos);
  EXPECT_NE(msg(64, 1, 32, DType::kF32).find("bits"), std::string::npos);
  EXPECT_NE(msg(64, 4, 16, DType::kF32).find("group_size"), std::string::npos);
  EXPECT_NE(msg(48, 4, 32, DType::kF32).find("multiple of group_size"), std::string::npos);
  EXPECT_NE(msg(64, 4, 32, DType::kI32).find("dtype"), std::string::npos);
  EXPECT_TRUE(mlx_quantize(w.data(), 1, 64, 4, 32, DType::kF32, q.data(), s.data(), b.data()).is_ok());
}

namespace {
// One tensor of the MLX fixture file, copied out of the (validated) safetensors reader.
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
}  // namespace

// Our quantize, and the engine's dequantizer, against the real MLX on every bits x group x dtype.
TEST(MlxQuant, MatchesMlxFixtures) {
  std::map<std::string, FixtureTensor> fx;
  const std::string path = std::string(ANVIL_TEST_DATA) + "/quant/mlx_quant.safetensors";
  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  for (const TensorView& t : (*file)->tensors())
    fx[t.name] = FixtureTensor{std::string(dtype_name(t.dtype)), t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  int cases = 0;
  for (const char* dt_name : {"f32", "bf16"}) {
    const DType dt = std::string(dt_name) == "f32" ? DType::kF32 : DType::kBF16;
    for (int bits : kAllBits) {
      for (int group : kAllGroups) {
        const std::string p = "b" + std::to_string(bits) + "_g" + std::to_string(group) + "_" + dt_name + ".";
        SCOPED_TRACE(p);
        ASSERT_TRUE(fx.count(p + "w") && fx.count(p + "q") && fx.count(p + "deq_f32")) << p;
        const auto& wt = fx[p + "w"];
        ASSERT_EQ(wt.shape.size(), 2u);
        const int64_t rows = wt.shape[0], cols = wt.shape[1];
        const int64_t pc = mlx_packed_cols(cols, bits);
        const int64_t ng = cols / group;
        ASSERT_EQ(fx[p + "q"].shape, (std::vector<int64_t>{rows, pc}));
        ASSERT_EQ(fx[p + "scales"].shape, (std::vector<int64_t>{rows, ng}));
        ASSERT_EQ(fx[p + "scales"].dtype, std::string(dtype_name(dt)));

        std::vector<float> w(size_t(rows * cols));
        for (size_t i = 0; i < w.size(); ++i) w[i] = load_float(wt.bytes.data(), dt, i);

        // quantize: q, scales and biases bit-exact.
        const size_t esz = dtype_size(dt);
        std::vector<uint32_t> q(size_t(rows * pc));
        std::vector<uint8_t> scales(size_t(rows * ng) * esz), biases(size_t(rows * ng) * esz);
        ASSERT_TRUE(mlx_quantize(w.data(), rows, cols, bits, group, dt, q.data(), scales.data(), biases.data()).is_ok());
        EXPECT_EQ(q, fx[p + "q"].as<uint32_t>());
        EXPECT_EQ(scales, fx[p + "scales"].bytes);
        EXPECT_EQ(biases, fx[p + "biases"].bytes);

        // dequantize MLX's own q/scales/biases.
        const auto mq = fx[p + "q"].as<uint32_t>();
        const auto& ms = fx[p + "scales"].bytes;
        const auto& mb = fx[p + "biases"].bytes;
        const auto deq_f32 = fx[p + "deq_f32"].as<float>();
        const auto& deq_native = fx[p + "deq"];
        std::vector<float> out(static_cast<size_t>(cols));
        int64_t max_ulp = 0;
        // Through the engine's own dequantizer (the CPU backend's weight_row_to_f32, which the fp32
        // linear path and the embedding lookup run), on a weight matrix over MLX's tensors.
        WeightMatrix wm;
        wm.rows = rows;
        wm.cols = cols;
        wm.dtype = dt;
        wm.bits = bits;
        wm.group_size = group;
        wm.data = mq.data();
        wm.scales = ms.data();
        wm.biases = mb.data();
        for (int64_t r = 0; r < rows; ++r) {
          cpu::weight_row_to_f32(wm, r, out.data());
          for (int64_t c = 0; c < cols; ++c) {
            const size_t i = size_t(r * cols + c);
            max_ulp = std::max(max_ulp, ulp_distance(out[size_t(c)], deq_f32[i]));
            // MLX's native output in the model dtype: for bf16 MLX rounds scale*q to bf16 before
            // adding the bias, so allow half a bf16 ulp of the product plus one ulp of the result.
            const float native = load_float(deq_native.bytes.data(), dt, i);
            if (dt == DType::kF32) {
              EXPECT_LE(ulp_distance(out[size_t(c)], native), 1) << "row " << r << " col " << c;
            } else {
              const float s = load_float(ms.data(), dt, size_t(r * ng + c / group));
              const float qv = float(mlx_unpack_element(mq.data() + r * pc, c, bits));
              const float tol = std::ldexp(std::fabs(s * qv), -8) + std::ldexp(std::fabs(native), -7) + 1e-30f;
              EXPECT_LE(std::fabs(out[size_t(c)] - native), tol) << "row " << r << " col " << c;
            }
          }
        }
        EXPECT_LE(max_ulp, 1);
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 36);
}

// dequantize(quantize(w)): every element not clipped at the far end is within |scale|/2 (plus
// float rounding). MLX moves the scale so that the edge maps to an exact integer; when that shrinks
// the scale, the far end of the range can clip, and those elements (q == 2^bits - 1) are within
// one |scale| instead (see FarEndCanExceedHalfScale).
TEST(MlxQuant, RoundTripErrorBound) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t rows = 16, cols = 256;
  std::vector<float> w(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) w[size_t(i)] = nd(rng) * (i / cols % 2 ? 0.01f : 3.0f) + (i / cols % 3) * 0.5f;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int bits : kAllBits) {
      for (int group : kAllGroups) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " bits " + std::to_string(bits) + " group " + std::to_string(group));
        const int64_t pc = mlx_packed_cols(cols, bits), ng = cols / group;
        std::vector<uint32_t> q(size_t(rows * pc));
        std::vector<uint8_t> s(size_t(rows * ng) * 4), b(size_t(rows * ng) * 4);
        ASSERT_TRUE(mlx_quantize(w.data(), rows, cols, bits, group, dt, q.data(), s.data(), b.data()).is_ok());
        const float n_bins = float((1 << bits) - 1);
        // A 16-bit scale/bias is off by up to half an ulp of its type; that error is multiplied by q.
        const float rel = dt == DType::kBF16 ? std::ldexp(1.0f, -8) : dt == DType::kF16 ? std::ldexp(1.0f, -11) : 0.0f;
        std::vector<float> out(static_cast<size_t>(cols));
        for (int64_t r = 0; r < rows; ++r) {
          const size_t esz = dtype_size(dt);
          mlx_dequantize_row(q.data() + r * pc, s.data() + size_t(r * ng) * esz, b.data() + size_t(r * ng) * esz, dt, cols,
                             bits, group, out.data());
          for (int64_t c = 0; c < cols; ++c) {
            const float scale = std::fabs(load_float(s.data(), dt, size_t(r * ng + c / group)));
            const float bias = std::fabs(load_float(b.data(), dt, size_t(r * ng + c / group)));
            const float qv = float(mlx_unpack_element(q.data() + r * pc, c, bits));
            const float x = w[size_t(r * cols + c)];
            const float err = std::fabs(out[size_t(c)] - x);
            const float slack = 1e-6f * (std::fabs(x) + bias + scale * qv) + rel * (scale * n_bins + bias);
            const float limit = (qv == n_bins ? scale : 0.5f * scale) * (1.0f + 1e-5f) + slack;
            ASSERT_LE(err, limit) << "row " << r << " col " << c << " q " << qv << " w " << x << " deq " << out[size_t(c)];
          }
        }
      }
    }
  }
}

// Documents the MLX edge rule: with bits=2 and a group spanning [-1, 1), |min| > |max| so the bias is
// -1 and the scale, (2 - tiny)/3, is moved to 1/round(1.5) = 0.5: values near +1 clip at q = 3 (0.5)
// with an error close to one full scale. Zero stays exact.
TEST(MlxQuant, FarEndCanExceedHalfScale) {
  std::vector<float> w(32, 0.0f);
  w[0] = -1.0f;
  w[1] = std::nextafter(1.0f, 0.0f);
  std::vector<uint32_t> q(2);
  float s = 0, b = 0;
  ASSERT_TRUE(mlx_quantize(w.data(), 1, 32, 2, 32, DType::kF32, q.data(), &s, &b).is_ok());
  EXPECT_EQ(s, 0.5f);
  EXPECT_EQ(b, -1.0f);
  std::vector<float> out(32);
  mlx_dequantize_row(q.data(), &s, &b, DType::kF32, 32, 2, 32, out.data());
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[1], 0.5f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_GT(std::fabs(out[1] - w[1]), 0.5f * s);
  EXPECT_LE(std::fabs(out[1] - w[1]), s);
}

// A constant group: |min| == |max|, so the scale is -1e-7 and the bias is the constant; an all-zero
// group gets scale -1e-7 and bias 0 (q0 = 0). Both dequantize exactly.
TEST(MlxQuant, ConstantAndZeroGroupsAreExact) {
  std::vector<float> w(64, 0.0f);
  for (int i = 0; i < 32; ++i) w[size_t(i)] = 0.3f;
  std::vector<uint32_t> q(8);
  float s[2], b[2];
  ASSERT_TRUE(mlx_quantize(w.data(), 1, 64, 4, 32, DType::kF32, q.data(), s, b).is_ok());
  EXPECT_EQ(b[0], 0.3f);
  EXPECT_LT(s[0], 0.0f);
  EXPECT_EQ(s[1], -1e-7f);  // |0| > |0| is false: the max side, negated
  EXPECT_EQ(b[1], 0.0f);
  std::vector<float> out(64);
  mlx_dequantize_row(q.data(), s, b, DType::kF32, 64, 4, 32, out.data());
  EXPECT_EQ(out, w);
}

// Tensors in a mapped checkpoint can start at any byte offset: the engine's dequantizer reads packed
// words and bf16/f32 scales through memcpy, so a misaligned copy gives the same floats (and UBSan,
// in the CI's sanitizer run, sees no misaligned load).
TEST(MlxQuant, MisalignedWeightsDequantizeTheSame) {
  const int64_t cols = 128;
  std::vector<float> w = std::vector<float>(size_t(cols));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : w) x = u(rng);
  for (int bits : {3, 4, 8})
    for (DType dt : {DType::kF32, DType::kBF16}) {
      const int64_t pc = mlx_packed_cols(cols, bits), ng = cols / 32;
      const size_t esz = dtype_size(dt);
      std::vector<uint32_t> q(static_cast<size_t>(pc));
      std::vector<uint8_t> s(size_t(ng) * esz), b(size_t(ng) * esz);
      ASSERT_TRUE(mlx_quantize(w.data(), 1, cols, bits, 32, dt, q.data(), s.data(), b.data()).is_ok());
      std::vector<uint8_t> buf(q.size() * 4 + 2 * s.size() + 8);
      uint8_t* base = buf.data() + 1;  // odd address
      std::memcpy(base, q.data(), q.size() * 4);
      std::memcpy(base + q.size() * 4, s.data(), s.size());
      std::memcpy(base + q.size() * 4 + s.size() + 1, b.data(), b.size());
      WeightMatrix wm;
      wm.rows = 1;
      wm.cols = cols;
      wm.dtype = dt;
      wm.bits = bits;
      wm.group_size = 32;
      wm.data = q.data();
      wm.scales = s.data();
      wm.biases = b.data();
      std::vector<float> aligned(static_cast<size_t>(cols)), mis(static_cast<size_t>(cols));
      cpu::weight_row_to_f32(wm, 0, aligned.data());
      wm.data = base;
      wm.scales = base + q.size() * 4;
      wm.biases = base + q.size() * 4 + s.size() + 1;
      cpu::weight_row_to_f32(wm, 0, mis.data());
      EXPECT_EQ(aligned, mis) << bits << " bits";
    }
}
