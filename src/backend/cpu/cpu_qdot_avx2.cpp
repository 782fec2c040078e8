// The AVX2/FMA kernels of the CPU backend, compiled with target attributes so the library stays
// portable x86-64; callers select them at run time (cpu_use_avx2()).
//
// Quantized mat-vec (qgemv_rows_avx2), the decode hot path. Goal: stream the packed weights at
// memory bandwidth with few instructions per byte. The trick is to never shuffle weight bytes:
// a 32-byte load holds 16 little-endian 16-bit words; word w holds e = 16/bits consecutive elements
// e*w + j (j = 0..e-1) at bit 4j (4-bit) or 8j (8-bit). (word >> bits*j) & mask is then a vector of
// 16 int16 quantized values, and x is pre-permuted once per call into that lane order (xq, see
// cpu_kernels.h) and pre-quantized to int16, so _mm256_madd_epi16 does 16 multiply-adds into 8
// int32 lanes. Per 32 weight bytes (4-bit): 1 load, 3 shifts, 3 ands, 4 madd, 4 adds; no port-5
// shuffles. The int32 sums of one group are scaled once by scale*xscale (fp32 FMA); the affine
// bias term is bias_g * sum(x_g), a second small dot over the groups.
// Overflow: |q| <= 255, |xq| <= 32767, one madd lane <= 2*255*32767 < 2^24; a group of 128 adds
// at most 8 of them per lane, < 2^27.
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

#define ANVIL_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ANVIL_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

