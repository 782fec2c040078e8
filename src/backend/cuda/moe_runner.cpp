// The host side of the CUDA moe_ffn (see moe_runner.h): validation, per-layer pointer tables, the
// workspace, and the launch sequence of moe.h.
#include "backend/cuda/moe_runner.h"
#include "backend/cuda/dev_matrix.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cpu/cpu_backend.h"  // moe_skip_experts()

namespace anvil::cuda {
namespace {

std::string num(int64_t v) { return std::to_string(v); }

bool dense_dtype(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

int fmt_of(const WeightMatrix& m) { return moe_fmt(m.bits, elem_unchecked(m.dtype)); }

bool same_format(const WeightMatrix& a, const WeightMatrix& b) {
  return a.bits == b.bits && a.dtype == b.dtype && (a.bits == 0 || a.group_size == b.group_size);
}

// `m` ([rows, cols]) is one the expert / router kernels take; `what` names it in the error.
Status check_matrix(const WeightMatrix& m, int64_t rows, int64_t cols, const std::string& what) {
  if (m.rows != rows || m.cols != cols)
    return invalid_argument("moe_ffn: " + what + " must be [" + num(rows) + ", " + num(cols) + "], got [" +
                            num(m.rows) + ", " + num(m.cols) + "]");
  if (!m.data || (m.quantized() && (!m.scales || !m.biases)))
    return invalid_argument("moe_ffn: " + what + " has no data (or no scales/biases)");
  if (!dense_dtype(m.dtype))
    return unsupported("moe_ffn: " + what + " dtype " + std::string(dtype_name(m.dtype)) + " (expected BF16/F16/F32)");
  if (!moe_fmt_supported(fmt_of(m)))
    return unsupported("moe_ffn on CUDA: " + what + " is " + num(m.bits) +
                       "-bit; the MoE kernels take 2- to 6- or 8-bit MLX or dense weights");
  if (m.quantized() && m.group_size != 32 && m.group_size != 64 && m.group_size != 128)
    return unsupported("moe_ffn: " + what + " group_size must be 32, 64 or 128, got " + num(m.group_size));
  if (m.bias) return unsupported("moe_ffn on CUDA: " + what + " has a bias (no MoE architecture here has one)");
  return Status::ok();
}

MoEMats mats(const ExpertPtrs* table, const WeightMatrix& m) {
  MoEMats s;
  s.ptrs = table;
  s.rows = m.rows, s.cols = m.cols;
  s.fmt = fmt_of(m);
  s.group = m.group_size;
  s.dtype = elem_unchecked(m.dtype);
  return s;
}


Status launch_status(cudaError_t e, const char* kernel) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string("cuda: ") + kernel + ": " + cudaGetErrorString(e));
}

size_t up256(size_t n) { return (n + 255) / 256 * 256; }

// ANVIL_MOE_STREAM=0: decode through moe.cu's warp-per-row kernels instead (for measuring).
bool moe_stream_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("ANVIL_MOE_STREAM");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

}  // namespace

MoERunner::~MoERunner() {
  if (side_) cudaStreamSynchronize(side_);
  for (auto& [k, t] : tables_) cudaFree(t.dev);
  for (void* p : retired_) cudaFree(p);
  if (ws_) cudaFree(ws_);
  if (counters_) cudaFree(counters_);
  if (side_) cudaStreamDestroy(side_);
}

Status MoERunner::side_stream() {
  if (side_) return Status::ok();
  return launch_status(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "moe_ffn side stream");
}

Status MoERunner::grow(void** buf, size_t* have, size_t need, bool zero) {
  if (*have >= need) return Status::ok();
  const size_t n = std::max(need, *have * 2);
  void* p = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::kOutOfMemory, "moe_ffn: could not allocate " + num(int64_t(n >> 20)) +
                                                " MiB of device workspace");
  }
  if (zero) {
    ANVIL_RETURN_IF_ERROR(side_stream());
    ANVIL_RETURN_IF_ERROR(launch_status(cudaMemsetAsync(p, 0, n, side_), "moe_ffn workspace"));
    ANVIL_RETURN_IF_ERROR(launch_status(cudaStreamSynchronize(side_), "moe_ffn workspace"));
  }
  if (*buf) retired_.push_back(*buf);  // a captured graph may still use it
  *buf = p;
  *have = n;
  return Status::ok();
}

