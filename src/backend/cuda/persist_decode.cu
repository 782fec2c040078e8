// The persistent decode kernel (opt-in: ANVIL_CUDA_PERSIST=1): one decode token of one sequence
// through every dense layer in one launch, one block per SM, for models whose matrices are all
// MLX q4 (one group size). Why: at batch 1 the per-kernel path pays every dependent step's launch,
// ramp and drain (qwen3-0.6b: ~27 us per layer for ~2 us of DRAM), and the memory system idles
// while the latency-bound ops (norms, rope, attention) run (qwen3-8b: 67 us per layer for 26 us of
// weights; docs/architecture.md "what the remaining batch-1 targets ask for").
//
// How:
// - Weights: every matrix is cut into units of 32 rows x kc columns (kc: 1024 where the sizes
//   allow it, else 512; at least 8 groups).
//   Block s owns a contiguous, balanced range of each matrix's units (the same formula on host
//   and device: units [s N / S, (s + 1) N / S)). Its producer warp copies them, in the order the
//   block will consume them, layer after layer, into a ring of shared-memory stages with
//   mbarrier transaction counts: three tensor-map copies per unit (cp.async.bulk.tensor: the
//   packed weights, the scales, the biases; copy_async 3, the default), or one cp.async.bulk per
//   row and part (0: 96 copies per unit, measured issue-bound), or 16-byte cp.async (1). Weights
//   never depend on activations, so the producer never waits for one: it runs ahead of the
//   consumers by up to the ring's depth (~180 KB per SM, ~24 MB over the device) through every
//   barrier, norm and attention below, with at most `inflight` units' copies outstanding (so
//   the consumers' own loads do not queue behind the whole ring). That is what keeps the memory
//   system busy where the per-kernel path lets it idle.
//   Copies still arriving at an SM delay its other loads, the barrier's fence included (session
//   30's trace: 1.0 us with one unit in flight, 2.1 with two, 5.6 with the whole ring). Pausing
//   the producer around phase boundaries made the fence fast (0.5 us) but not the layer (session
//   31: "quiet windows", removed; benchmarks.md).
// - Consumers (8 warps): for each phase (q/k/v, attention, o, gate/up, down) they wait for the
//   previous phase on a device-wide barrier (a counter per phase and layer; each block adds 1),
//   stage the phase's input once per block, then multiply their units from the ring: the
//   integer dot products of qgemv_int.cuh (int16 activations per 32-element piece, dp4a on the
//   raw nibbles), the planes stored piece-minor ([word][piece]) so 16 lanes reading 16 pieces hit
//   16 different bank groups.
// - Sums: a tile (32 rows) may be split over the K dimension between consecutive blocks. Each
//   block writes its part of a row to its own slot, part[slot][row] (slot = block - the block
//   owning the tile's first unit), and whoever reads the row sums its slots in slot order, so the
//   result does not depend on timing. The reader knows the slots from the same range formula.
// - Activations between phases never make a round trip through a separate kernel: every block
//   keeps the residual stream (bf16, [hidden]) in shared memory and updates it itself, identically,
//   from the summed o / down rows; the norms are computed by every block from its copy (the
//   staging of the q/k/v and gate/up inputs); SwiGLU is applied when the down projection's input
//   is staged. The attention phase is split into (kv head, split) items over the blocks, at
//   most one per block (at least 32 positions each): each item forms its q heads (q norm, RoPE
//   from a per-launch angle table) from the summed q/k/v rows, the item holding the current
//   position also its K row (k norm, RoPE) and V row, which it appends to the page; a half warp
//   reads each K/V row; the last split of a kv head to finish (a counter per kv head) merges the
//   splits into the attention output. The last layer's residual goes back to h, each block
//   writing a slice.
// - Arithmetic per op is that of the per-kernel path (qgemv_int.cuh, rope_kv.cu, the decode
//   attention with an fp32 online softmax), with the same bf16 roundings between ops: the
//   mat-vec outputs, the residual sums, the norm outputs, q and k after RoPE, the SwiGLU product.
//   The order of fp32 sums differs, so results are close to, not equal to, the per-kernel path's
//   (CudaPersist.* bounds the difference).
//
// Invariants:
// - The producer has at most `inflight` units' copies outstanding (PersistArgs::inflight < stages).
// - All blocks are resident at once (cooperative launch, one block per SM): the barriers spin.
// - Each barrier counter gains exactly gridDim.x per launch; a launch reads the epoch (sync[0])
//   at its start and waits for (epoch + 1) * gridDim.x; block 0 bumps the epoch at its end, after
//   the last barrier, which every block has passed its start to reach.
// - The per-kv-head split counters are back at 0 when a launch ends (the merging block resets its
//   counter, before the fence that precedes its merged output).
// - Split-sum slots that a reader adds but no block writes (a block owning no unit, when a phase
//   has fewer units than blocks) hold 0: the host zeroes the part buffers once (persist_plan.h).
// - The producer issues, and the consumers consume, the same unit sequence; a stage is refilled
//   only after all 8 consumer warps have arrived on its empty barrier.
#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/mem_order.cuh"
#include "backend/cuda/persist_plan.h"
#include "backend/cuda/qgemv_int.cuh"