namespace anvil::cpu {
namespace {
// Software prefetch distance for the streamed weight rows. A thread's rows are one sequential
// stream, but the kernel spends long enough on each cache line that the hardware prefetcher alone
// keeps too few lines in flight: per core, compute and memory time then add up instead of
// overlapping. Prefetching ~2 KiB ahead measured +25% decode speed (27 -> 34 tok/s, qwen3-0.6b
// q4g64, 2 threads); 512 B gave +14%, and anything from 2 to 8 KiB was the same within noise.
constexpr int kPrefetchBytes = 2048;

ANVIL_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Eight floats p[i, i+8) of a float-like dtype.
ANVIL_AVX2 inline __m256 load8(const void* p, DType dt, int64_t i) {
  if (dt == DType::kF32) return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
  if (dt == DType::kBF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

// For groups [g0, g0 + n) of weight row `gbase / ng`: the combined scales scale_g * xscale_g of every
// activation row into comb, and the affine bias term sum_g bias_g * xsum_g added to btail (reduced to
// a scalar per staged chunk, so no register stays tied up by it across the main loop: NX = 4 would
// otherwise spill, -30% for prefill). Shared by the AVX2 and AVX-512 kernels: the same operations in
// the same order, so both give the same bits.
template <int NX, int kChunk>
ANVIL_AVX2 inline void stage_groups(const WeightMatrix& w, int64_t gbase, int64_t g0, int n, const QuantizedX* xs,
                                    float (&comb)[NX][kChunk], float (&btail)[NX]) {
  int g = 0;
  __m256 bacc[NX];
  for (int x = 0; x < NX; ++x) bacc[x] = _mm256_setzero_ps();
  for (; g + 8 <= n; g += 8) {
    const __m256 s = load8(w.scales, w.dtype, gbase + g0 + g);
    const __m256 b = load8(w.biases, w.dtype, gbase + g0 + g);
    for (int x = 0; x < NX; ++x) {
      _mm256_store_ps(comb[x] + g, _mm256_mul_ps(s, _mm256_loadu_ps(xs[x].xscale + g0 + g)));
      bacc[x] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xs[x].xsum + g0 + g), bacc[x]);
    }
  }
  for (; g < n; ++g) {
    const float s = load_float(w.scales, w.dtype, size_t(gbase + g0 + g));
    const float b = load_float(w.biases, w.dtype, size_t(gbase + g0 + g));
    for (int x = 0; x < NX; ++x) {
      comb[x][g] = s * xs[x].xscale[g0 + g];
      btail[x] += b * xs[x].xsum[g0 + g];
    }
  }
  for (int x = 0; x < NX; ++x) btail[x] += hsum(bacc[x]);
}

// NX activation rows (1..4) share one pass over the weights: each extracted q vector is multiplied
// against all of them, so batches (batched decode, prefill) read W once per 4 rows, not once per row.
// One weight row at a time, front to back: the rows of a thread's chunk are then one sequential
// stream that the hardware prefetcher follows. Tiles of 4 weight rows (4 interleaved streams of
// 512-byte rows, too short for the prefetcher to lock on) were measured at -40% decode speed.
//
// 2, 3, 5 and 6 bits (kWords false). MLX packs a row as one little-endian bit stream, so elements
// straddle bytes and words, and the 16-bit-word trick does not apply. There 16 consecutive elements
// take 2 * kBits bytes: both 128-bit lanes get the same 16 bytes (one broadcast load), one byte
// shuffle gives each 16-bit lane the two bytes that hold its element (lane i: element i, bits
// [kBits*i, kBits*i + kBits) at bit s = kBits*i mod 8 of the pair), a multiply by 2^(16-kBits-s)
// drops the bits above the element and a shift right by 16 - kBits the ones below it. x is in
// natural order (quantize_x_int16_avx2 with e = 1). Per 16 elements: 1 load, 1 shuffle, 1 multiply,
// 1 shift, then the madds as above. (Until session 31 these widths were dequantized to fp32 row by
// row: qwen3-0.6b q6g64 decoded at 3.8 tok/s on 2 threads against 123 for q4g64.) The last 16 bytes
// of a matrix may lie past its end (a vector uses only 2 * kBits of them): those vectors are copied
// to the stack first, so the kernel never reads beyond the weights.
template <int kBits, int kGroup, int NX>
ANVIL_AVX2 void qgemv_rows_t(const WeightMatrix& w, int64_t r0, int64_t r1, const QuantizedX* xs, float* out,
                             int64_t ldo) {
  constexpr bool kWords = kBits == 4 || kBits == 8;  // else a packed-stream width
  constexpr int E = kWords ? 16 / kBits : 1;        // elements per 16-bit word (1: natural x order)
  constexpr int B = 16 * E;                          // elements per 32-byte block (16 per vector)
  constexpr int kChunk = 64;                         // groups whose combined scales are staged at a time (even)
  const int64_t cols = w.cols, ng = cols / kGroup, rb = cols * kBits / 8;
  const __m256i mask = _mm256_set1_epi16(int16_t((1 << kBits) - 1));
  // Packed widths: the byte shuffle and the multipliers (see above), and where the weights end.
  alignas(32) int8_t shuf[32] = {};
  alignas(32) int16_t mul[16] = {};
  if constexpr (!kWords)
    for (int i = 0; i < 16; ++i) {
      const int bit = kBits * i, b = bit / 8, sh = bit % 8;
      // (lane i / 8 of the shuffle; both 128-bit lanes hold the same 16 bytes, so b indexes them)
      shuf[2 * i] = int8_t(b);
      shuf[2 * i + 1] = int8_t(b + 1);
      mul[i] = int16_t(1 << (16 - kBits - sh));
    }
  const __m256i vshuf = _mm256_load_si256(reinterpret_cast<const __m256i*>(shuf));
  const __m256i vmul = _mm256_load_si256(reinterpret_cast<const __m256i*>(mul));
  const uint8_t* const end = static_cast<const uint8_t*>(w.data) + w.rows * rb;
  alignas(32) float comb[NX][kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * rb;
    const int64_t gbase = r * ng;
    __m256 acc[NX];
    float btail[NX];
    for (int x = 0; x < NX; ++x) {
      acc[x] = _mm256_setzero_ps();
      btail[x] = 0.0f;
    }
    for (int64_t g0 = 0; g0 < ng; g0 += kChunk) {
      const int n = int(std::min<int64_t>(kChunk, ng - g0));
      stage_groups<NX, kChunk>(w, gbase, g0, n, xs, comb, btail);
      int g = 0;
      if constexpr (kGroup >= B) {
        constexpr int kBlocksPerGroup = kGroup / B;
        for (g = 0; g < n; ++g) {
          const int64_t ge = (g0 + g) * kGroup;  // first element of the group
          const __m256i* wp = reinterpret_cast<const __m256i*>(row + ge * kBits / 8);
          _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchBytes, _MM_HINT_T0);
          __m256i iacc[NX];
          for (int x = 0; x < NX; ++x) iacc[x] = _mm256_setzero_si256();
          if constexpr (kWords) {
#pragma GCC unroll 4
            for (int b = 0; b < kBlocksPerGroup; ++b) {
              const __m256i v = _mm256_loadu_si256(wp + b);
#pragma GCC unroll 4
              for (int j = 0; j < E; ++j) {
                __m256i qj = j == 0 ? v : _mm256_srli_epi16(v, kBits * j);
                if (j != E - 1) qj = _mm256_and_si256(qj, mask);
#pragma GCC unroll 4
                for (int x = 0; x < NX; ++x) {
                  const __m256i xj = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[x].xq + ge + b * B + j * 16));
                  iacc[x] = _mm256_add_epi32(iacc[x], _mm256_madd_epi16(qj, xj));
                }
              }
            }
          } else {
#pragma GCC unroll 8
            for (int v = 0; v < kBlocksPerGroup; ++v) {  // (a block is one 16-element vector here)
              const uint8_t* p = reinterpret_cast<const uint8_t*>(wp) + v * 2 * kBits;
              __m128i raw;
              if (p + 16 <= end) {
                raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
              } else {
                alignas(16) uint8_t tail[16] = {};
                std::copy(p, p + 2 * kBits, tail);
                raw = _mm_load_si128(reinterpret_cast<const __m128i*>(tail));
              }
              const __m256i pairs = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(raw), vshuf);
              const __m256i q = _mm256_srli_epi16(_mm256_mullo_epi16(pairs, vmul), 16 - kBits);
#pragma GCC unroll 4
              for (int x = 0; x < NX; ++x) {
                const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[x].xq + ge + v * 16));
                iacc[x] = _mm256_add_epi32(iacc[x], _mm256_madd_epi16(q, xv));
              }
            }
          }
          for (int x = 0; x < NX; ++x)
            acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[x]), _mm256_set1_ps(comb[x][g]), acc[x]);
        }
      } else {
        // 4-bit, group 32: a 64-element block holds two groups, one per 128-bit lane (words 0..7
        // are elements 0..31), so the int32 lanes 0..3 belong to group g and 4..7 to g+1.
        static_assert(kBits == 4 && kGroup == 32, "only 4-bit groups can be smaller than a block");
        for (g = 0; g < n; g += 2) {
          const int64_t ge = (g0 + g) * kGroup;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + ge / 2));
          _mm_prefetch(reinterpret_cast<const char*>(row + ge / 2) + kPrefetchBytes, _MM_HINT_T0);
          __m256i iacc[NX];
          for (int x = 0; x < NX; ++x) iacc[x] = _mm256_setzero_si256();
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) {
            __m256i qj = j == 0 ? v : _mm256_srli_epi16(v, 4 * j);
            if (j != 3) qj = _mm256_and_si256(qj, mask);
#pragma GCC unroll 4
            for (int x = 0; x < NX; ++x) {
              const __m256i xj = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[x].xq + ge + j * 16));
              iacc[x] = _mm256_add_epi32(iacc[x], _mm256_madd_epi16(qj, xj));
            }
          }
          for (int x = 0; x < NX; ++x) {
            const __m256 sc = _mm256_setr_m128(_mm_set1_ps(comb[x][g]), _mm_set1_ps(comb[x][g + 1]));
            acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[x]), sc, acc[x]);
          }
        }
      }
    }
    const float bias = weight_bias(w, r);
    for (int x = 0; x < NX; ++x) out[x * ldo + r] = hsum(acc[x]) + btail[x] + bias;
  }
}

