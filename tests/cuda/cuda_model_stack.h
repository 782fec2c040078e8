// Shared by the whole-model CUDA tests: a synthetic model uploaded to a CUDA backend, its transformer
// and an engine (no backend, and so nothing else, where no GPU is usable: the test then skips).
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "model/loader.h"
#include "runtime/engine.h"

namespace anvil {

struct CudaModelStack {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<Engine> engine;
};

inline CudaModelStack make_cuda_model_stack(const std::string& synth, int ctx, int max_seqs) {
  CudaModelStack s;
  auto b = make_cuda_backend(0);
  if (!b.is_ok()) return s;
  s.backend = std::move(*b);
  auto m = load_synthetic(synth);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  s.model = std::move(m).value();
  auto w = upload_weights(s.model->weights, *s.backend);
  EXPECT_TRUE(w.is_ok()) << w.status().message();
  auto tf = Transformer::create(s.model->config, *w, *s.backend, 64);
  EXPECT_TRUE(tf.is_ok()) << tf.status().message();
  s.tf = std::move(tf).value();
  EngineOptions o;
  o.max_context = ctx;
  o.max_seqs = max_seqs;
  o.prefix_cache = false;
  auto e = Engine::create(*s.tf, s.model->fingerprint, o);
  EXPECT_TRUE(e.is_ok()) << e.status().message();
  s.engine = std::move(e).value();
  return s;
}

}  // namespace anvil