namespace anvil::cuda {
namespace {

constexpr int kCW = 8;             // consumer warps
constexpr int kCT = kCW * 32;      // consumer threads (named barrier 1)
constexpr int kNT = kCT + 32;      // + the producer warp
constexpr int kMaxStages = 32;
constexpr int kHead = 128;         // head_dim
constexpr int kMaxG = 4;           // query heads per kv head (register arrays: see the attention phase)
// K/V rows per lane per pass of the attention loop: 2 by default (no register spills; on the
// H100, qwen3-8b q4g64 308 tok/s against 290 with 4, whose 8 loads per lane in flight at once cost
// a few spilled registers). ANVIL_PERSIST_ATTN_ROWS=4 at build time for measuring.
#ifndef ANVIL_PERSIST_ATTN_ROWS
#define ANVIL_PERSIST_ATTN_ROWS 2
#endif
constexpr int kAttnRows = ANVIL_PERSIST_ATTN_ROWS;
constexpr int kAttnPos = kCW * 2 * kAttnRows;  // positions per pass of an item (a warp: 2 kAttnRows)
using persist::kAttnMinPos;        // positions per (kv head, split) item at least (persist_plan.h)
constexpr int kPhases = 5;         // barriers per layer: after q/k/v, attention, o, gate/up, down


template <int N>
struct IntC {
  static constexpr int value = N;
};

// The consumer warps' barrier (the producer warp never joins it).
__device__ __forceinline__ void cbar() { asm volatile("bar.sync 1, %0;" ::"n"(kCT) : "memory"); }

// A phase's matrix as units: rows_v virtual rows (tiles of 32), K columns, U = K / kc units per tile.
struct Shape {
  int64_t rows_v;
  int K, U;
  __device__ __forceinline__ int64_t units() const { return rows_v / 32 * U; }
};

// Block s's units of a shape and the owner of a unit: persist_plan.h.
using persist::first_unit;
using persist::owner_of;

// Row r (0..31) of tile t of phase ph: its matrix m (the PersistLayer::w index: q, k, v, o, gate,
// up, down) and the row in it. A q/k/v tile's rows run over q, then k, then v; a gate/up tile holds
// 16 gate rows, then the same 16 up rows.
__device__ __forceinline__ void unit_row(int ph, int64_t t, int r, int QD, int KD, int& m, int64_t& row) {
  if (ph == 0) {
    const int64_t vr = t * 32 + r;
    m = vr < QD ? 0 : vr < QD + KD ? 1 : 2;
    row = m == 0 ? vr : m == 1 ? vr - QD : vr - QD - KD;
  } else if (ph == 1) {
    m = 3, row = t * 32 + r;
  } else if (ph == 2) {
    m = r < 16 ? 4 : 5, row = t * 16 + (r & 15);
  } else {
    m = 6, row = t * 32 + r;
  }
}

// Block s's units of phase ph. Gate/up with at least one tile per block (gu_whole) goes by whole
// tiles (at most one tile of imbalance), so each tile's rows are summed in one block, which applies
// SwiGLU itself; every other phase by balanced unit ranges, a tile's K split over blocks as needed.
__device__ __forceinline__ void unit_range(const Shape& sh, int ph, bool gu_whole, int S, int s, int64_t& u0,
                                           int64_t& u1) {
  if (ph == 2 && gu_whole) {
    const int64_t T = sh.rows_v / 32;
    u0 = first_unit(T, S, s) * sh.U, u1 = first_unit(T, S, s + 1) * sh.U;
  } else {
    const int64_t N = sh.units();
    u0 = first_unit(N, S, s), u1 = first_unit(N, S, s + 1);
  }
}

// A position in a block's unit sequence (layer, phase, unit, its tile and column chunk).
struct Cursor {
  int l = 0, ph = -1;
  int64_t u = 0, u1 = 0, t = 0;
  int c = 0;
};
// Steps k to the next unit of block s; false past the last layer's.
__device__ __forceinline__ bool cursor_next(Cursor& k, const Shape* shp, bool gu_whole, int S, int s, int n_layers) {
  if (k.ph >= 0 && k.u + 1 < k.u1) {
    ++k.u;
    if (++k.c == shp[k.ph].U) k.c = 0, ++k.t;
    return true;
  }
  for (;;) {
    if (++k.ph == 4) {
      k.ph = 0;
      if (++k.l >= n_layers) return false;
    }
    int64_t u0, u1;
    unit_range(shp[k.ph], k.ph, gu_whole, S, s, u0, u1);
    if (u0 < u1) {
      k.u = u0, k.u1 = u1, k.t = u0 / shp[k.ph].U, k.c = int(u0 - k.t * shp[k.ph].U);
      return true;
    }
  }
}

// The sum of a virtual row's parts (slots in order; up to 4 slots' loads in flight at once).
__device__ __forceinline__ float row_sum(const float* part, const Shape& sh, int S, int64_t vr) {
  const int64_t N = sh.units(), t = vr / 32;
  const int s0 = owner_of(N, S, t * sh.U), n = owner_of(N, S, (t + 1) * sh.U - 1) - s0 + 1;
  float x[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = k < n ? __ldcg(part + k * sh.rows_v + vr) : 0.0f;
  float v = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (k < n) v += x[k];
  for (int k = 4; k < n; ++k) v += __ldcg(part + k * sh.rows_v + vr);
  return v;
}
// The sums of 8 consecutive virtual rows vr0.. (vr0 % 8 == 0: one tile, one half of a gate/up
// tile), the same order of additions as row_sum; one pair of 16-byte loads per slot, the first 4
// slots' loads in flight at once.
__device__ __forceinline__ void row_sum8(const float* part, const Shape& sh, int S, int64_t vr0, float (&f)[8]) {
  constexpr int KF = 4;
  const int64_t N = sh.units(), t = vr0 / 32;
  const int s0 = owner_of(N, S, t * sh.U), n = owner_of(N, S, (t + 1) * sh.U - 1) - s0 + 1;
  float4 x[KF], y[KF];
#pragma unroll
  for (int k = 0; k < KF; ++k) {
    if (k < n) {
      const float4* p = reinterpret_cast<const float4*>(part + k * sh.rows_v + vr0);
      x[k] = __ldcg(p), y[k] = __ldcg(p + 1);
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = 0.0f;
  auto add = [&](const float4& a, const float4& b) {
    f[0] += a.x, f[1] += a.y, f[2] += a.z, f[3] += a.w, f[4] += b.x, f[5] += b.y, f[6] += b.z, f[7] += b.w;
  };
#pragma unroll
  for (int k = 0; k < KF; ++k)
    if (k < n) add(x[k], y[k]);
  for (int k = KF; k < n; ++k) {
    const float4* p = reinterpret_cast<const float4*>(part + k * sh.rows_v + vr0);
    add(__ldcg(p), __ldcg(p + 1));
  }
}
__device__ __forceinline__ float bf(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// qgemv_int.cuh's quantization with the planes stored piece-minor: word j of piece P at
// xi[j * NP + P].
__device__ __forceinline__ void stage_piece(const float (&f)[8], bool valid, int P, int j, int NP, uint4* xi,
                                            float2* xf) {
  tc::int_quantize_piece(f, valid, j, xi + j * NP + P, xf + P);
}

struct Smem {
  uint64_t* full;   // [kMaxStages]
  uint64_t* empty;  // [kMaxStages]
  float* red;       // [64]
  float2* rope;     // [64]: cos, sin of pos * inv_freq[i] (the same for every layer)
  __nv_bfloat16* res;  // [hidden]
  uint8_t* xbuf;       // planes, or the attention scratch
  uint8_t* ring;
};

__device__ __forceinline__ float csum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  cbar();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kCW; ++w) s += red[w];
  cbar();
  return s;
}

// ANVIL_CUDA_PERSIST_TRACE: the global timer at mark e of phase k of layer l, per block
// ([layer][phase][kPersistMarks][block]). Marks: 0 phase start, 1 input staged, 2 phase done (the
// arrival, before its fence), 3 attention: its positions done, 4 the arrival's atomic returned,
// 5 norm phases: split sums added and the RMS known, 6 the block's first unit in the ring, 7 its
// last unit in the ring.
__device__ __forceinline__ void tmark(const PersistArgs& a, int l, int k, int e) {
  if (a.trace && threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    a.trace[((size_t(l) * kPhases + k) * kPersistMarks + e) * gridDim.x + blockIdx.x] = t;
  }
}

// The device-wide barrier of phase index i: arrive (after this block's writes), or wait.
__device__ __forceinline__ void bar_arrive(unsigned* bars, int i, const PersistArgs& a) {
  cbar();
  tmark(a, i / kPhases, i % kPhases, 2);
  if (threadIdx.x == 0) {
    if (a.red_release) {
      red_add1_release(bars + i);
    } else {
      __threadfence();
      const unsigned old = atomicAdd(bars + i, 1u);
      if (a.trace) {
        asm volatile("" ::"r"(old));  // (the mark after the atomic's round trip)
        tmark(a, i / kPhases, i % kPhases, 4);
      }
    }
  }
}
// (Marks the start of phase i + 1.)
__device__ __forceinline__ void bar_wait(unsigned* bars, int i, unsigned target, const PersistArgs& a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    while (int(ld_acquire32(bars + i) - target) < 0) {
    }
  }
#endif
  tmark(a, (i + 1) / kPhases, (i + 1) % kPhases, 0);
  cbar();
}

// q/k/v rows (virtual rows of the q/k/v shape) of one head through its RMSNorm and RoPE (rope_kv.cu's
// arithmetic; lane holds pairs (i, i + 64), i = lane, lane + 32); out: the bf16-rounded results.
__device__ __forceinline__ void head_norm_rope(const float* part, const Shape& sh, int S, int64_t vr0,
                                               const __nv_bfloat16* nw, float eps, const float2* rope,
                                               float (&out)[4]) {
  const int lane = threadIdx.x & 31;
  float a[2], c[2], ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = lane + 32 * j;
    a[j] = bf(row_sum(part, sh, S, vr0 + i));
    c[j] = bf(row_sum(part, sh, S, vr0 + i + kHead / 2));
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) ss += a[j] * a[j] + c[j] * c[j];
  float inv = 1.0f;
  if (nw) inv = rsqrtf(warp_sum(ss) / float(kHead) + eps);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int i = lane + 32 * j;
    const float fc = rope[i].x, fs = rope[i].y;
    float x0 = a[j], x1 = c[j];
    if (nw) {
      x0 = x0 * inv * __bfloat162float(nw[i]);
      x1 = x1 * inv * __bfloat162float(nw[i + kHead / 2]);
    }
    out[2 * j] = bf(x0 * fc - x1 * fs);      // element i
    out[2 * j + 1] = bf(x1 * fc + x0 * fs);  // element i + 64
  }
}

__global__ void __launch_bounds__(kNT, 1) persist_decode_kernel(PersistArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) uint8_t smem_raw[];
  const int S = gridDim.x, s = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;
  Smem sm;
  sm.full = reinterpret_cast<uint64_t*>(smem_raw);
  sm.empty = sm.full + kMaxStages;
  sm.red = reinterpret_cast<float*>(sm.empty + kMaxStages);
  sm.rope = reinterpret_cast<float2*>(sm.red + 64);
  sm.res = reinterpret_cast<__nv_bfloat16*>(smem_raw + a.off_res);
  sm.xbuf = smem_raw + a.off_x;
  sm.ring = smem_raw + a.off_ring;
  const int NS = a.stages, kc = a.kc, g = a.group;
  const int H = a.hidden, QD = a.q_dim, KD = a.kv_dim, F = a.ffn;
  const Shape shp[4] = {{int64_t(QD + 2 * KD), H, H / kc}, {int64_t(H), QD, QD / kc}, {2 * int64_t(F), H, H / kc},
                        {int64_t(H), F, F / kc}};
  const bool gu_whole = F / 16 >= S;             // gate/up by whole tiles (unit_range)
  const int ng = kc / g;                         // groups per unit row
  const unsigned row_w = unsigned(kc / 2);       // bytes of packed weights per unit row
  const unsigned row_s = unsigned(ng * 2);       // bytes of scales (and of biases) per unit row
  if (tid == 0) {
    for (int i = 0; i < NS; ++i) mbar_init(sm.full + i, a.copy_async == 1 ? 32 : 1), mbar_init(sm.empty + i, kCW);
    mbar_init_fence();
  }
  __syncthreads();