// GCC 12's AVX-512 insert/extract intrinsics start from an undefined vector and warn about it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The x lanes of two blocks, one per 256-bit half.
ANVIL_AVX512 inline __m512i x2(const int16_t* xq, int64_t e0, int64_t e1) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + e0));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + e1));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// The same mat-vec with AVX-512 VNNI, for groups of at least one 32-byte block (every format but
// 4-bit group 32): a 64-byte load holds two consecutive blocks, whose 16-bit lanes are unpacked as
// above and multiplied into int32 lanes by one vpdpwssd per activation row (the x of the two blocks
// joined in one register). Bit for bit the AVX2 kernel's results: the int32 sums are exact, each
// 256-bit half is one block's (or one group's), and the halves reach the fp32 accumulator in the AVX2
// kernel's order (a group's blocks summed as integers first; consecutive groups one after the other).
template <int kBits, int kGroup, int NX>
ANVIL_AVX512 void qgemv_rows_512_t(const WeightMatrix& w, int64_t r0, int64_t r1, const QuantizedX* xs, float* out,
                                   int64_t ldo) {
  constexpr int E = 16 / kBits;
  constexpr int B = 16 * E;
  constexpr int kChunk = 64;
  constexpr int kBlocksPerGroup = kGroup / B;
  static_assert(kGroup >= B && (kBlocksPerGroup == 1 || kBlocksPerGroup % 2 == 0), "two blocks per 64-byte load");
  const int64_t cols = w.cols, ng = cols / kGroup, rb = cols * kBits / 8;
  const __m512i mask = _mm512_set1_epi16(int16_t((1 << kBits) - 1));
  const __m256i mask256 = _mm256_set1_epi16(int16_t((1 << kBits) - 1));
  alignas(32) float comb[NX][kChunk];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * rb;
    const int64_t gbase = r * ng;
    __m256 acc[NX];
    float btail[NX];
    for (int x = 0; x < NX; ++x) {
      acc[x] = _mm256_setzero_ps();
      btail[x] = 0.0f;
    }
    for (int64_t g0 = 0; g0 < ng; g0 += kChunk) {
      const int n = int(std::min<int64_t>(kChunk, ng - g0));
      stage_groups<NX, kChunk>(w, gbase, g0, n, xs, comb, btail);
      int g = 0;
      if constexpr (kBlocksPerGroup >= 2) {
        for (g = 0; g < n; ++g) {
          const int64_t ge = (g0 + g) * kGroup;
          const uint8_t* wp = row + ge * kBits / 8;
          _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchBytes, _MM_HINT_T0);
          __m512i iacc[NX];
          for (int x = 0; x < NX; ++x) iacc[x] = _mm512_setzero_si512();
#pragma GCC unroll 2
          for (int b = 0; b < kBlocksPerGroup; b += 2) {
            const __m512i v = _mm512_loadu_si512(wp + b * 32);
#pragma GCC unroll 4
            for (int j = 0; j < E; ++j) {
              __m512i qj = j == 0 ? v : _mm512_srli_epi16(v, kBits * j);
              if (j != E - 1) qj = _mm512_and_si512(qj, mask);
#pragma GCC unroll 4
              for (int x = 0; x < NX; ++x)
                iacc[x] = _mm512_dpwssd_epi32(iacc[x], qj, x2(xs[x].xq, ge + b * B + j * 16, ge + (b + 1) * B + j * 16));
            }
          }
          for (int x = 0; x < NX; ++x) {
            const __m256i s32 = _mm256_add_epi32(_mm512_castsi512_si256(iacc[x]), _mm512_extracti64x4_epi64(iacc[x], 1));
            acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_set1_ps(comb[x][g]), acc[x]);
          }
        }
      } else {
        // One block per group: groups g and g+1 in one load, each half reaching acc in turn.
        for (g = 0; g + 2 <= n; g += 2) {
          const int64_t ge = (g0 + g) * kGroup;
          const uint8_t* wp = row + ge * kBits / 8;
          _mm_prefetch(reinterpret_cast<const char*>(wp) + kPrefetchBytes, _MM_HINT_T0);
          const __m512i v = _mm512_loadu_si512(wp);
          __m512i iacc[NX];
          for (int x = 0; x < NX; ++x) iacc[x] = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int j = 0; j < E; ++j) {
            __m512i qj = j == 0 ? v : _mm512_srli_epi16(v, kBits * j);
            if (j != E - 1) qj = _mm512_and_si512(qj, mask);
#pragma GCC unroll 4
            for (int x = 0; x < NX; ++x) iacc[x] = _mm512_dpwssd_epi32(iacc[x], qj, x2(xs[x].xq, ge + j * 16, ge + B + j * 16));
          }
          for (int x = 0; x < NX; ++x) {
            acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm512_castsi512_si256(iacc[x])), _mm256_set1_ps(comb[x][g]),
                                     acc[x]);
            acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(iacc[x], 1)),
                                     _mm256_set1_ps(comb[x][g + 1]), acc[x]);
          }
        }
        for (; g < n; ++g) {  // an odd last group: one block, as the AVX2 kernel does it
          const int64_t ge = (g0 + g) * kGroup;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + ge * kBits / 8));
          __m256i iacc[NX];
          for (int x = 0; x < NX; ++x) iacc[x] = _mm256_setzero_si256();
          for (int j = 0; j < E; ++j) {
            __m256i qj = j == 0 ? v : _mm256_srli_epi16(v, kBits * j);
            if (j != E - 1) qj = _mm256_and_si256(qj, mask256);
            for (int x = 0; x < NX; ++x) {
              const __m256i xj = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[x].xq + ge + j * 16));
              iacc[x] = _mm256_add_epi32(iacc[x], _mm256_madd_epi16(qj, xj));
            }
          }
          for (int x = 0; x < NX; ++x)
            acc[x] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[x]), _mm256_set1_ps(comb[x][g]), acc[x]);
        }
      }
    }
    const float bias = weight_bias(w, r);
    for (int x = 0; x < NX; ++x) out[x * ldo + r] = hsum(acc[x]) + btail[x] + bias;
  }
}

