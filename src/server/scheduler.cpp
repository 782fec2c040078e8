#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <random>
#include <unordered_map>

#include "runtime/generate.h"
#include "server/json_mode.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/stream_decoder.h"

namespace anvil::server {

using clock = std::chrono::steady_clock;

namespace {
uint64_t ns_since(clock::time_point t0) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now() - t0).count());
}
}  // namespace

template <class F>
Status Scheduler::timed_forward(F&& forward) {
  const auto t0 = clock::now();
  const uint64_t rows0 = engine_.logit_rows_to_host();
  Status st = forward();
  forward_ns_ += ns_since(t0);
  metrics_.logit_rows_to_host += engine_.logit_rows_to_host() - rows0;
  if (st.is_ok()) prep_ns_ += engine_.last_step_prep_ns();
  ++forwards_;
  return st;
}

struct Scheduler::Active {
  std::shared_ptr<Job> job;
  int seq = -1;
  int64_t order = 0;                  // admission order; the newest is preempted first
  std::vector<int32_t> tokens;        // while queued after preemption: prompt + generated (the last pending)
  bool admitted_once = false;
  bool holds_place = false;           // taken from the queue: counted in seqs_taken_ until released
  bool session_open = false;          // recording job->params.session (KVStore::session_begin .. close)
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> dec;
  std::unique_ptr<StopMatcher> stop;
  int generated = 0;
  std::unordered_map<int32_t, int> counts;  // generated token -> occurrences (presence/frequency)
  clock::time_point last_token;
  std::vector<float> scratch;         // logits copy for logprobs
  std::unique_ptr<JsonConstraint> json;  // JSON mode: what the reply may hold next
  bool json_waiting = false;             // in reasoning: the constraint begins after params.json_think_close
  std::vector<uint64_t> json_first;      // the first token's mask: the JSON's, and <think>
  // Echo (GenerationParams::echo): whether the prompt's event went out (on_token, before the first
  // token); with log-probabilities, the prompt's tokens so far with theirs (one per position, the
  // first with none), filled chunk by chunk from every row of its prefill steps.
  bool prompt_echoed = false;
  std::vector<TokenInfo> prompt_lp;
  // The prompt's log-probabilities are still to compute: every prompt token's logits are needed.
  bool wants_prompt_logprobs() const { return job->params.echo && job->params.top_logprobs >= 0 && !prompt_echoed; }
};

namespace {
// The log-sum-exp of a row of raw logits, and its k likeliest tokens with their log-probabilities
// (most likely first, ties by lower id) into *top when k > 0: log-probabilities are of the raw model
// distribution (what OpenAI and vLLM report), before any processor touches the logits.
double raw_logprobs(const float* logits, int V, int k, std::vector<TokenLogprob>* top) {
  float mx = -INFINITY;
  for (int i = 0; i < V; ++i) mx = std::max(mx, logits[i]);
  double s = 0;
  for (int i = 0; i < V; ++i) s += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(s);
  if (k > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int i = 0; i < V; ++i) idx[size_t(i)] = i;
    k = std::min(k, V);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t x, int32_t y) {
      return logits[x] > logits[y] || (logits[x] == logits[y] && x < y);
    });
    for (int j = 0; j < k; ++j) top->push_back({idx[size_t(j)], float(logits[idx[size_t(j)]] - lse)});
  }
  return lse;
}
}  // namespace

