// Opens a model: a directory (or a Hugging Face repo id in the local cache) or a synthetic shape,
// and binds its weights. The tensors stay where they are (mmapped file or synthetic buffers).
#pragma once
#include <memory>
#include <string>

#include "base/hash128.h"
#include "format/model_config.h"
#include "format/safetensors.h"
#include "model/synth.h"
#include "model/weights.h"

namespace anvil {

struct LoadedModel {
  std::string source;  // the directory, or "synthetic:NAME:QUANT"
  std::string dir;     // empty for in-memory synthetic models
  ModelConfig config;
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<SynthModel> synthetic;
  ModelWeights weights;  // host views
  // Identity of every weight byte and the config (model/fingerprint.h): the root of every KV page
  // key and the model key of the durable store.
  Hash128 fingerprint;
};

// `path_or_repo`: a model directory or a repo id found in the HF cache, at `revision` (empty: main;
// format/hf_cache.h).
Result<std::unique_ptr<LoadedModel>> load_model(const std::string& path_or_repo, const std::string& revision = "");
// "NAME[:QUANT]", e.g. "qwen3-0.6b:q4g64" (QUANT defaults to q4g64).
Result<std::unique_ptr<LoadedModel>> load_synthetic(const std::string& spec);

// A directory holding the Qwen3 tokenizer built into anvil (used for synthetic models), unpacked
// into a cache directory on first use (model/default_tokenizer.cpp); "" when it cannot be written.
std::string default_tokenizer_dir();

}  // namespace anvil