#pragma GCC diagnostic pop

template <int kBits, int NX>
void qgemv_bits_dispatch(const WeightMatrix& w, int64_t r0, int64_t r1, const QuantizedX* xs, float* out, int64_t ldo) {
  switch (w.group_size) {
    case 32: qgemv_rows_t<kBits, 32, NX>(w, r0, r1, xs, out, ldo); break;
    case 64: qgemv_rows_t<kBits, 64, NX>(w, r0, r1, xs, out, ldo); break;
    default: qgemv_rows_t<kBits, 128, NX>(w, r0, r1, xs, out, ldo);
  }
}

template <int NX>
void qgemv_dispatch(const WeightMatrix& w, int64_t r0, int64_t r1, const QuantizedX* xs, float* out, int64_t ldo) {
  const bool v512 = cpu_use_avx512();
  switch (w.bits * 1000 + w.group_size) {
    case 4032: qgemv_rows_t<4, 32, NX>(w, r0, r1, xs, out, ldo); break;
    case 4064:
      v512 ? qgemv_rows_512_t<4, 64, NX>(w, r0, r1, xs, out, ldo) : qgemv_rows_t<4, 64, NX>(w, r0, r1, xs, out, ldo);
      break;
    case 4128:
      v512 ? qgemv_rows_512_t<4, 128, NX>(w, r0, r1, xs, out, ldo) : qgemv_rows_t<4, 128, NX>(w, r0, r1, xs, out, ldo);
      break;
    case 8032:
      v512 ? qgemv_rows_512_t<8, 32, NX>(w, r0, r1, xs, out, ldo) : qgemv_rows_t<8, 32, NX>(w, r0, r1, xs, out, ldo);
      break;
    case 8064:
      v512 ? qgemv_rows_512_t<8, 64, NX>(w, r0, r1, xs, out, ldo) : qgemv_rows_t<8, 64, NX>(w, r0, r1, xs, out, ldo);
      break;
    case 8128:
      v512 ? qgemv_rows_512_t<8, 128, NX>(w, r0, r1, xs, out, ldo) : qgemv_rows_t<8, 128, NX>(w, r0, r1, xs, out, ldo);
      break;
    default:  // callers check qdot_avx2_supported() first
      switch (w.bits) {
        case 2: qgemv_bits_dispatch<2, NX>(w, r0, r1, xs, out, ldo); break;
        case 3: qgemv_bits_dispatch<3, NX>(w, r0, r1, xs, out, ldo); break;
        case 5: qgemv_bits_dispatch<5, NX>(w, r0, r1, xs, out, ldo); break;
        case 6: qgemv_bits_dispatch<6, NX>(w, r0, r1, xs, out, ldo); break;
        default: break;
      }
  }
}

// Activations in the kernel's lane order: blocks of 16 * e elements, e = 16 / bits for the 4- and
// 8-bit word trick, 1 (natural order) for the packed-stream widths.
int x_lane_e(int bits) { return bits == 4 || bits == 8 ? 16 / bits : 1; }

}  // namespace

bool qdot_avx2_supported(int bits, int group_size, int64_t cols) {
  if (bits != 2 && bits != 3 && bits != 4 && bits != 5 && bits != 6 && bits != 8) return false;
  if (group_size != 32 && group_size != 64 && group_size != 128) return false;
  const int block = 16 * x_lane_e(bits);
  return cols % block == 0 && cols % group_size == 0;
}