Scheduler::Scheduler(Engine& engine, const Tokenizer& tok, Metrics& metrics, SchedulerOptions opts)
    : engine_(engine), tok_(tok), metrics_(metrics), opts_(std::move(opts)) {
  step_tokens_ = engine_.model().max_tokens();
  if (opts_.step_tokens > 0) step_tokens_ = std::min(step_tokens_, opts_.step_tokens);
  pages_total_ = engine_.pool().n_pages();
  // Sampling (and the log-probabilities' normalizer) is host work per row; with many streams it is
  // spread over a few threads that sleep between steps (no spinning: the engine's own CPU threads
  // are idle while this runs, and a CUDA step waits for it).
  sample_pool_ = std::make_unique<ThreadPool>(std::max(1, std::min(8, ThreadPool::default_threads())), 0);
  device_sample_ = device_sampler_enabled(engine_.model().backend());  // read once, not per step
  publish_counts();  // the pool as it starts (a restarted server's prefix cache may hold warmed pages)
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::start() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    thread_done_ = false;
  }
  // ANVIL_SERVE_NOTIFIER=0: each event wakes its HTTP thread from the scheduler thread, as before
  // the Notifier (for measuring the host's part of a step against it).
  const char* n = std::getenv("ANVIL_SERVE_NOTIFIER");
  if (!(n && *n == '0')) notifier_ = std::make_unique<Notifier>();
  // Pages the store failed to write wake an idle loop for their retry (wait_for_work). The mutex
  // orders the wake-up after the loop's look at the store: taken, then notified.
  if (opts_.store)
    opts_.store->set_failed_listener([this] {
      { std::lock_guard<std::mutex> lk(mu_); }
      cv_.notify_all();
    });
  thread_ = std::thread([this] { loop(); });
}

Status Scheduler::submit(std::shared_ptr<Job> job) {
  if (draining_.load()) return Status(StatusCode::kOutOfMemory, "the server is shutting down");
  auto a = std::make_unique<Active>();
  a->job = std::move(job);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return Status(StatusCode::kOutOfMemory, "the server is shutting down");
    // The queue holds jobs about to take a free sequence too: only those beyond the free sequences
    // wait, and --max-queue bounds them (0: none wait; it refused every request). A job gives its
    // place back before its end is sent, so a client that saw its request end finds the place free.
    const int free_seqs = std::max(0, engine_.options().max_seqs - seqs_taken_);
    const int waiting = int(queue_.size()) - free_seqs;  // < 0: this job finds a free sequence too
    if (waiting >= opts_.max_queue)
      return Status(StatusCode::kOutOfMemory, "the server is busy: " + std::to_string(waiting) +
                                                  " requests are already waiting (raise --max-queue)");
    queue_.push_back(std::move(a));
  }
  cv_.notify_all();
  return Status::ok();
}

Result<std::shared_ptr<const JsonVocab>> Scheduler::json_vocab() {
  std::lock_guard<std::mutex> lk(json_mu_);
  if (!json_built_) {
    auto v = server::json_vocab(tok_, int(engine_.model().config().vocab_size), opts_.eos_ids);
    if (v.is_ok())
      json_vocab_ = *v;
    else
      json_error_ = v.status();
    json_built_ = true;
  }
  if (!json_vocab_) return json_error_;
  return json_vocab_;
}

int Scheduler::queued() const {
  // As submit() counts them: jobs about to take a free sequence at the next step do not wait.
  std::lock_guard<std::mutex> lk(mu_);
  const int free_seqs = std::max(0, engine_.options().max_seqs - seqs_taken_);
  return std::max(0, int(queue_.size()) - free_seqs);
}

void Scheduler::begin_drain() { draining_.store(true); }

bool Scheduler::wait_idle(clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_until(lk, deadline, [&] { return queue_.empty() && running_.load() == 0; });
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (opts_.store) opts_.store->set_failed_listener(nullptr);  // (waits for a call in progress)
  notifier_.reset();  // wakes whatever the loop posted last; from here on emit() wakes at once
  // Whatever is left (the thread ended or never ran) ends now.
  std::deque<std::unique_ptr<Active>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(queue_);
  }
  for (auto& a : left) close_session(*a);
  for (auto& a : left) emit(a->job, {JobEvent::kError, {}, {}, {}, Status(StatusCode::kOutOfMemory, "the server is shutting down")});
}

void Scheduler::call(const std::function<void()>& fn) {
  std::promise<void> done;
  auto ran = done.get_future();
  bool queued = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!thread_done_) {
      calls_.push_back([&] {
        fn();
        done.set_value();
      });
      queued = true;
    }
  }
  if (!queued) {
    std::lock_guard<std::mutex> lk(inline_call_mu_);
    fn();
    return;
  }
  cv_.notify_all();
  ran.wait();  // the loop runs every queued call, also on its way out
}

void Scheduler::run_calls() {
  std::deque<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lk(mu_);
    calls.swap(calls_);
  }
  for (auto& c : calls) c();
}

