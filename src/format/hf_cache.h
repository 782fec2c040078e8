// Resolves the -m argument: a model directory, or a Hugging Face repo id ("Qwen/Qwen3-0.6B")
// already present in the local Hugging Face cache:
//   $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub
//   models--{org}--{name}/refs/main -> commit hash; models--{org}--{name}/snapshots/{hash}/
// When refs/main is missing the newest snapshot is used. The error lists every place it looked.
#pragma once
#include <string>

#include "base/status.h"

namespace anvil {

Result<std::string> resolve_model_path(const std::string& arg);

}  // namespace anvil
