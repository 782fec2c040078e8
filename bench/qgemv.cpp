// Mat-vec (decode) throughput of the CPU backend's linear: 4-bit group-64 MLX weights with bf16
// scales/biases (the q4g64 layout of docs/bench-protocol.md) at Qwen3 shapes [rows, cols], plus a bf16 dense
// lm_head and a 4-bit prefill matmul. bytes/s counts the weight bytes one call must read
// (WeightMatrix::bytes()); the measured read bandwidth of this machine is printed first so
// GB/s can be read as a fraction of the ceiling.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "base/thread_pool.h"

namespace {

using namespace anvil;

struct QWeight {
  std::vector<uint32_t> data;
  std::vector<uint16_t> scales, biases;
  WeightMatrix w;
};

QWeight make_q4g64(int64_t rows, int64_t cols) {
  QWeight q;
  std::mt19937 rng(1);
  q.data.resize(size_t(rows * cols / 8));
  for (auto& v : q.data) v = rng();
  q.scales.assign(size_t(rows * cols / 64), f32_to_bf16(0.01f));
  q.biases.assign(size_t(rows * cols / 64), f32_to_bf16(-0.08f));
  q.w.rows = rows;
  q.w.cols = cols;
  q.w.dtype = DType::kBF16;
  q.w.bits = 4;
  q.w.group_size = 64;
  q.w.data = q.data.data();
  q.w.scales = q.scales.data();
  q.w.biases = q.biases.data();
  return q;
}

// ANVIL_BENCH_THREADS overrides the thread count (e.g. 1 to see one core's kernel throughput).
int bench_threads() {
  const char* e = std::getenv("ANVIL_BENCH_THREADS");
  return e && std::atoi(e) > 0 ? std::atoi(e) : ThreadPool::default_threads();
}

Backend& backend() {
  static std::unique_ptr<Backend> be = make_cpu_backend(bench_threads());
  return *be;
}

void run_linear(benchmark::State& state, const WeightMatrix& w, int64_t T) {
  std::vector<float> x(size_t(T * w.cols), 0.5f), y(size_t(T * w.rows));
  Backend& be = backend();
  for (auto _ : state) {
    be.linear(Act{x.data(), T, w.cols, DType::kF32}, w, Act{y.data(), T, w.rows, DType::kF32});
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(w.bytes()));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(T) * double(w.rows) * double(w.cols) * double(state.iterations()),
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void BM_q4g64_gemv(benchmark::State& state) {
  QWeight q = make_q4g64(state.range(0), state.range(1));
  run_linear(state, q.w, 1);
}
BENCHMARK(BM_q4g64_gemv)
    ->Args({1024, 3072})
    ->Args({3072, 1024})
    ->Args({4096, 12288})
    ->Args({151936, 1024})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_bf16_gemv(benchmark::State& state) {
  std::vector<uint16_t> data(size_t(state.range(0) * state.range(1)), f32_to_bf16(0.01f));
  WeightMatrix w;
  w.rows = state.range(0);
  w.cols = state.range(1);
  w.dtype = DType::kBF16;
  w.data = data.data();
  run_linear(state, w, 1);
}
BENCHMARK(BM_bf16_gemv)->Args({151936, 1024})->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_q4g64_prefill64(benchmark::State& state) {
  QWeight q = make_q4g64(state.range(0), state.range(1));
  run_linear(state, q.w, 64);
}
BENCHMARK(BM_q4g64_prefill64)->Args({3072, 1024})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  ThreadPool pool(bench_threads());
  const double bw = measure_read_bandwidth_gbs(pool, size_t(512) << 20);
  std::printf("cpu: %s, %d threads; measured read bandwidth (512 MiB, best of 4): %.2f GB/s\n",
              cpu_use_avx2() ? "avx2+fma" : "scalar", pool.size(), bw);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
