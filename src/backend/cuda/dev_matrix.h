// Host side of the CUDA backend: a backend.h WeightMatrix as the kernels take it (cuda_kernels.h
// DevMatrix). Shared by the backend's ops and the MoE runner.
#pragma once
#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

namespace anvil::cuda {

// A float dtype as the kernels' Elem (the dtype is checked where the weight was uploaded).
inline Elem elem_unchecked(DType d) { return d == DType::kF32 ? Elem::kF32 : d == DType::kF16 ? Elem::kF16 : Elem::kBF16; }

inline DevMatrix dev_matrix(const WeightMatrix& w) {
  DevMatrix m;
  m.data = w.data, m.scales = w.scales, m.biases = w.biases, m.bias = w.bias;
  m.rows = w.rows, m.cols = w.cols, m.bits = w.bits, m.group = w.group_size;
  m.dtype = elem_unchecked(w.dtype), m.bias_dtype = elem_unchecked(w.bias_dtype);
  return m;
}

}  // namespace anvil::cuda
