// measure_read_bandwidth_gbs: the ceiling `anvil bench` reports achieved GB/s against. Every thread
// streams its own contiguous slice of one buffer far larger than the last-level cache; the best of
// a few passes is taken (the first pass after the page-faulting fill is already warm).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"

namespace anvil {

namespace {
uint64_t read_sum_scalar(const uint8_t* p, size_t n) {
  uint64_t a[4] = {0, 0, 0, 0};
  for (size_t i = 0; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * j, 8);
      a[j] ^= v;
    }
  return a[0] ^ a[1] ^ a[2] ^ a[3];
}
}  // namespace

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes) {
  constexpr size_t kUnit = size_t(1) << 20;  // slices are whole MiB (multiples of the kernels' 128 B)
  const size_t units = std::max<size_t>(1, bytes / kUnit);
  const size_t n = units * kUnit;
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(64, n));
  if (!buf) return 0.0;
  // Touch every page in parallel so the first timed pass does not measure page faults.
  pool.parallel_for(int64_t(units), 1, [&](int64_t b, int64_t e) {
    std::memset(buf + size_t(b) * kUnit, int(b & 0xff), size_t(e - b) * kUnit);
  });
  const bool avx2 = cpu_use_avx2();
  std::atomic<uint64_t> sink{0};
  double best = 0.0;
  for (int pass = 0; pass < 4; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(int64_t(units), 1, [&](int64_t b, int64_t e) {
      const uint8_t* p = buf + size_t(b) * kUnit;
      const size_t len = size_t(e - b) * kUnit;
      sink.fetch_xor(avx2 ? cpu::read_sum_avx2(p, len) : read_sum_scalar(p, len), std::memory_order_relaxed);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, double(n) / s / 1e9);
  }
  std::free(buf);
  return best;  // the reads feed the atomic `sink`, so they cannot be optimized away
}

}  // namespace anvil
