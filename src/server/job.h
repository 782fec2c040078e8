// A generation job: what an HTTP thread hands the scheduler, and the ordered events the scheduler
// hands back. The job is shared (shared_ptr) by the two threads; every field below the mutex is
// guarded by it, `params` is immutable after submit(), `cancel()` may be called from any thread.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "runtime/sampler.h"
#include "tokenizer/stop_strings.h"

namespace anvil::server {

struct GenerationParams {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  float presence_penalty = 0.0f;   // OpenAI: logit -= presence * [count > 0], over generated tokens
  float frequency_penalty = 0.0f;  // OpenAI: logit -= frequency * count, over generated tokens
  std::vector<std::string> stop;
  // Markup a stop string never cuts (StopMatcher): the reasoning tags when a chat reply's
  // reasoning is split off, then the tool-call tags when tool calls are parsed.
  std::vector<MarkupPair> stop_markup;
  int top_logprobs = -1;  // -1: no logprobs; else the number of alternatives per token (0..20)
  // Completions' echo: the reply repeats the prompt before the completion. The scheduler sends the
  // prompt's tokens in one event (JobEvent::prompt) before the first generated one, with their
  // log-probabilities under the model when top_logprobs >= 0 (every prompt token is then computed:
  // no prefix from the cache).
  bool echo = false;
  bool ignore_eos = false;
  // JSON mode (response_format json_object): the reply's content is a JSON object, by constrained
  // decoding (runtime/json_mask.h), and the reply ends with an end-of-sequence id once the object
  // is closed. Reasoning comes first where the model writes it: the reply may open with
  // json_think_open (<think>; -1: no reasoning) as its first token, or starts inside the reasoning
  // (json_in_reasoning: the prompt opened it); the constraint then begins after json_think_close
  // (</think>), and until then anything but an end-of-sequence id may be sampled.
  bool json_object = false;
  bool json_in_reasoning = false;
  int32_t json_think_open = -1, json_think_close = -1;
  // Non-empty: record this request's sequence as durable session `session` (the prompt already
  // holds the session's earlier tokens); see Scheduler and docs/api.md, "Sessions".
  std::string session;
  std::string session_meta;  // the session's meta while this turn is recorded
};

struct TokenLogprob {
  int32_t id;
  float logprob;  // log-softmax of the model's raw logits (before penalties and temperature)
};

struct TokenInfo {
  int32_t id;
  float logprob = 0;  // NaN: none (a prompt's first token, which nothing predicts)
  std::vector<TokenLogprob> top;  // the top_logprobs most likely tokens, most likely first
};

struct JobEvent {
  enum Kind { kDelta, kDone, kError } kind = kDelta;
  std::string text;               // kDelta: newly complete output text (stop strings removed)
  std::vector<TokenInfo> tokens;  // kDelta: the token(s) behind it
  std::string finish_reason;      // kDone: "stop", "length", "cancelled"
  Status error;                   // kError (the job is over)
  int64_t step = 0;               // the scheduler step that produced it (ordering across jobs, tests)
  std::vector<TokenInfo> prompt = {};  // kDelta, echo only: the prompt's tokens, once, before any generated one
  bool has_prompt = false;        // this is that event
};

class Job {
 public:
  using clock = std::chrono::steady_clock;
  explicit Job(GenerationParams p) : params(std::move(p)), submitted(clock::now()) {}

  const GenerationParams params;
  const clock::time_point submitted;

  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Scheduler side. With notify = false the waiting HTTP thread is not woken here: the caller
  // wakes it later through notify() (the scheduler leaves that to its Notifier thread).
  void push(JobEvent e, bool notify = true) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (e.kind != JobEvent::kDelta) ended_ = true;
      events_.push_back(std::move(e));
    }
    if (notify) cv_.notify_all();
  }
  void notify() { cv_.notify_all(); }
  // The scheduler began recording params.session (set before any event; the recording is closed
  // before the terminal event, and the HTTP side then calls KVStore::session_finish).
  void set_session_recorded() { session_recorded_.store(true); }
  bool session_recorded() const { return session_recorded_.load(); }
  void set_prompt_stats(int prompt_tokens, int cached_tokens) {
    std::lock_guard<std::mutex> lk(mu_);
    prompt_tokens_ = prompt_tokens;
    cached_tokens_ = cached_tokens;
  }
  void add_completion_tokens(int n) {
    std::lock_guard<std::mutex> lk(mu_);
    completion_tokens_ += n;
  }

  // HTTP side: moves the queued events into *out; waits up to `timeout` when there are none.
  // Returns false on timeout.
  bool wait(std::vector<JobEvent>* out, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_for(lk, timeout, [&] { return !events_.empty(); })) return false;
    out->insert(out->end(), std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
    events_.clear();
    return true;
  }
  // Waits until the terminal event has been pushed (consumed or not); false on timeout.
  bool wait_ended(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return ended_; });
  }
  int prompt_tokens() const { std::lock_guard<std::mutex> lk(mu_); return prompt_tokens_; }
  int cached_tokens() const { std::lock_guard<std::mutex> lk(mu_); return cached_tokens_; }
  int completion_tokens() const { std::lock_guard<std::mutex> lk(mu_); return completion_tokens_; }

 private:
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> session_recorded_{false};
  bool ended_ = false;  // guarded by mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
  int prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
};

}  // namespace anvil::server
