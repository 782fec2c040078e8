// The CUDA backend class: memory, uploads, sticky errors, graphs and the op dispatch onto the
// kernel files (cuda_kernels.h). Every op checks its arguments on the host; a bad argument or a
// failed launch is recorded as the backend's first error (the op then does nothing) and returned by
// synchronize(), as are asynchronous device faults. Once an error is recorded it stays: a CUDA
// context that faulted cannot be trusted again.
//
// Routing: linear() with T <= kGemvMaxTokens rows runs the mat-vec kernels (qgemv.cu), otherwise the
// tensor-core GEMM (gemm.cu). q/k/v (linear_multi) and gate/up + SwiGLU (linear_swiglu) are one
// mat-vec launch each at decode. Buffers that a captured graph may reference (the attention
// workspace, the MLP scratch) are never freed while the backend lives: growing one retires the old.
#include "backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda.h>  // CUtensorMap (the encoder comes through the runtime's driver entry point)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>

#include "backend/cpu/cpu_backend.h"  // moe_phase_profiling / moe_phase_add
#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/dev_matrix.h"
#include "backend/cuda/cuda_page_copy.h"
#include "backend/cuda/moe_runner.h"
#include "backend/cuda/persist_plan.h"
#include "backend/cuda/trace.h"
#include "base/sample_math.h"