void Scheduler::close_session(Active& a) {
  if (!a.session_open || !opts_.store) return;
  a.session_open = false;
  const int n_kv = a.seq >= 0 ? engine_.seq_kv(a.seq) : 0;
  const int32_t tail = a.seq >= 0 ? engine_.seq_tail_page(a.seq) : -1;
  Status st = opts_.store->session_close(a.job->params.session, n_kv, tail, engine_.pool());
  if (!st.is_ok()) std::fprintf(stderr, "[anvil] session %s: %s\n", a.job->params.session.c_str(), st.message().c_str());
}

void Scheduler::emit(const std::shared_ptr<Job>& job, JobEvent e) {
  e.step = step_no_;
  if (!notifier_) {
    job->push(std::move(e));
    return;
  }
  job->push(std::move(e), /*notify=*/false);
  notifier_->post(job);  // woken at the end of this loop iteration (Notifier)
}

void Scheduler::release(Active& a) {
  if (a.seq >= 0) engine_.seq_release(a.seq);
  a.seq = -1;
  give_back_place(a);
}

void Scheduler::give_back_place(Active& a) {
  if (!a.holds_place) return;
  a.holds_place = false;
  std::lock_guard<std::mutex> lk(mu_);
  --seqs_taken_;
}

void Scheduler::finish(Active& a, std::string reason) {
  // Text held back by the decoder (an incomplete UTF-8 tail) or the stop matcher (a possible stop
  // prefix that never completed) belongs to the output. A stop string may complete in it (the
  // U+FFFD of a character max_tokens cut short): the reply then ended at a stop string.
  if (reason != "cancelled" && a.dec && a.stop && !a.stop->stopped()) {
    std::string rest = a.stop->push(a.dec->flush());
    rest += a.stop->flush();
    if (!rest.empty()) emit(a.job, {JobEvent::kDelta, std::move(rest), {}, {}, {}});
    if (a.stop->stopped()) reason = "stop";
  }
  if (reason == "cancelled") metrics_.cancelled++;
  metrics_.e2e.observe(std::chrono::duration<double>(clock::now() - a.job->submitted).count());
  close_session(a);  // before the terminal event: the HTTP side then finishes the recording
  release(a);  // first: a client that sees the end also sees the pages back
  emit(a.job, {JobEvent::kDone, {}, {}, reason, {}});
}

void Scheduler::fail(Active& a, const Status& st) {
  close_session(a);
  release(a);
  emit(a.job, {JobEvent::kError, {}, {}, {}, st});
}

void Scheduler::preempt(Active& a) {
  a.tokens = engine_.seq_tokens(a.seq);
  if (a.session_open) (void)opts_.store->session_rebind(a.job->params.session, -1);
  release(a);
  metrics_.preemptions++;
}

