#include "backend/backend.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace anvil {

size_t WeightMatrix::data_bytes() const {
  return bits == 0 ? size_t(rows) * size_t(cols) * dtype_size(dtype) : size_t(rows) * size_t(cols) * size_t(bits) / 8;
}

size_t WeightMatrix::group_bytes() const {
  return bits == 0 ? 0 : size_t(rows) * size_t(cols / group_size) * dtype_size(dtype);
}

size_t WeightMatrix::bytes() const {
  return data_bytes() + 2 * group_bytes() + (bias ? size_t(rows) * dtype_size(bias_dtype) : 0);
}

void Backend::linear_multi(Act x, std::span<const WeightMatrix* const> ws, std::span<const Act> outs) {
  for (size_t i = 0; i < ws.size() && i < outs.size(); ++i) linear(x, *ws[i], outs[i]);
}

void Backend::rmsnorm_linear_multi(Act h, const WeightVector& norm, float eps, Act x,
                                   std::span<const WeightMatrix* const> ws, std::span<const Act> outs) {
  rmsnorm(h, norm, eps, x);
  linear_multi(x, ws, outs);
}

void Backend::linear_qkv_rope(Act in, const WeightVector* norm, float eps, Act x,
                              std::span<const WeightMatrix* const> ws, std::span<const Act> outs,
                              const WeightVector& q_norm, const WeightVector& k_norm, const float* inv_freq,
                              const KVCacheView& kv, int layer, const BatchView& batch) {
  if (ws.size() != 3 || outs.size() != 3) {
    linear_multi(in, ws, outs);  // reports the mismatch as linear_multi does
    return;
  }
  if (norm) rmsnorm_linear_multi(in, *norm, eps, x, ws, outs);
  else linear_multi(in, ws, outs);
  qk_norm_rope_kv_append(outs[0], outs[1], outs[2], q_norm, k_norm, eps, inv_freq, kv, layer, batch);
}

void Backend::rmsnorm_linear_swiglu(Act h, const WeightVector& norm, float eps, Act x, const WeightMatrix& gate,
                                    const WeightMatrix& up, Act out) {
  rmsnorm(h, norm, eps, x);
  linear_swiglu(x, gate, up, out);
}

void Backend::linear_add(Act x, const WeightMatrix& w, Act h, Act scratch) {
  linear(x, w, scratch);
  add(h, scratch);
}

Result<void*> Backend::alloc_host_staging(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) return Status(StatusCode::kOutOfMemory, "host staging: could not allocate " + std::to_string(bytes) + " bytes");
  return p;
}

void Backend::free_host_staging(void* p) { std::free(p); }

void Backend::copy_2d_to_host_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                                    size_t rows, uint64_t) {
  for (size_t r = 0; r < rows; ++r)
    copy_to_host(static_cast<uint8_t*>(dst) + r * dst_pitch, static_cast<const uint8_t*>(src) + r * src_pitch, width);
}

void Backend::moe_ffn(Act, const MoEWeights&, Act) {
  std::fprintf(stderr, "anvil: backend %s has no mixture-of-experts op (moe_ffn) yet\n", name().c_str());
  std::abort();
}

void Backend::rope_attention(Act q, Act k, Act v, const WeightVector& q_norm, const WeightVector& k_norm, float eps,
                             const float* inv_freq, const KVCacheView& kv, int layer, const BatchView& batch,
                             float scale, Act out) {
  qk_norm_rope_kv_append(q, k, v, q_norm, k_norm, eps, inv_freq, kv, layer, batch);
  attention(q, kv, layer, batch, scale, out);
}

void Backend::sample_rows(Act, const SampleArgs&, int32_t*) {
  std::fprintf(stderr, "anvil: backend %s has no device sampler (sample_rows)\n", name().c_str());
  std::abort();
}

}  // namespace anvil