void qgemv_rows_avx2(const WeightMatrix& w, int64_t r0, int64_t r1, const QuantizedX* xs, int nx, float* out,
                     int64_t ldo) {
  switch (nx) {
    case 1: qgemv_dispatch<1>(w, r0, r1, xs, out, ldo); break;
    case 2: qgemv_dispatch<2>(w, r0, r1, xs, out, ldo); break;
    case 3: qgemv_dispatch<3>(w, r0, r1, xs, out, ldo); break;
    case 4: qgemv_dispatch<4>(w, r0, r1, xs, out, ldo); break;
    default: break;
  }
}

ANVIL_AVX2 void quantize_x_int16_avx2(const float* x, int64_t cols, int bits, int64_t G, int16_t* xq, float* xscale,
                                      float* xsum) {
  const int64_t ng = cols / G, e = x_lane_e(bits), B = 16 * e;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t g = 0; g < ng; ++g) {
    __m256 vmax = _mm256_setzero_ps(), vsum = _mm256_setzero_ps();
    for (int64_t k = g * G; k < (g + 1) * G; k += 8) {
      const __m256 v = _mm256_loadu_ps(x + k);
      vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
      vsum = _mm256_add_ps(vsum, v);
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    xscale[g] = _mm_cvtss_f32(m) / 32767.0f;
    xsum[g] = hsum(vsum);
  }
  // Round to nearest even (the default MXCSR mode, as lrintf) in natural order, then permute one
  // block into the kernel's lane order: xq[blk + j*16 + w] = q[blk + e*w + j].
  alignas(32) int32_t q[64];
  for (int64_t blk = 0; blk < cols; blk += B) {
    for (int64_t k = 0; k < B; k += 8) {
      const float sc = xscale[(blk + k) / G];
      const __m256i v = sc > 0.0f ? _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + blk + k), _mm256_set1_ps(sc)))
                                  : _mm256_setzero_si256();
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + k), v);
    }
    for (int64_t j = 0; j < e; ++j)
      for (int64_t wd = 0; wd < 16; ++wd) xq[blk + j * 16 + wd] = int16_t(q[e * wd + j]);
  }
}

ANVIL_AVX2 float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

ANVIL_AVX2 void axpy_f32_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

// 8 bf16 -> 8 fp32: widen to 32 bits and shift into the high half.
ANVIL_AVX2 static inline __m256 load8_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

// Helpers of the page kernels below (row tails, odd query counts):
// out[r] = dot(q + r*ldq, k) for r < nq;  y[r*ldy + :] += a[r] * v for r < nq.
ANVIL_AVX2 static void dot_bf16_multi_avx2(const float* q, int64_t ldq, int nq, const uint16_t* k, int64_t n, float* out) {
  int r = 0;
  for (; r + 2 <= nq; r += 2) {  // two query heads share every K load
    const float* q0 = q + r * ldq;
    const float* q1 = q0 + ldq;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 kv = load8_bf16(k + i);
      a0 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q0 + i), a0);
      a1 = _mm256_fmadd_ps(kv, _mm256_loadu_ps(q1 + i), a1);
    }
    float s0 = hsum(a0), s1 = hsum(a1);
    for (; i < n; ++i) {
      const float kf = bf16_to_f32(k[i]);
      s0 += kf * q0[i];
      s1 += kf * q1[i];
    }
    out[r] = s0;
    out[r + 1] = s1;
  }
  for (; r < nq; ++r) {
    const float* q0 = q + r * ldq;
    __m256 a0 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8_bf16(k + i), _mm256_loadu_ps(q0 + i), a0);
    float s0 = hsum(a0);
    for (; i < n; ++i) s0 += bf16_to_f32(k[i]) * q0[i];
    out[r] = s0;
  }
}

ANVIL_AVX2 static void axpy_bf16_multi_avx2(const float* a, int nq, const uint16_t* v, float* y, int64_t ldy, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 vv = load8_bf16(v + i);
    for (int r = 0; r < nq; ++r) {
      float* yr = y + r * ldy + i;
      _mm256_storeu_ps(yr, _mm256_fmadd_ps(_mm256_set1_ps(a[r]), vv, _mm256_loadu_ps(yr)));
    }
  }
  for (; i < n; ++i) {
    const float vf = bf16_to_f32(v[i]);
    for (int r = 0; r < nq; ++r) y[r * ldy + i] += a[r] * vf;
  }
}

