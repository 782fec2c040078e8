// Engine::seq_append / step: the continuous-batching entry points (see engine.h). Kept apart from
// extend/decode so that the scheduler's needs stay one small, local addition to the engine.
#include <algorithm>
#include <chrono>

#include "runtime/engine.h"

namespace anvil {

Status Engine::seq_append(int seq, std::span<const int32_t> tokens, bool reuse) {
  if (seq < 0 || seq >= int(seqs_.size()) || !seqs_[seq].live) return invalid_argument("append: no such sequence");
  const int V = model_.config().vocab_size;
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      return invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) +
                              ")");
  Seq& s = seqs_[seq];
  if (int(s.tokens.size() + tokens.size()) > opts_.max_context)
    return invalid_argument("sequence of " + std::to_string(s.tokens.size() + tokens.size()) +
                            " tokens exceeds the context limit of " + std::to_string(opts_.max_context));
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  if (reuse) reuse_prefix(s);  // no-op unless the sequence is fresh
  return Status::ok();
}

Status Engine::step(std::span<const StepItem> items, std::vector<float>* logits) {
  return step_impl(items, logits, {});
}

Status Engine::step_impl(std::span<const StepItem> items, std::vector<float>* logits,
                         const std::function<Status(Greedy*)>& sample) {
  const auto t0 = std::chrono::steady_clock::now();
  if (items.empty()) return invalid_argument("step: no items");
  if (int(items.size()) > opts_.max_seqs)
    return invalid_argument("step: " + std::to_string(items.size()) + " sequences, the engine allows " +
                            std::to_string(opts_.max_seqs));
  const int V = model_.config().vocab_size;
  int total = 0, n_rows = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    if (it.seq < 0 || it.seq >= int(seqs_.size()) || !seqs_[it.seq].live)
      return invalid_argument("step: no such sequence");
    for (size_t j = 0; j < i; ++j)
      if (items[j].seq == it.seq) return invalid_argument("step: a sequence appears twice");
    if (it.n_tokens < 1 || it.n_tokens > seq_pending(it.seq))
      return invalid_argument("step: " + std::to_string(it.n_tokens) + " tokens asked, " +
                              std::to_string(seq_pending(it.seq)) + " pending");
    if (it.all_logits && sample)
      return invalid_argument("step_sample: an item wanting every token's logits (step takes it)");
    total += it.n_tokens;
    n_rows += it.all_logits ? it.n_tokens : it.want_logits ? 1 : 0;
  }
  if (total > model_.max_tokens())
    return invalid_argument("step: " + std::to_string(total) + " tokens exceed the forward's limit of " +
                            std::to_string(model_.max_tokens()));
  if (n_rows > model_.max_logit_rows())
    return invalid_argument("step: " + std::to_string(n_rows) + " logit rows exceed the forward's limit of " +
                            std::to_string(model_.max_logit_rows()));
  // step_sample: the sampler's state for these (now valid) sequences, before any page is taken.
  Greedy g;
  const Greedy* greedy = nullptr;
  if (sample) {
    ANVIL_RETURN_IF_ERROR(sample(&g));
    greedy = &g;
  }
  if (store_) store_tick();  // pages the store's writer has copied come back; dropped ones offered again
  for (const StepItem& it : items) ANVIL_RETURN_IF_ERROR(ensure_pages(seqs_[it.seq], seqs_[it.seq].n_kv + it.n_tokens));

  std::vector<int> order;
  std::vector<int32_t> ids, sidx, pos;
  std::vector<int> rows;
  ids.reserve(size_t(total));
  for (size_t i = 0; i < items.size(); ++i) {
    const Seq& s = seqs_[items[i].seq];
    order.push_back(items[i].seq);
    for (int k = 0; k < items[i].n_tokens; ++k) {
      if (items[i].all_logits) rows.push_back(int(ids.size()));
      ids.push_back(s.tokens[size_t(s.n_kv + k)]);
      sidx.push_back(int32_t(i));
      pos.push_back(int32_t(s.n_kv + k));
    }
    if (items[i].want_logits && !items[i].all_logits) rows.push_back(int(ids.size()) - 1);
  }
  if (!greedy) logits->resize(rows.size() * size_t(V));
  ANVIL_RETURN_IF_ERROR(run_batch(order, ids, sidx, pos, rows, greedy ? nullptr : logits->data(), greedy));
  last_step_prep_ns_ = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(model_.last_issue() - t0).count());
  for (const StepItem& it : items) {
    Seq& s = seqs_[it.seq];
    s.n_kv += it.n_tokens;
    publish_full_pages(s);
  }
  return Status::ok();
}

Status Engine::step_sample(std::span<const StepItem> items, std::span<const SamplingParams> params,
                           std::span<const uint64_t> random, std::span<const int32_t> suppress,
                           std::vector<int32_t>* next, std::span<const RowMode> modes,
                           std::vector<float>* host_logits) {
  std::vector<int> seqs;  // the items that sample, in order (step_impl checks them)
  for (const StepItem& it : items)
    if (it.want_logits) seqs.push_back(it.seq);
  if (params.size() != seqs.size() || random.size() != seqs.size())
    return invalid_argument("step_sample: one parameter set and one random number per item that wants a token");
  if (seqs.empty()) return invalid_argument("step_sample: no item wants a token");
  if (!modes.empty() && modes.size() != seqs.size())
    return invalid_argument("step_sample: one row mode per item that wants a token, or none");
  std::vector<int> host_rows;  // the rows whose logits come back instead of a token
  for (size_t r = 0; r < modes.size(); ++r)
    if (modes[r].host) host_rows.push_back(int(r));
  if (!host_rows.empty() && !host_logits)
    return invalid_argument("step_sample: host rows need a buffer for their logits");
  for (size_t r = 0; r < params.size(); ++r)
    if (modes.empty() || !modes[r].host) ANVIL_RETURN_IF_ERROR(validate(params[r]));
  SampleArgs args;
  ANVIL_RETURN_IF_ERROR(step_impl(items, nullptr, [&](Greedy* g) -> Status {
    ANVIL_RETURN_IF_ERROR(sample_upload(seqs, {}, params, random, modes, &args));
    next->resize(seqs.size());
    if (host_logits) host_logits->resize(host_rows.size() * size_t(model_.config().vocab_size));
    *g = Greedy{suppress, next->data(), &args, host_rows, host_logits ? host_logits->data() : nullptr};
    return Status::ok();
  }));
  sample_committed(seqs, params, modes);
  return Status::ok();
}

}  // namespace anvil