  if (warp == kCW) {
    // ---- the producer: every unit of every layer, in consumption order ----
    // Ring position: stage st of lap par (parity); a stage is refilled from the second lap on.
    int st = 0;
    uint32_t par = 0;
    bool lapped = false;
    int64_t issued = 0;
    const unsigned tx = 32u * (row_w + 2 * row_s);
    // With tensor maps, a second cursor l2_ahead units ahead pulls units into L2 (no shared memory,
    // no barrier), so the memory system keeps streaming while the ring is full during the
    // consumers' barriers, staging and attention.
    // pf_idx: the place in the block's unit sequence of the unit at pf (the next one to pull);
    // issued: of the unit being copied. Every unit up to issued + l2_ahead is pulled into L2 before
    // its copy.
    Cursor pf;
    bool pf_ok = a.copy_async == 3 && a.l2_ahead > 0 &&
                 cursor_next(pf, shp, gu_whole, S, s, a.n_layers);
    int64_t pf_idx = 0;
    auto pull_l2 = [&]() {  // pf's unit into L2, then pf to the next unit
      if (lane == 0) {
        const uint8_t* tm = static_cast<const uint8_t*>(a.tmaps) + size_t(pf.l) * 21 * 128;
        const int x_w = pf.c * (kc / 8), x_s = pf.c * ng;
        for (int h = 0; h < (pf.ph == 2 ? 2 : 1); ++h) {  // (gate/up: the gate box, then the up box)
          int m;
          int64_t row;
          unit_row(pf.ph, pf.t, 16 * h, QD, KD, m, row);
          const uint8_t* mt = tm + m * 3 * 128;
          tensor_prefetch_l2(mt, x_w, int(row));
          tensor_prefetch_l2(mt + 128, x_s, int(row));
          tensor_prefetch_l2(mt + 256, x_s, int(row));
        }
      }
      pf_ok = cursor_next(pf, shp, gu_whole, S, s, a.n_layers), ++pf_idx;
    };
    for (int l = 0; l < a.n_layers; ++l) {
      const PersistLayer& L = a.layers[l];
      for (int ph = 0; ph < 4; ++ph) {
        const Shape sh = shp[ph];
        int64_t u0, u1;
        unit_range(sh, ph, gu_whole, S, s, u0, u1);
        // (t, c) stepped, not divided out of u: 64-bit divisions per unit cost more than the unit.
        int64_t t = u0 / sh.U;
        int c = int(u0 - t * sh.U);
        for (int64_t u = u0; u < u1; ++u, ++c == sh.U ? (c = 0, ++t) : 0) {
          // (units at or before this one are copied without the L2 step)
          while (pf_ok && pf_idx <= issued) pf_ok = cursor_next(pf, shp, gu_whole, S, s, a.n_layers), ++pf_idx;
          while (pf_ok && pf_idx <= issued + a.l2_ahead) pull_l2();
          if (lapped) mbar_wait(sm.empty + st, par ^ 1u);  // the consumers' release of the previous lap
          // At most `inflight` units in flight: wait until the unit that many back has landed. The
          // memory system keeps streaming with a few tens of KB per SM in flight; a whole ring
          // in flight (~24 MB over the device) queues every other load behind ~8 us of copies,
          // and the consumers' latency-bound phases (staging, attention) pay that on each round trip.
          if (a.inflight > 0 && issued >= a.inflight) {
            const int sd = st - a.inflight;
            mbar_wait(sm.full + (sd < 0 ? sd + NS : sd), sd < 0 ? par ^ 1u : par);
          }
          ++issued;
          auto src = [&](int r, int& m, int64_t& row) { unit_row(ph, t, r, QD, KD, m, row); };
          const int K = sh.K;
          uint8_t* dst = sm.ring + size_t(st) * a.stage_bytes;
          if (a.copy_async == 3) {
            // Tensor-map boxes: 3 copies per unit (6 for gate/up: 16 rows of each), from lane 0.
            if (lane == 0) {
              mbar_expect_tx(sm.full + st, tx);
              const uint8_t* tm = static_cast<const uint8_t*>(a.tmaps) + size_t(l) * 21 * 128;
              const int x_w = c * (kc / 8), x_s = c * ng;  // box origins: u32 words, bf16 groups
              if (ph == 2) {
                for (int h = 0; h < 2; ++h) {
                  const uint8_t* mt = tm + (4 + h) * 3 * 128;
                  const int y = int(t * 16);
                  tensor_copy(dst + h * 16 * row_w, mt, x_w, y, sm.full + st);
                  tensor_copy(dst + 32 * row_w + h * 16 * row_s, mt + 128, x_s, y, sm.full + st);
                  tensor_copy(dst + 32 * row_w + 32 * row_s + h * 16 * row_s, mt + 256, x_s, y, sm.full + st);
                }
              } else {
                int m;
                int64_t row;
                src(0, m, row);
                const uint8_t* mt = tm + m * 3 * 128;
                tensor_copy(dst, mt, x_w, int(row), sm.full + st);
                tensor_copy(dst + 32 * row_w, mt + 128, x_s, int(row), sm.full + st);
                tensor_copy(dst + 32 * row_w + 32 * row_s, mt + 256, x_s, int(row), sm.full + st);
              }
            }
            __syncwarp();
          } else if (a.copy_async != 1) {
            // One bulk copy per row and part (weights, scales, biases), lane r copying row r.
            if (lane == 0) mbar_expect_tx(sm.full + st, tx);
            __syncwarp();
            int m;
            int64_t row;
            src(lane, m, row);
            const uint8_t* wd = static_cast<const uint8_t*>(L.w[m][0]) + row * (K / 2) + int64_t(c) * row_w;
            const uint8_t* ws = static_cast<const uint8_t*>(L.w[m][1]) + (row * (K / g) + int64_t(c) * ng) * 2;
            const uint8_t* wb = static_cast<const uint8_t*>(L.w[m][2]) + (row * (K / g) + int64_t(c) * ng) * 2;
            bulk_copy(dst + lane * row_w, wd, row_w, sm.full + st);
            bulk_copy(dst + 32 * row_w + lane * row_s, ws, row_s, sm.full + st);
            bulk_copy(dst + 32 * row_w + 32 * row_s + lane * row_s, wb, row_s, sm.full + st);
          } else {
            // 16-byte cp.async copies over the lanes; each lane arrives on the full barrier once
            // its own copies have landed.
            const int cw = int(row_w / 16), cs = int(row_s / 16);
            for (int i = lane; i < 32 * cw; i += 32) {
              const int r = i / cw, o = i % cw;
              int m;
              int64_t row;
              src(r, m, row);
              async_copy16(dst + r * row_w + o * 16,
                           static_cast<const uint8_t*>(L.w[m][0]) + row * (K / 2) + int64_t(c) * row_w + o * 16);
            }
            for (int i = lane; i < 2 * 32 * cs; i += 32) {
              const int which = i / (32 * cs), r = (i / cs) % 32, o = i % cs;
              int m;
              int64_t row;
              src(r, m, row);
              async_copy16(dst + 32 * row_w + which * 32 * row_s + r * row_s + o * 16,
                           static_cast<const uint8_t*>(L.w[m][1 + which]) + (row * (K / g) + int64_t(c) * ng) * 2 +
                               o * 16);
            }
            async_arrive(sm.full + st);
          }
          if (++st == NS) st = 0, par ^= 1u, lapped = true;
        }
      }
    }
    if (a.copy_async == 1) asm volatile("cp.async.wait_all;" ::: "memory");
    return;
  }

