#include "backend/backend.h"

#include <cstdio>
#include <cstdlib>

namespace anvil {

size_t WeightMatrix::bytes() const {
  size_t n = 0;
  if (bits == 0) {
    n = size_t(rows) * size_t(cols) * dtype_size(dtype);
  } else {
    n = size_t(rows) * size_t(cols) * size_t(bits) / 8;
    size_t groups = size_t(rows) * size_t(cols / group_size);
    n += 2 * groups * dtype_size(dtype);
  }
  if (bias) n += size_t(rows) * dtype_size(bias_dtype);
  return n;
}

void Backend::linear_multi(Act x, std::span<const WeightMatrix* const> ws, std::span<const Act> outs) {
  for (size_t i = 0; i < ws.size() && i < outs.size(); ++i) linear(x, *ws[i], outs[i]);
}

void Backend::moe_ffn(Act, const MoEWeights&, Act) {
  std::fprintf(stderr, "anvil: backend %s has no mixture-of-experts op (moe_ffn) yet\n", name().c_str());
  std::abort();
}

}  // namespace anvil
