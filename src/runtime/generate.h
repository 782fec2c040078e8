// The generation loop for one sequence: prefill (extend) the new tokens, then decode one token at a
// time, sampling each, until EOS, the token limit, or the callback says stop.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace anvil {

struct GenerateRequest {
  std::vector<int32_t> prompt;  // new tokens appended to the sequence (its whole prompt, or one more turn)
  int max_new_tokens = 128;
  SamplingParams sampling;
  std::vector<int32_t> eos_ids;
  bool ignore_eos = false;  // EOS ids are suppressed (never sampled), as the benchmark protocol asks
  // Asked between prefill chunks (Engine::extend's keep_going); false stops the prefill there:
  // finish_reason "cancelled" with no ids, the chunks computed so far kept (the sequence ends at the
  // last of them). on_token's false stops the decode the same way.
  std::function<bool()> keep_prefilling;
};

struct GenerateResult {
  std::vector<int32_t> ids;   // generated ids (an EOS that ended generation is included)
  std::string finish_reason;  // "stop" (EOS), "length" (max_new_tokens, or the context limit is reached), "cancelled"
  int prompt_tokens = 0;
  int reused_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  int prompt_done = 0;    // prompt tokens with KV: all of them, unless keep_prefilling stopped the prefill
  double prefill_s = 0;   // start -> first token
  double decode_s = 0;    // first token -> last token
};

// on_token(id) is called for every generated id as soon as it is sampled; returning false stops.
using TokenCallback = std::function<bool(int32_t)>;

Result<GenerateResult> generate(Engine& engine, int seq, const GenerateRequest& req, const TokenCallback& on_token);

// Whether generate() samples every decode step on the backend (Engine::decode_sample), not only
// greedy steps: by default on CUDA (verified on the H200 to give the host Sampler's ids exactly), off
// on the CPU, whose op is the slower reference. ANVIL_CUDA_DEVICE_SAMPLER=0 or 1 forces it off or on
// (on: the CPU backend's reference op too, which the tests use) where the backend has the op.
bool device_sampler_enabled(const Backend& backend);

}  // namespace anvil
