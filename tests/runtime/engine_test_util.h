// Shared by the engine tests: a synthetic model on the CPU backend wrapped in an Engine.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "model/loader.h"
#include "runtime/engine.h"

namespace anvil::testing {

struct FixtureOptions {
  std::string spec = "tiny:q4g64";
  int max_tokens = 64;
  int threads = 2;
  int sliding_window = -1;  // >= 0: the model's config.sliding_window replaced by it (0: none)
  EngineOptions engine;
  FixtureOptions() {
    engine.page_size = 16;
    engine.max_context = 512;
    engine.max_seqs = 4;
    engine.kv_dtype = DType::kF32;
  }
};

// The loaded model is shared between fixtures of one spec (the weights are read-only).
inline std::shared_ptr<LoadedModel> shared_model(const std::string& spec) {
  static std::map<std::string, std::shared_ptr<LoadedModel>> cache;
  auto it = cache.find(spec);
  if (it != cache.end()) return it->second;
  auto m = load_synthetic(spec);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  if (!m.is_ok()) return nullptr;
  auto sp = std::shared_ptr<LoadedModel>(std::move(m).value());
  cache[spec] = sp;
  return sp;
}

struct SharedEngineFixture {
  std::shared_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<Engine> engine;
  int vocab() const { return model->config.vocab_size; }
};

inline SharedEngineFixture make_engine(const FixtureOptions& o) {
  SharedEngineFixture f;
  f.model = shared_model(o.spec);
  if (!f.model) return f;
  f.backend = make_cpu_backend(o.threads);
  auto w = upload_weights(f.model->weights, *f.backend);
  EXPECT_TRUE(w.is_ok());
  ModelConfig cfg = f.model->config;
  if (o.sliding_window >= 0) cfg.sliding_window = o.sliding_window;
  auto tf = Transformer::create(cfg, *w, *f.backend, o.max_tokens);
  EXPECT_TRUE(tf.is_ok()) << tf.status().message();
  f.tf = std::move(tf).value();
  auto e = Engine::create(*f.tf, f.model->fingerprint, o.engine);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  if (e.is_ok()) f.engine = std::move(e).value();
  return f;
}

inline std::vector<int32_t> random_ids(int n, uint64_t seed, int vocab = 151936) {
  std::mt19937_64 r(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = int32_t(r() % uint64_t(vocab));
  return v;
}

inline bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

inline int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace anvil::testing