void Scheduler::loop() {
  for (;;) {
    std::vector<std::unique_ptr<Active>> incoming, gone;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wait_for_work(lk);
      if (stop_) break;
      // A queued job whose client went away leaves the queue now, not when a sequence frees up:
      // its queue place and its session (claimed from validation, also against other processes)
      // are given back within a step.
      for (auto it = queue_.begin(); it != queue_.end();)
        if ((*it)->job->cancelled()) {
          gone.push_back(std::move(*it));
          it = queue_.erase(it);
        } else {
          ++it;
        }
      while (!queue_.empty() && int(active_.size() + incoming.size()) < engine_.options().max_seqs) {
        queue_.front()->holds_place = true;
        ++seqs_taken_;
        incoming.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    const auto t0 = clock::now();
    run_calls();
    admit(gone);  // (each is cancelled: ended, with no sequence)
    admit(incoming);
    // Cancelled jobs leave at the step boundary.
    for (auto& a : active_)
      if (a->job->cancelled()) finish(*a, "cancelled");
    std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->seq < 0; });
    publish_counts();
    forwards_ = 0, forward_ns_ = 0, prep_ns_ = 0;
    if (!active_.empty() && !run_step()) {
      // run_step() failed the jobs it could not run; nothing else to do here.
    }
    std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return a->seq < 0; });
    if (notifier_) notifier_->flush();  // this iteration's events: their HTTP threads wake while the next step runs
    if (forwards_ > 0) {  // a forward pass ran: the iteration was a step (the count last, see Metrics)
      metrics_.step_ns += ns_since(t0);
      metrics_.forward_ns += forward_ns_;
      metrics_.prep_ns += prep_ns_;
      metrics_.steps += forwards_;
    }
    // Going idle: take back the pages the store's writer still holds for copying (otherwise they
    // stay out of the pool until the next step), so an idle server's pages are all free or cached.
    // In short waits, and not past the arrival of work: after a long prompt the writer holds its
    // pages for as long as the disk takes to write them (a 4,096-token qwen3-8b prompt: 600 MB,
    // ~200 ms on the H200 machine), and the next request must not wait for that. Pages the store
    // dropped under load (its queue full) and the prefix cache still holds are offered to it again
    // meanwhile, as its queue drains, so that an idle server catches up on what it could not write.
    if (active_.empty() && opts_.store)
      for (;;) {
        const size_t dropped = engine_.offer_dropped();
        if (opts_.store->reap_for(engine_.pool(), std::chrono::milliseconds(2)) && dropped == 0) break;
        std::lock_guard<std::mutex> lk(mu_);
        if (stop_ || !queue_.empty() || !calls_.empty()) break;
      }
    publish_counts();
    cv_.notify_all();  // wait_idle()
  }
  for (auto& a : active_) {
    close_session(*a);
    emit(a->job, {JobEvent::kError, {}, {}, {}, Status(StatusCode::kOutOfMemory, "the server is shutting down")});
    release(*a);
  }
  active_.clear();
  if (notifier_) notifier_->flush();
  running_.store(0);
  std::deque<std::function<void()>> calls;
  {
    std::lock_guard<std::mutex> lk(mu_);
    thread_done_ = true;  // call() runs on its caller's thread from now on
    calls.swap(calls_);
  }
  for (auto& c : calls) c();
}

void Scheduler::wait_for_work(std::unique_lock<std::mutex>& lk) {
  for (;;) {
    if (stop_ || !queue_.empty() || !active_.empty() || !calls_.empty()) return;
    // Idle, while full pages the store could not write (a full disk) wait for their retry
    // (invariant 11 of kvstore.h): the loop wakes when it is due, and its idle pass offers them
    // again (Engine::offer_dropped), so they become durable without a request. The store wakes it
    // when pages fail or it recovers (set_failed_listener, under mu_: no wake-up is lost between
    // this look and the wait); with nothing failed, this waits for work alone. A due time already
    // woken for once and still listed (the engine did not take them: cannot happen while the engine
    // holds this store) is not woken for again: never a busy loop.
    std::optional<clock::time_point> due = opts_.store ? opts_.store->failed_ready_at() : std::nullopt;
    if (due && retry_woken_for_ && *retry_woken_for_ == *due) due.reset();
    if (!due) {
      cv_.wait(lk);
      continue;
    }
    if (clock::now() >= *due) {
      retry_woken_for_ = due;
      return;
    }
    cv_.wait_until(lk, *due);
  }
}

void Scheduler::publish_counts() {
  pages_used_.store(engine_.pool().n_pages() - engine_.pool().n_free());
  prefix_pages_.store(int64_t(engine_.pool().prefix_entries()));
  running_.store(int(active_.size()));  // last: whoever sees no job running sees these page counts
}