  // ---- the consumers ----
  unsigned* bars = a.sync + 1 + a.n_kv;
  unsigned* head_cnt = a.sync + 1;
  __shared__ unsigned epoch_s;
  __shared__ int flag_s;
  if (tid == 0) epoch_s = __ldcg(a.sync);
  cbar();
  const unsigned target = (epoch_s + 1u) * unsigned(S);
  const int pos = __ldcg(a.b.pos), seq = __ldcg(a.b.seq);
  const int ctx = pos + 1;
  const int G = a.n_heads / a.n_kv;
  // RoPE's angles once per launch (rope_kv.cu's arithmetic: double-precision sincos).
  if (tid < kHead / 2) {
    double sn, cs;
    sincos(double(pos) * double(a.inv_freq[tid]), &sn, &cs);
    sm.rope[tid] = make_float2(float(cs), float(sn));
  }
  cbar();
  // A phase's input staged (its trace mark), and its arrival at barrier i.
  auto staged = [&](int l, int k) { tmark(a, l, k, 1); };
  auto arrive = [&](int i) { bar_arrive(bars, i, a); };
  int st = 0;  // the ring position, as the producer's
  uint32_t par = 0;

  // Stage x for a phase: K values as int16 planes, 8 consecutive ones at a time: `load(i0)` fetches
  // 16 bytes for them (the loads of up to 4 passes per thread issued before any is used: each pass
  // waiting for its own load cost one L2 round trip, ~1 us, per 2,048 values), `conv(i0, raw, f)`
  // makes the 8 values.
  uint4* xi = reinterpret_cast<uint4*>(sm.xbuf);
  auto stage_x = [&](int K, auto&& load, auto&& conv, auto nb) {
    const int NP = K / 32, n8 = K / 8;
    float2* xf = reinterpret_cast<float2*>(sm.xbuf + size_t(K) * 2);
    using Raw = decltype(load(0));
    constexpr int NB = decltype(nb)::value;  // passes in flight
    for (int base = 0; base < n8; base += NB * kCT) {
      Raw raw[NB];
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        const int idx = base + j * kCT + tid;
        raw[j] = idx < n8 ? load(idx * 8) : Raw{};
      }
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        const int idx = base + j * kCT + tid;
        if (base + j * kCT >= n8) break;  // (uniform over the block)
        const bool valid = idx < n8;
        float f[8];
        if (valid) conv(idx * 8, raw[j], f);
        else
#pragma unroll
          for (int e = 0; e < 8; ++e) f[e] = 0.0f;
        stage_piece(f, valid, idx >> 2, idx & 3, NP, xi, xf);
      }
    }
    cbar();
  };
  // A norm's weights (bf16 [n], read-only) pulled into L1 before a barrier wait, so that the
  // staging's __ldg of them after the residual pass hits L1 instead of making an L2 round trip.
  auto prefetch_l1 = [&](const void* w, int n) {
    for (int i = tid * 64; i < n; i += kCT * 64)
      asm volatile("prefetch.global.L1 [%0];" ::"l"(static_cast<const __nv_bfloat16*>(w) + i));
  };
  auto unpack8 = [](const uint4& v, float (&f)[8]) {
    f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
    f[4] = bf16_lo(v.z), f[5] = bf16_hi(v.z), f[6] = bf16_lo(v.w), f[7] = bf16_hi(v.w);
  };
  // res = bf16(res + bf16(sum of the rows of `part`)) (or res = h for the first layer), then the
  // planes of bf16(res * rsqrt(mean(res^2) + eps) * w).
  auto stage_norm = [&](const float* part, const Shape* sh, const __nv_bfloat16* w, int l, int k) {
    float ss = 0.0f;
    // (One pass's loads at a time: two passes' in flight at once spilled registers, also with 2
    // slots each instead of 4.)
    for (int i0 = tid * 8; i0 < H; i0 += kCT * 8) {
      float f[8];
      if (!part) unpack8(__ldcg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.h) + i0)), f);
      else {
        row_sum8(part, *sh, S, i0, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = bf(__bfloat162float(sm.res[i0 + e]) + bf(f[e]));
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sm.res[i0 + e] = __float2bfloat16_rn(f[e]), ss += f[e] * f[e];
    }
    const float inv = rsqrtf(csum(ss, sm.red) / float(H) + a.eps);  // (csum's barriers order res)
    tmark(a, l, k, 5);
    stage_x(
        H, [&](int i0) { return __ldg(reinterpret_cast<const uint4*>(w + i0)); },
        [&](int i0, const uint4& wv, float (&f)[8]) {
          float wf[8];
          unpack8(wv, wf);
#pragma unroll
          for (int e = 0; e < 8; ++e) f[e] = bf(__bfloat162float(sm.res[i0 + e]) * inv * wf[e]);
        },
        IntC<4>{});
  };
  // The block's units of phase ph: the ring's stages through the integer dot products; parts to `part`.
  auto matvec = [&](int ph, float* part, int l, int k) {
    const Shape sh = shp[ph];
    const int64_t N = sh.units();
    int64_t u0, u1;
    unit_range(sh, ph, gu_whole, S, s, u0, u1);
    const int PR = kc / 32, NP = sh.K / 32;
    const float2* xf = reinterpret_cast<const float2*>(sm.xbuf + size_t(sh.K) * 2);
    const int half = lane >> 4, li = lane & 15;
    const int rA = 4 * warp + half, rB = rA + 2;
    float acc0 = 0.0f, acc1 = 0.0f;
    int64_t cur = -1;
    auto flush = [&]() {
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) {
        acc0 += __shfl_xor_sync(0xffffffffu, acc0, o);
        acc1 += __shfl_xor_sync(0xffffffffu, acc1, o);
      }
      if (ph == 2 && gu_whole) {
        // The tile's 16 gate and 16 up rows are whole here: SwiGLU, bf16 into act.
        float* gs = sm.red + 32;
        if (li == 0) gs[rA] = acc0, gs[rB] = acc1;
        cbar();
        if (tid < 16) {
          const float gv = bf(gs[tid]), uv = bf(gs[16 + tid]);
          const float y = gv / (1.0f + __expf(-gv)) * uv;
          static_cast<__nv_bfloat16*>(a.act)[cur * 16 + tid] = __float2bfloat16_rn(y);
        }
        cbar();
      } else if (li == 0) {
        const int slot = s - owner_of(N, S, cur * sh.U);
        part[slot * sh.rows_v + cur * 32 + rA] = acc0;
        part[slot * sh.rows_v + cur * 32 + rB] = acc1;
      }
      acc0 = acc1 = 0.0f;
    };
    int64_t t = u0 / sh.U;
    int c = int(u0 - t * sh.U);
    for (int64_t u = u0; u < u1; ++u, ++c == sh.U ? (c = 0, ++t) : 0) {
      if (t != cur) {
        if (cur >= 0) flush();
        cur = t;
      }
      mbar_wait(sm.full + st, par);
      if (u == u0) tmark(a, l, k, 6);
      if (u == u1 - 1) tmark(a, l, k, 7);
      const uint8_t* stage = sm.ring + size_t(st) * a.stage_bytes;
      const uint4* wq = reinterpret_cast<const uint4*>(stage);
      const __nv_bfloat16* sc = reinterpret_cast<const __nv_bfloat16*>(stage + 32 * (kc / 2));
      const __nv_bfloat16* bi = sc + 32 * ng;
      for (int p = li; p < PR; p += 16) {
        const int P = c * PR + p;
        const uint4 x[4] = {xi[P], xi[NP + P], xi[2 * NP + P], xi[3 * NP + P]};
        const float2 xd = xf[P];
        const int gi = (p * 32) / g;
        const float sa = __bfloat162float(sc[rA * ng + gi]), ba = __bfloat162float(bi[rA * ng + gi]);
        const float sb = __bfloat162float(sc[rB * ng + gi]), bb = __bfloat162float(bi[rB * ng + gi]);
        acc0 = fmaf(ba, xd.y, fmaf(sa, xd.x * float(tc::int_piece_isum16(wq[rA * PR + p], x)), acc0));
        acc1 = fmaf(bb, xd.y, fmaf(sb, xd.x * float(tc::int_piece_isum16(wq[rB * PR + p], x)), acc1));
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(sm.empty + st);
      if (++st == NS) st = 0, par ^= 1u;
    }
    if (cur >= 0) flush();
  };

  for (int l = 0; l < a.n_layers; ++l) {
    const PersistLayer& L = a.layers[l];
    float* const p_qkv = a.part[0];
    // ---- q/k/v ----
    prefetch_l1(L.attn_norm, H);
    if (l > 0) bar_wait(bars, (l - 1) * kPhases + 4, target, a);
    else tmark(a, 0, 0, 0);
    stage_norm(l == 0 ? nullptr : a.part[3], &shp[3], static_cast<const __nv_bfloat16*>(L.attn_norm), l, 0);
    staged(l, 0);
    matvec(0, p_qkv, l, 0);
    arrive(l * kPhases + 0);

    // ---- attention: items (kv head, split) over the blocks ----
    const persist::AttnSplits spl = persist::attn_splits(ctx, a.max_split, kAttnMinPos);
    const int nsplit = spl.n, chunk = spl.chunk;
    {
      // While the other blocks finish q/k/v: this block's K and V rows of earlier positions into
      // L2 (they do not depend on this step), so that its attention items read them from there.
      const __nv_bfloat16* kvb = static_cast<const __nv_bfloat16*>(a.kv.base);
      const int32_t* ptab = a.b.page_table + int64_t(seq) * a.b.max_pages;
      const int64_t vstride = int64_t(a.kv.n_kv_heads) * a.kv.page_size * kHead;
      for (int item = s; a.kv_prefetch && item < a.n_kv * nsplit; item += S) {
        const int kvh = item / nsplit, p0 = (item % nsplit) * chunk, p1 = min(pos, p0 + chunk);
        for (int i = tid; i < 4 * (p1 - p0); i += kCT) {
          const int p = p0 + (i >> 2), part = i & 3;
          const int64_t krow = kv_row(ptab[p / a.kv.page_size], l, 0, kvh, p % a.kv.page_size, a.kv.n_layers,
                                      a.kv.n_kv_heads, a.kv.page_size, kHead);
          const __nv_bfloat16* line = kvb + krow + (part >> 1) * vstride + (part & 1) * 64;
          asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
      }
    }
    if (L.q_norm) prefetch_l1(L.q_norm, kHead);  // (the items' q and k norms: 256 bytes each)
    if (L.k_norm) prefetch_l1(L.k_norm, kHead);
    bar_wait(bars, l * kPhases + 0, target, a);
    // Register arrays sized for GM >= G query heads per kv head (2 or 4). With 8 the kernel did not
    // fit 168 registers (9 warps of one block: 3 per SM partition, so at most 168 per thread).
    auto attention = [&](auto gm) {
      constexpr int GM = decltype(gm)::value;
      {
        float* qs = reinterpret_cast<float*>(sm.xbuf);          // [G][128]
        float* wm = qs + kMaxG * kHead;                         // [kCW][G]: running max
        float* wl = wm + kCW * kMaxG;                           // [kCW][G]: running sum
        float* wacc = wl + kCW * kMaxG;                         // [kCW][G][128]
        __nv_bfloat16* knew = reinterpret_cast<__nv_bfloat16*>(wacc + kCW * kMaxG * kHead);  // [2][128]: K, V appended
        const int64_t vstride = int64_t(a.kv.n_kv_heads) * a.kv.page_size * kHead;  // K row -> V row
        __nv_bfloat16* kvb = static_cast<__nv_bfloat16*>(a.kv.base);
        const int32_t* ptab = a.b.page_table + int64_t(seq) * a.b.max_pages;
        for (int item = s; item < a.n_kv * nsplit; item += S) {
          const int kvh = item / nsplit, sp = item % nsplit;
          const int p0 = sp * chunk, p1 = min(ctx, p0 + chunk);
          const bool last = sp == nsplit - 1;
          // Positions: a half warp per K/V row (lane li holds dims 8 li .. 8 li + 7 of q, K, V), each
          // lane kAttnRows rows per pass (positions c0 + half + 2 i), the pass's K and V loads all in
          // flight at once; an fp32 online softmax per warp, the two halves' sums joined at the end.
          // The first pass's rows are loaded before q is formed: the rows of earlier positions do not
          // depend on this step, and the current position's row, which this block appends below, is
          // taken from shared memory instead. (Session 30, H100: the item's positions 5.3 -> 4.5 us
          // on qwen3-8b, its q 4.7 -> 5.4; qwen3-0.6b 1,083 -> 1,100 tok/s. Loading each later pass
          // before the previous one is used, too, spilled registers.)
          const int half = lane >> 4, li = lane & 15;
          struct Pass {
            uint4 k[kAttnRows], v[kAttnRows];
            bool ok[kAttnRows];
          };
          auto load_pass = [&](Pass& ps, int c0, bool skip_cur) {
#pragma unroll
            for (int i = 0; i < kAttnRows; ++i) {
              const int p = c0 + half + 2 * i;
              ps.ok[i] = p < p1;
              ps.k[i] = ps.v[i] = make_uint4(0, 0, 0, 0);
              if (ps.ok[i] && !(skip_cur && p == pos)) {
                const int64_t krow = kv_row(ptab[p / a.kv.page_size], l, 0, kvh, p % a.kv.page_size, a.kv.n_layers,
                                            a.kv.n_kv_heads, a.kv.page_size, kHead);
                ps.k[i] = __ldcg(reinterpret_cast<const uint4*>(kvb + krow) + li);
                ps.v[i] = __ldcg(reinterpret_cast<const uint4*>(kvb + krow + vstride) + li);
              }
            }
          };
          Pass cur;
          int c0 = p0 + warp * (2 * kAttnRows);
          load_pass(cur, c0, true);
          for (int task = warp; task < G + (last ? 2 : 0); task += kCW) {
            float v[4];
            if (task < G) {
              const int h = kvh * G + task;
              head_norm_rope(p_qkv, shp[0], S, int64_t(h) * kHead, static_cast<const __nv_bfloat16*>(L.q_norm),
                                   a.eps, sm.rope, v);
              qs[task * kHead + lane] = v[0], qs[task * kHead + lane + 64] = v[1];
              qs[task * kHead + lane + 32] = v[2], qs[task * kHead + lane + 96] = v[3];
            } else {
              const int64_t page = ptab[pos / a.kv.page_size];
              __nv_bfloat16* dst =
                  kvb + kv_row(page, l, task - G, kvh, pos % a.kv.page_size, a.kv.n_layers, a.kv.n_kv_heads,
                               a.kv.page_size, kHead);
              if (task == G) {
                head_norm_rope(p_qkv, shp[0], S, QD + int64_t(kvh) * kHead,
                                     static_cast<const __nv_bfloat16*>(L.k_norm), a.eps, sm.rope, v);
                const int o4[4] = {lane, lane + 64, lane + 32, lane + 96};
#pragma unroll
                for (int q = 0; q < 4; ++q) dst[o4[q]] = knew[o4[q]] = __float2bfloat16_rn(v[q]);
              } else {
                for (int i = lane; i < kHead; i += 32)
                  dst[i] = knew[kHead + i] =
                      __float2bfloat16_rn(row_sum(p_qkv, shp[0], S, QD + KD + int64_t(kvh) * kHead + i));
              }
            }
          }
          cbar();  // qs, and the appended row (knew)
          if (item == s) staged(l, 1);
#pragma unroll
          for (int i = 0; i < kAttnRows; ++i)
            if (cur.ok[i] && c0 + half + 2 * i == pos) {
              cur.k[i] = reinterpret_cast<const uint4*>(knew)[li];
              cur.v[i] = reinterpret_cast<const uint4*>(knew + kHead)[li];
            }
          // (q read from shared memory where it is used: held in registers across the early loads,
          // it spilled registers)
          float m[GM], lsum[GM], acc[GM][8];
#pragma unroll
          for (int gq = 0; gq < GM; ++gq) {
            m[gq] = -INFINITY, lsum[gq] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[gq][e] = 0.0f;
          }
          for (; c0 < p1; c0 += kAttnPos) {
            const int cn = c0 + kAttnPos;
            const uint4(&kk)[kAttnRows] = cur.k;
            const uint4(&vv)[kAttnRows] = cur.v;
            const bool(&ok)[kAttnRows] = cur.ok;
#pragma unroll
            for (int gq = 0; gq < GM; ++gq) {
              if (gq >= G) continue;
              float sc[kAttnRows];
              const float4 q0 = reinterpret_cast<const float4*>(qs + gq * kHead + li * 8)[0];
              const float4 q1 = reinterpret_cast<const float4*>(qs + gq * kHead + li * 8)[1];
              const float qv[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
              for (int i = 0; i < kAttnRows; ++i) {
                const float kf[8] = {bf16_lo(kk[i].x), bf16_hi(kk[i].x), bf16_lo(kk[i].y), bf16_hi(kk[i].y),
                                     bf16_lo(kk[i].z), bf16_hi(kk[i].z), bf16_lo(kk[i].w), bf16_hi(kk[i].w)};
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) d = fmaf(qv[e], kf[e], d);
#pragma unroll
                for (int o = 1; o < 16; o <<= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
                sc[i] = ok[i] ? d * a.scale : -INFINITY;
              }
              // (row c0 of half 0 is always valid, so the warp's max is finite)
              float mx = m[gq];
#pragma unroll
              for (int i = 0; i < kAttnRows; ++i) mx = fmaxf(mx, sc[i]);
              mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
              const float corr = __expf(m[gq] - mx);
              float ps = 0.0f;
#pragma unroll
              for (int e = 0; e < 8; ++e) acc[gq][e] *= corr;
#pragma unroll
              for (int i = 0; i < kAttnRows; ++i) {
                const float pe = ok[i] ? __expf(sc[i] - mx) : 0.0f;
                ps += pe;
                const float vf[8] = {bf16_lo(vv[i].x), bf16_hi(vv[i].x), bf16_lo(vv[i].y), bf16_hi(vv[i].y),
                                     bf16_lo(vv[i].z), bf16_hi(vv[i].z), bf16_lo(vv[i].w), bf16_hi(vv[i].w)};
#pragma unroll
                for (int e = 0; e < 8; ++e) acc[gq][e] = fmaf(pe, vf[e], acc[gq][e]);
              }
              lsum[gq] = lsum[gq] * corr + ps;
              m[gq] = mx;
            }
            if (cn < p1) load_pass(cur, cn, false);
          }
#pragma unroll
          for (int gq = 0; gq < GM; ++gq) {
            lsum[gq] += __shfl_xor_sync(0xffffffffu, lsum[gq], 16);
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[gq][e] += __shfl_xor_sync(0xffffffffu, acc[gq][e], 16);
          }
            if (item == s) tmark(a, l, 1, 3);
#pragma unroll
          for (int gq = 0; gq < GM; ++gq) {
            if (gq >= G) continue;
            if (lane == 0) wm[warp * kMaxG + gq] = m[gq], wl[warp * kMaxG + gq] = lsum[gq];
            if (half == 0) {
              float4* w4 = reinterpret_cast<float4*>(wacc + (warp * kMaxG + gq) * kHead + 8 * li);
              w4[0] = make_float4(acc[gq][0], acc[gq][1], acc[gq][2], acc[gq][3]);
              w4[1] = make_float4(acc[gq][4], acc[gq][5], acc[gq][6], acc[gq][7]);
            }
          }
          cbar();
          // This item's part: (acc, max, sum) per q head, merged over the warps.
          float* ws = a.attn_ws + (int64_t(kvh) * a.max_split + sp) * G * (kHead + 2);
          for (int i = tid; i < G * kHead; i += kCT) {
            const int gq = i / kHead, d = i % kHead;
            float M = -INFINITY;
            for (int w = 0; w < kCW; ++w) M = fmaxf(M, wm[w * kMaxG + gq]);
            float Ls = 0.0f, A = 0.0f;
            for (int w = 0; w < kCW; ++w) {
              const float f = wl[w * kMaxG + gq] > 0.0f ? __expf(wm[w * kMaxG + gq] - M) : 0.0f;
              Ls += wl[w * kMaxG + gq] * f;
              A += wacc[(w * kMaxG + gq) * kHead + d] * f;
            }
            ws[gq * (kHead + 2) + d] = A;
            if (d == 0) ws[gq * (kHead + 2) + kHead] = M, ws[gq * (kHead + 2) + kHead + 1] = Ls;
          }
          cbar();
          if (tid == 0) {
            __threadfence();
            flag_s = atomicAdd(head_cnt + kvh, 1u) == unsigned(nsplit - 1);
          }
          cbar();
          if (flag_s) {
            // The counter back to 0 for the next layer, ordered by the fence before every later
            // store of this block.
            if (tid == 0) head_cnt[kvh] = 0;
            __threadfence();
            // The merge in few round trips: every split's (max, sum) into shared memory at once, each
            // q head's weights from them, then each output's accumulators, 16 splits per load batch.
            // (Loading max, sum and accumulator split after split per output took ~8 dependent
            // round trips: likely the attention phase's slowest block.)
            float* sM = wacc;                        // [nsplit][G] (wacc is free after the cbar above)
            float* sL = sM + 64 * kMaxG;             // [nsplit][G]
            float* fw = sL + 64 * kMaxG;             // [nsplit][G]: the weights
            float* sLs = fw + 64 * kMaxG;            // [G]
            const float* w0 = a.attn_ws + int64_t(kvh) * a.max_split * G * (kHead + 2);
            for (int i = tid; i < nsplit * G; i += kCT) {
              sM[i] = __ldcg(w0 + i * (kHead + 2) + kHead);
              sL[i] = __ldcg(w0 + i * (kHead + 2) + kHead + 1);
            }
            cbar();
            if (tid < G) {
              float M = -INFINITY;
              for (int k = 0; k < nsplit; ++k) M = fmaxf(M, sM[k * G + tid]);
              float Ls = 0.0f;
              for (int k = 0; k < nsplit; ++k) {
                const float lk = sL[k * G + tid];
                const float f = lk > 0.0f ? __expf(sM[k * G + tid] - M) : 0.0f;
                fw[k * G + tid] = f;
                Ls += lk * f;
              }
              sLs[tid] = Ls;
            }
            cbar();
            constexpr int kB = 16;
            for (int i = tid; i < G * kHead; i += kCT) {
              const int gq = i / kHead, d = i % kHead;
              float A = 0.0f;
              for (int k0 = 0; k0 < nsplit; k0 += kB) {
                float v[kB];
#pragma unroll
                for (int kk = 0; kk < kB; ++kk)
                  v[kk] = k0 + kk < nsplit ? __ldcg(w0 + ((k0 + kk) * G + gq) * (kHead + 2) + d) : 0.0f;
#pragma unroll
                for (int kk = 0; kk < kB; ++kk)
                  if (k0 + kk < nsplit) A += v[kk] * fw[(k0 + kk) * G + gq];
              }
              const int64_t o = (int64_t(kvh) * G + gq) * kHead + d;
              static_cast<__nv_bfloat16*>(a.attn)[o] = __float2bfloat16_rn(A / sLs[gq]);
            }
          }
          cbar();
        }
      }
    };
    if (G <= 2) attention(IntC<2>{});
    else attention(IntC<4>{});  // (the host takes at most 4 query heads per kv head)
    arrive(l * kPhases + 1);

    // ---- o ----
    bar_wait(bars, l * kPhases + 1, target, a);
    stage_x(
        QD, [&](int i0) { return __ldcg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.attn) + i0)); },
        [&](int, const uint4& v, float (&f)[8]) { unpack8(v, f); }, IntC<4>{});
    staged(l, 2);
    matvec(1, a.part[1], l, 2);
    arrive(l * kPhases + 2);

    // ---- gate/up (tile t: gate rows 16t.., then up rows 16t..) ----
    prefetch_l1(L.ffn_norm, H);
    bar_wait(bars, l * kPhases + 2, target, a);
    stage_norm(a.part[1], &shp[1], static_cast<const __nv_bfloat16*>(L.ffn_norm), l, 3);
    staged(l, 3);
    matvec(2, a.part[2], l, 3);
    arrive(l * kPhases + 3);

    // ---- down, on bf16(silu(bf16(gate)) * bf16(up)) ----
    bar_wait(bars, l * kPhases + 3, target, a);
    // (tiles split over blocks, !gu_whole: the gate and up rows summed here, SwiGLU applied)
    auto swiglu_rows = [&](int i0, float (&f)[8]) {
      const int64_t vr = int64_t(i0 / 16) * 32 + (i0 % 16);
      float gt[8], up[8];
      row_sum8(a.part[2], shp[2], S, vr, gt);
      row_sum8(a.part[2], shp[2], S, vr + 16, up);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float gv = bf(gt[e]);
        f[e] = bf(gv / (1.0f + __expf(-gv)) * bf(up[e]));
      }
    };
    // (8 passes' loads in flight where they are plain loads: qwen3-8b's 12,288 values in one round
    // trip instead of two; session 30, H100: qwen3-0.6b 1,085 -> 1,100 tok/s, qwen3-8b the same)
    auto act_load = [&](int i0) {
      return gu_whole ? __ldcg(reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.act) + i0))
                      : make_uint4(0, 0, 0, 0);
    };
    auto act_conv = [&](int i0, const uint4& v, float (&f)[8]) {
      if (gu_whole) return unpack8(v, f);
      swiglu_rows(i0, f);
    };
    if (gu_whole) stage_x(F, act_load, act_conv, IntC<8>{});
    else stage_x(F, act_load, act_conv, IntC<4>{});
    staged(l, 4);
    matvec(3, a.part[3], l, 4);
    arrive(l * kPhases + 4);
  }
  // The last residual, a slice per block.
  bar_wait(bars, (a.n_layers - 1) * kPhases + 4, target, a);
  for (int i = int(int64_t(s) * H / S) + tid; i < int(int64_t(s + 1) * H / S); i += kCT)
    static_cast<__nv_bfloat16*>(a.h)[i] =
        __float2bfloat16_rn(bf(__bfloat162float(sm.res[i]) + bf(row_sum(a.part[3], shp[3], S, i))));
  if (s == 0 && tid == 0) a.sync[0] = epoch_s + 1u;
