// The host side of the graph timeline (trace.h): the buffer, the kernel names per captured graph,
// the armed replay and the file it writes.
#include "backend/cuda/trace.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace anvil::cuda::trace {
namespace {

struct State {
  std::mutex mu;
  std::vector<Binder> binders;
  void* dev = nullptr;
  bool bind_failed = false;
  std::vector<const void*> capturing;
  std::map<uint64_t, std::vector<const void*>> names;
  std::map<uint64_t, int> replays;
  std::map<uint64_t, bool> done;
};
State& st() {
  static State s;
  return s;
}
const char* path() {
  static const char* p = std::getenv("ANVIL_CUDA_TRACE");
  return p && *p ? p : nullptr;
}
int step() {
  static const int n = [] {
    const char* e = std::getenv("ANVIL_CUDA_TRACE_STEP");
    const int v = e ? std::atoi(e) : 0;
    return v > 0 ? v : 20;
  }();
  return n;
}

// Allocates and binds the buffer once (under st().mu).
bool ensure_buffer(State& s) {
  if (s.dev) return true;
  if (s.bind_failed) return false;
  if (s.binders.empty()) {
    std::fprintf(stderr, "anvil: ANVIL_CUDA_TRACE is set but this build has no trace points "
                         "(configure with -DCMAKE_CUDA_FLAGS=-DANVIL_CUDA_TRACE)\n");
    s.bind_failed = true;
    return false;
  }
  if (cudaMalloc(&s.dev, kBufBytes) != cudaSuccess) {
    std::fprintf(stderr, "anvil: trace: cannot allocate %zu bytes\n", kBufBytes);
    s.dev = nullptr, s.bind_failed = true;
    return false;
  }
  for (Binder b : s.binders)
    if (b(s.dev) != cudaSuccess) {
      std::fprintf(stderr, "anvil: trace: binding a kernel unit's buffer failed\n");
      s.bind_failed = true;
      return false;
    }
  return true;
}

}  // namespace

void add_binder(Binder b) {
  std::lock_guard<std::mutex> lk(st().mu);
  st().binders.push_back(b);
}

bool armed() { return path() != nullptr; }

void note_launch(const void* fn) {
  if (!armed()) return;
  std::lock_guard<std::mutex> lk(st().mu);
  st().capturing.push_back(fn);
}
void capture_begin() {
  if (!armed()) return;
  std::lock_guard<std::mutex> lk(st().mu);
  st().capturing.clear();
}
void capture_end(uint64_t key) {
  if (!armed()) return;
  std::lock_guard<std::mutex> lk(st().mu);
  st().names[key] = std::move(st().capturing);
  st().capturing.clear();
  st().replays[key] = 0;
}

bool before_launch(uint64_t key, cudaStream_t s) {
  if (!armed()) return false;
  State& S = st();
  std::lock_guard<std::mutex> lk(S.mu);
  if (S.done[key] || ++S.replays[key] != step() || !ensure_buffer(S)) return false;
  cudaStreamSynchronize(s);
  cudaMemset(S.dev, 0, kBufBytes);
  return true;
}

void after_launch(uint64_t key, cudaStream_t s) {
  State& S = st();
  std::lock_guard<std::mutex> lk(S.mu);
  S.done[key] = true;
  cudaStreamSynchronize(s);
  std::vector<Rec> recs(size_t(kSlots) * kBlocks);
  cudaMemcpy(recs.data(), S.dev, kBufBytes, cudaMemcpyDeviceToHost);
  size_t kept = 0;
  for (const Rec& r : recs) kept += r.grid != 0;
  const std::string file = std::string(path()) + "." + std::to_string(key) + ".txt";
  FILE* f = std::fopen(file.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "anvil: trace: cannot write %s\n", file.c_str());
    return;
  }
  int dev = 0, clock_khz = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  std::fprintf(f, "# anvil graph trace: key %llu, replay %d, %zu blocks (the first %d of each launch), sm clock %d kHz\n",
               static_cast<unsigned long long>(key), step(), kept, kBlocks, clock_khz);
  for (const void* fn : S.names[key]) {
    const char* name = nullptr;
    if (cudaFuncGetName(&name, fn) != cudaSuccess || !name) name = "?";
    std::fprintf(f, "K %s\n", name);
  }
  for (size_t i = 0; i < recs.size(); ++i) {
    const Rec& r = recs[i];
    if (!r.grid) continue;
    for (int ph = 0; ph < kPhases; ++ph)
      if (r.t[ph])
        std::fprintf(f, "R %llu %llu 0 %zu %u %d\n", static_cast<unsigned long long>(r.t[ph]),
                     static_cast<unsigned long long>(r.grid - 1), i % kBlocks, r.sm, ph);
  }
  std::fclose(f);
  std::fprintf(stderr, "anvil: trace: %zu blocks of graph %llu written to %s\n", kept,
               static_cast<unsigned long long>(key), file.c_str());
}

}  // namespace anvil::cuda::trace