ANVIL_AVX2 void scores_bf16_avx2(const float* q, int nq, const uint16_t* k, int n, int d, float scale, float* s,
                                 int64_t lds) {
  const int d8 = d & ~7;
  int r = 0;
  for (; r + 2 <= nq; r += 2) {  // two queries x two keys per pass: each K and q load feeds two FMAs
    const float* q0 = q + int64_t(r) * d;
    const float* q1 = q0 + d;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
      const uint16_t* k0 = k + int64_t(j) * d;
      const uint16_t* k1 = k0 + d;
      __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
      for (int i = 0; i < d8; i += 8) {
        const __m256 kv0 = load8_bf16(k0 + i), kv1 = load8_bf16(k1 + i);
        const __m256 qv0 = _mm256_loadu_ps(q0 + i), qv1 = _mm256_loadu_ps(q1 + i);
        a00 = _mm256_fmadd_ps(qv0, kv0, a00);
        a01 = _mm256_fmadd_ps(qv0, kv1, a01);
        a10 = _mm256_fmadd_ps(qv1, kv0, a10);
        a11 = _mm256_fmadd_ps(qv1, kv1, a11);
      }
      float s00 = hsum(a00), s01 = hsum(a01), s10 = hsum(a10), s11 = hsum(a11);
      for (int i = d8; i < d; ++i) {
        const float kf0 = bf16_to_f32(k0[i]), kf1 = bf16_to_f32(k1[i]);
        s00 += q0[i] * kf0;
        s01 += q0[i] * kf1;
        s10 += q1[i] * kf0;
        s11 += q1[i] * kf1;
      }
      s[r * lds + j] = s00 * scale;
      s[r * lds + j + 1] = s01 * scale;
      s[(r + 1) * lds + j] = s10 * scale;
      s[(r + 1) * lds + j + 1] = s11 * scale;
    }
    for (; j < n; ++j) {
      float out[2];
      dot_bf16_multi_avx2(q0, d, 2, k + int64_t(j) * d, d, out);
      s[r * lds + j] = out[0] * scale;
      s[(r + 1) * lds + j] = out[1] * scale;
    }
  }
  for (; r < nq; ++r)
    for (int j = 0; j < n; ++j) {
      float out;
      dot_bf16_multi_avx2(q + int64_t(r) * d, d, 1, k + int64_t(j) * d, d, &out);
      s[r * lds + j] = out * scale;
    }
}

ANVIL_AVX2 void pv_bf16_avx2(const float* p, int64_t ldp, int nq, const uint16_t* v, int n, int d, const float* corr,
                             float* acc) {
  int r = 0;
  for (; r + 2 <= nq; r += 2) {  // two queries share every V load; 8 accumulators stay in registers over the keys
    const float* p0 = p + r * ldp;
    const float* p1 = p0 + ldp;
    float* y0 = acc + int64_t(r) * d;
    float* y1 = y0 + d;
    const __m256 c0 = _mm256_set1_ps(corr[r]), c1 = _mm256_set1_ps(corr[r + 1]);
    int i = 0;
    for (; i + 32 <= d; i += 32) {
      __m256 a0[4], a1[4];
      for (int u = 0; u < 4; ++u) {
        a0[u] = _mm256_mul_ps(_mm256_loadu_ps(y0 + i + 8 * u), c0);
        a1[u] = _mm256_mul_ps(_mm256_loadu_ps(y1 + i + 8 * u), c1);
      }
      for (int j = 0; j < n; ++j) {
        const uint16_t* vj = v + int64_t(j) * d + i;
        const __m256 w0 = _mm256_set1_ps(p0[j]), w1 = _mm256_set1_ps(p1[j]);
        for (int u = 0; u < 4; ++u) {
          const __m256 vv = load8_bf16(vj + 8 * u);
          a0[u] = _mm256_fmadd_ps(w0, vv, a0[u]);
          a1[u] = _mm256_fmadd_ps(w1, vv, a1[u]);
        }
      }
      for (int u = 0; u < 4; ++u) {
        _mm256_storeu_ps(y0 + i + 8 * u, a0[u]);
        _mm256_storeu_ps(y1 + i + 8 * u, a1[u]);
      }
    }
    for (; i + 8 <= d; i += 8) {
      __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(y0 + i), c0), a1 = _mm256_mul_ps(_mm256_loadu_ps(y1 + i), c1);
      for (int j = 0; j < n; ++j) {
        const __m256 vv = load8_bf16(v + int64_t(j) * d + i);
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(p0[j]), vv, a0);
        a1 = _mm256_fmadd_ps(_mm256_set1_ps(p1[j]), vv, a1);
      }
      _mm256_storeu_ps(y0 + i, a0);
      _mm256_storeu_ps(y1 + i, a1);
    }
    for (; i < d; ++i) {
      float s0 = y0[i] * corr[r], s1 = y1[i] * corr[r + 1];
      for (int j = 0; j < n; ++j) {
        const float vf = bf16_to_f32(v[int64_t(j) * d + i]);
        s0 += p0[j] * vf;
        s1 += p1[j] * vf;
      }
      y0[i] = s0;
      y1[i] = s1;
    }
  }
  for (; r < nq; ++r) {
    const float* p0 = p + r * ldp;
    float* y0 = acc + int64_t(r) * d;
    for (int i = 0; i < d; ++i) y0[i] *= corr[r];
    for (int j = 0; j < n; ++j) axpy_bf16_multi_avx2(p0 + j, 1, v + int64_t(j) * d, y0, d, d);
  }
}

