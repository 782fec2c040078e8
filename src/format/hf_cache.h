// Resolves the -m argument: a model directory, or a Hugging Face repo id ("Qwen/Qwen3-0.6B") already
// present in the local Hugging Face hub cache, found exactly where the huggingface_hub package
// (and so transformers, mlx-lm, vLLM) would look offline:
//   cache:    $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
//             $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; a variable that is set
//             counts even when empty (huggingface_hub then uses a path relative to the current
//             directory), and "~", "~user", "$VAR" and "${VAR}" are expanded as Python's
//             os.path.expanduser / expandvars do
//   repo:     models--{org}--{name}; the id must be one huggingface_hub accepts (validate_repo_id)
//   revision: "main" unless given: a 40-hex commit is snapshots/{commit}; else refs/{revision} holds the
//             commit; else a hex prefix (4 or more digits) of exactly one snapshot's commit
// No refs/main is an error naming the cached revisions (huggingface_hub does not guess either). The
// chosen snapshot is checked for an interrupted download (a file that links to a missing blob, a
// shard model.safetensors.index.json names that is absent, a file the cached tree listing
// trees/{commit}.json has that the snapshot lacks), among the files anvil reads. Every error lists
// the places it looked.
#pragma once
#include <string>

#include "base/status.h"

namespace anvil {

// The hub cache directory huggingface_hub uses (constants.HF_HUB_CACHE), and where it came from
// ("$HF_HUB_CACHE", ..., "~/.cache/huggingface/hub"), for messages.
struct HubCacheDir {
  std::string path;
  std::string source;
};
HubCacheDir hub_cache_dir();

// "" when huggingface_hub accepts `id` as a repo id (NAME or NAMESPACE/NAME, each 1 to 96 of
// [A-Za-z0-9_.-], beginning and ending with a letter, digit or '_'; no "--" or ".."; not ending in
// ".git"), else why not.
std::string repo_id_problem(const std::string& id);

// Which files of a cached snapshot the caller will read, so that only those must be complete: the
// tokenizer's (tokenizer.json, tokenizer_config.json, chat_template.jinja/.json), or a whole model's
// (also config.json, generation_config.json and the safetensors weights).
enum class ModelFiles { kModel, kTokenizer };

// `revision`: empty for "main"; only meaningful for a repo id (an error with a directory).
Result<std::string> resolve_model_path(const std::string& arg, const std::string& revision = "",
                                       ModelFiles needs = ModelFiles::kModel);

}  // namespace anvil
