// The streamed q4 mat-vec: the decode default (T <= 8) of gemv_tc (qgemv_tc.cu), weights streamed
// through shared memory with cp.async. Shared pieces (TcParams, Step, dq_pair, mma_bf16) are in
// qgemv_tc.cuh. At one token the same ring feeds integer dot products instead of the mma (INT;
// qgemv_int.cuh, int_rule below).
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "backend/cuda/qgemv_int.cuh"
#include "backend/cuda/rope_kv.cuh"

namespace anvil::cuda::tc {
namespace {

// stage_x: 16-byte pieces of x each thread loads before permuting any (all in flight at once).
constexpr int kStageV = 8;

// bf16(h * w) for the pair h (fused norm: the weight is applied at staging, 1/rms in the epilogue),
// adding h^2 to ss. The same rounding as the scalar form: the fp32 product rounded to bf16.
__device__ __forceinline__ uint32_t norm_pair(uint32_t h, uint32_t w, float& ss) {
  const float h0 = bf16_lo(h), h1 = bf16_hi(h);
  ss += h0 * h0 + h1 * h1;
  return bf2_as_u32(__floats2bfloat162_rn(h0 * bf16_lo(w), h1 * bf16_hi(w)));
}

// Fused norm: the 8 activations a (piece kp of its row, elements 8 kp..8 kp+7) times the norm's
// weights (wpre: that piece of them loaded before the PDL wait, where wn_pre), h^2 added to ss.
__device__ __forceinline__ uint4 norm_piece(const TcParams& p, uint4 a, int kp, uint4 wpre, bool wn_pre, bool wn_vec,
                                            float& ss) {
  uint4 w;
  if (wn_pre) w = wpre;
  else if (wn_vec) w = __ldg(static_cast<const uint4*>(p.norm_w) + kp);
  else {
    const int k = kp * 8;
    auto pr = [&](int e) {
      return bf2_as_u32(__floats2bfloat162_rn(load_bias(p.norm_w, k + e, p.norm_dtype),
                                              load_bias(p.norm_w, k + e + 1, p.norm_dtype)));
    };
    w = make_uint4(pr(0), pr(2), pr(4), pr(6));
  }
  return make_uint4(norm_pair(a.x, w.x, ss), norm_pair(a.y, w.y, ss), norm_pair(a.z, w.z, ss),
                    norm_pair(a.w, w.w, ss));
}

// The decode default (T <= 8): weights streamed through shared memory with cp.async.
//
// ncu on the H200 showed the register-fed kernels (qgemv_tc.cu) at 16-24 warps per SM with 1-2 KB of loads in
// flight per warp: 0.8-1.7 TB/s, bounded by the bytes in flight (Little's law: ~4 TB/s at ~1 us of
// latency needs ~30 KB in flight per SM, all the time). Here each lane copies its own 32 bytes per
// step (rows g and g+8) into a per-warp ring of S steps in shared memory, so S steps per warp are
// in flight without holding registers; a lane reads back only what it copied itself, so waiting
// for its own copy groups is enough (no barrier). The tile's scales and biases (16 rows) are
// copied once, the activations staged once per block in mma fragment order (step_mma_frag).
// The weights and scales are copied before griddepcontrol.wait (no kernel writes them).

// Shared memory of one block: ring [W][S][M][2 rows][32 lanes] x 16 B | scales and biases
// [M][2][16 rows][padded_groups(ng)] bf16 | activations [T][K] bf16.
// The staged scales' row stride: ng plus 8 or 16, so that it is 8 mod 16 and the words of rows
// g = 0..7 (each lane group reads its own row) fall on 8 different banks. Unpadded, a stride of 64
// or 192 groups (qwen3-8b) put all 8 rows on one bank: 8-way conflicts on every scale load. Padded,
// qwen3-8b q4g64 decoded at 365-367 against 358 tok/s on the H200 (2026-12-01, session 10).
__host__ __device__ constexpr int padded_groups(int ng) { return ng + ((ng & 8) ? 16 : 8); }
__host__ __device__ constexpr size_t async_ring_bytes(int W, int S, int M) { return size_t(W) * S * M * 2 * 32 * 16; }
// INT (one token, qgemv_int.cuh): the activations as int16 byte planes and per-piece floats.
inline size_t async_smem_bytes(int W, int S, int M, int T, int64_t K, int group, bool INT = false) {
  return async_ring_bytes(W, S, M) + size_t(M) * 2 * 16 * size_t(padded_groups(int(K / group))) * 2 +
         (INT ? int_x_bytes(K) : size_t(T) * size_t(K) * 2);
}

// The explicit minimum of 1 block per SM matters: without it ptxas picks fewer registers (48 instead of
// 64 here) and spills in some shapes.
// INT: one token (p.T == 1), multiplied as integers on the CUDA cores (qgemv_int.cuh).
// ROPE (one token, INT, not SWIGLU; p.rope): rope_kv's work in the tail, after the block's rows are
// stored (RopeEpi; the epilogue after finish_tile). An instance of its own, so the others keep their
// registers.
// FU: the fused forms (p.norm_w, p.residual) compiled in. FU = false (one token, neither set; the
// default, plain_rule): an instance without their code and with fewer registers, so that the plain
// path's code no longer moves with edits to theirs (session 47, H100: qwen3-8b q4g64 decode, which
// takes no fused form, went 404 -> 395 -> 375 tok/s over two commits that changed only the fused
// forms' code) and more gate/up blocks fit on an SM (session 48: 376 -> 427 tok/s).
template <bool SWIGLU, int W, int S, bool INT, bool ROPE = false, bool FU = true>
__global__ void __launch_bounds__(W * 32, 1) qgemv4_async_kernel(TcParams p) {
  constexpr int M = SWIGLU ? 2 : 1;
  const bool fnorm = FU && p.norm_w != nullptr, fres = FU && p.residual;
  extern __shared__ __align__(16) uint8_t smem[];
  pdl_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, c = lane & 3;
  int64_t r0 = 0;
  const TcSeg& m = tile_seg(p, blockIdx.x, &r0);
  const int K = int(p.K), steps = K / 128;
  const int gshift = group_shift(p.group);
  const int ng = K >> gshift;  // groups per row (a multiple of 8: the host checks)
  uint4* ring = reinterpret_cast<uint4*>(smem);
  __nv_bfloat16* sc = reinterpret_cast<__nv_bfloat16*>(smem + async_ring_bytes(W, S, M));
  const int ngp = padded_groups(ng);
  uint32_t* xs = reinterpret_cast<uint32_t*>(sc + size_t(M) * 2 * 16 * ngp);

  // The tile's scales and biases: [array = matrix*2 + (0 scales, 1 biases)][row][ngp].
  const int pieces = ng / 8;  // 16-byte pieces per row
  for (int i = threadIdx.x; i < M * 2 * 16 * pieces; i += W * 32) {
    const int piece = i % pieces, r = (i / pieces) % 16, arr = i / (pieces * 16);
    const TcSeg& mm = (arr >> 1) ? p.up : m;
    const __nv_bfloat16* src = ((arr & 1) ? mm.biases : mm.scales) + min(r0 + r, m.rows - 1) * int64_t(ng);
    cp_async16(sc + (size_t(arr) * 16 + r) * ngp + piece * 8, src + piece * 8);
  }
  const int64_t oa = min(r0 + g, m.rows - 1) * (K / 32), ob = min(r0 + g + 8, m.rows - 1) * (K / 32);
  // This warp's steps: warp, warp + W, ... (a measured variant that gave each warp a run of
  // consecutive steps instead made no difference: 284.6 against 285.1 tok/s on qwen3-8b q4g64).
  const int n = steps > warp ? (steps - warp + W - 1) / W : 0;
  auto step_of = [&](int i) { return warp + i * W; };
  uint4* my = ring + size_t(warp) * S * M * 2 * 32;
  auto issue = [&](int i) {
    const int kq = (step_of(i) * 128 + c * 32) >> 5;  // 16-byte piece within a row
    uint4* slot = my + (i % S) * M * 2 * 32;
    cp_async16(slot + lane, reinterpret_cast<const uint4*>(m.w) + oa + kq);
    cp_async16(slot + 32 + lane, reinterpret_cast<const uint4*>(m.w) + ob + kq);
    if constexpr (SWIGLU) {
      cp_async16(slot + 64 + lane, reinterpret_cast<const uint4*>(p.up.w) + oa + kq);
      cp_async16(slot + 96 + lane, reinterpret_cast<const uint4*>(p.up.w) + ob + kq);
    }
  };
  // The ring's first S steps, all before the PDL wait. (Session 31, H100: only the first 2 before
  // it and the rest after was slower, qwen3-8b q4g64 383.5 against 400.4 tok/s; benchmarks.md.)
#pragma unroll
  for (int i = 0; i < S; ++i) {
    if (i < n) issue(i);
    cp_async_commit();  // group i (group 0 also holds the scales)
  }
  __shared__ float tok_ss[8];  // fused norm: per-row sum of h^2
  __shared__ float warp_ss[W];  // fused norm, one token: each warp's part of it
  if (threadIdx.x < 8) tok_ss[threadIdx.x] = 0.0f;
  // The fused norm's weights, loaded before the wait (no kernel writes them) when they are bf16 and
  // this thread's pieces fit in one pass of stage_x (below). Only the opt-in fused path uses them,
  // but taking this out (88 registers instead of 120) made plain decode slower on the H200: qwen3-8b
  // q4g64 352 against 365 tok/s (session 10), so it stays.
  const int kq = K / 8, nq = p.T * kq;  // 16-byte pieces of x: per row, in all
  const bool wn_vec = fnorm && p.norm_dtype == Elem::kBF16 && reinterpret_cast<uintptr_t>(p.norm_w) % 16 == 0;
  const bool wn_pre = wn_vec && nq <= kStageV * W * 32;
  uint4 wn[kStageV];
  if (wn_pre) {
#pragma unroll
    for (int i = 0; i < kStageV; ++i) {
      const int q = threadIdx.x + i * W * 32;
      if (q < nq) wn[i] = __ldg(static_cast<const uint4*>(p.norm_w) + q % kq);
    }
  }
  // ROPE: in warp 0, the angles and norm weights of this block's item (its tile's q head, or the kv
  // head of a k or v tile) and its destination rows, none of which depends on the previous kernel,
  // kept in shared memory through the loop (not in registers, which the other instances need).
  static_assert(!ROPE || (INT && !SWIGLU), "the rope epilogue follows the one-token q/k/v launch");
  __shared__ rope::Lane rope_lane[ROPE ? 32 : 1];
  __shared__ __nv_bfloat16* rope_dst[2];
  if constexpr (ROPE) {
    const int D = p.rope.kv.head_dim;
    const int si = (blockIdx.x >= p.seg[1].tile_begin) + (blockIdx.x >= p.seg[2].tile_begin);
    const int head = int(r0 / D);
    if (warp == 0) {
      const int32_t pos = p.rope.b.pos[0];
      rope::Lane rl;
      rope::prepare(rl, lane, D / 2, pos, p.rope.inv_freq, si == 0 ? p.rope.q_norm : p.rope.k_norm, p.rope.norm_dtype);
      rope_lane[lane] = rl;
      if (lane == 0) {
        if (si == 0) {
          rope_dst[0] = static_cast<__nv_bfloat16*>(p.seg[0].out) + int64_t(head) * D;
          rope_dst[1] = nullptr;
        } else {
          const KVDev& kv = p.rope.kv;
          const int64_t page = p.rope.b.page_table[int64_t(p.rope.b.seq[0]) * p.rope.b.max_pages + pos / kv.page_size];
          const int slot = pos % kv.page_size;
          rope_dst[0] = static_cast<__nv_bfloat16*>(kv.base) +
                        kv_row(page, p.rope.layer, 0, head, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
          rope_dst[1] = static_cast<__nv_bfloat16*>(kv.base) +
                        kv_row(page, p.rope.layer, 1, head, slot, kv.n_layers, kv.n_kv_heads, kv.page_size, D);
        }
      }
    }
  }
  __syncthreads();
  pdl_wait();
  // Activations in fragment order: for each 32-element chunk, mma j's (b0, b1) =
  // ((x[e0], x[e0+4]), (x[e0+1], x[e0+5])) with e0 = 8*(j/2) + 2*(j%2), as step_mma builds them.
  // That order keeps every 16-byte piece of x in place (piece q holds fragments 2q and 2q+1), so
  // each thread loads up to kStageV pieces at once and permutes them in registers: one round trip
  // to L2 instead of one per fragment (ncu: the staging sat behind the weight copies it follows).
  // With a fused norm (p.norm_w), x is the residual stream h. RMSNorm is a per-row scalar, so
  // W (h * inv * w) = inv * W (h * w): the fragments hold bf16(h * w), the same pass sums h^2 per
  // row, and the epilogue multiplies each dot product by its row's inv = rsqrt(mean(h^2) + eps).
  // One pass over h and no barrier before the steps (a first version normalized first, as
  // rmsnorm() writes x: two passes and two more barriers per block, and slower on qwen3-8b).
  const uint4* xv = reinterpret_cast<const uint4*>(p.x);
  uint4* xq = reinterpret_cast<uint4*>(xs);
  // INT: the planes at xs (int_stage_piece), the pieces' (d / 16, sum) after them. The loop runs
  // whole warps (the quads' shuffles): nq is a multiple of 16, not always of the block's threads.
  float2* xpf = reinterpret_cast<float2*>(reinterpret_cast<uint8_t*>(xs) + size_t(K) * 2);
  if (INT && p.xplanes && !fnorm) {
    int_copy_planes<W * 32>(p.xplanes, K, xs);  // the producer (rmsnorm with planes) staged x already
  } else if constexpr (INT) {
    float ss = 0.0f;
    for (int q0 = threadIdx.x - lane; q0 < nq; q0 += kStageV * W * 32) {
      uint4 v[kStageV];
#pragma unroll
      for (int i = 0; i < kStageV; ++i) {
        const int q = q0 + lane + i * W * 32;
        v[i] = q < nq ? __ldg(xv + q) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < kStageV; ++i) {
        const int q = q0 + lane + i * W * 32;
        if (q0 + i * W * 32 >= nq) break;  // the whole warp past the end
        uint4 a = v[i];
        if (fnorm && q < nq) {
          a = norm_piece(p, a, q, wn[i], wn_pre, wn_vec, ss);
        }
        int_stage_piece(a, q < nq, q >> 2, q & 3, xq, xpf);
      }
    }
    // One partial sum per warp, added in warp order before the epilogue (below): the same bits on
    // every run, where atomics would add in arrival order (and all of a block's threads adding to
    // one shared word serialize on the path to the first step).
    if (fnorm) {
      ss = warp_sum(ss);
      if (lane == 0) warp_ss[warp] = ss;
    }
  } else {
    for (int q0 = threadIdx.x; q0 < nq; q0 += kStageV * W * 32) {
      uint4 v[kStageV];
#pragma unroll
      for (int i = 0; i < kStageV; ++i) {
        const int q = q0 + i * W * 32;
        if (q < nq) v[i] = __ldg(xv + q);
      }
      // (Several tokens, ANVIL_CUDA_FUSE=1 only: the per-row atomics add in arrival order, so the
      // last bit of a norm may differ from run to run.)
      int cur = -1;  // the row whose h^2 sum ss holds
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < kStageV; ++i) {
        const int q = q0 + i * W * 32;
        if (q >= nq) break;
        uint4 a = v[i];
        if (fnorm) {
          const int t = q / kq;
          if (t != cur) {
            if (cur >= 0) atomicAdd(&tok_ss[cur], ss);
            cur = t, ss = 0.0f;
          }
          a = norm_piece(p, a, q % kq, wn[i], wn_pre, wn_vec, ss);
        }
        xq[q] = make_uint4(__byte_perm(a.x, a.z, 0x5410), __byte_perm(a.x, a.z, 0x7632),
                           __byte_perm(a.y, a.w, 0x5410), __byte_perm(a.y, a.w, 0x7632));
      }
      if (cur >= 0) atomicAdd(&tok_ss[cur], ss);
    }
  }
  const uint2* xf = reinterpret_cast<const uint2*>(xs);
  cp_async_wait<S - 1>();  // this thread's group 0; the barrier makes every thread's visible
  __syncthreads();
  trace::point(2);

  if constexpr (INT) {
    // The residual add in the epilogue (p.residual): warp 0's lanes c = 0 store rows g and g + 8,
    // and load those rows' old values now, behind the steps, not after them. Every kernel before
    // this one is complete (the PDL wait), and only this block writes these rows.
    float hpre[2] = {0.0f, 0.0f};
    if (!SWIGLU && fres && warp == 0 && c == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (r0 + g + 8 * h < m.rows)
          hpre[h] = __bfloat162float(__ldcg(static_cast<const __nv_bfloat16*>(m.out) + r0 + g + 8 * h));
    }
    // Lane (g, c): rows g and g+8 over its own piece of each step (k = step * 128 + c * 32).
    const uint4* xi = reinterpret_cast<const uint4*>(xs);
    float acc[M][2] = {};
    for (int i = 0; i < n; ++i) {
      cp_async_wait<S - 1>();
      const int k = step_of(i) * 128 + c * 32;
      int_ring_step<M>(acc, my + (i % S) * M * 2 * 32, sc, ngp, g, k >> gshift, lane, xi, xpf, k >> 5);
      if (i + S < n) issue(i + S);
      cp_async_commit();
    }
    trace::point(3);
    if (fnorm && threadIdx.x == 0) {  // the warps' parts (staged before the barrier above), in order
      float ss = 0.0f;
#pragma unroll
      for (int w = 0; w < W; ++w) ss += warp_ss[w];
      tok_ss[0] = ss;  // read after finish_tile's barrier
    }
    int_quad_sum<M>(acc);  // lanes c = 0 hold rows g and g + 8
    // finish_tile reads accumulator elements 0 and 2 of lanes c = 0 (the others are tokens >= 1: unused).
    finish_tile<SWIGLU, W, 1, FU>(p, m, r0, tok_ss, [&](int mi, int, int i) { return (i & 1) ? 0.0f : acc[mi][i >> 1]; },
                                  fres ? hpre : nullptr);
    if constexpr (ROPE) {
      // The rope epilogue, by warp 0 (which stored the block's rows): each lane's stores made
      // visible device-wide, then the item's arrival counted (a q head: D / 16 tiles; a kv head:
      // its K tiles and its V tiles); the block that completes the item reads the head back from
      // L2 and does rope_kv's work for it (rope_kv.cuh), and resets the count for the next launch.
      // The next kernel reads q and the page after its PDL wait, which waits for this whole launch.
      if (warp == 0) {
        const int D = p.rope.kv.head_dim;
        const int si = (blockIdx.x >= p.seg[1].tile_begin) + (blockIdx.x >= p.seg[2].tile_begin);
        const int head = int(r0 / D);
        const int item = si == 0 ? head : p.rope.n_heads + head;
        const unsigned need = unsigned(si == 0 ? 1 : 2) * unsigned(D / 16);
        __threadfence();
        __syncwarp();
        unsigned prev = 0;
        if (lane == 0) prev = atomicAdd(p.rope.counters + item, 1u);
        prev = __shfl_sync(0xffffffffu, prev, 0);
        if (prev + 1 == need) {
          __threadfence();  // the other blocks' rows, counted before this one
          if (lane == 0) p.rope.counters[item] = 0u;
          const bool is_q = si == 0;
          const int64_t at = int64_t(head) * D;
          const __nv_bfloat16* src = static_cast<const __nv_bfloat16*>(is_q ? p.seg[0].out : p.seg[1].out) + at;
          const __nv_bfloat16* vsrc = is_q ? nullptr : static_cast<const __nv_bfloat16*>(p.seg[2].out) + at;
          const rope::Lane rl = rope_lane[lane];
          rope::apply<true>(rl, lane, D, src, rope_dst[0], vsrc, rope_dst[1],
                            (is_q ? p.rope.q_norm : p.rope.k_norm) != nullptr, p.rope.eps);
        }
      }
    }
    trace::point(9);
    return;
  } else {
    float d[M][4] = {};
    // Lanes g >= T (mma columns no token fills) read token T - 1's activations instead of zeros:
    // those columns are never stored, and an unconditional load saves a predicated load and a
    // register clear per mma (SASS: 8 CS2R per step). With dq_pair's lop3: 244 -> 196 per step.
    const uint2* xrow = xf + min(g, max(p.T - 1, 0)) * (K / 4);
    for (int i = 0; i < n; ++i) {
      cp_async_wait<S - 1>();  // S + i groups committed: group i is complete
      const int k = step_of(i) * 128 + c * 32, gi = k >> gshift;
      const uint4* slot = my + (i % S) * M * 2 * 32;
      Step st[M];
      ring_step<M>(st, slot, sc, ngp, g, gi, lane);
      step_mma_frag<M>(d, st, xrow + (k / 32) * 8);
      // The slot just read is refilled only after its words were consumed by the mmas above.
      if (i + S < n) issue(i + S);
      cp_async_commit();
    }
    trace::point(3);
    finish_tile<SWIGLU, W, 1, FU>(p, m, r0, tok_ss, [&](int mi, int, int i) { return d[mi][i]; });
    trace::point(9);
  }
}

constexpr size_t kAsyncMaxSmem = 160 * 1024;

template <bool SW, int W, int S, bool INT, bool ROPE = false, bool FU = true>
cudaError_t async_launch_one(int64_t tiles, size_t smem, cudaStream_t s, const TcParams& p) {
  static const cudaError_t attr = cudaFuncSetAttribute(qgemv4_async_kernel<SW, W, S, INT, ROPE, FU>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(kAsyncMaxSmem));
  if (attr != cudaSuccess) return attr;
  launch_k(qgemv4_async_kernel<SW, W, S, INT, ROPE, FU>, dim3(unsigned(tiles)), dim3(W * 32), smem, s, p);
  return cudaGetLastError();
}

// One token through the integer dot products (qgemv_int.cuh): every one-token launch. Session 14
// took only launches of >= 2^24 weights with K >= 4,096 (qwen3-8b q4g64 395 -> 407 tok/s, smaller
// launches slower: the staging, a max and a sum per 32 elements and int16 planes, was longer than
// the bf16 permutation). With the staging's arithmetic cut (int_stage_piece, session 15), every
// one-token launch integer measured on the H200 (A/B in one call): qwen3-0.6b q4g64 1,200 against
// 1,167 tok/s, qwen3-30b-a3b-16L 954 against 950, qwen3-8b unchanged (all its launches already
// were). ANVIL_QGEMV_INT=0 turns it off (the tensor cores, bf16 activations).
bool int_rule() {
  static const bool on = [] {
    const char* e = std::getenv("ANVIL_QGEMV_INT");
    return !(e && *e == '0');
  }();
  return on;
}

// A per-launch switch: the variable's first character '1' (or '0' for a switch on by default) flips
// it. Read at every launch (a decode step's launches are captured once), so that a test can compare
// both ways in one process.
bool launch_switch(const char* name, bool on_by_default) {
  const char* e = std::getenv(name);
  return e && *e == (on_by_default ? '0' : '1') ? !on_by_default : on_by_default;
}

// One-token launches without a fused form take the instances compiled without those forms' code
// (FU = false in qgemv4_async_kernel: 84-88 registers against 109-122). With fewer registers the
// one-token gate/up blocks (4 warps) fit 5 to an SM instead of 4, so qwen3-8b's 768 gate/up tiles
// need 1.2 waves instead of 1.5. Session 48 (H100, against the default FU = true instances in the
// same call): qwen3-8b q4g64 decode 376.1 -> 426.6 tok/s, qwen3-30b-a3b-16L 1,052.6 -> 1,136.3,
// qwen3-0.6b 1,365.4 -> 1,384.8. ANVIL_QGEMV_PLAIN=0 goes back to the FU = true instances (for
// measuring).
bool plain_rule() { return launch_switch("ANVIL_QGEMV_PLAIN", true); }

// Launches of 2-8 tokens (batched decode) without a fused form take FU = false instances too (the
// tensor-core form, 72-86 registers). Session 49 (H100, bench-kv, qwen3-8b q4g64, median per step,
// two runs each way): 4 sequences 3.26-3.27 ms against 3.45-3.48, 8 sequences 3.96-4.01 against
// 4.22 (-6%). ANVIL_QGEMV_PLAIN_T=0 goes back (for measuring).
bool plain_t_rule() { return launch_switch("ANVIL_QGEMV_PLAIN_T", true); }

// Rings no deeper than each warp's steps: a launch whose warps have fewer steps each than the ring
// holds gets the smallest ring (4, 6 or 8 steps; halved with the up matrix) that still holds them all.
// With n <= S every step is issued before the loop either way, so only the shared memory left unused
// changes (qwen3-0.6b's 8-warp launches use 1-3 of 8 steps, qwen3-8b's o projection 4): room for more
// of this launch's blocks, or for the next kernel's to become resident under PDL.
// By default, one-token launches of 8-warp blocks while the backend says so (set_ring_fit_default:
// until an MoE block has run, like the norms that let the next kernel in late); batched decode's
// launches (2-8 tokens) are not yet measured fitted, so they keep their rings. Sessions 49-50 (H100,
// three calls, every round): 8-warp launches fitted gave qwen3-8b +0.8..+1.3% and qwen3-0.6b
// +1.3..+1.5%, but qwen3-30b-a3b-16L -1.8% (its o projection alone) to -3.0% (with its 4-warp
// launches); 4-warp launches fitted gave the dense models nothing. ANVIL_QGEMV_RING_FIT=0 never
// fits, =1 fits every launch, =8 / =4 launches of 8-warp (4-warp) blocks only, whatever the model.
thread_local bool t_ring_fit_default = true;

bool ring_fit_rule(int W, int T) {
  const char* e = std::getenv("ANVIL_QGEMV_RING_FIT");
  if (!e || !*e) return W == 8 && T == 1 && t_ring_fit_default;
  return *e == '1' || *e == '0' + W;
}

bool ring_override(int* W, int* S) {
  static const std::pair<int, int> v = [] {
    const char* e = std::getenv("ANVIL_QGEMV_RING");
    int w = 0, st = 0;
    if (e && std::sscanf(e, "%d,%d", &w, &st) == 2 && (w == 4 || w == 8) && (st == 4 || st == 6 || st == 8))
      return std::make_pair(w, st);
    return std::make_pair(0, 0);
  }();
  if (v.first == 0) return false;
  *W = v.first, *S = v.second;
  return true;
}

}  // namespace

bool async_ok(const TcParams& p, int n_mats, int T, bool swiglu, AsyncShape* a) {
  const int64_t K = p.K;
  if (T > 8 || K > (int64_t(1) << 30) || (K / p.group) % 8 != 0) return false;
  if (!weights_aligned16(p, n_mats, swiglu) || reinterpret_cast<uintptr_t>(p.x) % 16 != 0) return false;
  int64_t tiles = 0;
  for (int i = 0; i < n_mats; ++i) tiles += (p.seg[i].rows + 15) / 16;
  const int M = swiglu ? 2 : 1;
  const bool forced = ring_override(&a->W, &a->S);
  if (!forced) a->W = tiles < 2 * 132 ? 8 : 4, a->S = 8;
  a->S /= M;
  a->integer = T == 1 && int_rule();
  a->smem = async_smem_bytes(a->W, a->S, M, T, K, p.group, a->integer);
  if (a->smem > kAsyncMaxSmem && !forced && a->W == 8) {
    a->W = 4;
    a->smem = async_smem_bytes(a->W, a->S, M, T, K, p.group, a->integer);
  }
  if (a->smem > kAsyncMaxSmem) return false;
  // ring_fit_rule: the smallest ring that holds each warp's steps. Decided after the shape, so that it
  // never changes whether (or with how many warps) a launch runs, only its shared memory.
  if (!forced && ring_fit_rule(a->W, T)) {
    const int64_t per_warp = (K / 128 + a->W - 1) / a->W;
    for (const int st : {4, 6})
      if (st / M >= per_warp && st / M < a->S) {
        a->S = st / M;
        a->smem = async_smem_bytes(a->W, a->S, M, T, K, p.group, a->integer);
        break;
      }
  }
  return true;
}

namespace {

template <bool SW, int W, bool INT>
cudaError_t async_launch_w(int S, int64_t tiles, size_t smem, cudaStream_t s, const TcParams& p) {
  constexpr int m = SW ? 2 : 1;  // the up matrix halves the ring
  if constexpr (!SW && INT) {
    if (p.rope.counters) switch (S) {
        case 4: return async_launch_one<false, W, 4, true, true>(tiles, smem, s, p);
        case 6: return async_launch_one<false, W, 6, true, true>(tiles, smem, s, p);
        default: return async_launch_one<false, W, 8, true, true>(tiles, smem, s, p);
      }
  }
  // No fused form: the instances without its code (FU = false; by default, plain_rule and
  // plain_t_rule).
  if (!p.norm_w && !p.residual && (INT ? plain_rule() : plain_t_rule())) {
    switch (S * m) {
      case 4: return async_launch_one<SW, W, 4 / m, INT, false, false>(tiles, smem, s, p);
      case 6: return async_launch_one<SW, W, 6 / m, INT, false, false>(tiles, smem, s, p);
      default: return async_launch_one<SW, W, 8 / m, INT, false, false>(tiles, smem, s, p);
    }
  }
  switch (S * m) {
    case 4: return async_launch_one<SW, W, 4 / m, INT>(tiles, smem, s, p);
    case 6: return async_launch_one<SW, W, 6 / m, INT>(tiles, smem, s, p);
    default: return async_launch_one<SW, W, 8 / m, INT>(tiles, smem, s, p);
  }
}
template <bool SW, int W>
cudaError_t async_launch_i(const AsyncShape& a, int64_t tiles, cudaStream_t s, const TcParams& p) {
  return a.integer ? async_launch_w<SW, W, true>(a.S, tiles, a.smem, s, p)
                   : async_launch_w<SW, W, false>(a.S, tiles, a.smem, s, p);
}

}  // namespace

cudaError_t async_launch(bool swiglu, const AsyncShape& a, int64_t tiles, cudaStream_t s, const TcParams& p) {
  if (swiglu)
    return a.W == 8 ? async_launch_i<true, 8>(a, tiles, s, p) : async_launch_i<true, 4>(a, tiles, s, p);
  return a.W == 8 ? async_launch_i<false, 8>(a, tiles, s, p) : async_launch_i<false, 4>(a, tiles, s, p);
}

}  // namespace anvil::cuda::tc

namespace anvil::cuda {
// cuda_kernels.h
void set_ring_fit_default(bool on) { tc::t_ring_fit_default = on; }
}  // namespace anvil::cuda
