// CUDA device discovery: which GPUs the runtime sees. The CUDA backend's ops land in one .cu per
// op family beside this file (qgemv, attention, norm_rope, ...).
#pragma once
#include <string>
#include <vector>

namespace anvil::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_bytes = 0;
};

// Every device the CUDA runtime reports; empty (with *error set) when there is no usable GPU.
std::vector<DeviceInfo> list_devices(std::string* error);

// Whether this build's kernels can run on the current device (they are compiled for
// ANVIL_CUDA_ARCHS only); otherwise *error says why.
bool kernels_runnable(std::string* error);

}  // namespace anvil::cuda