namespace anvil {
namespace {

using cuda::DevMatrix;
using cuda::Elem;
using cuda::elem_unchecked;

std::string mib(size_t b) { return std::to_string((b + (1 << 19)) >> 20) + " MiB"; }

Result<Elem> elem_of(DType d) {
  switch (d) {
    case DType::kF32: return Elem::kF32;
    case DType::kF16: return Elem::kF16;
    case DType::kBF16: return Elem::kBF16;
    default: return invalid_argument(std::string("cuda: unsupported weight dtype ") + std::string(dtype_name(d)));
  }
}

DevMatrix dev(const WeightMatrix& w) { return cuda::dev_matrix(w); }

// cuTensorMapEncodeTiled from the driver, without linking libcuda; null where it is missing.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const cudaDeviceProp& prop) : dev_(device) {
    name_ = std::string("cuda (") + prop.name + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
            ", " + std::to_string(prop.multiProcessorCount) + " SMs, " + mib(prop.totalGlobalMem) + ")";
    sms_ = prop.multiProcessorCount;
    cc_major_ = prop.major;
  }
  Status init() {
    if (!ok(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking), "stream")) return err_;
    if (!ok(cudaMallocHost(&pinned_, kPinnedBytes), "pinned staging buffer")) return err_;
    ANVIL_RETURN_IF_ERROR(copier_.init(dev_, st_));
    if (cublasCreate(&cublas_) != CUBLAS_STATUS_SUCCESS) return internal_error("cuda: cublasCreate failed");
    const char* e = std::getenv("ANVIL_CUDA_NO_CUBLAS");
    use_cublas_ = !(e && *e && *e != '0');
    // Batches of 9..64 rows (batched decode: the server; short prompts). The prefill WMMA GEMM
    // (gemm.cu) walks K in 32-element steps, each a dependent global load and two barriers: ~128
    // serialized steps per matrix at K = 4096, and a 32-sequence qwen3-8b q4g64 step took 68.6 ms
    // on the H200 against 3.56 ms at batch 1. So by default rows whose weights take the q4 tensor
    // cores run as mat-vecs: 9..16 through the register-fed kernel (2 token tiles per dequantized
    // fragment), 17..64 through the batch kernel (qgemm_batch.cu; batch_scratch). On the H200 the
    // 32-sequence step takes 10.9 ms, the 64-sequence one 15.2 ms (2026-12-01).
    // ANVIL_CUDA_TC_BATCH=0 restores the GEMM (and cuBLAS from 64 rows).
    // ANVIL_CUDA_GEMV_MAX_T=N (up to 63) sends every format's batches of up to N rows to the
    // mat-vecs (other formats then run 8 rows per launch).
    if (const char* f = std::getenv("ANVIL_CUDA_FA"); f && *f == '0') fa_ = false;
    if (const char* f = std::getenv("ANVIL_CUDA_FA_MIN"); f && *f) fa_min_ = std::max(1, std::atoi(f));
    if (const char* f = std::getenv("ANVIL_CUDA_FUSE"); f && (*f == '0' || *f == '1')) fuse_ = *f - '0';
    if (const char* f = std::getenv("ANVIL_CUDA_QKV_ROPE"); f && *f == '1') qkv_rope_ = true;
    // =1: tensor-map copies (bulk copies per row where the driver has no encoder); =2: bulk copies
    // per row; =3: 16-byte cp.async (PersistArgs::copy_async 3, 0, 1).
    if (const char* f = std::getenv("ANVIL_CUDA_PERSIST"); f && *f >= '1' && *f <= '3')
      persist_ = true, persist_copy_ = *f == '1' ? 3 : *f == '2' ? 0 : 1;
    if (const char* f = std::getenv("ANVIL_CUDA_L2_PREFETCH"); f && *f) {
      int mb = 0, early = 0, keep = 0, fork = 0;
      if (std::sscanf(f, "%d,%d,%d,%d", &mb, &early, &keep, &fork) >= 1 && mb > 0 && mb <= 4096)
        l2_prefetch_bytes_ = uint64_t(mb) << 20, l2_prefetch_early_ = early == 1, l2_prefetch_keep_ = keep == 1,
        l2_prefetch_fork_ = fork == 1;
      if (l2_prefetch_fork_ && (!ok(cudaStreamCreateWithFlags(&st_pf_, cudaStreamNonBlocking), "prefetch stream") ||
                                !ok(cudaEventCreateWithFlags(&ev_fork_, cudaEventDisableTiming), "prefetch event") ||
                                !ok(cudaEventCreateWithFlags(&ev_join_, cudaEventDisableTiming), "prefetch event")))
        return err_;
    }
    if (const char* f = std::getenv("ANVIL_CUDA_L2_PREFETCH_MLP"); f && *f) {
      int mb = 0, keep = 0;
      if (std::sscanf(f, "%d,%d", &mb, &keep) >= 1 && mb > 0 && mb <= 4096)
        l2_prefetch_mlp_bytes_ = uint64_t(mb) << 20, l2_prefetch_mlp_keep_ = keep == 1;
    }
    if (const char* f = std::getenv("ANVIL_CUDA_ATTN_FUSED"); f && *f == '1') attn_fused_ = true;
    if (const char* f = std::getenv("ANVIL_CUDA_ATTN_TC"); f && *f == '0') attn_tc_ = false;
    if (const char* f = std::getenv("ANVIL_CUDA_ROPE_ATTN"); f && *f == '1') rope_attn_ = true;
    // The fused decode attention's cluster limit, probed once here rather than inside a capture.
    if (rope_attn_ && cuda::rope_attention_cluster(1, 1, 1 << 20, sms_) < 1) rope_attn_ = false;
    if (const char* f = std::getenv("ANVIL_CUDA_ATTN_CLUSTER"); f && *f == '0') attn_cluster_ = false;
    if (const char* f = std::getenv("ANVIL_CUDA_NORM_PLANES"); f && *f == '0') norm_planes_ = false;
    if (attn_cluster_) attn_cluster_ = cuda::attention_tc_cluster_limit() >= 2;  // (probed here, not in a capture)
    if (const char* f = std::getenv("ANVIL_CUDA_ATTN_CHUNK"); f && *f == '0') attn_chunk_ = false;
    if (attn_chunk_) attn_chunk_ = cuda::attention_tc_chunk_limit() >= 1;  // (probed here, not in a capture)
    if (const char* b = std::getenv("ANVIL_CUDA_TC_BATCH"); b && *b == '0') tc_batch_ = false;
    if (const char* k = std::getenv("ANVIL_CUDA_SKIP"); k && *k) {
      skip_ = k;
      std::fprintf(stderr, "anvil: ANVIL_CUDA_SKIP=%s: those ops launch nothing (for measuring; results are meaningless)\n", k);
    }
    if (const char* b = std::getenv("ANVIL_CUDA_BATCH_GEMV"); b && *b == '0') batch_gemv_ = false;
    // The batch kernel's split sums in thread block clusters where they cost no wave (the default;
    // ANVIL_QGEMM_CLUSTER=0: through global memory).
    bscratch_.cluster = true;
    if (const char* c = std::getenv("ANVIL_QGEMM_CLUSTER"); c && *c == '0') bscratch_.cluster = false;
    // The other split launches' sums in a kernel of their own where the wave planner plans (beyond
    // 32 tokens; the default), or by the last block of each row block. ANVIL_QGEMM_SUM_KERNEL=0: the
    // last blocks everywhere, =1: the sum kernel everywhere. H200, qwen3-8b q4g64: the sum kernel
    // took the 64-sequence step 11.08 -> 9.40 ms (session 23); at 32 sequences the last blocks were
    // faster, 5.42 -> 5.36-5.38 (session 25; see batch_plan).
    bscratch_.sum_kernel = cuda::kSumKernelWavePlanner;
    if (const char* c = std::getenv("ANVIL_QGEMM_SUM_KERNEL"); c && (*c == '0' || *c == '1'))
      bscratch_.sum_kernel = *c == '0' ? cuda::kSumKernelNever : cuda::kSumKernelAlways;
    // The batch kernel reads x as it is (the default since session 32: on an H100 the 32- and
    // 64-sequence qwen3-8b q4g64 steps 5.91 -> 5.59 and 9.40 -> 9.01 ms, one launch fewer per
    // batched matrix); ANVIL_QGEMM_PLAIN_X=0: after permute_x_kernel, as before.
    bscratch_.plain_x = true;
    if (const char* c = std::getenv("ANVIL_QGEMM_PLAIN_X"); c && *c == '0') bscratch_.plain_x = false;
    if (const char* g = std::getenv("ANVIL_CUDA_GEMV_MAX_T"); g && *g)
      gemv_max_t_ = std::clamp(std::atoi(g), cuda::kGemvMaxTokens, cuda::kCublasMinTokens - 1);
    return Status::ok();
  }
  ~CudaBackend() override {
    cudaStreamSynchronize(st_);
    persist_trace_report();
    for (void* p : persist_bufs_) cudaFree(p);
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g.exec);
    for (void* p : retired_) cudaFree(p);
    if (attn_ws_) cudaFree(attn_ws_);
    if (attn_done_) cudaFree(attn_done_);
    for (void* b : {bscratch_.xperm, static_cast<void*>(bscratch_.part), static_cast<void*>(bscratch_.done)})
      if (b) cudaFree(b);
    if (mlp_scratch_) cudaFree(mlp_scratch_);
    if (planes_) cudaFree(planes_);
    if (argmax_counters_) cudaFree(argmax_counters_);
    if (rope_counters_) cudaFree(rope_counters_);
    if (argmax_part_) cudaFree(argmax_part_);
    if (wdeq_) cudaFree(wdeq_);
    if (cublas_) cublasDestroy(cublas_);
    for (auto& e : prof_events_) cudaEventDestroy(e.first), cudaEventDestroy(e.second);
    if (pinned_) cudaFreeHost(pinned_);
    if (st_) cudaStreamDestroy(st_);
    if (st_pf_) cudaStreamSynchronize(st_pf_), cudaStreamDestroy(st_pf_);
    if (ev_fork_) cudaEventDestroy(ev_fork_);
    if (ev_join_) cudaEventDestroy(ev_join_);
  }

  std::string name() const override { return name_; }
  // The store's copies (cuda_page_copy.h), verified on the H200 (tests and benchmarks in
  // docs/benchmarks.md); ANVIL_CUDA_PAGE_STORE=0 turns them off (the default store is then off on
  // CUDA and an explicit --kv-store/--session is refused).
  bool supports_page_store() const override {
    const char* e = std::getenv("ANVIL_CUDA_PAGE_STORE");
    return !(e && std::string(e) == "0");
  }
  Result<void*> alloc_host_staging(size_t bytes) override { return copier_.alloc_host(bytes); }
  void free_host_staging(void* p) override { copier_.free_host(p); }
  uint64_t record_fence() override { return copier_.record_fence(); }
  void copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                             size_t rows, uint64_t after_fence) override {
    (void)copier_.copy_2d_to_host_async(dst, dst_pitch, src, src_pitch, width, rows, after_fence);  // sticky: wait returns it
  }
  Status wait_host_copies() override { return copier_.wait_host_copies(); }
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override {
    planes_for_ = nullptr;
    (void)copier_.copy_to_device_async(dst, src, bytes);  // sticky: wait_device_copies returns it
  }
  Status wait_device_copies() override { return copier_.wait_device_copies(); }
  Status wait_device_copies_from(const void* src) override { return copier_.wait_device_copies_from(src); }
  bool device_copies_concurrent() const override { return true; }
  DType act_dtype() const override { return DType::kBF16; }

  // ---- memory ----
  Result<void*> alloc(size_t bytes) override {
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 256));
    if (e != cudaSuccess) {
      cudaGetLastError();  // an allocation failure is not sticky
      return Status(StatusCode::kOutOfMemory, "cuda: could not allocate " + mib(bytes) + " of device memory (" +
                                                  cudaGetErrorString(e) + "; " + mem_summary() + ")");
    }
    return p;
  }
  void free(void* p) override {
    if (p) cudaFree(p);
  }
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    planes_for_ = nullptr;
    if (bytes) ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st_), "copy_to_device");
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    // Small reads (the sampled ids) go through pinned memory: a direct DMA, no staging copy.
    if (bytes <= kPinnedBytes) {
      if (ok(cudaMemcpyAsync(pinned_, src, bytes, cudaMemcpyDeviceToHost, st_), "copy_to_host") &&
          ok(cudaStreamSynchronize(st_), "copy_to_host"))
        std::memcpy(dst, pinned_, bytes);
      return;
    }
    if (ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st_), "copy_to_host"))
      ok(cudaStreamSynchronize(st_), "copy_to_host");
  }
  void copy_device(void* dst, const void* src, size_t bytes) override {
    planes_for_ = nullptr;  // (a copy may overwrite the norm output whose planes are pending)
    if (bytes) ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st_), "copy_device");
  }

  Result<WeightMatrix> upload_weight(const WeightMatrix& w) override {
    if (w.rows <= 0 || w.cols <= 0 || !w.data)
      return invalid_argument("weight: expected rows > 0, cols > 0 and data, got [" + std::to_string(w.rows) + ", " +
                              std::to_string(w.cols) + "]");
    ANVIL_RETURN_IF_ERROR(elem_of(w.dtype).status());
    if (w.bias) ANVIL_RETURN_IF_ERROR(elem_of(w.bias_dtype).status());
    if (w.quantized()) {
      if (w.bits < 2 || w.bits > 8 || w.bits == 7)
        return unsupported("quantized weight: bits must be 2, 3, 4, 5, 6 or 8, got " + std::to_string(w.bits));
      if (w.group_size != 32 && w.group_size != 64 && w.group_size != 128)
        return unsupported("quantized weight: group_size must be 32, 64 or 128, got " + std::to_string(w.group_size));
      if (w.cols % w.group_size != 0)
        return invalid_argument("quantized weight: cols " + std::to_string(w.cols) + " is not a multiple of group_size " +
                                std::to_string(w.group_size));
      if (!w.scales || !w.biases) return invalid_argument("quantized weight: scales and biases are required");
    }
    const size_t data_bytes = w.data_bytes(), sb_bytes = w.group_bytes();
    const size_t bias_bytes = w.bias ? size_t(w.rows) * dtype_size(w.bias_dtype) : 0;
    auto up = [](size_t n) { return (n + 255) / 256 * 256; };
    const size_t total = up(data_bytes) + 2 * up(sb_bytes) + up(bias_bytes);
    ANVIL_ASSIGN_OR_RETURN(void* base, alloc(total));
    uint8_t* p = static_cast<uint8_t*>(base);
    WeightMatrix d = w;
    auto put = [&](const void* src, size_t n) -> const void* {
      if (!src || !n) return nullptr;
      // On the backend's stream: a plain cudaMemcpy runs on the legacy stream, which does not order
      // with our non-blocking stream, and from pageable memory it may return before its DMA is done
      // (the first kernel then read half-uploaded weights: caught by the op tests' poisoning).
      cudaMemcpyAsync(p, src, n, cudaMemcpyHostToDevice, st_);
      const void* at = p;
      p += up(n);
      return at;
    };
    d.data = put(w.data, data_bytes);  // first: free_weight() frees the block through data
    d.scales = put(w.scales, sb_bytes);
    d.biases = put(w.biases, sb_bytes);
    d.bias = put(w.bias, bias_bytes);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
      cudaFree(base);
      return internal_error(std::string("cuda: weight upload failed: ") + cudaGetErrorString(e));
    }
    return d;
  }
  Result<WeightVector> upload_vector(const WeightVector& v) override {
    if (v.n <= 0 || !v.data) return invalid_argument("vector weight: expected n > 0 and data");
    ANVIL_RETURN_IF_ERROR(elem_of(v.dtype).status());
    const size_t bytes = size_t(v.n) * dtype_size(v.dtype);
    ANVIL_ASSIGN_OR_RETURN(void* p, alloc(bytes));
    cudaError_t e = cudaMemcpyAsync(p, v.data, bytes, cudaMemcpyHostToDevice, st_);  // see upload_weight
    if (e != cudaSuccess) {
      cudaFree(p);
      return internal_error(std::string("cuda: vector upload failed: ") + cudaGetErrorString(e));
    }
    WeightVector d = v;
    d.data = p;
    return d;
  }
  void free_weight(const WeightMatrix& w) override {
    if (w.data) cudaFree(const_cast<void*>(w.data));
  }
  void free_vector(const WeightVector& v) override {
    if (v.data) cudaFree(const_cast<void*>(v.data));
  }

  Status synchronize() override {
    if (!capturing_) ok(cudaStreamSynchronize(st_), "synchronize");
    return err_;
  }

  // ---- graphs ----
  bool graphs_supported() const override { return !profiling_; }
  Status graph_capture_begin() override {
    if (!err_.is_ok()) return err_;
    copier_.capture_mu().lock();  // until graph_capture_end: the store's writer records no event meanwhile
    if (!ok(cudaStreamBeginCapture(st_, cudaStreamCaptureModeRelaxed), "graph capture")) {
      copier_.capture_mu().unlock();
      return err_;
    }
    capturing_ = true;
    capture_launches_ = launches_;
    cuda::trace::capture_begin();
    cuda::set_pdl_capture(true);
    return Status::ok();
  }
  Status graph_capture_end(uint64_t key) override {
    cudaGraph_t g = nullptr;
    const bool was_capturing = capturing_;
    capturing_ = false;
    cuda::set_pdl_capture(false);
    if (pf_join_pending_) {  // the prefetch branch (ANVIL_CUDA_L2_PREFETCH fork) rejoins the capture
      ok(cudaEventRecord(ev_join_, st_pf_), "prefetch join");
      ok(cudaStreamWaitEvent(st_, ev_join_, 0), "prefetch join");
      pf_join_pending_ = false;
    }
    const bool ended = ok(cudaStreamEndCapture(st_, &g), "graph capture");
    if (was_capturing) copier_.capture_mu().unlock();
    if (!ended || !err_.is_ok()) {
      if (g) cudaGraphDestroy(g);
      return err_;
    }
    cudaGraphExec_t exec = nullptr;
    const bool inst = ok(cudaGraphInstantiate(&exec, g, 0), "graph instantiate");
    size_t nodes = 0;
    cudaGraphGetNodes(g, nullptr, &nodes);
    cudaGraphDestroy(g);
    if (!inst) return err_;
    launches_ = capture_launches_;  // recorded, not run: replays count them
    auto it = graphs_.find(key);
    if (it != graphs_.end()) cudaGraphExecDestroy(it->second.exec);
    graphs_[key] = Graph{exec, nodes};
    cuda::trace::capture_end(key);
    return Status::ok();
  }
  bool graph_launch(uint64_t key) override {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) return false;
    const bool traced = cuda::trace::before_launch(key, st_);  // ANVIL_CUDA_TRACE (trace.h)
    if (ok(cudaGraphLaunch(it->second.exec, st_), "graph launch")) launches_ += it->second.nodes;
    if (traced) cuda::trace::after_launch(key, st_);
    return true;
  }
  uint64_t launch_count() const override { return launches_; }

  // ---- ops ----
  void embed(const WeightMatrix& table, const int32_t* ids, Act out) override {
    if (!bf16(out, "embed", "out") || !expect(out.cols == table.cols, "embed: out.cols must equal the table's cols"))
      return;
    Prof pr(this, "embed");
    launched(cuda::embed(dev(table), ids, int(out.rows), out.data, st_), "embed");
  }
  void rmsnorm(Act x, const WeightVector& w, float eps, Act out) override {
    if (!bf16(x, "rmsnorm", "x") || !bf16(out, "rmsnorm", "out") || !same_shape(x, out, "rmsnorm")) return;
    if (!expect(w.n == x.cols, "rmsnorm: weight length must equal cols")) return;
    if (skip("norm")) return;
    Prof pr(this, "norm");
    bool planes = false;
    void* pl = planes_buffer(x);
    launched(cuda::rmsnorm(nullptr, x.data, w.data, elem_unchecked(w.dtype), eps, int(x.rows), int(x.cols), out.data,
                           st_, late_norms(), pl, &planes),
             "rmsnorm");
    planes_written(planes, out);
  }
  void add_rmsnorm(Act residual, Act x, const WeightVector& w, float eps, Act out) override {
    if (!bf16(residual, "add_rmsnorm", "residual") || !bf16(x, "add_rmsnorm", "x") ||
        !bf16(out, "add_rmsnorm", "out") || !same_shape(x, out, "add_rmsnorm") ||
        !same_shape(residual, x, "add_rmsnorm"))
      return;
    if (!expect(w.n == x.cols, "add_rmsnorm: weight length must equal cols")) return;
    if (skip("norm")) return;
    Prof pr(this, "norm");
    bool planes = false;
    void* pl = planes_buffer(x);
    launched(cuda::rmsnorm(residual.data, x.data, w.data, elem_unchecked(w.dtype), eps, int(x.rows), int(x.cols),
                           out.data, st_, late_norms(), pl, &planes),
             "add_rmsnorm");
    planes_written(planes, out);
  }
  void linear(Act x, const WeightMatrix& w, Act out) override {
    if (!check_linear(x, w, out, "linear")) return;
    if (out.dtype != DType::kF32 && skip("linear")) return;
    Prof pr(this, out.dtype == DType::kF32 ? "lm_head" : "linear");
    matvec_hints();
    run_linear(x, w, out);
  }
  // ANVIL_CUDA_L2_PREFETCH=MB[,1] (off by default; for measuring): in decode steps (up to 64 rows)
  // the kernel of l2_prefetch.cu pulls MB megabytes of the named matrices into L2 while attention
  // runs: the first (the o projection) whole, then the same share of the tail of each other (gate,
  // up: the rows their kernel's second wave of blocks reads), data, scales and biases in proportion.
  // ",1" issues them before the kernel's PDL wait, while the q/k/v mat-vec still runs; a third
  // field of 1 (",0,1") gives the lines the evict_last L2 priority; a fourth (",0,0,1") launches
  // the kernel on a stream of its own, forked after q/k/v, so nothing waits for it.
  // ANVIL_CUDA_L2_PREFETCH_MLP=MB[,1] (off; for measuring): the kMlp hint, after gate/up: MB of the
  // down projection (its tail first), always issued before the kernel's PDL wait, so while gate/up
  // runs (its first wave's compute leaves the memory system idle); ",1": evict_last.
  void prefetch_weights(int64_t rows, std::span<const WeightMatrix* const> ws, PrefetchWindow when) override {
    const bool mlp = when == PrefetchWindow::kMlp;
    const uint64_t budget = mlp ? l2_prefetch_mlp_bytes_ : l2_prefetch_bytes_;
    if (budget == 0 || rows < 1 || rows > 64 || ws.empty() || skip("prefetch")) return;
    cuda::L2Ranges r;
    // The last `want` bytes of a region of `total` bytes at p. Regions start 256-byte aligned and
    // are padded to 256 bytes (upload_weight), so the range may round out to 16 bytes.
    auto add = [&](const void* p, uint64_t total, uint64_t want) {
      if (!p || total == 0 || want == 0 || r.n == cuda::L2Ranges::kMax) return;
      const uintptr_t base = reinterpret_cast<uintptr_t>(p);
      const uintptr_t begin = (base + total - std::min(want, total)) / 16 * 16, end = (base + total + 15) / 16 * 16;
      r.ptr[r.n] = reinterpret_cast<const void*>(begin);
      r.bytes[r.n] = end - begin;
      ++r.n;
    };
    auto tail = [&](const WeightMatrix& w, uint64_t want) {  // want bytes from the end of each part
      const uint64_t data = w.data_bytes(), sb = w.group_bytes();
      const double f = std::min(1.0, double(want) / double(data + 2 * sb));
      add(w.data, data, uint64_t(f * double(data)));
      add(w.scales, sb, uint64_t(f * double(sb)));
      add(w.biases, sb, uint64_t(f * double(sb)));
    };
    const uint64_t first = std::min<uint64_t>(budget, ws[0]->bytes());
    tail(*ws[0], first);
    if (ws.size() > 1)
      for (size_t i = 1; i < ws.size(); ++i) tail(*ws[i], (budget - first) / (ws.size() - 1));
    if (!mlp && l2_prefetch_fork_) {
      // On a stream of its own, after the q/k/v mat-vec, concurrent with rope_kv, attention and o
      // (inside a capture: a branch of the graph, joined at its end by graph_capture_end).
      ok(cudaEventRecord(ev_fork_, st_), "prefetch fork");
      ok(cudaStreamWaitEvent(st_pf_, ev_fork_, 0), "prefetch fork");
      launched(cuda::l2_prefetch(r, true, l2_prefetch_keep_, st_pf_, false), "prefetch_weights");
      if (capturing_) pf_join_pending_ = true;
      return;
    }
    launched(cuda::l2_prefetch(r, mlp || l2_prefetch_early_, mlp ? l2_prefetch_mlp_keep_ : l2_prefetch_keep_, st_),
             "prefetch_weights");
  }
  void linear_multi(Act x, std::span<const WeightMatrix* const> ws, std::span<const Act> outs) override {
    if (!expect(ws.size() == outs.size() && !ws.empty() && ws.size() <= 3, "linear_multi: 1..3 weights, one output each"))
      return;
    bool fusable = matvec_rows(x.rows, dev(*ws[0]));
    for (size_t i = 0; i < ws.size(); ++i) {
      if (!check_linear(x, *ws[i], outs[i], "linear_multi")) return;
      fusable &= cuda::gemv_fusable(dev(*ws[0]), dev(*ws[i])) && outs[i].dtype == DType::kBF16;
    }
    if (skip("linear")) return;
    Prof pr(this, "linear");
    matvec_hints();
    if (!fusable) {
      for (size_t i = 0; i < ws.size(); ++i) run_linear(x, *ws[i], outs[i]);
      return;
    }
    DevMatrix d[3];
    void* o[3];
    for (size_t i = 0; i < ws.size(); ++i) d[i] = dev(*ws[i]), o[i] = outs[i].data;
    launched(cuda::gemv(d, o, int(ws.size()), x.data, int(x.rows), false, st_,
                        x.rows == 1 ? planes_scratch(x) : batch_scratch(d, int(ws.size()), nullptr, x.rows)),
             "linear_multi");
  }
  void linear_swiglu(Act x, const WeightMatrix& gate, const WeightMatrix& up, Act out) override {
    if (!check_linear(x, gate, out, "linear_swiglu") || !check_linear(x, up, out, "linear_swiglu")) return;
    if (!bf16(out, "linear_swiglu", "out")) return;
    if (skip("mlp_gate_up")) return;
    Prof pr(this, "mlp_gate_up");
    matvec_hints();
    if (matvec_rows(x.rows, dev(gate)) && cuda::gemv_fusable(dev(gate), dev(up))) {
      const DevMatrix dg = dev(gate), du = dev(up);
      launched(cuda::gemv_swiglu(dg, du, x.data, int(x.rows), out.data, st_,
                                 x.rows == 1 ? planes_scratch(x) : batch_scratch(&dg, 1, &du, x.rows)),
               "linear_swiglu");
      return;
    }
    const size_t bytes = size_t(out.rows * out.cols) * 2;
    if (!grow(&mlp_scratch_, &mlp_scratch_bytes_, bytes)) return;
    Act u{mlp_scratch_, out.rows, out.cols, DType::kBF16};
    run_linear(x, gate, out);
    run_linear(x, up, u);
    launched(cuda::swiglu(out.data, u.data, out.data, out.rows * out.cols, st_), "swiglu");
  }
  // The fused decode forms (backend.h): the streamed q4 mat-vec normalizes h itself, and the output
  // projections add into h in their epilogue. Whatever the streamed kernel does not take runs the
  // reference composition. The ops always fuse what they can; whether the transformer calls them
  // (fuses_norm_linear) is fuse_rule() below, or the ANVIL_CUDA_FUSE switch.
  bool fuses_norm_linear(int64_t T, std::span<const WeightMatrix* const> ws) const override {
    if (T < 1 || T > cuda::kGemvMaxTokens || ws.empty() || fuse_ == 0) return false;
    if (fuse_ < 0 && !fuse_rule(T, ws[0]->cols)) return false;
    for (const WeightMatrix* w : ws) {
      const DevMatrix d = dev(*w);
      if (!cuda::gemv_tc_fusable(&d, 1, nullptr, int(T))) return false;
    }
    return true;
  }
  void rmsnorm_linear_multi(Act h, const WeightVector& norm, float eps, Act x, std::span<const WeightMatrix* const> ws,
                            std::span<const Act> outs) override {
    DevMatrix d[3];
    void* o[3];
    bool fuse = bf16(h, "rmsnorm_linear_multi", "h") && norm.n == h.cols && ws.size() == outs.size() &&
                !ws.empty() && ws.size() <= 3;
    for (size_t i = 0; fuse && i < ws.size(); ++i) {
      if (!check_linear(h, *ws[i], outs[i], "rmsnorm_linear_multi")) return;
      d[i] = dev(*ws[i]), o[i] = outs[i].data;
      fuse &= outs[i].dtype == DType::kBF16;
    }
    fuse = fuse && h.rows <= cuda::kGemvMaxTokens && cuda::gemv_tc_fusable(d, int(ws.size()), nullptr, int(h.rows));
    if (!fuse) return Backend::rmsnorm_linear_multi(h, norm, eps, x, ws, outs);
    if (skip("linear")) return;
    Prof pr(this, "linear");
    matvec_hints();
    const cuda::GemvFuse f{norm.data, elem_unchecked(norm.dtype), eps, false};
    launched(cuda::gemv_tc_fused(d, o, int(ws.size()), nullptr, h.data, int(h.rows), f, st_), "rmsnorm_linear_multi");
  }
  void rmsnorm_linear_swiglu(Act h, const WeightVector& norm, float eps, Act x, const WeightMatrix& gate,
                             const WeightMatrix& up, Act out) override {
    if (!check_linear(h, gate, out, "rmsnorm_linear_swiglu") || !check_linear(h, up, out, "rmsnorm_linear_swiglu"))
      return;
    const DevMatrix dg = dev(gate), du = dev(up);
    if (norm.n != h.cols || out.dtype != DType::kBF16 || h.rows > cuda::kGemvMaxTokens ||
        !cuda::gemv_tc_fusable(&dg, 1, &du, int(h.rows)))
      return Backend::rmsnorm_linear_swiglu(h, norm, eps, x, gate, up, out);
    if (skip("mlp_gate_up")) return;
    Prof pr(this, "mlp_gate_up");
    matvec_hints();
    void* o = out.data;
    const cuda::GemvFuse f{norm.data, elem_unchecked(norm.dtype), eps, false};
    launched(cuda::gemv_tc_fused(&dg, &o, 1, &du, h.data, int(h.rows), f, st_), "rmsnorm_linear_swiglu");
  }
  void linear_add(Act x, const WeightMatrix& w, Act h, Act scratch) override {
    if (!check_linear(x, w, h, "linear_add") || !bf16(h, "linear_add", "h")) return;
    const DevMatrix d = dev(w);
    if (x.rows > cuda::kGemvMaxTokens || !cuda::gemv_tc_fusable(&d, 1, nullptr, int(x.rows)))
      return Backend::linear_add(x, w, h, scratch);
    if (skip("linear")) return;
    Prof pr(this, "linear");
    matvec_hints();
    void* o = h.data;
    cuda::GemvFuse f;
    f.residual = true;
    launched(cuda::gemv_tc_fused(&d, &o, 1, nullptr, x.data, int(x.rows), f, st_), "linear_add");
  }
  // The q/k/v launch with rope_kv's work in its tail (RopeEpi, qgemv_stream.cu): one token of one
  // sequence, whole-head rotary, the one-token integer mat-vec. Opt-in (ANVIL_CUDA_QKV_ROPE=1): it
  // takes a kernel and its boundary out of each layer and adds a fence, an atomic and one L2 round
  // trip to the q/k/v launch's tail, and measured slower (session 47, H100: qwen3-0.6b -12.6%,
  // qwen3-8b -2.4%; docs/benchmarks.md).
  bool fuses_qkv_rope(int64_t T, const KVCacheView& kv, std::span<const WeightMatrix* const> qkv) const override {
    if (!qkv_rope_ || T != 1 || qkv.size() != 3 || kv.head_dim <= 0 || kv.n_kv_heads <= 0 ||
        (kv.rotary_dim != 0 && kv.rotary_dim != kv.head_dim))
      return false;
    const DevMatrix d[3] = {dev(*qkv[0]), dev(*qkv[1]), dev(*qkv[2])};
    return d[1].rows == int64_t(kv.n_kv_heads) * kv.head_dim && cuda::gemv_qkv_rope_ok(d, int(T), kv.head_dim);
  }
  void linear_qkv_rope(Act in, const WeightVector* norm, float eps, Act x, std::span<const WeightMatrix* const> ws,
                       std::span<const Act> outs, const WeightVector& q_norm, const WeightVector& k_norm,
                       const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch) override {
    if (!fuses_qkv_rope(in.rows, kv, ws) || outs.size() != 3 || batch.n_tokens != 1 || batch.n_seqs != 1 ||
        (norm && norm->n != in.cols))
      return Backend::linear_qkv_rope(in, norm, eps, x, ws, outs, q_norm, k_norm, inv_freq, kv, layer, batch);
    if (!bf16(in, "linear_qkv_rope", "in")) return;
    for (size_t i = 0; i < 3; ++i)
      if (!check_linear(in, *ws[i], outs[i], "linear_qkv_rope") || !bf16(outs[i], "linear_qkv_rope", "out")) return;
    if (!rope_args_ok("linear_qkv_rope", outs[0], outs[1], outs[2], q_norm, k_norm, kv, layer, batch)) return;
    if (skip("linear")) return;
    const int n_heads = int(outs[0].cols / kv.head_dim);
    // A count per q head and kv head, zeroed when new; every launch leaves them zero.
    const size_t words = size_t(n_heads + kv.n_kv_heads);
    void* before = rope_counters_;
    if (!grow(&rope_counters_, &rope_counters_bytes_, words * 4)) return;
    if (rope_counters_ != before && !ok(cudaMemsetAsync(rope_counters_, 0, rope_counters_bytes_, st_), "rope counters"))
      return;
    Prof pr(this, "linear");
    matvec_hints();
    cuda::RopeEpi r;
    r.counters = static_cast<unsigned*>(rope_counters_);
    r.n_heads = n_heads;
    r.q_norm = q_norm.data, r.k_norm = k_norm.data;
    r.norm_dtype = norm_elem(q_norm, k_norm);
    r.eps = eps, r.inv_freq = inv_freq;
    r.kv = kvdev(kv), r.layer = layer, r.b = bdev(batch);
    cuda::GemvFuse f;
    if (norm) f.norm_w = norm->data, f.norm_dtype = elem_unchecked(norm->dtype), f.eps = eps;
    else if (const cuda::GemvScratch* ps = planes_scratch(in)) f.xplanes = ps->xplanes;
    f.rope = &r;
    const DevMatrix d[3] = {dev(*ws[0]), dev(*ws[1]), dev(*ws[2])};
    void* o[3] = {outs[0].data, outs[1].data, outs[2].data};
    launched(cuda::gemv_tc_fused(d, o, 3, nullptr, in.data, 1, f, st_), "linear_qkv_rope");
  }
  void swiglu(Act gate, Act up, Act out) override {
    if (!bf16(gate, "swiglu", "gate") || !bf16(up, "swiglu", "up") || !bf16(out, "swiglu", "out") ||
        !same_shape(gate, up, "swiglu") || !same_shape(gate, out, "swiglu"))
      return;
    Prof pr(this, "elementwise");
    launched(cuda::swiglu(gate.data, up.data, out.data, gate.rows * gate.cols, st_), "swiglu");
  }
  void add(Act a, Act b) override {
    if (!bf16(a, "add", "a") || !bf16(b, "add", "b") || !same_shape(a, b, "add")) return;
    Prof pr(this, "elementwise");
    launched(cuda::add(a.data, b.data, a.rows * a.cols, st_), "add");
  }
  // The arguments of qk_norm_rope_kv_append (and rope_attention, named op): bf16 q/k/v of matching
  // shapes, a usable KV view, q/k norms of one dtype.
  bool rope_args_ok(const char* op, Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm,
                    const KVCacheView& kv, int layer, const BatchView& batch) {
    if (!bf16(q, op, "q") || !bf16(k, op, "k") || !bf16(v, op, "v") || !check_kv(kv, layer, op)) return false;
    if (!(k.cols == int64_t(kv.n_kv_heads) * kv.head_dim && v.cols == k.cols && q.cols % kv.head_dim == 0 &&
          q.rows == batch.n_tokens && k.rows == q.rows && v.rows == q.rows))
      return expect(false, std::string(op) + ": expected q [T, n_heads*head_dim], k/v [T, n_kv_heads*head_dim]");
    if (!(q_norm.dtype == k_norm.dtype || !q_norm.data || !k_norm.data))
      return expect(false, std::string(op) + ": q_norm and k_norm must share a dtype");
    return true;
  }
  static cuda::Elem norm_elem(const WeightVector& q_norm, const WeightVector& k_norm) {
    return elem_unchecked(q_norm.data ? q_norm.dtype : k_norm.dtype);
  }
  void qk_norm_rope_kv_append(Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                              const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch) override {
    if (!rope_args_ok("qk_norm_rope_kv_append", q, k, v, q_norm, k_norm, kv, layer, batch)) return;
    if (skip("rope_kv")) return;
    Prof pr(this, "rope_kv");
    launched(cuda::qk_norm_rope_kv_append(q.data, k.data, v.data, int(q.cols / kv.head_dim), q_norm.data, k_norm.data,
                                          norm_elem(q_norm, k_norm), eps, inv_freq, kvdev(kv), layer, bdev(batch), st_,
                                          kv.rotary_dim, kv.rope_scale),
             "qk_norm_rope_kv_append");
  }
  void attention(Act q, const KVCacheView& kv, int layer, const BatchView& batch, float scale, Act out) override {
    if (!bf16(q, "attention", "q") || !bf16(out, "attention", "out") || !same_shape(q, out, "attention") ||
        !check_kv(kv, layer, "attention"))
      return;
    const int n_heads = int(q.cols / kv.head_dim);
    if (!expect(q.cols % kv.head_dim == 0 && n_heads % kv.n_kv_heads == 0 && q.rows == batch.n_tokens,
                "attention: q must be [T, n_heads*head_dim] with n_heads a multiple of n_kv_heads"))
      return;
    if (skip("attention")) return;
    if (fa_ && batch.n_tokens >= fa_min_ && cuda::attention_prefill_ok(kv.head_dim) && one_run(batch)) {
      Prof pr(this, "attention");
      launched(cuda::attention_prefill(q.data, n_heads, kvdev(kv, layer), layer, bdev(batch), batch.pos_host[0], scale,
                                       out.data, st_),
               "attention (prefill, tensor cores)");
      return;
    }
    const bool tc = attn_tc_ && cuda::attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim);
    if (attn_chunk_ && tc && batch.n_tokens > 1 && n_heads / kv.n_kv_heads <= 8 && one_run(batch)) {
      // Splits for the groups of 16 / G tokens as for so many tokens, within one cluster.
      const int tpb = 16 / (n_heads / kv.n_kv_heads), groups = (batch.n_tokens + tpb - 1) / tpb;
      const int cl = std::min(cuda::attention_splits(groups, kv.n_kv_heads, batch.max_pages * kv.page_size, sms_, false),
                              cuda::attention_tc_chunk_limit());
      Prof pr(this, "attention");
      launched(cuda::attention_tc_chunk(q.data, n_heads, kvdev(kv, layer), layer, bdev(batch), scale, std::max(1, cl), out.data,
                                        st_),
               "attention (tensor cores, token groups)");
      return;
    }
    const int splits = cuda::attention_splits(batch.n_tokens, kv.n_kv_heads, attn_span(kv, layer, batch), sms_,
                                              tc && batch.n_tokens == batch.n_seqs);
    // The workspace holds the splits' partials. ANVIL_CUDA_ATTN_FUSED=1 adds one counter per (token,
    // kv head) for the in-kernel merge, in a buffer of its own (a region of the workspace would move
    // with T and land on old partials): zeroed whenever it is new, and the kernel leaves them zero.
    const size_t floats = cuda::attention_workspace_floats(batch.n_tokens, n_heads, kv.head_dim, splits);
    if (!grow(reinterpret_cast<void**>(&attn_ws_), &attn_ws_bytes_, floats * 4)) return;
    unsigned* done = nullptr;
    if (attn_fused_ && !tc && splits > 1) {
      void* before = attn_done_;
      if (!grow(&attn_done_, &attn_done_bytes_, size_t(batch.n_tokens) * size_t(kv.n_kv_heads) * 4)) return;
      if (attn_done_ != before && !ok(cudaMemsetAsync(attn_done_, 0, attn_done_bytes_, st_), "attention counters"))
        return;
      done = static_cast<unsigned*>(attn_done_);
    }
    Prof pr(this, "attention");
    if (tc && attn_cluster_ && splits > 1 && splits <= cuda::attention_tc_cluster_limit()) {
      // The splits merged inside their cluster: one kernel (attn_cluster_).
      launched(cuda::attention_tc_cluster(q.data, n_heads, kvdev(kv, layer), layer, bdev(batch), scale, splits, out.data, st_),
               "attention (tensor cores, cluster merge)");
      return;
    }
    if (tc) {
      // The splits' merge stays a second kernel: merged by the last split block instead (as
      // ANVIL_CUDA_ATTN_FUSED=1 does for attention.cu), qwen3-8b q4g64 decode measured 324 against
      // 359 tok/s at 512 tokens and 184 against 300 at 4,096 (2026-12-01): that one block's serial
      // loop over the splits sits on the critical path.
      launched(cuda::attention_tc(q.data, n_heads, kvdev(kv, layer), layer, bdev(batch), scale, splits, attn_ws_, out.data, st_),
               "attention (tensor cores)");
      if (splits > 1) launches_ += 1;  // the split kernel and the combine
      return;
    }
    launched(cuda::attention(q.data, n_heads, kvdev(kv, layer), layer, bdev(batch), scale, splits, attn_ws_, done, out.data,
                             st_),
             "attention");
    if (splits > 1 && !done) launches_ += 1;  // the split kernel and the combine
  }
  void rope_attention(Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                      const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch, float scale,
                      Act out) override {
    const int n_heads = kv.head_dim > 0 ? int(q.cols / kv.head_dim) : 0;
    // (The fused kernel turns whole heads: partial rotary goes through rope_kv.cu.)
    const bool whole_heads = kv.rotary_dim == 0 || kv.rotary_dim == kv.head_dim;
    const bool fusable = rope_attn_ && attn_tc_ && whole_heads && batch.n_tokens == batch.n_seqs && batch.n_tokens > 0 &&
                         kv.head_dim > 0 && q.cols % kv.head_dim == 0 && kv.n_kv_heads > 0 &&
                         cuda::attention_tc_ok(n_heads, kv.n_kv_heads, kv.head_dim) && !skip("rope_kv") &&
                         !skip("attention");
    const int cluster =
        fusable ? cuda::rope_attention_cluster(batch.n_tokens, kv.n_kv_heads, attn_span(kv, layer, batch), sms_) : 0;
    if (cluster < 1) {
      Backend::rope_attention(q, k, v, q_norm, k_norm, eps, inv_freq, kv, layer, batch, scale, out);
      return;
    }
    if (!rope_args_ok("rope_attention", q, k, v, q_norm, k_norm, kv, layer, batch) ||
        !bf16(out, "rope_attention", "out") || !same_shape(q, out, "rope_attention"))
      return;
    Prof pr(this, "attention");
    cuda::RopeDev r;
    r.k = k.data, r.v = v.data, r.q_norm = q_norm.data, r.k_norm = k_norm.data;
    r.norm_dtype = norm_elem(q_norm, k_norm);
    r.eps = eps, r.inv_freq = inv_freq;
    launched(cuda::rope_attention_tc(q.data, n_heads, r, kvdev(kv, layer), layer, bdev(batch), scale, cluster, out.data, st_),
             "rope_attention (tensor cores, fused)");
  }
  void gather_rows(Act src, const int32_t* rows, Act dst) override {
    if (!expect(src.dtype == dst.dtype && src.cols == dst.cols, "gather_rows: src and dst must match in dtype and cols"))
      return;
    Prof pr(this, "sample");
    launched(cuda::gather_rows(src.data, src.rows, rows, int(dst.rows), src.cols, dtype_size(src.dtype), dst.data, st_),
             "gather_rows");
  }
  void argmax_rows(Act logits, const int32_t* suppress, int n_suppress, int32_t* ids) override {
    if (!expect(logits.dtype == DType::kF32, "argmax_rows: logits must be F32")) return;
    Prof pr(this, "sample");
    // The scratch (per-row counters, zeroed when new, and the blocks' partial results) grows to the
    // largest call; the kernel leaves the counters zero.
    const int rows = int(logits.rows);
    void* before = argmax_counters_;
    if (!grow(&argmax_counters_, &argmax_counters_bytes_, size_t(rows) * 4) ||
        !grow(&argmax_part_, &argmax_part_bytes_, cuda::argmax_partial_bytes(rows, logits.cols)))
      return;
    if (argmax_counters_ != before &&
        !ok(cudaMemsetAsync(argmax_counters_, 0, argmax_counters_bytes_, st_), "argmax counters"))
      return;
    launched(cuda::argmax_rows(static_cast<const float*>(logits.data), rows, logits.cols, suppress, n_suppress,
                               cuda::argmax_scratch(static_cast<unsigned*>(argmax_counters_), argmax_part_, rows,
                                                    logits.cols),
                               ids, st_),
             "argmax_rows");
  }
  bool has_sample_rows() const override { return true; }
  size_t sample_scratch_bytes(int rows, int64_t vocab) const override { return cuda::sample_scratch_bytes(rows, vocab); }
  void sample_rows(Act logits, const SampleArgs& a, int32_t* ids) override {
    static_assert(sizeof(SampleRowParams) == sizeof(cuda::SampleRowDev) &&
                  offsetof(SampleRowParams, top_k) == offsetof(cuda::SampleRowDev, top_k) &&
                  offsetof(SampleRowParams, random) == offsetof(cuda::SampleRowDev, random) &&
                  offsetof(SampleRowParams, flags) == offsetof(cuda::SampleRowDev, flags) &&
                  kSampleRowSkip == cuda::kSampleDevSkip && kSampleRowNoSuppress == cuda::kSampleDevNoSuppress);
    if (!expect(logits.dtype == DType::kF32, "sample_rows: logits must be F32") ||
        !expect(logits.cols <= sampling::kMaxVocab, "sample_rows: vocab " + std::to_string(logits.cols) +
                                                        " above the limit " + std::to_string(sampling::kMaxVocab)) ||
        !expect(a.params && a.scratch && (a.n_suppress == 0 || a.suppress),
                "sample_rows: params, scratch and suppress must be set") ||
        !expect(!a.bias_offsets || (a.bias_ids && a.bias_values),
                "sample_rows: bias_offsets needs bias_ids and bias_values"))
      return;
    Prof pr(this, "sample");
    launched(cuda::sample_rows(static_cast<float*>(logits.data), int(logits.rows), logits.cols,
                               reinterpret_cast<const cuda::SampleRowDev*>(a.params), a.suppress, a.n_suppress,
                               a.counts, a.updates, a.update_offsets, a.bias_offsets, a.bias_ids, a.bias_values,
                               a.scratch, ids, st_),
             "sample_rows");
  }
  void to_host_f32(Act x, float* dst) override {
    const size_t n = size_t(x.rows * x.cols);
    if (x.dtype == DType::kF32) return copy_to_host(dst, x.data, n * 4);
    if (!bf16(x, "to_host_f32", "x")) return;
    std::vector<uint16_t> tmp(n);
    copy_to_host(tmp.data(), x.data, n * 2);
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(tmp[i]);
  }

  // ---- mixture of experts (moe.cu, planned by moe_runner.cpp) ----
  bool has_moe_ffn() const override { return true; }
  // ---- the persistent decode kernel (persist_decode.cu; ANVIL_CUDA_PERSIST=1) ----
  int prepare_decode_layers(std::span<const DenseLayerView> layers, int n_heads, int n_kv, int hd) override {
    if (!persist_ || layers.empty()) return -1;
    auto no = [&](const std::string& why) {
      std::fprintf(stderr, "anvil: ANVIL_CUDA_PERSIST: decode runs op by op (%s)\n", why.c_str());
      return -1;
    };
    if (cc_major_ < 9) return no("the kernel needs compute capability 9.0 (Hopper)");
    if (hd != 128) return no("head_dim " + std::to_string(hd) + "; the kernel takes 128");
    if (n_kv <= 0 || n_heads % n_kv != 0 || n_heads / n_kv > 4)
      return no("more than 4 query heads per kv head, or none");
    const WeightMatrix& q0 = *layers[0].q;
    const int g = q0.group_size;
    if (q0.bits != 4 || (g != 32 && g != 64 && g != 128)) return no("the kernel takes MLX q4 with groups of 32/64/128");
    const int64_t H = q0.cols, QD = int64_t(n_heads) * hd, KD = int64_t(n_kv) * hd, F = layers[0].gate->rows;
    // Units of 1024 columns where every size allows it (twice the work per ring stage and per
    // barrier wait of 512), else 512; ANVIL_CUDA_PERSIST_KC=512|1024 picks one for measuring.
    auto fits = [&](int k) { return k >= cuda::persist_kc(g) && H % k == 0 && QD % k == 0 && F % k == 0; };
    int kc = fits(1024) ? 1024 : 512;
    if (const char* f = std::getenv("ANVIL_CUDA_PERSIST_KC"); f && *f) {
      const int want = std::atoi(f);
      if ((want == 512 || want == 1024) && fits(want)) kc = want;
      else
        std::fprintf(stderr, "anvil: ANVIL_CUDA_PERSIST_KC=%s does not fit (512 or 1024, at least 8 groups, dividing "
                     "hidden, q and ffn sizes); units of %d columns\n", f, kc);
    }
    if (H > 8192 || !fits(kc))
      return no("hidden, q and ffn sizes must be multiples of " + std::to_string(kc) + " (hidden at most 8192)");
    auto mat_ok = [&](const WeightMatrix* w, int64_t rows, int64_t cols) {
      auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
      return w && w->bits == 4 && w->group_size == g && w->dtype == DType::kBF16 && !w->bias && w->rows == rows &&
             w->cols == cols && al(w->data) && al(w->scales) && al(w->biases);
    };
    auto vec_ok = [](const WeightVector* v, int64_t n, bool optional) {
      if (!v || !v->data) return optional;
      // (16-byte aligned: the norms are read 8 weights per load)
      return v->dtype == DType::kBF16 && v->n == n && reinterpret_cast<uintptr_t>(v->data) % 16 == 0;
    };
    std::vector<cuda::PersistLayer> host(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      const DenseLayerView& L = layers[l];
      if (!mat_ok(L.q, QD, H) || !mat_ok(L.k, KD, H) || !mat_ok(L.v, KD, H) || !mat_ok(L.o, H, QD) ||
          !mat_ok(L.gate, F, H) || !mat_ok(L.up, F, H) || !mat_ok(L.down, H, F))
        return no("layer " + std::to_string(l) + ": a matrix is not q4 of the first layer's group and shape");
      if (!vec_ok(L.attn_norm, H, false) || !vec_ok(L.ffn_norm, H, false) || !vec_ok(L.q_norm, hd, true) ||
          !vec_ok(L.k_norm, hd, true))
        return no("layer " + std::to_string(l) + ": norm weights not bf16 of the expected size, 16-byte aligned");
      cuda::PersistLayer& P = host[l];
      P.attn_norm = L.attn_norm->data, P.ffn_norm = L.ffn_norm->data;
      P.q_norm = L.q_norm ? L.q_norm->data : nullptr, P.k_norm = L.k_norm ? L.k_norm->data : nullptr;
      const WeightMatrix* ms[7] = {L.q, L.k, L.v, L.o, L.gate, L.up, L.down};
      for (int m = 0; m < 7; ++m) P.w[m][0] = ms[m]->data, P.w[m][1] = ms[m]->scales, P.w[m][2] = ms[m]->biases;
    }
    cuda::PersistArgs a;
    a.n_layers = int(layers.size());
    a.hidden = int(H), a.q_dim = int(QD), a.kv_dim = int(KD), a.ffn = int(F), a.n_heads = n_heads, a.n_kv = n_kv;
    a.group = g, a.kc = kc;
    a.copy_async = persist_copy_;
    a.l2_ahead = 0;
    // Measuring switches: ANVIL_CUDA_PERSIST_KVPF=0 (no L2 prefetch of the attention items' K/V
    // rows), ANVIL_CUDA_PERSIST_RED=1 (barrier arrivals as one release reduction).
    if (const char* f = std::getenv("ANVIL_CUDA_PERSIST_KVPF"); f && *f) a.kv_prefetch = std::atoi(f) != 0;
    if (const char* f = std::getenv("ANVIL_CUDA_PERSIST_RED"); f && *f) a.red_release = std::atoi(f) != 0;
    if (const char* f = std::getenv("ANVIL_CUDA_PERSIST_L2AHEAD"); f && *f) a.l2_ahead = std::clamp(std::atoi(f), 0, 256);

    int optin = 0;
    if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev_) != cudaSuccess || optin < 1024)
      return no("shared memory per block unknown");
    if (!cuda::persist_layout(a, size_t(optin) - 1024)) return no("too little shared memory for the ring");
    if (cuda::persist_blocks_per_sm(a.smem_bytes) < 1) return no("one block per SM does not fit");
    // Attention items (kv head, split): one per block at most, so that every SM reads K/V rows.
    a.max_split = std::clamp(sms_ / n_kv, 1, 64);
    // The producer's copies in flight: ~48 KB per SM by default (what ~1 us of DRAM latency at the
    // full rate needs: ~4.8 TB/s x 1 us / 132 SMs = 36 KB), ANVIL_CUDA_PERSIST_INFLIGHT=KB (0: the
    // whole ring, as before).
    int inflight_kb = 48;
    if (const char* f = std::getenv("ANVIL_CUDA_PERSIST_INFLIGHT"); f && *f) inflight_kb = std::max(0, std::atoi(f));
    a.inflight = inflight_kb == 0 ? 0 : std::clamp(int((size_t(inflight_kb) << 10) / size_t(a.stage_bytes)), 1, a.stages - 1);
    const int64_t rows_v[4] = {QD + 2 * KD, H, 2 * F, H}, K[4] = {H, QD, H, F};
    for (int p = 0; p < 4; ++p)  // (the kernel's unit arithmetic is 32-bit: persist_plan.h)
      if (!cuda::persist::fits_32bit(rows_v[p] / 32 * (K[p] / kc), sms_)) return no("a matrix too large");
    auto get = [&](size_t bytes) -> void* {
      auto p = alloc(bytes);
      if (!p.is_ok()) return nullptr;
      persist_bufs_.push_back(*p);
      return *p;
    };
    void* table = get(host.size() * sizeof(cuda::PersistLayer));
    if (!table) return no("out of device memory");
    copy_to_device(table, host.data(), host.size() * sizeof(cuda::PersistLayer));
    a.layers = static_cast<const cuda::PersistLayer*>(table);
    for (int p = 0; p < 4; ++p) {
      // Zeroed once: the slots of blocks that own no unit (fewer units than blocks) are read as 0
      // and never written (persist_plan.h).
      const size_t bytes = size_t(cuda::persist_max_parts(rows_v[p], int(K[p]), kc, sms_) * rows_v[p]) * 4;
      a.part[p] = static_cast<float*>(get(bytes));
      if (!a.part[p] || !ok(cudaMemsetAsync(a.part[p], 0, bytes, st_), "persistent decode sums")) return no("out of device memory");
    }
    a.attn_ws = static_cast<float*>(get(cuda::persist_attn_ws_floats(n_kv, a.max_split, n_heads / n_kv) * 4));
    a.attn = get(size_t(QD) * 2);
    a.act = get(size_t(F) * 2);
    const size_t sync_bytes = cuda::persist_sync_words(n_kv, a.n_layers) * 4;
    a.sync = static_cast<unsigned*>(get(sync_bytes));
    if (!a.attn_ws || !a.attn || !a.act || !a.sync) return no("out of device memory");
    if (!ok(cudaMemsetAsync(a.sync, 0, sync_bytes, st_), "persistent decode counters") ||
        !ok(cudaStreamSynchronize(st_), "persistent decode counters"))
      return -1;
    // Tensor maps per layer and matrix: the packed weights as u32 [rows][K/8], scales and biases
    // as u16 [rows][K/group]; boxes of one unit (32 rows, 16 for gate and up, x kc columns).
    // Without the driver's encoder: per-row bulk copies.
    const auto encode = a.copy_async == 3 ? tensor_map_encoder() : nullptr;
    if (a.copy_async == 3 && !encode) a.copy_async = 0;
    if (encode) {
      std::vector<CUtensorMap> maps(layers.size() * 21);
      for (size_t l = 0; l < layers.size(); ++l) {
        const DenseLayerView& L = layers[l];
        const WeightMatrix* ms[7] = {L.q, L.k, L.v, L.o, L.gate, L.up, L.down};
        for (int m = 0; m < 7; ++m) {
          const WeightMatrix& w = *ms[m];
          const cuuint32_t box_rows = (m == 4 || m == 5) ? 16 : 32;
          for (int k = 0; k < 3; ++k) {
            const bool data = k == 0;
            const cuuint64_t dims[2] = {cuuint64_t(data ? w.cols / 8 : w.cols / g), cuuint64_t(w.rows)};
            const cuuint64_t strides[1] = {cuuint64_t(data ? w.cols / 2 : w.cols / g * 2)};
            const cuuint32_t box[2] = {cuuint32_t(data ? kc / 8 : kc / g), box_rows}, estr[2] = {1, 1};
            const void* base = k == 0 ? w.data : k == 1 ? w.scales : w.biases;
            if (encode(&maps[l * 21 + m * 3 + k], data ? CU_TENSOR_MAP_DATA_TYPE_UINT32 : CU_TENSOR_MAP_DATA_TYPE_UINT16, 2,
                       const_cast<void*>(base), dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                       CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
              return no("cuTensorMapEncodeTiled refused layer " + std::to_string(l));
          }
        }
      }
      void* dm = get(maps.size() * sizeof(CUtensorMap));
      if (!dm) return no("out of device memory");
      copy_to_device(dm, maps.data(), maps.size() * sizeof(CUtensorMap));
      a.tmaps = dm;
    }
    if (const char* t = std::getenv("ANVIL_CUDA_PERSIST_TRACE"); t && *t == '1') {
      const size_t bytes = size_t(a.n_layers + 1) * 5 * cuda::kPersistMarks * sms_ * 8;
      a.trace = static_cast<unsigned long long*>(get(bytes));
      if (!a.trace || !ok(cudaMemsetAsync(a.trace, 0, bytes, st_), "persistent decode trace"))
        return no("out of device memory");
    }
    std::fprintf(stderr,
                 "anvil: ANVIL_CUDA_PERSIST: %d layers in one launch, %d blocks, %d ring stages of %d bytes, %d in flight\n",
                 a.n_layers, sms_, a.stages, a.stage_bytes, a.inflight ? a.inflight : a.stages);
    persist_plans_.push_back(a);
    return int(persist_plans_.size()) - 1;
  }
  // ANVIL_CUDA_PERSIST_TRACE=1: the last launch's phase timeline, per phase averaged over layers
  // 1.. (microseconds): staging and work per block (mean, and the slowest block's work), how long
  // after the last block's arrival the blocks start the next phase, and the layer. Then where the
  // latency sits: the arrival's fence + atomic, the norm phases' split sums + RMS (before the
  // planes), how long a block waited for its first unit's weights after staging, and how long
  // before its arrival its last unit's weights were in the ring. Marks a block did not write in
  // the last launch (no unit, no attention item) fail the ordering checks and are left out.
  void persist_trace_report() {
    for (const cuda::PersistArgs& a : persist_plans_) {
      if (!a.trace) continue;
      const int S = sms_, L = a.n_layers, M = cuda::kPersistMarks;
      std::vector<unsigned long long> t(size_t(L + 1) * 5 * M * S);
      if (cudaMemcpy(t.data(), a.trace, t.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess) return;
      auto at = [&](int l, int k, int e, int b) { return double(t[((size_t(l) * 5 + k) * M + e) * S + b]); };
      const char* names[5] = {"q/k/v", "attention", "o", "gate/up", "down"};
      std::fprintf(stderr, "anvil: persist trace (us, mean over layers 1..%d):\n", L - 1);
      double layer = 0.0;
      for (int l = 1; l < L; ++l) layer += (at(l, 4, 2, 0) - at(l - 1, 4, 2, 0)) / 1e3 / (L - 1);
      // The mean of f over the blocks and layers where ok holds (-1 where it never does).
      auto mean = [&](auto&& ok, auto&& f) {
        double sum = 0;
        int n = 0;
        for (int l = 1; l < L; ++l)
          for (int b = 0; b < S; ++b)
            if (ok(l, b)) sum += f(l, b), ++n;
        return n ? sum / n : -1.0;
      };
      for (int k = 0; k < 5; ++k) {
        double stage = 0, work = 0, worst = 0, release = 0;
        for (int l = 1; l < L; ++l) {
          double last = 0, wmax = 0;
          for (int b = 0; b < S; ++b) {
            stage += (at(l, k, 1, b) - at(l, k, 0, b)) / 1e3;
            work += (at(l, k, 2, b) - at(l, k, 0, b)) / 1e3;
            wmax = std::max(wmax, (at(l, k, 2, b) - at(l, k, 0, b)) / 1e3);
            last = std::max(last, at(l, k, 2, b));
          }
          worst += wmax / (L - 1);
          const int nl = k == 4 ? l + 1 : l, nk = (k + 1) % 5;
          double rel = 0;
          for (int b = 0; b < S; ++b) rel += (at(nl, nk, 0, b) - last) / 1e3;
          release += rel / S / (L - 1);
        }
        stage /= double(S) * (L - 1), work /= double(S) * (L - 1);
        std::fprintf(stderr, "  %-9s stage %6.2f  work %6.2f (slowest block %6.2f)  next phase starts %5.2f after the last arrival\n",
                     names[k], k == 1 ? 0.0 : stage, work, worst, release);
        std::string more;
        char buf[96];
        const double arrive = mean([&](int l, int b) { return at(l, k, 2, b) <= at(l, k, 4, b) && at(l, k, 4, b) <= at(l, k, 2, b) + 1e6; },
                                   [&](int l, int b) { return (at(l, k, 4, b) - at(l, k, 2, b)) / 1e3; });
        if (arrive >= 0) std::snprintf(buf, sizeof buf, "; fence + atomic %.2f", arrive), more += buf;
        if (k == 0 || k == 3) {
          const double rms = mean([&](int l, int b) { return at(l, k, 0, b) <= at(l, k, 5, b) && at(l, k, 5, b) <= at(l, k, 1, b); },
                                  [&](int l, int b) { return (at(l, k, 5, b) - at(l, k, 0, b)) / 1e3; });
          if (rms >= 0) std::snprintf(buf, sizeof buf, "; split sums + RMS %.2f", rms), more += buf;
        }
        if (k != 1) {
          const double first = mean([&](int l, int b) { return at(l, k, 0, b) <= at(l, k, 6, b) && at(l, k, 6, b) <= at(l, k, 2, b); },
                                    [&](int l, int b) { return std::max(0.0, at(l, k, 6, b) - at(l, k, 1, b)) / 1e3; });
          const double lastu = mean([&](int l, int b) { return at(l, k, 0, b) <= at(l, k, 7, b) && at(l, k, 7, b) <= at(l, k, 2, b); },
                                    [&](int l, int b) { return (at(l, k, 2, b) - at(l, k, 7, b)) / 1e3; });
          if (first >= 0) std::snprintf(buf, sizeof buf, "; first unit waited %.2f, last unit in the ring %.2f before the arrival", first, lastu), more += buf;
        }
        if (!more.empty()) std::fprintf(stderr, "            %s\n", more.c_str() + 2);  // (past the first "; ")
      }
      // Attention, over the blocks that had an item: q/k/v prepared, positions, merges.
      double prep = 0, pos = 0, rest = 0;
      int n = 0;
      for (int l = 1; l < L; ++l)
        for (int b = 0; b < S; ++b) {
          const double e0 = at(l, 1, 0, b), e1 = at(l, 1, 1, b), e3 = at(l, 1, 3, b), e2 = at(l, 1, 2, b);
          if (!(e0 <= e1 && e1 <= e3 && e3 <= e2)) continue;
          prep += (e1 - e0) / 1e3, pos += (e3 - e1) / 1e3, rest += (e2 - e3) / 1e3, ++n;
        }
      if (n) std::fprintf(stderr, "  attention items: q/k/v prepared %.2f, positions %.2f, merges %.2f (%d)\n", prep / n,
                          pos / n, rest / n, n);
      std::fprintf(stderr, "  layer %.2f us\n", layer);
    }
  }
  bool decode_layers(int handle, Act h, float eps, const float* inv_freq, const KVCacheView& kv, const BatchView& batch,
                     float scale) override {
    if (handle < 0 || size_t(handle) >= persist_plans_.size()) return false;
    cuda::PersistArgs a = persist_plans_[size_t(handle)];
    // (Its attention is over the whole context: a sliding window takes the per-op path.)
    if (kv.dtype != DType::kBF16 || kv.head_dim != 128 || kv.n_kv_heads != a.n_kv || kv.n_layers != a.n_layers || kv.window > 0 ||
        batch.n_tokens != 1 || batch.n_seqs != 1 || h.dtype != DType::kBF16 || h.rows != 1 || h.cols != a.hidden)
      return false;
    a.eps = eps, a.scale = scale, a.inv_freq = inv_freq, a.kv = kvdev(kv), a.b = bdev(batch), a.h = h.data;
    Prof pr(this, "persist");
    return launched(cuda::persist_decode(a, sms_, st_), "decode layers (persistent kernel)");
  }
  // The limits of rope_kv.cu, attention.cu and attention_decode_tc.cu (off with ANVIL_CUDA_ATTN_TC=0).
  std::string attention_unsupported(int n_heads, int n_kv_heads, int head_dim, int rotary_dim = 0) const override {
    const std::string shape = " (" + std::to_string(n_heads) + " heads, " + std::to_string(n_kv_heads) +
                              " kv heads, head_dim " + std::to_string(head_dim) + ")";
    // Partial rotary embeddings (rotary_dim < head_dim, Phi-4-mini) take rope_kv.cu's partial kernel; the
    // fused and persistent forms turn whole heads and are not used for them.
    (void)rotary_dim;
    if (n_kv_heads < 1 || n_heads % n_kv_heads != 0) return "the heads are not a multiple of the kv heads" + shape;
    if (head_dim % 2 != 0 || head_dim > 256) return "head_dim must be even and at most 256" + shape;
    const int G = n_heads / n_kv_heads;
    const int DL = head_dim <= 32 ? 1 : head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : 8;
    if (head_dim % DL != 0) return "head_dim must be a multiple of " + std::to_string(DL) + shape;
    if (G > 8 && !(attn_tc_ && cuda::attention_tc_ok(n_heads, n_kv_heads, head_dim)))
      return std::to_string(G) + " query heads per kv head; its kernels take at most 8" + shape +
             (attn_tc_ ? " (16 with head_dim 64 or 128)"
                       : " (ANVIL_CUDA_ATTN_TC=0 is set; the tensor-core kernel takes 16 with head_dim 64 or 128)") +
             "; --device cpu runs it";
    return {};
  }
  void moe_ffn(Act x, const MoEWeights& w, Act out) override {
    moe_seen_ = true;  // late_norms()
    if (!bf16(x, "moe_ffn", "x") || !bf16(out, "moe_ffn", "out") || !same_shape(x, out, "moe_ffn")) return;
    if (!expect(x.data != out.data && x.cols == w.router.cols,
                "moe_ffn: expected x and out [T, hidden] (distinct) and a router [num_experts, hidden]"))
      return;
    for (int64_t t0 = 0; t0 < x.rows; t0 += cuda::kMoEMaxChunk) {
      const int64_t n = std::min(cuda::kMoEMaxChunk, x.rows - t0);
      const Act xc = x.slice_rows(t0, n);
      cuda::MoEPlan plan;
      if (!record(moe_.prepare(w, n, &plan))) return;
      // The norm's planes of x (ANVIL_CUDA_NORM_PLANES), taken before the routing launches: only the
      // expert gate/up reads them, and neither the routing nor anything else writes x or them.
      const cuda::GemvScratch* xp = n == 1 && x.rows == 1 ? planes_scratch(x) : nullptr;
      // bench --profile: the routing timed apart (synchronized; never while capturing).
      const bool phases = moe_phase_profiling() && !capturing_;
      const auto t_begin = phases ? phase_clock() : 0.0;
      Status st;
      {
        Prof pr(this, "moe_route");
        st = moe_.route(xc.data, w, plan, st_, &launches_);
      }
      if (!record(st)) return;
      const auto t_routed = phases ? phase_clock() : 0.0;
      if (plan.shared && !plan.shared_fused) {  // the shared expert through the dense ops
        const Act sh{plan.shared_h, n, plan.S, DType::kBF16}, so{plan.shared_out, n, plan.H, DType::kBF16};
        linear_swiglu(xc, w.shared_gate, w.shared_up, sh);
        if (check_linear(sh, w.shared_down, so, "moe_ffn (shared expert)")) run_linear(sh, w.shared_down, so);
      }
      {
        Prof pr(this, "moe_experts");
        matvec_hints();
        if (!record(moe_.experts(xc.data, w, plan, out.slice_rows(t0, n).data, st_, &launches_,
                                 xp ? xp->xplanes : nullptr)))
          return;
      }
      if (phases) moe_phase_add(t_routed - t_begin, phase_clock() - t_routed);
    }
  }

  // ---- profiling (cuda_set_profiling / cuda_profile_report) ----
  void set_profiling(bool on) {
    profiling_ = on;
    prof_marks_.clear();
    prof_used_ = 0;
  }
  std::vector<std::pair<std::string, double>> profile_report() {
    cudaStreamSynchronize(st_);
    std::map<std::string, double> ms;
    for (size_t i = 0; i < prof_used_; ++i) {
      float t = 0;
      cudaEventElapsedTime(&t, prof_events_[i].first, prof_events_[i].second);
      ms[prof_marks_[i]] += t;
    }
    std::vector<std::pair<std::string, double>> out(ms.begin(), ms.end());
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.second > b.second; });
    return out;
  }
  Result<double> copy_bandwidth(size_t bytes) {
    ANVIL_ASSIGN_OR_RETURN(void* a, alloc(bytes));
    auto b_or = alloc(bytes);
    if (!b_or.is_ok()) {
      cudaFree(a);
      return b_or.status();
    }
    void* b = *b_or;
    cudaMemsetAsync(a, 1, bytes, st_);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 6; ++i) {
      cudaEventRecord(e0, st_);
      cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st_);
      cudaEventRecord(e1, st_);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      if (i > 0) best = std::min(best, ms);  // the first is the warm-up
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    ANVIL_RETURN_IF_ERROR(synchronize());
    return 2.0 * double(bytes) / (double(best) * 1e-3) / 1e9;
  }

 private:
  static constexpr size_t kPinnedBytes = 1 << 16;
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    size_t nodes = 0;
  };
  // Brackets one op with CUDA events while profiling.
  struct Prof {
    CudaBackend* b;
    size_t slot = SIZE_MAX;
    Prof(CudaBackend* be, const char* family) : b(be) {
      if (!b->profiling_) return;
      if (b->prof_used_ == b->prof_events_.size()) {
        cudaEvent_t x, y;
        cudaEventCreate(&x);
        cudaEventCreate(&y);
        b->prof_events_.emplace_back(x, y);
        b->prof_marks_.emplace_back();
      }
      slot = b->prof_used_++;
      if (b->prof_marks_.size() < b->prof_used_) b->prof_marks_.resize(b->prof_used_);
      b->prof_marks_[slot] = family;
      cudaEventRecord(b->prof_events_[slot].first, b->st_);
    }
    ~Prof() {
      if (slot != SIZE_MAX) cudaEventRecord(b->prof_events_[slot].second, b->st_);
    }
  };

  bool ok(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return true;
    if (err_.is_ok()) err_ = internal_error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
    return false;
  }
  // Seconds on a steady clock once the stream has drained (moe_ffn's phase timing).
  double phase_clock() {
    ok(cudaStreamSynchronize(st_), "moe_ffn profiling");
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool record(const Status& s) {
    if (!s.is_ok() && err_.is_ok()) err_ = s;
    return s.is_ok();
  }
  bool launched(cudaError_t e, const char* op) {
    ++launches_;
    return ok(e, op);
  }
  bool expect(bool cond, const std::string& what) {
    if (!cond && err_.is_ok()) err_ = invalid_argument("cuda: " + what);
    return cond;
  }
  bool bf16(const Act& a, const char* op, const char* name) {
    return expect(a.dtype == DType::kBF16, std::string(op) + ": activation '" + name +
                                               "' must be BF16 (the CUDA backend's act_dtype), got " +
                                               std::string(dtype_name(a.dtype)));
  }
  bool same_shape(const Act& a, const Act& b, const char* op) {
    return expect(a.rows == b.rows && a.cols == b.cols, std::string(op) + ": operands differ in shape");
  }
  bool check_linear(const Act& x, const WeightMatrix& w, const Act& out, const char* op) {
    if (!bf16(x, op, "x")) return false;
    if (!expect(out.dtype == DType::kBF16 || out.dtype == DType::kF32, std::string(op) + ": out must be BF16 or F32"))
      return false;
    return expect(x.cols == w.cols && out.cols == w.rows && out.rows == x.rows,
                  std::string(op) + ": expected x [T, " + std::to_string(w.cols) + "] and out [T, " +
                      std::to_string(w.rows) + "], got x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) +
                      "], out [" + std::to_string(out.rows) + ", " + std::to_string(out.cols) + "]");
  }
  bool check_kv(const KVCacheView& kv, int layer, const char* op) {
    return expect(kv.dtype == DType::kBF16, std::string(op) + ": the CUDA KV cache must be BF16 (--kv-dtype bf16)") &&
           expect(layer >= 0 && layer < kv.n_layers, std::string(op) + ": layer out of range");
  }
  // Whether T rows of a linear with these weights run as mat-vecs (else the prefill GEMM): up to
  // gemv_max_t_ rows for every format, up to 64 for the q4 tensor-core kernels.
  bool matvec_rows(int64_t T, const DevMatrix& d) const {
    return T <= gemv_max_t_ || (tc_batch_ && T <= cuda::kTcMaxTokens && cuda::gemv_uses_tc(d));
  }
  // A one-row norm also writes its output as the one-token integer mat-vec's int16 planes (norm.cu,
  // qgemv_int.cuh), and the mat-vec launched right after it on that output copies them instead of
  // staging x (the staging was 2.5 us of a qwen3-8b q/k/v block after its PDL release, session 15's
  // timeline; one pass in the norm instead). Measured on the H200 (session 17, A/B in one call, tg64
  // best of 2): qwen3-8b q4g64 434-436 -> 450-452 tok/s, qwen3-0.6b 1,271-1,278 -> 1,290-1,303,
  // qwen3-30b-a3b-16L 1,096-1,097 -> 1,117. ANVIL_CUDA_NORM_PLANES=0 turns it off.
  // planes_buffer: where the norm of x may write them (null: not this time); planes_written: what
  // it wrote, valid for the very next launch only (launches_ unchanged since) and for that output.
  void* planes_buffer(const Act& x) {
    planes_for_ = nullptr;
    if (!norm_planes_ || x.rows != 1 || x.cols % 32 != 0 || x.cols > 8192) return nullptr;
    if (!grow(&planes_, &planes_bytes_, cuda::rmsnorm_planes_bytes(int(x.cols)))) return nullptr;
    return planes_;
  }
  void planes_written(bool written, const Act& out) {
    if (!written) return;
    planes_for_ = out.data, planes_cols_ = out.cols, planes_at_ = launches_;
  }
  const cuda::GemvScratch* planes_scratch(const Act& x) {
    if (!planes_for_ || planes_for_ != x.data || x.rows != 1 || x.cols != planes_cols_ || launches_ != planes_at_)
      return nullptr;
    pscratch_ = cuda::GemvScratch{};
    pscratch_.xplanes = planes_;
    return &pscratch_;
  }
  // The scratch of the q4 batch kernel (qgemm_batch.cu) for 17..64 rows of these matrices, grown
  // to what it needs (its counters zeroed when new); null: the call runs without it.
  const cuda::GemvScratch* batch_scratch(const DevMatrix* ws, int n, const DevMatrix* up, int64_t T) {
    cuda::GemvScratch need;
    need.cluster = bscratch_.cluster, need.sum_kernel = bscratch_.sum_kernel, need.plain_x = bscratch_.plain_x;
    if (!batch_gemv_ || T < cuda::kBatchMinTokens || T > cuda::kTcMaxTokens ||
        !cuda::gemv_batch_need(ws, n, up, int(T), &need))
      return nullptr;
    cuda::GemvScratch& b = bscratch_;
    if (!grow(&b.xperm, &b.xperm_bytes, need.xperm_bytes)) return nullptr;
    size_t bytes = b.part_floats * 4;
    if (need.part_floats && !grow(reinterpret_cast<void**>(&b.part), &bytes, need.part_floats * 4)) return nullptr;
    b.part_floats = bytes / 4;
    if (need.n_done) {
      void* done = b.done;
      bytes = b.n_done * 4;
      if (!grow(&done, &bytes, need.n_done * 4)) return nullptr;
      const bool fresh = done != b.done;
      b.done = static_cast<unsigned*>(done), b.n_done = bytes / 4;
      if (fresh && !ok(cudaMemsetAsync(done, 0, bytes, st_), "batch mat-vec counters")) return nullptr;
    }
    return &b;
  }
  void run_linear(const Act& x, const WeightMatrix& w, const Act& out) {
    const bool f32 = out.dtype == DType::kF32;
    const DevMatrix d = dev(w);
    if (use_cublas_ && x.rows >= cuda::kCublasMinTokens && w.cols % 32 == 0 && !matvec_rows(x.rows, d)) {
      // bf16 weights go to cuBLAS as they are; other formats are first dequantized (or converted)
      // into a bf16 scratch. (Until 2026-12-01 bf16 ones were copied there too: a qwen3-8b bf16
      // prefill chunk moved 33 GB more than it needed.)
      if (d.bits == 0 && d.dtype == cuda::Elem::kBF16) {
        launched(cuda::gemm_cublas(cublas_, d.data, d, x.data, int(x.rows), out.data, f32, st_), "linear (cuBLAS)");
        return;
      }
      if (!grow(&wdeq_, &wdeq_bytes_, size_t(w.rows * w.cols) * 2)) return;
      if (launched(cuda::dequant_bf16(d, wdeq_, st_), "linear (dequantize)"))
        launched(cuda::gemm_cublas(cublas_, wdeq_, d, x.data, int(x.rows), out.data, f32, st_), "linear (cuBLAS)");
      return;
    }
    if (!matvec_rows(x.rows, d) && w.cols % 32 == 0) {
      launched(cuda::gemm(d, x.data, int(x.rows), out.data, f32, st_), "linear (gemm)");
      return;
    }
    void* o = out.data;
    launched(cuda::gemv(&d, &o, 1, x.data, int(x.rows), f32, st_, batch_scratch(&d, 1, nullptr, x.rows)),
             "linear (gemv)");  // chunks T itself
  }
  // Grows a backend-owned buffer to at least `need` bytes. The old one is retired, not freed: a
  // captured graph may still read it.
  bool grow(void** buf, size_t* have, size_t need) {
    if (*have >= need) return true;
    const size_t n = std::max(need, *have * 2);
    auto p = alloc(n);
    if (!p.is_ok()) {
      if (err_.is_ok()) err_ = p.status();
      return false;
    }
    if (*buf) retired_.push_back(*buf);
    *buf = *p;
    *have = n;
    return true;
  }
  // The most positions one token attends to: the page table's capacity (fixed, so that a captured
  // graph's split count holds as the context grows), or a sliding window when smaller.
  static int attn_span(const KVCacheView& kv, int layer, const BatchView& batch) {
    const int cap = batch.max_pages * kv.page_size, w = kv.window_of(layer);
    return w > 0 ? std::min(cap, w) : cap;
  }
  // layer: the one the launch attends over (its sliding window, KVCacheView::window_of); -1: none.
  static cuda::KVDev kvdev(const KVCacheView& kv, int layer = -1) {
    cuda::KVDev d;
    d.base = kv.base, d.n_layers = kv.n_layers, d.n_kv_heads = kv.n_kv_heads, d.head_dim = kv.head_dim;
    d.page_size = kv.page_size;
    d.window = layer >= 0 ? kv.window_of(layer) : 0;
    return d;
  }
  static cuda::BatchDev bdev(const BatchView& b) {
    cuda::BatchDev d;
    d.n_tokens = b.n_tokens, d.n_seqs = b.n_seqs, d.max_pages = b.max_pages;
    d.pos = b.pos, d.seq = b.seq, d.page_table = b.page_table;
    return d;
  }
  std::string mem_summary() const {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return "free memory unknown";
    return mib(f) + " free of " + mib(t);
  }

  int dev_ = 0, sms_ = 132, cc_major_ = 9;
  // ANVIL_CUDA_PERSIST=1: decode tokens of one sequence through persist_decode.cu (prepare_decode_layers).
  bool persist_ = false;
  int persist_copy_ = 3;  // PersistArgs::copy_async (ANVIL_CUDA_PERSIST=1: 3, tensor maps; =2: 0; =3: 1)
  std::vector<cuda::PersistArgs> persist_plans_;
  std::vector<void*> persist_bufs_;
  std::string name_;
  cudaStream_t st_ = nullptr;
  Status err_;
  cuda::PageCopier copier_;  // the KV store's copy streams
  void* pinned_ = nullptr;
  bool capturing_ = false;
  uint64_t launches_ = 0, capture_launches_ = 0;
  std::unordered_map<uint64_t, Graph> graphs_;
  float* attn_ws_ = nullptr;
  size_t attn_ws_bytes_ = 0;
  // The q4 batch kernel's scratch (batch_scratch): fragment-order activations, split-K partials,
  // counters. ANVIL_CUDA_BATCH_GEMV=0: 17..64 rows run the register-fed kernel instead.
  bool batch_gemv_ = true;
  cuda::GemvScratch bscratch_;  // its buffers, owned here
  void* attn_done_ = nullptr;  // ANVIL_CUDA_ATTN_FUSED=1: the split counters (see attention())
  size_t attn_done_bytes_ = 0;
  void* mlp_scratch_ = nullptr;
  void* argmax_counters_ = nullptr;  // argmax_rows (sample.cu): per-row counters, partial results
  size_t argmax_counters_bytes_ = 0;
  void* argmax_part_ = nullptr;
  size_t argmax_part_bytes_ = 0;
  size_t mlp_scratch_bytes_ = 0;
  void* wdeq_ = nullptr;  // prefill: the current matrix dequantized to bf16 for cuBLAS
  size_t wdeq_bytes_ = 0;
  cublasHandle_t cublas_ = nullptr;
  bool use_cublas_ = true;
  // Prefill chunks through attention_prefill.cu (ANVIL_CUDA_FA=0: the split kernels). On the H200
  // it took qwen3-8b q4g64 pp4096 from 3.2k to 5.8k tok/s (docs/benchmarks.md, 2026-12-01).
  bool fa_ = true;
  // The fewest tokens of a one-sequence chunk that go to the prefill kernel (smaller chunks take the
  // decode kernels: attention_tc_chunk); ANVIL_CUDA_FA_MIN=T sets it, for measuring.
  int fa_min_ = 64;
  // A prefill chunk of one sequence at consecutive positions (what attention_prefill takes), by the
  // batch's host mirrors.
  static bool one_run(const BatchView& b) {
    if (!b.pos_host || !b.seq_host) return false;
    for (int t = 1; t < b.n_tokens; ++t)
      if (b.seq_host[t] != b.seq_host[0] || b.pos_host[t] != b.pos_host[0] + t) return false;
    return true;
  }
  int gemv_max_t_ = cuda::kGemvMaxTokens;  // batches up to this many rows run as 8-row mat-vecs
  bool tc_batch_ = true;  // 9..64 rows of q4 tensor-core weights run as mat-vecs (ANVIL_CUDA_TC_BATCH=0: GEMM)
  // Whether a layer whose residual stream is `hidden` wide runs its norms and residual adds inside
  // the mat-vecs at T tokens by default: one token, and the output projections (hidden rows: o and
  // down, which add into h) in at most one 16-row tile per SM. Why (session 46's timeline, H100):
  // without the norm kernel between them, the q/k/v and gate/up blocks can become resident (and
  // copy their first weights) during the previous mat-vec only where it leaves SMs free. On
  // qwen3-0.6b (64 tiles) they started 4-15 us before their release and decode gained 5.2%
  // (1,291 -> 1,359 tok/s); on qwen3-8b (256 tiles, two blocks filling each SM's registers) they
  // started ~1 us before it, the q/k/v mat-vec took 13.3 instead of ~5 us, and decode lost 2.6%.
  bool fuse_rule(int64_t T, int64_t hidden) const { return T == 1 && hidden <= 16 * int64_t(sms_); }
  // ANVIL_CUDA_FUSE=1 / =0: decode layers always / never use the fused norm and residual-add
  // mat-vecs (fuses_norm_linear); -1 (unset): fuse_rule.
  int fuse_ = -1;
  // ANVIL_CUDA_QKV_ROPE=1: one-token q/k/v launches do rope_kv's work in their tail (fuses_qkv_rope);
  // rope_counters_: its per-head counts.
  bool qkv_rope_ = false;
  void* rope_counters_ = nullptr;
  size_t rope_counters_bytes_ = 0;
  // ANVIL_CUDA_L2_PREFETCH=MB[,1[,1]]: bytes prefetch_weights pulls into L2 per call (0: off),
  // whether before the prefetch kernel's PDL wait, and whether with the evict_last priority.
  uint64_t l2_prefetch_bytes_ = 0;
  bool l2_prefetch_early_ = false;
  bool l2_prefetch_keep_ = false;
  // A fourth field of 1: the kernel on a stream of its own (st_pf_), forked after q/k/v.
  bool l2_prefetch_fork_ = false;
  cudaStream_t st_pf_ = nullptr;
  cudaEvent_t ev_fork_ = nullptr, ev_join_ = nullptr;
  bool pf_join_pending_ = false;
  // ANVIL_CUDA_L2_PREFETCH_MLP=MB[,1]: the same for the kMlp hint (the down projection, during gate/up).
  uint64_t l2_prefetch_mlp_bytes_ = 0;
  bool l2_prefetch_mlp_keep_ = false;
  // ANVIL_CUDA_ATTN_FUSED=1: decode attention merges its splits in the split kernel's last block
  // (one launch per layer fewer). Correct on the H200, but slower there (qwen3-8b q4g64 251 vs 267
  // tok/s, qwen3-0.6b 760 vs 786: the last block's merge runs alone at the end), so opt-in.
  bool attn_fused_ = false;
  // Decode attention on the tensor cores merges its splits inside their thread block cluster
  // (attention_tc_cluster) where they fit in one (up to 16 splits on the H200), instead of the
  // combine kernel. Measured on the H200 (session 16, interleaved A/B, tg64 best of 2): qwen3-0.6b
  // q4g64 1,275 and 1,288 against 1,211 and 1,218 tok/s, qwen3-8b 443.7 and 443.9 against 439.3 and
  // 434.6. ANVIL_CUDA_ATTN_CLUSTER=0: the combine kernel.
  bool attn_cluster_ = true;
  // A prefill chunk of one sequence that the prefill kernel does not take (fewer than 64 tokens, or
  // ANVIL_CUDA_FA=0) runs through attention_tc_chunk, 16 / G tokens per block, instead of one block
  // per token (ANVIL_CUDA_ATTN_CHUNK=0). Why: on an H100 (session 34) a 16-token chunk after 4,096
  // tokens of context spent ~4 ms of its ~8 ms forward in attention, every block reading its
  // split's K/V for one token. Measured on an H100 (session 35, qwen3-8b q4g64, a 4,112-token
  // prompt): chunks of 16 tokens 2,456/2,432 -> 2,590/2,576 prefill tok/s, 32 tokens 3,497/3,500 ->
  // 4,432/4,448, 64 with ANVIL_CUDA_FA=0 5,599/5,610 -> 6,686/6,664.
  bool attn_chunk_ = true;
  // The one-row norms' int16 planes for the next mat-vec (planes_buffer above).
  bool norm_planes_ = true;
  void* planes_ = nullptr;
  size_t planes_bytes_ = 0;
  const void* planes_for_ = nullptr;
  int64_t planes_cols_ = 0;
  uint64_t planes_at_ = 0;
  cuda::GemvScratch pscratch_;
  // Decode attention on the tensor cores (attention_decode_tc.cu; ANVIL_CUDA_ATTN_TC=0: the split
  // kernels). On by default since it measured faster on the H200 (2026-12-01): qwen3-8b q4g64 311 vs
  // 286 tok/s, qwen3-0.6b 964 vs 870, the 32-sequence step 8.65 vs 10.86 ms (benchmarks.md).
  bool attn_tc_ = true;
  // Decode norms let the next kernel in late (norm.cu rmsnorm_vec_kernel) once an MoE block has run:
  // measured +6% on qwen3-30b-a3b-16L decode and -1.3..-1.5% on dense models (session 15).
  // ANVIL_CUDA_NORM_LATE=0 never, =1 always.
  bool moe_seen_ = false;
  // What the mat-vec launches of this backend's ops take from it (cuda_kernels.h): rings fitted to
  // their warps' steps in one-token 8-warp launches until an MoE block has run (qgemv_stream.cu,
  // ring_fit_rule).
  void matvec_hints() const { cuda::set_ring_fit_default(!moe_seen_); }
  bool late_norms() const {
    static const int mode = [] {
      const char* e = std::getenv("ANVIL_CUDA_NORM_LATE");
      return e && *e == '0' ? 0 : e && *e == '1' ? 1 : 2;
    }();
    return mode == 1 || (mode == 2 && moe_seen_);
  }
  // ANVIL_CUDA_ROPE_ATTN=1: decode steps run q/k norm + RoPE + KV append, tensor-core attention and
  // the splits' merge as one kernel (rope_attention, attention_decode_tc.cu) instead of rope_kv,
  // attention and combine. Correct on the H200 (CudaOps.FusedRopeAttentionMatchesCpu, golden 38/38)
  // but no faster there (2026-12-01, tg64 after 512: qwen3-8b q4g64 375.8 vs 371.1 tok/s, qwen3-0.6b
  // 1,069 vs 1,095, qwen3-30b-a3b-16L 877.8 vs 854.7; after 16,384 tokens 243.5 vs 275.1, with 16
  // blocks per kv head instead of 66), so opt-in.
  bool rope_attn_ = false;
  // ANVIL_CUDA_SKIP=family,...: for measuring only, the ops of these --profile families (norm,
  // rope_kv, attention, linear, mlp_gate_up) launch nothing, so the results are meaningless; the
  // change in decode time is what those kernels cost inside the graph, launch gaps included.
  std::string skip_;
  bool skip(const char* family) const {
    if (skip_.empty()) return false;
    const std::string f = "," + std::string(family) + ",";
    return ("," + skip_ + ",").find(f) != std::string::npos;
  }
  std::vector<void*> retired_;
  cuda::MoERunner moe_;  // destroyed after ~CudaBackend has drained the stream
  bool profiling_ = false;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> prof_events_;
  std::vector<std::string> prof_marks_;
  size_t prof_used_ = 0;
};

