// The arithmetic a sampled token depends on, written once for the host Sampler
// (src/runtime/sampler.cpp) and the on-device samplers (Backend::sample_rows: the CPU reference in
// src/backend/cpu/cpu_sample.cpp, the CUDA kernel in src/backend/cuda/sample_rows.cu), so that a seed
// gives the same token id on every backend, bit for bit:
//  - det_exp: exp(x) from IEEE double adds and multiplies only, in a fixed order, never contracted into
//    FMAs (host: anvil_core builds with -ffp-contract=off; device: __dadd_rn/__dmul_rn), so host and
//    device get the same bits where libm's exp and CUDA's exp may differ in the last place;
//  - token weights are fixed point: q = floor(exp(logit - max) * 2^44), summed as integers, so a sum
//    is exact and does not depend on the order of the additions (a GPU reduces in any order);
//  - the draw target floor(u53 * total / 2^53) is integer arithmetic as well.
// Weights below 2^-44 of the most probable token's are 0: such tokens are never drawn and move no
// top-p boundary. kMinRelLogit bounds them: logit - max < -31 gives exp < 3.5e-14 < 2^-44.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ANVIL_HD __host__ __device__ __forceinline__
#else
#define ANVIL_HD inline
#endif

namespace anvil::sampling {

constexpr int kWeightBits = 44;
constexpr double kWeightScale = 0x1.0p+44;
constexpr float kMinRelLogit = -31.0f;
// A row's weights sum to at most vocab * 2^44, which must fit in 63 bits.
constexpr int kMaxVocab = 1 << 19;

ANVIL_HD double bits_to_double(uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(b));
#else
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
#endif
}
ANVIL_HD uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}

// Host arithmetic: plain operators (anvil_core is compiled with -ffp-contract=off).
struct HostOps {
  static double add(double a, double b) { return a + b; }
  static double mul(double a, double b) { return a * b; }
  static double rint(double a);  // round half to even (the default rounding mode)
};

// exp(x), relative error below 2e-16 on [-708, 0]; 0 below -708 (and for -inf/NaN). Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2/2, a degree-12 Taylor polynomial (truncation < 2e-16), then
// the exact scaling by 2^n. For x <= 709 only (the sampler's x is <= 0).
template <class Ops>
ANVIL_HD double det_exp_impl(double x) {
  if (!(x >= -708.0)) return 0.0;
  if (x > 709.0) x = 709.0;
  const double n = Ops::rint(Ops::mul(x, 0x1.71547652b82fep+0));  // x / ln 2
  const double r = Ops::add(Ops::add(x, -Ops::mul(n, 0x1.62e42fee00000p-1)), -Ops::mul(n, 0x1.a39ef35793c76p-33));
  // 1/k! for k = 12 .. 0 (correctly rounded), Horner from the highest degree.
  double p = 0x1.1eed8eff8d898p-29;
  p = Ops::add(Ops::mul(p, r), 0x1.ae64567f544e4p-26);
  p = Ops::add(Ops::mul(p, r), 0x1.27e4fb7789f5cp-22);
  p = Ops::add(Ops::mul(p, r), 0x1.71de3a556c734p-19);
  p = Ops::add(Ops::mul(p, r), 0x1.a01a01a01a01ap-16);
  p = Ops::add(Ops::mul(p, r), 0x1.a01a01a01a01ap-13);
  p = Ops::add(Ops::mul(p, r), 0x1.6c16c16c16c17p-10);
  p = Ops::add(Ops::mul(p, r), 0x1.1111111111111p-7);
  p = Ops::add(Ops::mul(p, r), 0x1.5555555555555p-5);
  p = Ops::add(Ops::mul(p, r), 0x1.5555555555555p-3);
  p = Ops::add(Ops::mul(p, r), 0x1.0p-1);
  p = Ops::add(Ops::mul(p, r), 0x1.0p+0);
  p = Ops::add(Ops::mul(p, r), 0x1.0p+0);
  const double scale = bits_to_double(uint64_t(int64_t(n) + 1023) << 52);  // 2^n, n in [-1022, 1023]
  return Ops::mul(p, scale);
}

// The host instance (sample_math.cpp, compiled without contraction).
double det_exp(double x);

// Fixed-point weight of a token whose processed logit is `d` below the row's maximum (d <= 0).
ANVIL_HD uint64_t weight_fixed(double w) { return uint64_t(w * kWeightScale); }

// floor(u53 * total / 2^53) for u53 < 2^53, total < 2^63: the draw's target in [0, total).
ANVIL_HD uint64_t draw_target(uint64_t u53, uint64_t total) {
  const uint64_t a0 = u53 & 0xffffffffu, a1 = u53 >> 32, b0 = total & 0xffffffffu, b1 = total >> 32;
  const uint64_t p00 = a0 * b0, p01 = a0 * b1, p10 = a1 * b0, p11 = a1 * b1;
  const uint64_t mid = (p00 >> 32) + (p01 & 0xffffffffu) + (p10 & 0xffffffffu);
  const uint64_t lo = (mid << 32) | (p00 & 0xffffffffu);
  const uint64_t hi = p11 + (p01 >> 32) + (p10 >> 32) + (mid >> 32);
  return (hi << 11) | (lo >> 53);
}

// An unsigned key whose order is the float order of v (v not NaN); -0 and +0 get the same key, as
// they compare equal.
ANVIL_HD uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t b = float_bits(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// top-p's stopping rule (transformers' TopPLogitsWarper, sorted descending here): with `mass` the
// weight of the tokens kept so far, the ascending cumulative probability of the rest is
// (total - mass) / total; once it is <= 1 - top_p the remaining tokens are removed.
ANVIL_HD float top_p_threshold(float top_p) { return float(1.0 - double(top_p)); }
ANVIL_HD bool top_p_reached(uint64_t total, uint64_t mass, float threshold) {
  return float(double(total - mass) / double(total)) <= threshold;
}

// One step of a radix descent: bins b = 255..0 hold the weight of the tokens whose key has the
// current prefix and next byte b; `above` is the weight of every token ordered before the prefix.
// Returns the first bin (highest first) with weight whose last token satisfies pred(cumulative
// weight up to and including it) and adds the weight of the bins before it to `above`. Zero-weight
// bins are skipped: the first token satisfying a monotone predicate of the cumulative weight always
// has weight (the sum only changes there). -1 when no bin qualifies.
template <class W, class Pred>
ANVIL_HD int pick_bin(const W* bins, uint64_t* above, Pred pred) {
  uint64_t a = *above;
  for (int b = 255; b >= 0; --b) {
    const uint64_t m = uint64_t(bins[b]);
    if (m == 0) continue;
    if (pred(a + m)) {
      *above = a;
      return b;
    }
    a += m;
  }
  return -1;
}

}  // namespace anvil::sampling