// exp(x) for x <= 0: n = round(x*log2(e)), r = x - n*ln2 (ln2 in two parts, so r is exact to
// ~1e-10), e^r by its Taylor series to r^7 (|r| <= ln2/2: truncation < 2e-9 relative), times 2^n
// built in the exponent bits. Relative error ~2e-7 (a few fp32 roundings). Inputs below -87 are
// clamped there (a result of ~1.6e-38 instead of a smaller one; nothing a softmax sum can see).
ANVIL_AVX2 static inline __m256 exp_nonpos(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

ANVIL_AVX2 float exp_shift_sum_avx2(float* s, int n, float mx) {
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float tail = 0.0f;
  if (j < n) {  // the tail through a padded vector, so every element gets the same function
    alignas(32) float t[8];
    for (int i = 0; i < 8; ++i) t[i] = j + i < n ? s[j + i] - mx : 0.0f;
    _mm256_store_ps(t, exp_nonpos(_mm256_load_ps(t)));
    for (int i = 0; j + i < n; ++i) {
      s[j + i] = t[i];
      tail += t[i];
    }
  }
  return hsum(acc) + tail;
}

// Every output element, whatever tile computes it, is: one 8-lane accumulator over k = 0, 8, ...
// (FMA), its horizontal sum (hsum), then the scalar tail k >= c8 added in order. So a row's result
// does not depend on how many activation rows (T) or weight rows share its tile.
ANVIL_AVX2 static inline float dot_tile_order(const float* w, const float* x, int64_t c8, int64_t cols) {
  __m256 c = _mm256_setzero_ps();
  for (int64_t k = 0; k < c8; k += 8) c = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), c);
  float s = hsum(c);
  for (int64_t k = c8; k < cols; ++k) s += w[k] * x[k];
  return s;
}

ANVIL_AVX2 void gemm_tile_avx2(const float* W, int nw, const float* X, int64_t ldx, int nx, int64_t cols, float* out,
                               int64_t ldo) {
  const int64_t c8 = cols & ~int64_t(7);
  int t = 0;
  // 4 weight rows x 2 activation rows per register tile: 8 accumulators, 6 loads per 8 FMAs.
  for (; t + 2 <= nx; t += 2) {
    const float* x0 = X + t * ldx;
    const float* x1 = x0 + ldx;
    int r = 0;
    for (; r + 4 <= nw; r += 4) {
      const float* w0 = W + r * cols;
      __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
             c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
             c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
      for (int64_t k = 0; k < c8; k += 8) {
        const __m256 vx0 = _mm256_loadu_ps(x0 + k), vx1 = _mm256_loadu_ps(x1 + k);
        __m256 vw = _mm256_loadu_ps(w0 + k);
        c00 = _mm256_fmadd_ps(vw, vx0, c00);
        c01 = _mm256_fmadd_ps(vw, vx1, c01);
        vw = _mm256_loadu_ps(w0 + cols + k);
        c10 = _mm256_fmadd_ps(vw, vx0, c10);
        c11 = _mm256_fmadd_ps(vw, vx1, c11);
        vw = _mm256_loadu_ps(w0 + 2 * cols + k);
        c20 = _mm256_fmadd_ps(vw, vx0, c20);
        c21 = _mm256_fmadd_ps(vw, vx1, c21);
        vw = _mm256_loadu_ps(w0 + 3 * cols + k);
        c30 = _mm256_fmadd_ps(vw, vx0, c30);
        c31 = _mm256_fmadd_ps(vw, vx1, c31);
      }
      float s[4][2] = {{hsum(c00), hsum(c01)}, {hsum(c10), hsum(c11)}, {hsum(c20), hsum(c21)}, {hsum(c30), hsum(c31)}};
      for (int i = 0; i < 4; ++i)
        for (int64_t k = c8; k < cols; ++k) {
          s[i][0] += w0[i * cols + k] * x0[k];
          s[i][1] += w0[i * cols + k] * x1[k];
        }
      for (int i = 0; i < 4; ++i) {
        out[t * ldo + r + i] = s[i][0];
        out[(t + 1) * ldo + r + i] = s[i][1];
      }
    }
    for (; r < nw; ++r) {
      out[t * ldo + r] = dot_tile_order(W + r * cols, x0, c8, cols);
      out[(t + 1) * ldo + r] = dot_tile_order(W + r * cols, x1, c8, cols);
    }
  }
  // The last activation row (T odd, or decode): 4 weight rows x 1, four independent chains.
  for (; t < nx; ++t) {
    const float* x0 = X + t * ldx;
    int r = 0;
    for (; r + 4 <= nw; r += 4) {
      const float* w0 = W + r * cols;
      __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
      for (int64_t k = 0; k < c8; k += 8) {
        const __m256 vx = _mm256_loadu_ps(x0 + k);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), vx, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + cols + k), vx, c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 2 * cols + k), vx, c2);
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + 3 * cols + k), vx, c3);
      }
      float s[4] = {hsum(c0), hsum(c1), hsum(c2), hsum(c3)};
      for (int i = 0; i < 4; ++i) {
        for (int64_t k = c8; k < cols; ++k) s[i] += w0[i * cols + k] * x0[k];
        out[t * ldo + r + i] = s[i];
      }
    }
    for (; r < nw; ++r) out[t * ldo + r] = dot_tile_order(W + r * cols, x0, c8, cols);
  }
}

// Dense bf16 / f16 weights against one activation row, converted in registers instead of into an fp32
// block first (gemm in cpu_linear.cpp wrote and re-read 4 bytes per 2-byte weight: qwen3-0.6b bf16
// decoded at ~20% of the read bandwidth). Each output element is computed exactly as
// gemm_tile_avx2 / dot_tile_order compute it from the converted row (one 8-lane FMA accumulator, its
// hsum, then the scalar tail in order; the conversions are exact), so a row's result is bit for bit
// the same as inside a prefill batch. Four rows at a time (four independent FMA chains), each row's
// stream prefetched ahead.
template <bool kF16>
ANVIL_AVX2 inline __m256 half8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
template <bool kF16>
inline float half1(uint16_t h) {
  return kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}