CudaBackend* as_cuda(Backend& b) { return dynamic_cast<CudaBackend*>(&b); }

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(StatusCode::kNotFound, std::string("no usable CUDA GPU: ") + cudaGetErrorString(e) +
                                             " (is the NVIDIA driver installed and a GPU visible?)");
  }
  if (n == 0) return Status(StatusCode::kNotFound, "no CUDA GPU found");
  if (device < 0 || device >= n)
    return invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                            " found)");
  cudaDeviceProp prop;
  if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess || (e = cudaSetDevice(device)) != cudaSuccess)
    return Status(StatusCode::kNotFound, std::string("CUDA device ") + std::to_string(device) + ": " +
                                             cudaGetErrorString(e));
  std::string why;
  if (!cuda::kernels_runnable(&why))
    return unsupported(std::string("this anvil build has no kernels for ") + prop.name + " (sm_" +
                       std::to_string(prop.major) + std::to_string(prop.minor) + "): " + why +
                       "; rebuild with -DANVIL_CUDA_ARCHS=" + std::to_string(prop.major) + std::to_string(prop.minor));
  auto b = std::make_unique<CudaBackend>(device, prop);
  ANVIL_RETURN_IF_ERROR(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

Status cuda_memory_info(int device, size_t* free_bytes, size_t* total_bytes) {
  int cur = 0;
  cudaGetDevice(&cur);
  if (cur != device) cudaSetDevice(device);
  cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
  if (cur != device) cudaSetDevice(cur);
  if (e != cudaSuccess) return internal_error(std::string("cudaMemGetInfo: ") + cudaGetErrorString(e));
  return Status::ok();
}

Result<double> cuda_copy_bandwidth_gbs(Backend& b, size_t bytes) {
  CudaBackend* c = as_cuda(b);
  if (!c) return invalid_argument("cuda_copy_bandwidth_gbs: not a CUDA backend");
  return c->copy_bandwidth(bytes);
}

void cuda_set_profiling(Backend& b, bool on) {
  if (CudaBackend* c = as_cuda(b)) c->set_profiling(on);
}

std::vector<std::pair<std::string, double>> cuda_profile_report(Backend& b) {
  CudaBackend* c = as_cuda(b);
  return c ? c->profile_report() : std::vector<std::pair<std::string, double>>{};
}

}  // namespace anvil