void Scheduler::admit(std::vector<std::unique_ptr<Active>>& incoming) {
  for (auto& ap : incoming) {
    Active& a = *ap;
    if (a.job->cancelled()) {
      metrics_.cancelled++;
      close_session(a);
      give_back_place(a);
      emit(a.job, {JobEvent::kDone, {}, {}, "cancelled", {}});
      continue;
    }
    auto seq = engine_.seq_create();
    if (!seq.is_ok()) {
      fail(a, seq.status());
      continue;
    }
    a.seq = *seq;
    a.order = admit_counter_++;
    const bool resume = a.admitted_once;
    const std::vector<int32_t>& toks = resume ? a.tokens : a.job->params.prompt;
    // Echo with log-probabilities: every prompt token computed (its logits), none from the prefix
    // cache; a job preempted before its prompt's event went out starts them again.
    const bool all_prompt = a.wants_prompt_logprobs();
    if (all_prompt) a.prompt_lp.clear();
    Status st = engine_.seq_append(a.seq, toks, /*reuse=*/!all_prompt);
    if (!st.is_ok()) {
      fail(a, st);
      continue;
    }
    if (resume && a.session_open) {
      if (Status sr = opts_.store->session_rebind(a.job->params.session, a.seq); !sr.is_ok()) {
        fail(a, sr);
        continue;
      }
    }
    if (!resume && !a.job->params.session.empty() && opts_.store) {
      // The recording starts with the whole prompt (the session's earlier tokens + this turn).
      Status ss = opts_.store->session_begin(a.job->params.session, a.seq, engine_.seq_tokens(a.seq),
                                             engine_.options().max_context + 1, a.job->params.session_meta);
      if (!ss.is_ok()) {
        fail(a, ss);
        continue;
      }
      a.session_open = true;
      a.job->set_session_recorded();
    }
    if (!resume) {
      const GenerationParams& p = a.job->params;
      a.admitted_once = true;
      a.sampler = std::make_unique<Sampler>(p.sampling);
      if (p.ignore_eos) a.sampler->set_suppressed(opts_.eos_ids);
      a.dec = std::make_unique<StreamDecoder>(tok_, /*skip_special=*/true);
      a.stop = std::make_unique<StopMatcher>(p.stop, p.stop_markup);
      if (p.json_object) {
        auto v = json_vocab();
        if (!v.is_ok()) {
          fail(a, v.status());
          continue;
        }
        a.json = std::make_unique<JsonConstraint>(*v);
        a.json_waiting = p.json_in_reasoning;
      }
      const int cached = engine_.seq_cached_tokens(a.seq);
      a.job->set_prompt_stats(int(p.prompt.size()), cached);
      metrics_.prompt_tokens += p.prompt.size();
      metrics_.cached_prompt_tokens += uint64_t(cached);
      metrics_.store_prompt_tokens += uint64_t(engine_.seq_store_tokens(a.seq));
    }
    a.tokens.clear();
    active_.push_back(std::move(ap));
  }
}

