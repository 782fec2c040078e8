// A Backend decorator for `anvil bench --profile`: forwards every op to the wrapped backend and
// attributes its wall time (synchronized before and after, so device backends time the op itself) and
// its call count to a category: routing, expert FFN, attention, dense FFN or the rest. A linear is
// classified by the weight it reads (set_linear_category), moe_ffn is split into routing and experts by
// the backends' phase counters (cpu_backend.h; the CPU and CUDA backends report them).
// Timing every op adds a synchronization per op: use it for attribution, not for the headline figures.
#pragma once
#include <chrono>
#include <map>
#include <memory>

#include "backend/backend.h"

namespace anvil {

enum class ProfileCategory { kRouting, kExperts, kAttention, kDenseFfn, kRest, kCount };
const char* profile_category_name(ProfileCategory c);

struct ProfileTotals {
  double seconds[int(ProfileCategory::kCount)] = {};
  int64_t ops[int(ProfileCategory::kCount)] = {};
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : in_(inner) {}
  // Linears reading weight data `data` count as category c (default: kRest).
  void set_linear_category(const void* data, ProfileCategory c) { linear_cat_[data] = c; }
  void reset() { totals_ = ProfileTotals{}; }
  const ProfileTotals& totals() const { return totals_; }

  std::string name() const override { return in_.name(); }
  DType act_dtype() const override { return in_.act_dtype(); }
  Result<void*> alloc(size_t bytes) override { return in_.alloc(bytes); }
  void free(void* p) override { in_.free(p); }
  void copy_to_device(void* d, const void* s, size_t n) override { in_.copy_to_device(d, s, n); }
  void copy_to_host(void* d, const void* s, size_t n) override { in_.copy_to_host(d, s, n); }
  void copy_device(void* d, const void* s, size_t n) override { in_.copy_device(d, s, n); }
  Result<WeightMatrix> upload_weight(const WeightMatrix& w) override { return in_.upload_weight(w); }
  Result<WeightVector> upload_vector(const WeightVector& v) override { return in_.upload_vector(v); }
  void free_weight(const WeightMatrix& w) override { in_.free_weight(w); }
  void free_vector(const WeightVector& v) override { in_.free_vector(v); }
  Status synchronize() override { return in_.synchronize(); }
  uint64_t launch_count() const override { return in_.launch_count(); }  // graphs stay off: every op is timed

