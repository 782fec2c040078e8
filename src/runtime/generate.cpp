#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace anvil {

bool device_sampler_enabled(const Backend& backend) {
  if (!backend.has_sample_rows()) return false;
  const char* e = std::getenv("ANVIL_CUDA_DEVICE_SAMPLER");
  if (e && *e) return *e != '0';
  return backend.name().rfind("cuda", 0) == 0;  // the CPU's op is a reference, slower than the host Sampler
}

Result<GenerateResult> generate(Engine& engine, int seq, const GenerateRequest& req, const TokenCallback& on_token) {
  ANVIL_RETURN_IF_ERROR(validate(req.sampling));
  if (req.prompt.empty()) return invalid_argument("the prompt is empty: nothing to generate from");
  if (req.max_new_tokens < 0) return invalid_argument("-n must be >= 0");
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  GenerateResult r;
  r.prompt_tokens = int(req.prompt.size());
  std::vector<float> logits;
  const int V = engine.model().config().vocab_size;
  Sampler sampler(req.sampling);
  if (req.ignore_eos) sampler.set_suppressed(req.eos_ids);
  const size_t want = engine.seq_tokens(seq).size() + req.prompt.size();
  ANVIL_RETURN_IF_ERROR(engine.extend(seq, req.prompt, &logits, nullptr, req.keep_prefilling));
  r.reused_tokens = engine.seq_cached_tokens(seq);
  r.prompt_done = r.prompt_tokens - int(want - engine.seq_tokens(seq).size());
  if (r.prompt_done < r.prompt_tokens) {  // stopped between prefill chunks
    r.finish_reason = "cancelled";
    r.prefill_s = std::chrono::duration<double>(clock::now() - t0).count();
    return r;
  }
  r.finish_reason = "length";
  auto t_first = clock::now(), t_last = t_first;
  // Greedy without a penalty or a logit bias needs no logits on the host: after the first token, the
  // backend samples (Engine::decode_greedy) and only the token id comes back.
  const bool device_greedy = req.sampling.temperature == 0 && req.sampling.repetition_penalty == 1.0f &&
                             req.sampling.logit_bias.empty();
  // Any other sampling on the backend too (Engine::decode_sample): by default on CUDA, where it saves
  // copying a [vocab] logits row back per token; ANVIL_CUDA_DEVICE_SAMPLER=0/1 forces it off/on.
  const bool device_sample = !device_greedy && device_sampler_enabled(engine.model().backend());
  const std::vector<int32_t> suppressed = req.ignore_eos ? req.eos_ids : std::vector<int32_t>{};
  std::vector<int32_t> next;
  for (int i = 0; i < req.max_new_tokens; ++i) {
    int32_t id = ((device_greedy || device_sample) && i > 0) ? next[0]
                                                               : sampler.sample(logits.data(), V, engine.seq_tokens(seq));
    if (id < 0) return internal_error(kNoFiniteLogit);
    t_last = clock::now();
    if (i == 0) t_first = t_last;
    r.ids.push_back(id);
    bool keep_going = on_token ? on_token(id) : true;
    if (!req.ignore_eos && std::find(req.eos_ids.begin(), req.eos_ids.end(), id) != req.eos_ids.end()) {
      r.finish_reason = "stop";
      break;
    }
    if (!keep_going) {
      r.finish_reason = "cancelled";
      break;
    }
    if (i + 1 == req.max_new_tokens) break;
    // A full context ends generation like the token limit does, keeping what was generated:
    // decoding `id` would need one more position than --ctx allows.
    if (int(engine.seq_tokens(seq).size()) + 1 > engine.options().max_context) break;
    int s = seq;
    if (device_sample) {
      // The draw uses the next number of this sampler's stream, as sampler.sample() would have.
      const uint64_t u = req.sampling.temperature > 0 ? sampler.next_random53() : 0;
      ANVIL_RETURN_IF_ERROR(engine.decode_sample(std::span<const int>(&s, 1), std::span<const int32_t>(&id, 1),
                                                 std::span<const SamplingParams>(&req.sampling, 1),
                                                 std::span<const uint64_t>(&u, 1), suppressed, &next));
    } else if (device_greedy)
      ANVIL_RETURN_IF_ERROR(engine.decode_greedy(std::span<const int>(&s, 1), std::span<const int32_t>(&id, 1),
                                                 suppressed, &next));
    else
      ANVIL_RETURN_IF_ERROR(engine.decode(std::span<const int>(&s, 1), std::span<const int32_t>(&id, 1), &logits));
  }
  std::chrono::duration<double> pf = t_first - t0, dc = t_last - t_first;
  r.prefill_s = pf.count();
  r.decode_s = dc.count();
  return r;
}

}  // namespace anvil