Status moe_plan(const MoEWeights& w, int64_t T, MoEPlan* plan) {
  const int E = w.num_experts, k = w.top_k;
  if (T < 1 || T > kMoEMaxChunk) return invalid_argument("moe_ffn: 1.." + num(kMoEMaxChunk) + " tokens per pass");
  if (E < 1 || E > kMoEMaxExperts)
    return unsupported("moe_ffn on CUDA: num_experts must be 1.." + num(kMoEMaxExperts) + ", got " + num(E));
  if (k < 1 || k > E || k > kMoEMaxTopK)
    return invalid_argument("moe_ffn: top_k must be in 1..min(num_experts, " + num(kMoEMaxTopK) + "), got " + num(k));
  if (w.gate.size() != size_t(E) || w.up.size() != size_t(E) || w.down.size() != size_t(E))
    return invalid_argument("moe_ffn: expected num_experts (" + num(E) + ") gate, up and down matrices");
  const int64_t H = w.router.cols, F = w.gate[0].rows;
  if (H % 32 != 0 || F % 32 != 0)
    return unsupported("moe_ffn on CUDA: hidden (" + num(H) + ") and expert width (" + num(F) +
                       ") must be multiples of 32");
  ANVIL_RETURN_IF_ERROR(check_matrix(w.router, E, H, "router"));
  for (int e = 0; e < E; ++e) {
    const std::string n = "expert " + num(e) + " ";
    ANVIL_RETURN_IF_ERROR(check_matrix(w.gate[size_t(e)], F, H, n + "gate"));
    ANVIL_RETURN_IF_ERROR(check_matrix(w.up[size_t(e)], F, H, n + "up"));
    ANVIL_RETURN_IF_ERROR(check_matrix(w.down[size_t(e)], H, F, n + "down"));
    if (!same_format(w.gate[size_t(e)], w.gate[0]) || !same_format(w.up[size_t(e)], w.gate[0]) ||
        !same_format(w.down[size_t(e)], w.down[0]))
      return unsupported("moe_ffn on CUDA: every expert's gate and up (and every down) must share one format; " + n +
                         "differs from expert 0");
  }
  MoEPlan p;
  p.T = T, p.H = H, p.F = F;
  p.decode = T <= kMoEDecodeMaxTokens;
  p.skip_experts = moe_skip_experts();
  p.shared = w.has_shared();
  if (p.shared) {
    const int64_t S = w.shared_up.rows;
    p.S = S;
    if (w.shared_gate.rows != S || w.shared_gate.cols != H || w.shared_up.cols != H || w.shared_down.rows != H ||
        w.shared_down.cols != S || w.shared_gate_w.rows != 1 || w.shared_gate_w.cols != H || !w.shared_gate_w.data)
      return invalid_argument("moe_ffn: the shared expert must be gate/up [S, " + num(H) + "], down [" + num(H) +
                              ", S] and its gate [1, " + num(H) + "]");
    const WeightMatrix& sg = w.shared_gate_w;
    if (!dense_dtype(sg.dtype) || sg.bias || (sg.quantized() && (sg.bits < 2 || sg.bits > 8 || !sg.scales)))
      return unsupported("moe_ffn on CUDA: the shared expert gate must be dense or 2..8-bit MLX without a bias");
    p.shared_fusable = S % 32 == 0 && check_matrix(w.shared_gate, S, H, "").is_ok() &&
                       check_matrix(w.shared_up, S, H, "").is_ok() && check_matrix(w.shared_down, H, S, "").is_ok() &&
                       same_format(w.shared_gate, w.gate[0]) && same_format(w.shared_up, w.gate[0]) &&
                       same_format(w.shared_down, w.down[0]);
    p.shared_fused = p.shared_fusable && p.decode;
  }

  // Workspace.
  const int64_t A = T * k, S = p.S;
  const bool unfused_shared = p.shared && !p.shared_fused;
  const size_t parts[MoEPlan::kParts] = {
      size_t(T * E) * 4,                          // logits
      size_t(A) * 4,                              // idx
      size_t(A) * 4,                              // wt
      size_t(T) * 4,                              // coef
      size_t(A * F) * 2,                          // h
      p.shared_fused ? size_t(T * S) * 2 : 0,     // hs
      unfused_shared ? size_t(T * S) * 2 : 0,     // shared_h
      unfused_shared ? size_t(T * H) * 2 : 0,     // shared_out
      p.decode ? 0 : size_t(E + 1) * 4,           // offsets
      p.decode ? 0 : size_t(E + 1) * 4,           // tile_start
      p.decode ? 0 : size_t(A) * 4,               // order
      p.decode ? 0 : size_t(A) * 4,               // pos_of
      p.decode ? 0 : size_t(A * H) * 4};          // y
  p.workspace_bytes = 0;
  for (int i = 0; i < MoEPlan::kParts; ++i) p.workspace_bytes += up256(p.part_bytes[i] = parts[i]);
  *plan = p;
  return Status::ok();
}

