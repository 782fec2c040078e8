// The scheduler: one thread owns the Engine and runs continuous batching.
//
// Each step builds one forward from every active sequence: a sequence whose last sampled token is
// pending contributes that token (decode); a sequence still in its prompt contributes the next
// chunk of it, within what is left of the step's token budget (chunked prefill, oldest first), so
// a long prompt never stalls the others for more than one step. New jobs are admitted between
// steps while the engine has a free sequence slot.
//
// Admission control: a step first reserves KV pages for each item. When the pool is full, the
// most recently admitted other sequence is preempted: its pages go back and its job returns to
// the front of the queue with its tokens (prompt + generated); on readmission those tokens are
// prefilled again (the prefix index usually still holds most of them) and generation continues
// where it stopped, invisibly to the client. A sequence that cannot fit even alone fails alone.
//
// Invariants
//  1. Only the scheduler thread calls into the Engine.
//  2. Every active sequence has >= 1 pending token (its prompt rest, or its last sampled token).
//  3. A job gets exactly one terminal event (kDone or kError), after which its sequence is
//     released; a cancelled job is dropped at the next step boundary (its pages freed).
//  4. With a durable store, full pages of every sequence are persisted (Engine::step hands them to
//     it) and a new sequence's prefix is restored from it. A job naming a session is recorded as
//     that session from admission (KVStore::session_begin) to its end (session_close, before the
//     terminal event); a preempted job's recording is detached and bound again on readmission.
//  5. The store's catalog connection is this thread's too: other threads reach the store's
//     sessions through call().
//  6. Events are queued on their jobs as the step produces them, but the jobs' HTTP threads are
//     woken by the Notifier's thread, handed the iteration's jobs once at its end (server/notifier.h):
//     the wake-ups overlap the next forward pass instead of delaying it.
//  7. Idle, the loop takes back the pages the store's writer has copied and offers it the pages it
//     dropped; and while full pages the store could not write (a full disk) wait for their retry
//     (kvstore.h, invariant 11), it wakes when the retry is due (KVStore::failed_ready_at; the
//     store wakes it when pages fail or it recovers) and offers them again, so they become durable
//     without a request. With nothing failed an idle loop waits for work alone.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "kvstore/kvstore.h"
#include "runtime/engine.h"
#include "runtime/json_mask.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/notifier.h"
#include "tokenizer/tokenizer.h"

namespace anvil::server {

struct SchedulerOptions {
  int max_queue = 64;       // jobs waiting for a slot (beyond the free ones); more are refused (503)
  int step_tokens = 0;      // token budget of one step; 0 = the model's max tokens per forward
  std::vector<int32_t> eos_ids;
  KVStore* store = nullptr;  // the durable store attached to the engine, or none
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const Tokenizer& tok, Metrics& metrics, SchedulerOptions opts);
  ~Scheduler();  // stops the thread; unfinished jobs end with finish_reason "cancelled"

  void start();
  // Queues a job. kUnavailable-style refusal (StatusCode::kOutOfMemory) when the queue is full or
  // the scheduler is draining: the caller answers 503.
  Status submit(std::shared_ptr<Job> job);
  // Refuse new jobs from now on (SIGTERM).
  void begin_drain();
  // Waits until no job is queued or running, or the deadline passes; true when idle.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  // Ends every job (kError "server is shutting down") and stops the thread.
  void stop();
  // Runs fn on the scheduler thread between two steps and waits for it (invariant 5); once the
  // thread has stopped, on the caller's thread (one caller at a time).
  void call(const std::function<void()>& fn);

  // JSON mode's vocabulary (server/json_mode.h), built on first use (a 152k vocabulary: ~0.1 s),
  // from any thread; the error (a tokenizer JSON mode cannot take) is kept and returned each time.
  Result<std::shared_ptr<const JsonVocab>> json_vocab();

  // Jobs waiting for a sequence: those queued beyond the free sequences (the gauge
  // anvil_requests_waiting, the count --max-queue bounds).
  int queued() const;
  int running() const { return running_.load(); }
  int64_t kv_pages_used() const { return pages_used_.load(); }
  int64_t kv_pages_total() const { return pages_total_; }
  int64_t kv_prefix_pages() const { return prefix_pages_.load(); }
  bool draining() const { return draining_.load(); }