  void embed(const WeightMatrix& t, const int32_t* ids, Act out) override {
    timed(ProfileCategory::kRest, [&] { in_.embed(t, ids, out); });
  }
  void rmsnorm(Act x, const WeightVector& w, float eps, Act out) override {
    timed(ProfileCategory::kRest, [&] { in_.rmsnorm(x, w, eps, out); });
  }
  void add_rmsnorm(Act r, Act x, const WeightVector& w, float eps, Act out) override {
    timed(ProfileCategory::kRest, [&] { in_.add_rmsnorm(r, x, w, eps, out); });
  }
  void linear(Act x, const WeightMatrix& w, Act out) override {
    auto it = linear_cat_.find(w.data);
    timed(it == linear_cat_.end() ? ProfileCategory::kRest : it->second, [&] { in_.linear(x, w, out); });
  }
  void linear_multi(Act x, std::span<const WeightMatrix* const> ws, std::span<const Act> outs) override {
    auto it = ws.empty() ? linear_cat_.end() : linear_cat_.find(ws[0]->data);
    timed(it == linear_cat_.end() ? ProfileCategory::kRest : it->second, [&] { in_.linear_multi(x, ws, outs); });
  }
  void linear_swiglu(Act x, const WeightMatrix& g, const WeightMatrix& u, Act out) override {
    timed(ProfileCategory::kDenseFfn, [&] { in_.linear_swiglu(x, g, u, out); });
  }
  // The fused layer forms (backend.h) are forwarded, so a profile shows the flow the backend runs:
  // the norm is counted with the projection it is fused into, the residual add with its linear.
  // Not timed (a hint, not an op: where the backend acts on it, its cost lands in the next op's).
  void prefetch_weights(int64_t rows, std::span<const WeightMatrix* const> ws, PrefetchWindow when) override {
    in_.prefetch_weights(rows, ws, when);
  }
  bool fuses_norm_linear(int64_t T, std::span<const WeightMatrix* const> ws) const override {
    return in_.fuses_norm_linear(T, ws);
  }
  void rmsnorm_linear_multi(Act h, const WeightVector& n, float eps, Act x, std::span<const WeightMatrix* const> ws,
                            std::span<const Act> outs) override {
    auto it = ws.empty() ? linear_cat_.end() : linear_cat_.find(ws[0]->data);
    timed(it == linear_cat_.end() ? ProfileCategory::kRest : it->second,
          [&] { in_.rmsnorm_linear_multi(h, n, eps, x, ws, outs); });
  }
  bool fuses_qkv_rope(int64_t T, const KVCacheView& kv, std::span<const WeightMatrix* const> qkv) const override {
    return in_.fuses_qkv_rope(T, kv, qkv);
  }
  void linear_qkv_rope(Act in, const WeightVector* norm, float eps, Act x, std::span<const WeightMatrix* const> ws,
                       std::span<const Act> outs, const WeightVector& qn, const WeightVector& kn, const float* inv_freq,
                       const KVCacheView& kv, int layer, const BatchView& batch) override {
    auto it = ws.empty() ? linear_cat_.end() : linear_cat_.find(ws[0]->data);
    timed(it == linear_cat_.end() ? ProfileCategory::kRest : it->second,
          [&] { in_.linear_qkv_rope(in, norm, eps, x, ws, outs, qn, kn, inv_freq, kv, layer, batch); });
  }
  void rmsnorm_linear_swiglu(Act h, const WeightVector& n, float eps, Act x, const WeightMatrix& g,
                             const WeightMatrix& u, Act out) override {
    timed(ProfileCategory::kDenseFfn, [&] { in_.rmsnorm_linear_swiglu(h, n, eps, x, g, u, out); });
  }
  void linear_add(Act x, const WeightMatrix& w, Act h, Act scratch) override {
    auto it = linear_cat_.find(w.data);
    timed(it == linear_cat_.end() ? ProfileCategory::kRest : it->second, [&] { in_.linear_add(x, w, h, scratch); });
  }
  void gather_rows(Act src, const int32_t* rows, Act dst) override {
    timed(ProfileCategory::kRest, [&] { in_.gather_rows(src, rows, dst); });
  }
  void argmax_rows(Act logits, const int32_t* suppress, int n_suppress, int32_t* ids) override {
    timed(ProfileCategory::kRest, [&] { in_.argmax_rows(logits, suppress, n_suppress, ids); });
  }
  bool has_sample_rows() const override { return in_.has_sample_rows(); }
  size_t sample_scratch_bytes(int rows, int64_t vocab) const override { return in_.sample_scratch_bytes(rows, vocab); }
  void sample_rows(Act logits, const SampleArgs& a, int32_t* ids) override {
    timed(ProfileCategory::kRest, [&] { in_.sample_rows(logits, a, ids); });
  }
  void swiglu(Act g, Act u, Act out) override {
    timed(ProfileCategory::kDenseFfn, [&] { in_.swiglu(g, u, out); });
  }
  void add(Act a, Act b) override {
    timed(ProfileCategory::kRest, [&] { in_.add(a, b); });
  }
  void qk_norm_rope_kv_append(Act q, Act k, Act v, const WeightVector& qn, const WeightVector& kn, float eps,
                              const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& b) override {
    timed(ProfileCategory::kAttention,
          [&] { in_.qk_norm_rope_kv_append(q, k, v, qn, kn, eps, inv_freq, kv, layer, b); });
  }
  void attention(Act q, const KVCacheView& kv, int layer, const BatchView& b, float scale, Act out) override {
    timed(ProfileCategory::kAttention, [&] { in_.attention(q, kv, layer, b, scale, out); });
  }
  void rope_attention(Act q, Act k, Act v, const WeightVector& qn, const WeightVector& kn, float eps,
                      const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& b, float scale,
                      Act out) override {
    timed(ProfileCategory::kAttention,
          [&] { in_.rope_attention(q, k, v, qn, kn, eps, inv_freq, kv, layer, b, scale, out); });
  }
  void to_host_f32(Act x, float* dst) override {
    timed(ProfileCategory::kRest, [&] { in_.to_host_f32(x, dst); });
  }
  bool has_moe_ffn() const override { return in_.has_moe_ffn(); }
  bool supports_page_store() const override { return in_.supports_page_store(); }
  std::string attention_unsupported(int n_heads, int n_kv_heads, int head_dim, int rotary_dim = 0) const override {
    return in_.attention_unsupported(n_heads, n_kv_heads, head_dim, rotary_dim);
  }
  // The store's staging copies run on the wrapped backend's own streams (not timed: not decode ops).
  Result<void*> alloc_host_staging(size_t bytes) override { return in_.alloc_host_staging(bytes); }
  void free_host_staging(void* p) override { in_.free_host_staging(p); }
  uint64_t record_fence() override { return in_.record_fence(); }
  void copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                             size_t rows, uint64_t after_fence) override {
    in_.copy_2d_to_host_async(dst, dst_pitch, src, src_pitch, width, rows, after_fence);
  }
  Status wait_host_copies() override { return in_.wait_host_copies(); }
  bool device_memory_is_host() const override { return in_.device_memory_is_host(); }
  void copy_to_device_async(void* dst, const void* src, size_t bytes) override {
    in_.copy_to_device_async(dst, src, bytes);
  }
  Status wait_device_copies() override { return in_.wait_device_copies(); }
  Status wait_device_copies_from(const void* src) override { return in_.wait_device_copies_from(src); }
  void moe_ffn(Act x, const MoEWeights& w, Act out) override;

 private:
  template <class F>
  void timed(ProfileCategory c, F&& f) {
    (void)in_.synchronize();  // errors stay sticky in the wrapped backend: the caller's synchronize sees them
    const auto t0 = std::chrono::steady_clock::now();
    f();
    (void)in_.synchronize();
    totals_.seconds[int(c)] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++totals_.ops[int(c)];
  }

  Backend& in_;
  std::map<const void*, ProfileCategory> linear_cat_;
  ProfileTotals totals_;
};

}  // namespace anvil