#endif
}

}  // namespace

int persist_kc(int group) { return group * 8 > 512 ? group * 8 : 512; }

size_t persist_stage_bytes(int group, int kc) { return size_t(32) * (kc / 2 + 2 * (kc / group) * 2); }

size_t persist_attn_ws_floats(int n_kv, int max_split, int G) { return size_t(n_kv) * max_split * G * (kHead + 2); }

size_t persist_sync_words(int n_kv, int n_layers) { return 1 + size_t(n_kv) + size_t(kPhases) * n_layers; }

int64_t persist_max_parts(int64_t rows_v, int K, int kc, int S) { return persist::max_parts(rows_v, K / kc, S); }

bool persist_layout(PersistArgs& a, size_t smem_limit) {
  auto up16 = [](size_t b) { return (b + 127) / 128 * 128; };
  const int G = a.n_heads / a.n_kv;
  const size_t head = up16(2 * kMaxStages * 8 + 64 * 4 + kHead / 2 * 8);
  const size_t res = up16(size_t(a.hidden) * 2);
  int maxK = a.hidden > a.q_dim ? a.hidden : a.q_dim;
  if (a.ffn > maxK) maxK = a.ffn;
  size_t xb = tc::int_x_bytes(maxK);
  const size_t attn = (size_t(kMaxG) * kHead + 2 * kCW * kMaxG + size_t(kCW) * kMaxG * kHead) * 4 + 2 * kHead * 2;
  (void)G;
  if (attn > xb) xb = attn;
  xb = up16(xb);
  a.off_res = int(head), a.off_x = int(head + res), a.off_ring = int(head + res + xb);
  a.stage_bytes = int(persist_stage_bytes(a.group, a.kc));
  const size_t fixed = head + res + xb;
  if (smem_limit <= fixed) return false;
  const int stages = int((smem_limit - fixed) / size_t(a.stage_bytes));
  a.stages = stages > kMaxStages ? kMaxStages : stages;
  a.smem_bytes = fixed + size_t(a.stages) * a.stage_bytes;
  return a.stages >= 4;
}

// The kernel's dynamic shared-memory limit, only ever raised (to the largest plan's), so that it is
// set once per plan rather than per launched token, and a smaller plan never lowers it under a larger.
static cudaError_t allow_smem(size_t bytes) {
  static size_t allowed = 0;
  if (bytes <= allowed) return cudaSuccess;
  const cudaError_t e =
      cudaFuncSetAttribute(persist_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess) allowed = bytes;
  return e;
}

cudaError_t persist_decode(const PersistArgs& a, int blocks, cudaStream_t s) {
  if (const cudaError_t e = allow_smem(a.smem_bytes); e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(kNT);
  cfg.dynamicSmemBytes = a.smem_bytes;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (pdl_in_capture()) trace::note_launch(reinterpret_cast<const void*>(persist_decode_kernel));
  return cudaLaunchKernelEx(&cfg, persist_decode_kernel, a);
}

int persist_blocks_per_sm(size_t smem_bytes) {
  if (allow_smem(smem_bytes) != cudaSuccess) return 0;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, persist_decode_kernel, kNT, smem_bytes) != cudaSuccess)
    return 0;
  return n;
}

}  // namespace anvil::cuda