Status MoERunner::prepare(const MoEWeights& w, int64_t T, MoEPlan* plan) {
  ANVIL_RETURN_IF_ERROR(moe_plan(w, T, plan));
  MoEPlan& p = *plan;
  const int E = w.num_experts;
  const bool fusable = p.shared_fusable;
  // The layer's pointer table: [gate | up | down] x (E + 1); entry E is the shared expert when fusable.
  thread_local std::vector<ExpertPtrs> host;
  host.assign(size_t(3 * (E + 1)), ExpertPtrs{});
  for (int e = 0; e <= E; ++e) {
    const bool sh = e == E;
    if (sh && !fusable) continue;
    const WeightMatrix* m[3] = {sh ? &w.shared_gate : &w.gate[size_t(e)], sh ? &w.shared_up : &w.up[size_t(e)],
                                sh ? &w.shared_down : &w.down[size_t(e)]};
    for (int j = 0; j < 3; ++j) host[size_t(j * (E + 1) + e)] = ExpertPtrs{m[j]->data, m[j]->scales, m[j]->biases};
  }
  Table& tb = tables_[w.router.data];
  if (tb.host.size() != host.size() ||
      std::memcmp(tb.host.data(), host.data(), host.size() * sizeof(ExpertPtrs)) != 0) {
    // Uploaded through the private stream and waited for: nothing is enqueued on (or captured from) the
    // compute stream. A replaced table is retired, not freed: an older graph may still read it.
    ANVIL_RETURN_IF_ERROR(side_stream());
    ExpertPtrs* dev = nullptr;
    if (cudaMalloc(&dev, host.size() * sizeof(ExpertPtrs)) != cudaSuccess) {
      cudaGetLastError();
      return Status(StatusCode::kOutOfMemory, "moe_ffn: could not allocate the expert table");
    }
    ANVIL_RETURN_IF_ERROR(launch_status(
        cudaMemcpyAsync(dev, host.data(), host.size() * sizeof(ExpertPtrs), cudaMemcpyHostToDevice, side_),
        "moe_ffn expert table"));
    ANVIL_RETURN_IF_ERROR(launch_status(cudaStreamSynchronize(side_), "moe_ffn expert table"));
    if (tb.dev) retired_.push_back(tb.dev);
    tb.dev = dev;
    tb.host = host;
  }
  p.tables = tb.dev;
  p.gate = mats(tb.dev, w.gate[0]);
  p.up = mats(tb.dev + (E + 1), w.up[0]);
  p.down = mats(tb.dev + 2 * (E + 1), w.down[0]);
  // The streamed q4 expert kernels: their shapes and every routed expert's alignment (cp.async).
  p.stream = p.decode && !p.shared_fused && moe_stream_enabled() && moe_stream_shape_ok(p.gate, 0) &&
             moe_stream_shape_ok(p.down, w.top_k);
  for (int e = 0; p.stream && e < E; ++e)
    for (int j = 0; j < 3; ++j) {
      const ExpertPtrs& q = host[size_t(j * (E + 1) + e)];
      auto at = [](const void* ptr, uintptr_t n) { return reinterpret_cast<uintptr_t>(ptr) % n == 0; };
      if (!at(q.data, 16) || !at(q.scales, 4) || !at(q.biases, 4)) p.stream = false;
    }

  ANVIL_RETURN_IF_ERROR(grow(&ws_, &ws_bytes_, p.workspace_bytes, false));
  ANVIL_RETURN_IF_ERROR(grow(&counters_, &counters_bytes_, size_t((T + 7) / 8) * 4, true));
  uint8_t* base = static_cast<uint8_t*>(ws_);
  void* part[MoEPlan::kParts];
  for (int i = 0; i < MoEPlan::kParts; ++i) {
    part[i] = p.part_bytes[i] ? base : nullptr;
    base += up256(p.part_bytes[i]);
  }
  p.logits = static_cast<float*>(part[0]);
  p.idx = static_cast<int32_t*>(part[1]);
  p.wt = static_cast<float*>(part[2]);
  p.coef = static_cast<float*>(part[3]);
  p.h = part[4];
  p.hs = part[5];
  p.shared_h = part[6];
  p.shared_out = part[7];
  p.offsets = static_cast<int32_t*>(part[8]);
  p.tile_start = static_cast<int32_t*>(part[9]);
  p.order = static_cast<int32_t*>(part[10]);
  p.pos_of = static_cast<int32_t*>(part[11]);
  p.y = static_cast<float*>(part[12]);
  p.counters = static_cast<int*>(counters_);
  return Status::ok();
}