// Builds and runs one step. Returns false when the forward itself failed.
bool Scheduler::run_step() {
  ++step_no_;
  // Decode tokens first (each is one token and keeps a stream moving), then prompt chunks oldest first.
  std::vector<Active*> order;
  for (auto& a : active_) order.push_back(a.get());
  std::stable_sort(order.begin(), order.end(), [&](Active* x, Active* y) {
    const bool dx = engine_.seq_pending(x->seq) == 1, dy = engine_.seq_pending(y->seq) == 1;
    if (dx != dy) return dx;
    return x->order < y->order;
  });
  std::vector<Engine::StepItem> items;
  std::vector<Active*> item_owner;
  int budget = step_tokens_;
  bool all_rows_taken = false;
  for (Active* a : order) {
    if (a->seq < 0 || budget <= 0) continue;
    const int pending = engine_.seq_pending(a->seq);
    int n = std::min(pending, budget);
    // A prompt whose every token's log-probability is wanted (echo): a row of logits per token, so
    // its chunk leaves a row for each other sequence of the step within the forward's logit rows;
    // one such chunk per step (another waits for the next).
    const bool all_rows = a->wants_prompt_logprobs();
    if (all_rows) {
      if (all_rows_taken) continue;
      all_rows_taken = true;
      n = std::min(n, std::max(1, engine_.model().max_logit_rows() - (int(order.size()) - 1)));
    }
    const int n_kv = int(engine_.seq_tokens(a->seq).size()) - pending;
    // Admission control: pages for this chunk, taking them back from the newest others if needed.
    for (;;) {
      Status st = engine_.seq_reserve(a->seq, n_kv + n);
      if (st.is_ok()) break;
      if (st.code() != StatusCode::kOutOfMemory) {
        fail(*a, st);
        break;
      }
      Active* victim = nullptr;
      for (auto& o : active_)
        if (o.get() != a && o->seq >= 0 && (!victim || o->order > victim->order)) victim = o.get();
      if (!victim || victim->order < a->order) {
        // `a` is the newest: it yields instead, unless it is alone (then it can never fit).
        if (!victim) {
          fail(*a, Status(StatusCode::kOutOfMemory,
                          "the KV cache cannot hold this request (" + std::to_string(n_kv + n) +
                              " tokens): " + st.message()));
        } else {
          preempt(*a);
        }
        break;
      }
      preempt(*victim);
    }
    if (a->seq < 0) continue;
    items.push_back({a->seq, n, n == pending, all_rows});
    item_owner.push_back(a);
    budget -= n;
  }
  // Preempted sequences go back to the front of the queue, oldest first.
  {
    std::vector<std::unique_ptr<Active>> back;
    for (auto& a : active_)
      if (a->seq < 0 && !a->tokens.empty()) back.push_back(std::move(a));
    std::erase_if(active_, [](const std::unique_ptr<Active>& a) { return !a; });
    std::sort(back.begin(), back.end(), [](auto& x, auto& y) { return x->order > y->order; });
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& b : back) queue_.push_front(std::move(b));
  }
  // Items whose sequence was preempted after being added are dropped.
  std::vector<Engine::StepItem> run;
  std::vector<Active*> run_owner;
  for (size_t i = 0; i < items.size(); ++i)
    if (item_owner[i]->seq >= 0 && item_owner[i]->seq == items[i].seq) {
      bool alive = false;
      for (auto& a : active_) alive |= a && a.get() == item_owner[i];
      if (alive) {
        run.push_back(items[i]);
        run_owner.push_back(item_owner[i]);
      }
    }
  if (run.empty()) return true;
  if (const int dev = sample_on_device(run, run_owner); dev != 0) return dev > 0;
  // An echo's prompt chunk: its first position (its rows are numbered from it), before the step.
  std::vector<int> first(run.size(), 0);
  for (size_t i = 0; i < run.size(); ++i)
    if (run[i].all_logits) first[i] = int(engine_.seq_tokens(run[i].seq).size()) - engine_.seq_pending(run[i].seq);
  Status st = timed_forward([&] { return engine_.step(run, &logits_); });
  if (!st.is_ok()) {
    for (Active* a : run_owner) fail(*a, st.with_context("forward pass"));
    return false;
  }
  const size_t V = size_t(engine_.model().config().vocab_size);
  std::vector<Active*> rows;
  std::vector<size_t> row_of;  // each sampled row's place in logits_
  size_t next_row = 0;
  for (size_t i = 0; i < run.size(); ++i) {
    if (run[i].all_logits) {
      prompt_logprobs(*run_owner[i], first[i], run[i].n_tokens, logits_.data() + next_row * V);
      next_row += size_t(run[i].n_tokens);
      if (run[i].want_logits) rows.push_back(run_owner[i]), row_of.push_back(next_row - 1);
    } else if (run[i].want_logits) {
      rows.push_back(run_owner[i]), row_of.push_back(next_row++);
    }
  }
  std::vector<Sampled> sampled(rows.size());
  // Each row reads its logits and its own Active (sampler, counts, scratch) and the engine's token
  // list of its sequence, which nothing changes until on_token below: rows are independent.
  sample_pool_->parallel_for(int64_t(rows.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) sampled[size_t(r)] = sample_row(*rows[size_t(r)], logits_.data() + row_of[size_t(r)] * V);
  });
  for (size_t r = 0; r < rows.size(); ++r) on_token(*rows[r], std::move(sampled[r]));
  return true;
}

