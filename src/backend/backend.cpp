#include "backend/backend.h"

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

}  // namespace anvil