Status MoERunner::route(const void* x, const MoEWeights& w, const MoEPlan& p, cudaStream_t s, uint64_t* launches) {
  MoERouteArgs ra;
  ra.router = dev_matrix(w.router);
  if (p.shared) ra.shared_gate = dev_matrix(w.shared_gate_w);
  ra.E = w.num_experts, ra.k = w.top_k, ra.norm_topk = w.norm_topk_prob;
  ra.logits = p.logits, ra.counters = p.counters, ra.idx = p.idx, ra.wt = p.wt, ra.shared_coef = p.coef;
  ra.x = x, ra.T = int(p.T), ra.H = p.H;
  ++*launches;
  return launch_status(moe_route(ra, s), "moe_route");
}

Status MoERunner::experts(const void* x, const MoEWeights& w, const MoEPlan& p, void* out, cudaStream_t s,
                          uint64_t* launches, const void* xplanes) {
  const int E = w.num_experts, k = w.top_k, T = int(p.T);
  const int n_slots = p.skip_experts ? 0 : k;
  if (p.decode) {
    MoEGateUpArgs ga;
    ga.x = x, ga.T = T, ga.k = k, ga.E = E, ga.idx = p.idx;
    ga.gate = p.gate, ga.up = p.up;
    ga.routed = n_slots > 0;
    ga.shared_rows = p.shared_fused ? p.S : 0;
    ga.h = p.h, ga.hs = p.hs;
    ga.stream = p.stream && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    ga.xplanes = T == 1 ? xplanes : nullptr;
    // The down kernel copies its experts' weights while gate/up runs (moe.h MoEDownArgs::early);
    // only where gate/up is the kernel right before it. Measured on the H200 (session 17, A/B in one
    // call, tg64 best of 2): qwen3-30b-a3b-16L q4g64 1,097-1,103 -> 1,153-1,169 tok/s, the full
    // qwen3-30b-a3b 398 -> 425. ANVIL_MOE_DOWN_EARLY=0 turns it off.
    static const bool down_early = [] {
      const char* e = std::getenv("ANVIL_MOE_DOWN_EARLY");
      return !(e && *e == '0');
    }();
    const bool early = down_early && (ga.routed || ga.shared_rows);
    ga.late_trigger = early;
    if (ga.routed || ga.shared_rows) {
      ++*launches;
      ANVIL_RETURN_IF_ERROR(launch_status(moe_gate_up(ga, s), "moe_gate_up"));
    }
    MoEDownArgs da;
    da.h = p.h, da.hs = p.hs, da.T = T, da.k = k, da.E = E, da.n_slots = n_slots;
    da.idx = p.idx, da.wt = p.wt, da.down = p.down;
    da.shared_cols = p.shared_fused ? p.S : 0;
    da.shared_coef = p.coef;
    da.shared_out = p.shared && !p.shared_fused ? p.shared_out : nullptr;
    da.out = out;
    da.stream = ga.stream;
    da.early = early;
    ++*launches;
    return launch_status(moe_down(da, s), "moe_down");
  }

  const int A = T * k;
  if (n_slots > 0) {
    MoEGroupArgs g;
    g.idx = p.idx, g.A = A, g.E = E;
    g.offsets = p.offsets, g.tile_start = p.tile_start, g.order = p.order, g.pos_of = p.pos_of;
    ++*launches;
    ANVIL_RETURN_IF_ERROR(launch_status(moe_group(g, s), "moe_group"));
    MoEGroupedArgs ga;
    ga.x = x, ga.A = A, ga.E = E, ga.k = k;
    ga.offsets = p.offsets, ga.tile_start = p.tile_start, ga.order = p.order;
    ga.w = p.gate, ga.up = p.up, ga.out = p.h;
    ++*launches;
    ANVIL_RETURN_IF_ERROR(launch_status(moe_grouped_gate_up(ga, s), "moe_grouped_gate_up"));
    MoEGroupedArgs da = ga;
    da.x = p.h, da.order = nullptr, da.w = p.down, da.up = MoEMats{}, da.out = p.y;
    ++*launches;
    ANVIL_RETURN_IF_ERROR(launch_status(moe_grouped_down(da, s), "moe_grouped_down"));
  }
  MoECombineArgs ca;
  ca.y = p.y, ca.pos_of = p.pos_of, ca.wt = p.wt, ca.T = T, ca.k = k, ca.n_slots = n_slots, ca.H = p.H;
  ca.shared_coef = p.coef;
  ca.shared_out = p.shared ? p.shared_out : nullptr;
  ca.out = out;
  ++*launches;
  return launch_status(moe_combine(ca, s), "moe_combine");
}

}  // namespace anvil::cuda
