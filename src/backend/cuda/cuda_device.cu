#include <cuda_runtime.h>

#include "backend/cuda/cuda_device.h"

namespace anvil::cuda {

namespace {
__global__ void probe_kernel(int* p) {
  if (p) *p = 1;
}
}  // namespace

bool kernels_runnable(std::string* error) {
  cudaFuncAttributes attr;
  cudaError_t e = cudaFuncGetAttributes(&attr, probe_kernel);
  if (e == cudaSuccess) return true;
  cudaGetLastError();
  if (error) *error = cudaGetErrorString(e);
  return false;
}

std::vector<DeviceInfo> list_devices(std::string* error) {
  std::vector<DeviceInfo> out;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (error) *error = cudaGetErrorString(e);
    return out;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back({i, p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem});
  }
  return out;
}

}  // namespace anvil::cuda