 private:
  struct Active;
  void loop();
  // The loop's wait (lk holds mu_): until there is work (a job, a call, stop), or the store's failed
  // pages are due for their retry while idle (invariant 7).
  void wait_for_work(std::unique_lock<std::mutex>& lk);
  void admit(std::vector<std::unique_ptr<Active>>& incoming);
  // The page counts, then the running count (wait_idle() reads them in the other order).
  void publish_counts();
  bool run_step();
  void finish(Active& a, std::string reason);
  void fail(Active& a, const Status& st);
  void release(Active& a);  // its sequence, then its place (give_back_place)
  void give_back_place(Active& a);
  void preempt(Active& a);
  // One sampled row: what sample_row computes from the logits (in parallel over the step's rows,
  // each row touching only its own Active), then on_token applies it (serially, in row order).
  struct Sampled {
    int32_t id = -1;
    TokenInfo info;  // id, logprob and top alternatives when asked for
  };
  Sampled sample_row(Active& a, float* row);
  int sample_on_device(const std::vector<Engine::StepItem>& run, const std::vector<Active*>& owner);
  void on_token(Active& a, Sampled s);
  // An echo's prompt rows (every token's logits, Engine::StepItem::all_logits): their tokens'
  // log-probabilities into a.prompt_lp.
  void prompt_logprobs(Active& a, int first, int n, const float* logits);
  // Queues an event for the job. On the scheduler thread its HTTP thread is woken by notifier_ once
  // the loop's iteration flushes it; elsewhere (stop()) at once.
  void emit(const std::shared_ptr<Job>& job, JobEvent e);
  void close_session(Active& a);
  void run_calls();
  // Runs one forward call (Engine::step / step_sample), adding its time to this iteration's.
  template <class F>
  Status timed_forward(F&& forward);

  Engine& engine_;
  const Tokenizer& tok_;
  Metrics& metrics_;
  SchedulerOptions opts_;
  int step_tokens_;
  uint64_t forwards_ = 0, forward_ns_ = 0, prep_ns_ = 0;  // this iteration's forward passes, their time and its prep part (Metrics)
  int64_t pages_total_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Active>> queue_;  // guarded by mu_; preempted jobs go to the front
  // Guarded by mu_: the jobs the loop has taken from the queue and not yet released (each holds or
  // is about to hold a sequence; Active::holds_place). submit() counts a job as waiting only when
  // no sequence is free for it.
  int seqs_taken_ = 0;
  bool stop_ = false;                           // guarded by mu_
  bool thread_done_ = true;                     // guarded by mu_: the loop is not running (call() runs inline)
  std::deque<std::function<void()>> calls_;     // guarded by mu_
  std::mutex inline_call_mu_;                   // call() after the thread stopped
  std::atomic<bool> draining_{false};
  std::atomic<int> running_{0};
  std::atomic<int64_t> pages_used_{0}, prefix_pages_{0};
  std::mutex json_mu_;
  std::shared_ptr<const JsonVocab> json_vocab_;  // guarded by json_mu_ until built, then read-only
  Status json_error_;                            // guarded by json_mu_
  bool json_built_ = false;                      // guarded by json_mu_

  // Scheduler thread only.
  std::unique_ptr<ThreadPool> sample_pool_;
  std::vector<int32_t> sampled_ids_;  // sample_on_device's ids
  bool device_sample_ = false;        // device_sampler_enabled() for this engine's backend  // sample_row over a step's rows (a row of a 152k vocabulary: ~1 ms)
  std::vector<std::unique_ptr<Active>> active_;
  int64_t admit_counter_ = 0;
  std::optional<std::chrono::steady_clock::time_point> retry_woken_for_;  // wait_for_work's last retry wake
  int64_t step_no_ = 0;
  std::vector<float> logits_;
  std::unique_ptr<Notifier> notifier_;  // from start() until stop() has joined the thread
  std::thread thread_;
};

}  // namespace anvil::server