template <bool kF16>
ANVIL_AVX2 void gemv_half_t(const uint16_t* W, int64_t nw, const float* x, int64_t cols, float* out) {
  const int64_t c8 = cols & ~int64_t(7);
  constexpr int64_t kAhead = kPrefetchBytes / 2;  // elements
  int64_t r = 0;
  for (; r + 4 <= nw; r += 4) {
    const uint16_t* w0 = W + r * cols;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
    for (int64_t k = 0; k < c8; k += 8) {
      if ((k & 31) == 0) {
        for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(w0 + i * cols + k + kAhead), _MM_HINT_T0);
      }
      const __m256 vx = _mm256_loadu_ps(x + k);
      c0 = _mm256_fmadd_ps(half8<kF16>(w0 + k), vx, c0);
      c1 = _mm256_fmadd_ps(half8<kF16>(w0 + cols + k), vx, c1);
      c2 = _mm256_fmadd_ps(half8<kF16>(w0 + 2 * cols + k), vx, c2);
      c3 = _mm256_fmadd_ps(half8<kF16>(w0 + 3 * cols + k), vx, c3);
    }
    float s[4] = {hsum(c0), hsum(c1), hsum(c2), hsum(c3)};
    for (int i = 0; i < 4; ++i) {
      for (int64_t k = c8; k < cols; ++k) s[i] += half1<kF16>(w0[i * cols + k]) * x[k];
      out[r + i] = s[i];
    }
  }
  for (; r < nw; ++r) {
    const uint16_t* w0 = W + r * cols;
    __m256 c = _mm256_setzero_ps();
    for (int64_t k = 0; k < c8; k += 8) c = _mm256_fmadd_ps(half8<kF16>(w0 + k), _mm256_loadu_ps(x + k), c);
    float s = hsum(c);
    for (int64_t k = c8; k < cols; ++k) s += half1<kF16>(w0[k]) * x[k];
    out[r] = s;
  }
}

// NX (2..4) activation rows: 2 weight rows x NX per register tile (8 accumulators at NX = 4), every
// element still one 8-lane chain, its hsum and the tail in order (the same bits as above).
template <bool kF16, int NX>
ANVIL_AVX2 void gemv_half_nx_t(const uint16_t* W, int64_t nw, const float* X, int64_t ldx, int64_t cols, float* out,
                               int64_t ldo) {
  const int64_t c8 = cols & ~int64_t(7);
  constexpr int64_t kAhead = kPrefetchBytes / 2;
  int64_t r = 0;
  for (; r + 2 <= nw; r += 2) {
    const uint16_t* w0 = W + r * cols;
    __m256 c[2][NX];
    for (int i = 0; i < 2; ++i)
      for (int x = 0; x < NX; ++x) c[i][x] = _mm256_setzero_ps();
    for (int64_t k = 0; k < c8; k += 8) {
      if ((k & 31) == 0) {
        for (int i = 0; i < 2; ++i) _mm_prefetch(reinterpret_cast<const char*>(w0 + i * cols + k + kAhead), _MM_HINT_T0);
      }
      __m256 vx[NX];
      for (int x = 0; x < NX; ++x) vx[x] = _mm256_loadu_ps(X + x * ldx + k);
      for (int i = 0; i < 2; ++i) {
        const __m256 vw = half8<kF16>(w0 + i * cols + k);
        for (int x = 0; x < NX; ++x) c[i][x] = _mm256_fmadd_ps(vw, vx[x], c[i][x]);
      }
    }
    for (int i = 0; i < 2; ++i)
      for (int x = 0; x < NX; ++x) {
        float s = hsum(c[i][x]);
        for (int64_t k = c8; k < cols; ++k) s += half1<kF16>(w0[i * cols + k]) * X[x * ldx + k];
        out[x * ldo + r + i] = s;
      }
  }
  for (; r < nw; ++r)
    for (int x = 0; x < NX; ++x) gemv_half_t<kF16>(W + r * cols, 1, X + x * ldx, cols, out + x * ldo + r);
}

void gemv_half_avx2(const uint16_t* W, bool f16, int64_t nw, const float* X, int64_t ldx, int nx, int64_t cols,
                    float* out, int64_t ldo) {
  switch (nx) {
    case 1: f16 ? gemv_half_t<true>(W, nw, X, cols, out) : gemv_half_t<false>(W, nw, X, cols, out); break;
    case 2:
      f16 ? gemv_half_nx_t<true, 2>(W, nw, X, ldx, cols, out, ldo) : gemv_half_nx_t<false, 2>(W, nw, X, ldx, cols, out, ldo);
      break;
    case 3:
      f16 ? gemv_half_nx_t<true, 3>(W, nw, X, ldx, cols, out, ldo) : gemv_half_nx_t<false, 3>(W, nw, X, ldx, cols, out, ldo);
      break;
    default:
      f16 ? gemv_half_nx_t<true, 4>(W, nw, X, ldx, cols, out, ldo) : gemv_half_nx_t<false, 4>(W, nw, X, ldx, cols, out, ldo);
  }
}

ANVIL_AVX2 uint64_t read_sum_avx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

}  // namespace anvil::cpu
