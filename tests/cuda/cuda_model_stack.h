// Shared by the whole-model CUDA tests: a synthetic model uploaded to a CUDA backend, its transformer
// and an engine (no backend, and so nothing else, where no GPU is usable: the test then skips).
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "runtime/generate.h"

namespace anvil {

struct CudaModelStack {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<Engine> engine;
};

// A synthetic model on `backend` (null: an empty stack, nothing built).
inline CudaModelStack make_model_stack(std::unique_ptr<Backend> backend, const std::string& synth, int ctx,
                                       int max_seqs) {
  CudaModelStack s;
  if (!backend) return s;
  s.backend = std::move(backend);
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

inline CudaModelStack make_cuda_model_stack(const std::string& synth, int ctx, int max_seqs) {
  auto b = make_cuda_backend(0);
  return make_model_stack(b.is_ok() ? std::move(*b) : nullptr, synth, ctx, max_seqs);
}

// n greedy tokens after `prompt` through generate() (EOS ignored), in a sequence of its own.
inline std::vector<int32_t> greedy_ids(CudaModelStack& s, const std::vector<int32_t>& prompt, int n) {
  GenerateRequest req;
  req.prompt = prompt;
  req.max_new_tokens = n;
  req.sampling.temperature = 0;
  req.eos_ids = s.model->config.eos_token_ids;
  req.ignore_eos = true;
  auto seq = s.engine->seq_create();
  EXPECT_TRUE(seq.is_ok());
  auto r = generate(*s.engine, *seq, req, nullptr);
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  s.engine->seq_release(*seq);
  return r.is_ok() ? r->ids : std::vector<int32_t>{};
}

}  // namespace anvil