// The step sampled on the backend (Engine::step_sample), where the backend samples on the device by
// default (CUDA; device_sampler_enabled). A row whose job needs its full logits on the host
// (log-probabilities, presence/frequency penalties, JSON mode's token mask) is a host row: only its
// logits row comes back and sample_row samples it, as the host path does. The other rows are
// sampled on the device, each suppressing the EOS ids or not as its job's ignore_eos says, and only
// their ids come back; each draws the next number of its Sampler's stream, so every row's token is
// the one the host path samples. Returns 0 (nothing done) where it does not apply (every row a host
// row: Engine::step copies the same rows), 1 when the step ran, -1 when it failed (every owner
// failed with the error).
int Scheduler::sample_on_device(const std::vector<Engine::StepItem>& run, const std::vector<Active*>& owner) {
  if (!device_sample_) return 0;
  for (const Engine::StepItem& it : run)
    if (it.all_logits) return 0;  // every row of a prompt back to the host: Engine::step
  std::vector<Active*> rows;
  std::vector<SamplingParams> params;
  std::vector<uint64_t> random;
  std::vector<Engine::RowMode> modes;
  bool any_device = false, any_suppress = false;
  for (size_t i = 0; i < run.size(); ++i) {
    if (!run[i].want_logits) continue;
    const GenerationParams& p = owner[i]->job->params;
    Engine::RowMode m;
    m.host = p.top_logprobs >= 0 || p.presence_penalty != 0 || p.frequency_penalty != 0 || p.json_object;
    m.suppress = p.ignore_eos;
    any_device |= !m.host;
    any_suppress |= !m.host && m.suppress;
    rows.push_back(owner[i]);
    params.push_back(p.sampling);
    modes.push_back(m);
  }
  if (!any_device) return 0;
  for (size_t r = 0; r < rows.size(); ++r)
    random.push_back(!modes[r].host && params[r].temperature > 0 ? rows[r]->sampler->next_random53() : 0);
  const std::vector<int32_t> none;
  Status st = timed_forward([&] {
    return engine_.step_sample(run, params, random, any_suppress ? opts_.eos_ids : none, &sampled_ids_, modes,
                               &logits_);
  });
  if (!st.is_ok()) {
    for (Active* a : owner) fail(*a, st.with_context("forward pass"));
    return -1;
  }
  // The host rows, whose logits lie in logits_ in row order: sampled as on the host path (in
  // parallel, each row touching only its own Active), before any token is applied.
  const size_t V = size_t(engine_.model().config().vocab_size);
  std::vector<size_t> host;
  for (size_t r = 0; r < rows.size(); ++r)
    if (modes[r].host) host.push_back(r);
  std::vector<Sampled> sampled(rows.size());
  sample_pool_->parallel_for(int64_t(host.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t h = b; h < e; ++h)
      sampled[host[size_t(h)]] = sample_row(*rows[host[size_t(h)]], logits_.data() + size_t(h) * V);
  });
  for (size_t r = 0; r < rows.size(); ++r) {
    if (!modes[r].host) sampled[r].id = sampled[r].info.id = sampled_ids_[r];
    on_token(*rows[r], std::move(sampled[r]));
  }
  return 1;
}

Scheduler::Sampled Scheduler::sample_row(Active& a, float* logits) {
  const GenerationParams& p = a.job->params;
  const int V = engine_.model().config().vocab_size;
  Sampled out;
  TokenInfo& info = out.info;
  // Log-probabilities are of the raw model distribution (what OpenAI and vLLM report), so take
  // the top alternatives and the normalizer before any processor touches the logits.
  double lse = 0;
  if (p.top_logprobs >= 0) {
    lse = raw_logprobs(logits, V, p.top_logprobs, &info.top);
    a.scratch.assign(logits, logits + V);
  }
  if (p.presence_penalty != 0 || p.frequency_penalty != 0)
    for (auto& [id, c] : a.counts) logits[id] -= p.presence_penalty + p.frequency_penalty * float(c);
  // JSON mode: only the tokens that keep the reply a valid beginning of a JSON object (or, once it
  // is closed, an end-of-sequence id); before the constraint begins (reasoning first), anything but
  // an end-of-sequence id, so the reply cannot end before its JSON.
  if (a.json) {
    const std::vector<uint64_t>* mask = a.json_waiting ? &a.json->vocab().all_but_eos() : &a.json->allowed();
    if (!a.json_waiting && a.generated == 0 && p.json_think_open >= 0 && p.json_think_open < V) {
      a.json_first = *mask;  // the reply may open its reasoning instead
      a.json_first[size_t(p.json_think_open) / 64] |= uint64_t(1) << (p.json_think_open % 64);
      mask = &a.json_first;
    }
    a.sampler->set_allowed(mask->data());
  }
  const int32_t id = a.sampler->sample(logits, V, engine_.seq_tokens(a.seq));
  a.sampler->set_allowed(nullptr);
  out.id = id;
  info.id = id;
  if (id >= 0 && p.top_logprobs >= 0) info.logprob = float(a.scratch[size_t(id)] - lse);
  return out;
}

