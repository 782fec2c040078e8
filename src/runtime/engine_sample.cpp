// Engine::decode_sample: a decode step whose tokens are sampled on the backend (Backend::sample_rows).
// What the device needs besides the logits is each row's parameters and random number (uploaded per
// step: a few dozen bytes) and the repetition-penalty history. The history is kept on the device as
// token counts per sequence (counts row = sequence id) and changed only by the difference since the
// last step: the token this step appends (+1) and, with a window, the token that leaves it (-1).
// A sequence whose counts are not known to be current (new, after a failed step, a changed window)
// starts from a zeroed row with its whole window as updates. Every buffer keeps its address for the
// engine's life, so the decode graph captured over them stays valid (Transformer::forward_sample).
#include <algorithm>

#include "runtime/engine.h"

namespace anvil {

Status Engine::sample_state_init() {
  if (samp_.params) return Status::ok();
  Backend& be = model_.backend();
  if (!be.has_sample_rows()) return unsupported("the " + be.name() + " backend has no device sampler");
  const int R = opts_.max_seqs;
  const int64_t V = model_.config().vocab_size;
  // One step adds at most a whole context and removes at most as many per sequence.
  samp_.update_cap = size_t(R) * 2 * size_t(opts_.max_context + 1);
  ANVIL_ASSIGN_OR_RETURN(void* p, be.alloc(size_t(R) * sizeof(SampleRowParams)));
  samp_.params = static_cast<SampleRowParams*>(p);
  ANVIL_ASSIGN_OR_RETURN(p, be.alloc(size_t(R) * size_t(V) * 4));
  samp_.counts = static_cast<int32_t*>(p);
  ANVIL_ASSIGN_OR_RETURN(p, be.alloc(samp_.update_cap * 4));
  samp_.updates = static_cast<int32_t*>(p);
  ANVIL_ASSIGN_OR_RETURN(p, be.alloc(size_t(R + 1) * 4));
  samp_.offsets = static_cast<int32_t*>(p);
  const size_t bias_cap = size_t(R) * size_t(kMaxLogitBiasEntries);
  ANVIL_ASSIGN_OR_RETURN(p, be.alloc(size_t(R + 1) * 4));
  samp_.bias_offsets = static_cast<int32_t*>(p);
  ANVIL_ASSIGN_OR_RETURN(p, be.alloc(bias_cap * 4));
  samp_.bias_ids = static_cast<int32_t*>(p);
  ANVIL_ASSIGN_OR_RETURN(p, be.alloc(bias_cap * 4));
  samp_.bias_values = static_cast<float*>(p);
  samp_.uploaded_bias_offsets.clear();  // nothing uploaded yet
  const size_t scratch = be.sample_scratch_bytes(R, V);
  if (scratch > 0) {
    ANVIL_ASSIGN_OR_RETURN(samp_.scratch, be.alloc(scratch));
  }
  samp_.zeros.assign(size_t(V), 0);
  for (int r = 0; r < R; ++r) be.copy_to_device(samp_.counts + size_t(r) * V, samp_.zeros.data(), size_t(V) * 4);
  return Status::ok();
}

void Engine::sample_state_free() {
  Backend& be = model_.backend();
  for (void* p : {(void*)samp_.params, (void*)samp_.counts, (void*)samp_.updates, (void*)samp_.offsets, samp_.scratch,
                  (void*)samp_.bias_offsets, (void*)samp_.bias_ids, (void*)samp_.bias_values})
    if (p) be.free(p);
  samp_ = SampleState{};
}

Status Engine::decode_sample(std::span<const int> seqs, std::span<const int32_t> tokens,
                             std::span<const SamplingParams> params, std::span<const uint64_t> random,
                             std::span<const int32_t> suppress, std::vector<int32_t>* next) {
  if (params.size() != seqs.size() || random.size() != seqs.size())
    return invalid_argument("decode_sample: one parameter set and one random number per sequence");
  if (int(seqs.size()) > opts_.max_seqs) return invalid_argument("decode_sample: batch too large");
  for (const SamplingParams& p : params) ANVIL_RETURN_IF_ERROR(validate(p));
  for (int sq : seqs)
    if (sq < 0 || sq >= int(seqs_.size()) || !seqs_[sq].live)
      return invalid_argument("decode: no such sequence: " + std::to_string(sq));
  SampleArgs args;
  ANVIL_RETURN_IF_ERROR(sample_upload(seqs, tokens, params, random, {}, &args));
  next->resize(seqs.size());
  Greedy g{suppress, next->data(), &args};
  ANVIL_RETURN_IF_ERROR(decode_impl(seqs, tokens, nullptr, &g));
  sample_committed(seqs, params, {});
  return Status::ok();
}

// The rows' parameters and count updates, uploaded. Row i samples for sequence seqs[i], whose
// history after this step is its tokens plus extra[i] (decode: the token the step appends) or just
// its tokens (extra empty: step(), whose tokens are already appended). modes (empty: every row
// sampled, suppressing): a host row is uploaded as kSampleRowSkip (no bias, no count updates), a row
// that does not suppress as kSampleRowNoSuppress.
Status Engine::sample_upload(std::span<const int> seqs, std::span<const int32_t> extra,
                             std::span<const SamplingParams> params, std::span<const uint64_t> random,
                             std::span<const RowMode> modes, SampleArgs* out) {
  ANVIL_RETURN_IF_ERROR(sample_state_init());
  Backend& be = model_.backend();
  const int64_t V = model_.config().vocab_size;
  const size_t R = seqs.size();
  auto host = [&](size_t i) { return !modes.empty() && modes[i].host; };
  // Checked before any sequence's state changes.
  for (size_t i = 0; i < R; ++i)
    for (const LogitBias& b : params[i].logit_bias)
      if (!host(i) && b.id >= V)
        return invalid_argument("sampling parameter 'logit_bias': token id " + std::to_string(b.id) +
                                " is outside the vocabulary [0, " + std::to_string(V) + ")");
  samp_.host_params.resize(R);
  samp_.host_updates.clear();
  samp_.host_offsets.assign(1, 0);
  samp_.host_bias_offsets.assign(1, 0);
  samp_.host_bias_ids.clear();
  samp_.host_bias_values.clear();
  for (size_t i = 0; i < R; ++i) {
    SampleRowParams& rp = samp_.host_params[i];
    if (host(i)) {  // sampled on the host: the device leaves it alone
      rp = SampleRowParams{};
      rp.flags = kSampleRowSkip;
      samp_.host_bias_offsets.push_back(int32_t(samp_.host_bias_ids.size()));
      samp_.host_offsets.push_back(int32_t(samp_.host_updates.size()));
      continue;
    }
    const SamplingParams& p = params[i];
    for (const LogitBias& b : p.logit_bias) {
      samp_.host_bias_ids.push_back(b.id);
      samp_.host_bias_values.push_back(b.bias);
    }
    samp_.host_bias_offsets.push_back(int32_t(samp_.host_bias_ids.size()));
    const uint32_t flags = !modes.empty() && !modes[i].suppress ? kSampleRowNoSuppress : 0;
    rp = SampleRowParams{p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.top_k, -1, random[i], flags};
    if (p.repetition_penalty != 1.0f) {
      Seq& s = seqs_[seqs[i]];
      rp.count_row = seqs[i];
      // The history after this step: the sequence's tokens (and extra[i]).
      const int h = int(s.tokens.size()) + (extra.empty() ? 0 : 1), W = p.repetition_window;
      auto tok = [&](int j) { return j < int(s.tokens.size()) ? s.tokens[size_t(j)] : extra[i]; };
      auto lo = [W](int n) { return W > 0 ? std::max(0, n - W) : 0; };
      if (s.sample_counted < 0 || s.sample_window != W || s.sample_counted > h) {
        be.copy_to_device(samp_.counts + size_t(seqs[i]) * V, samp_.zeros.data(), size_t(V) * 4);
        s.sample_counted = 0;
        s.sample_window = W;
      }
      for (int j = std::max(s.sample_counted, lo(h)); j < h; ++j) samp_.host_updates.push_back(tok(j) + 1);
      for (int j = lo(s.sample_counted); j < std::min(lo(h), s.sample_counted); ++j)
        samp_.host_updates.push_back(-(tok(j) + 1));
      s.sample_counted = -1;  // unknown until the step succeeds
    }
    samp_.host_offsets.push_back(int32_t(samp_.host_updates.size()));
  }
  if (samp_.host_updates.size() > samp_.update_cap) return internal_error("decode_sample: too many count updates");
  be.copy_to_device(samp_.params, samp_.host_params.data(), R * sizeof(SampleRowParams));
  be.copy_to_device(samp_.offsets, samp_.host_offsets.data(), samp_.host_offsets.size() * 4);
  if (!samp_.host_updates.empty())
    be.copy_to_device(samp_.updates, samp_.host_updates.data(), samp_.host_updates.size() * 4);
  // The bias offsets only when they changed (steps without any logit_bias upload nothing more).
  if (samp_.host_bias_offsets != samp_.uploaded_bias_offsets) {
    be.copy_to_device(samp_.bias_offsets, samp_.host_bias_offsets.data(), samp_.host_bias_offsets.size() * 4);
    samp_.uploaded_bias_offsets = samp_.host_bias_offsets;
  }
  if (!samp_.host_bias_ids.empty()) {
    be.copy_to_device(samp_.bias_ids, samp_.host_bias_ids.data(), samp_.host_bias_ids.size() * 4);
    be.copy_to_device(samp_.bias_values, samp_.host_bias_values.data(), samp_.host_bias_values.size() * 4);
  }
  out->params = samp_.params;
  out->counts = samp_.counts;
  out->updates = samp_.updates;
  out->update_offsets = samp_.offsets;
  out->scratch = samp_.scratch;
  out->bias_offsets = samp_.bias_offsets;
  out->bias_ids = samp_.bias_ids;
  out->bias_values = samp_.bias_values;
  return Status::ok();
}

// After a successful step: the device counts of these sequences now cover all their tokens (a host
// row's were not touched).
void Engine::sample_committed(std::span<const int> seqs, std::span<const SamplingParams> params,
                              std::span<const RowMode> modes) {
  for (size_t i = 0; i < seqs.size(); ++i)
    if (params[i].repetition_penalty != 1.0f && (modes.empty() || !modes[i].host)) {
      Seq& s = seqs_[seqs[i]];
      s.sample_counted = int(s.tokens.size());  // the step's tokens are appended by now
      s.sample_window = params[i].repetition_window;
    }
}

}  // namespace anvil