// Rows 0 .. n - 1 of `logits` are positions first .. first + n - 1 of the sequence; row j gives the
// log-probability of the prompt's token at first + j + 1 (the rows past the prompt's end give none).
void Scheduler::prompt_logprobs(Active& a, int first, int n, const float* logits) {
  const std::vector<int32_t>& toks = engine_.seq_tokens(a.seq);
  const int len = int(a.job->params.prompt.size()), k = a.job->params.top_logprobs;
  const int V = engine_.model().config().vocab_size;
  if (first == 0 && len > 0) a.prompt_lp.push_back({toks[0], std::nanf(""), {}});  // nothing predicts it
  const int m = std::max(0, std::min(n, len - 1 - first));  // rows whose next token is the prompt's
  const size_t base = a.prompt_lp.size();
  a.prompt_lp.resize(base + size_t(m));
  sample_pool_->parallel_for(int64_t(m), 1, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      const float* row = logits + size_t(j) * size_t(V);
      TokenInfo& t = a.prompt_lp[base + size_t(j)];
      t.id = toks[size_t(first + j + 1)];
      const double lse = raw_logprobs(row, V, k, &t.top);
      t.logprob = float(row[t.id] - lse);
    }
  });
}

void Scheduler::on_token(Active& a, Sampled s) {
  const GenerationParams& p = a.job->params;
  if (p.echo && !a.prompt_echoed) {
    // The prompt first (its log-probabilities, computed over the prefill, when asked for).
    a.prompt_echoed = true;
    JobEvent pe{JobEvent::kDelta, {}, {}, {}, {}};
    pe.has_prompt = true;
    if (p.top_logprobs >= 0) {
      pe.prompt = std::move(a.prompt_lp);
    } else {
      for (int32_t t : p.prompt) pe.prompt.push_back({t, std::nanf(""), {}});
    }
    a.prompt_lp.clear();
    emit(a.job, std::move(pe));
    if (p.max_tokens == 0) {  // the prompt alone (echo with max_tokens 0): the sampled token is not used
      finish(a, "length");
      return;
    }
  }
  const int32_t id = s.id;
  TokenInfo& info = s.info;
  if (id < 0) {
    fail(a, internal_error(kNoFiniteLogit));
    return;
  }
  // A session records every sampled token, the end-of-sequence one too (as anvil generate does).
  if (a.session_open)
    opts_.store->session_note(a.seq, std::span<const int32_t>(&id, 1), engine_.seq_kv(a.seq),
                              engine_.seq_tail_page(a.seq), engine_.pool());
  const auto now = clock::now();
  if (a.generated == 0)
    metrics_.ttft.observe(std::chrono::duration<double>(now - a.job->submitted).count());
  else
    metrics_.itl.observe(std::chrono::duration<double>(now - a.last_token).count());
  a.last_token = now;
  const bool is_eos =
      !p.ignore_eos && std::find(opts_.eos_ids.begin(), opts_.eos_ids.end(), id) != opts_.eos_ids.end();
  ++a.generated;
  metrics_.generation_tokens++;
  a.job->add_completion_tokens(1);
  if (a.json && !is_eos) {
    if (a.json_waiting) {
      a.json_waiting = id != p.json_think_close;
    } else if (a.generated == 1 && id == p.json_think_open) {
      a.json_waiting = true;
    } else if (!a.json->accept(id)) {  // the mask allowed it: cannot happen
      fail(a, internal_error("JSON mode: token " + std::to_string(id) + " was sampled but does not continue the JSON"));
      return;
    }
  }
  if (is_eos) {
    finish(a, "stop");
    return;
  }
  ++a.counts[id];
  std::string text = a.stop->push(a.dec->push(id));
  JobEvent e{JobEvent::kDelta, std::move(text), {}, {}, {}};
  e.tokens.push_back(std::move(info));
  emit(a.job, std::move(e));
  if (a.stop->stopped()) {
    finish(a, "stop");
    return;
  }
  if (a.generated >= p.max_tokens || int(engine_.seq_tokens(a.seq).size()) + 1 > engine_.options().max_context) {
    finish(a, "length");
    return;
  }
  Status st = engine_.seq_append(a.seq, std::span<const int32_t>(&id, 1));
  if (!st.is_ok()) fail(a, st);
}

}  // namespace anvil::server
