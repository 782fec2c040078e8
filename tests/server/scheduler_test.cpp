// The continuous-batching scheduler and the Engine step API it drives, without HTTP: a request
// served in a busy batch gives the tokens it gets alone (greedy), prefill is chunked so a long
// prompt does not stall a running stream, a full KV pool preempts instead of failing, a cancelled
// request frees its pages, and the limits refuse instead of queueing without bound.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include <unistd.h>

#include "kvstore/fault_env.h"
#include "kvstore/sqlite_db.h"
#include "model/loader.h"
#include "runtime/engine.h"
#include "server/scheduler.h"

using namespace anvil;
using namespace anvil::server;

namespace {

struct Stack {
  std::unique_ptr<LoadedModel> model;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Transformer> tf;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Tokenizer> tok;
};

Stack make_stack(int max_tokens, int max_seqs, int64_t kv_pages = 0, bool prefix_cache = true) {
  Stack s;
  s.model = std::move(load_synthetic("tiny:q4g64")).value();
  s.backend = make_cpu_backend(2);
  auto w = upload_weights(s.model->weights, *s.backend);
  s.tf = std::move(Transformer::create(s.model->config, *w, *s.backend, max_tokens)).value();
  EngineOptions o;
  o.page_size = 16;
  o.max_context = 512;
  o.max_seqs = max_seqs;
  o.kv_pages = kv_pages;
  o.kv_dtype = DType::kF32;
  o.prefix_cache = prefix_cache;
  s.engine = std::move(Engine::create(*s.tf, s.model->fingerprint, o)).value();
  s.tok = std::move(Tokenizer::load(default_tokenizer_dir() + "/tokenizer.json")).value();
  return s;
}

std::vector<int32_t> random_ids(int n, uint64_t seed) {
  std::mt19937_64 r(seed);
  std::vector<int32_t> v(size_t(n), 0);
  for (auto& x : v) x = int32_t(r() % 150000);
  return v;
}

int argmax(const float* x, size_t n) { return int(std::max_element(x, x + n) - x); }

struct Outcome {
  std::vector<int32_t> ids;
  std::string text, finish;
  Status error;
  int64_t first_step = -1, done_step = -1;
};

// Reads a job's events to the end (bounded: 60 s).
Outcome collect(Job& job) {
  Outcome o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    std::vector<JobEvent> evs;
    job.wait(&evs, std::chrono::milliseconds(200));
    for (auto& e : evs) {
      if (e.kind == JobEvent::kDelta) {
        if (o.first_step < 0) o.first_step = e.step;
        for (auto& t : e.tokens) o.ids.push_back(t.id);
        o.text += e.text;
      } else {
        o.done_step = e.step;
        if (e.kind == JobEvent::kDone) o.finish = e.finish_reason;
        else o.error = e.error;
        return o;
      }
    }
  }
  o.finish = "timeout";
  return o;
}

GenerationParams greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerationParams p;
  p.prompt = std::move(prompt);
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Submits a job for each of `params`, in order (the scheduler may not have started).
std::vector<std::shared_ptr<Job>> submit_all(Scheduler& sch, const std::vector<GenerationParams>& params) {
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& p : params) {
    jobs.push_back(std::make_shared<Job>(p));
    EXPECT_TRUE(sch.submit(jobs.back()).is_ok());
  }
  return jobs;
}

SchedulerOptions sched_opts(int step_tokens = 0, int max_queue = 64) {
  SchedulerOptions o;
  o.step_tokens = step_tokens;
  o.max_queue = max_queue;
  o.eos_ids = {151645, 151643};
  return o;
}

}  // namespace

// A step mixing a prefill chunk of one sequence with a decode token of another gives the logits
// that extend()/decode() give each alone, bit for bit (the engine's numerical contract: a token's
// logits do not depend on its batch).
TEST(EngineStep, MixedStepMatchesSeparateCalls) {
  Stack a = make_stack(64, 4), b = make_stack(64, 4);
  const size_t V = size_t(a.model->config.vocab_size);
  auto p1 = random_ids(37, 1), p2 = random_ids(45, 2);
  // Reference: separate calls.
  int r1 = *b.engine->seq_create(), r2 = *b.engine->seq_create();
  std::vector<float> l1, l2, l1d;
  ASSERT_TRUE(b.engine->extend(r1, p1, &l1).is_ok());
  ASSERT_TRUE(b.engine->extend(r2, p2, &l2).is_ok());
  int32_t next = 1234;
  ASSERT_TRUE(b.engine->decode(std::span<const int>(&r1, 1), std::span<const int32_t>(&next, 1), &l1d).is_ok());
  // Stepped: p1 whole, then p1's decode token together with p2 in two chunks (20 + 25).
  int s1 = *a.engine->seq_create(), s2 = *a.engine->seq_create();
  std::vector<float> out;
  ASSERT_TRUE(a.engine->seq_append(s1, p1).is_ok());
  std::vector<Engine::StepItem> it = {{s1, 37, true}};
  ASSERT_TRUE(a.engine->step(it, &out).is_ok());
  EXPECT_EQ(out, l1);
  ASSERT_TRUE(a.engine->seq_append(s1, std::span<const int32_t>(&next, 1)).is_ok());
  ASSERT_TRUE(a.engine->seq_append(s2, p2).is_ok());
  EXPECT_EQ(a.engine->seq_pending(s2), 45);
  it = {{s1, 1, true}, {s2, 20, false}};
  ASSERT_TRUE(a.engine->step(it, &out).is_ok());
  ASSERT_EQ(out.size(), V);
  EXPECT_EQ(out, l1d);
  it = {{s2, 25, true}};
  ASSERT_TRUE(a.engine->step(it, &out).is_ok());
  EXPECT_EQ(out, l2);
  EXPECT_EQ(a.engine->seq_pending(s2), 0);
}

TEST(EngineStep, RejectsBadItemsWithoutChangingState) {
  Stack a = make_stack(32, 2);
  int s = *a.engine->seq_create();
  ASSERT_TRUE(a.engine->seq_append(s, random_ids(40, 3)).is_ok());
  std::vector<float> out;
  std::vector<Engine::StepItem> dup = {{s, 1, false}, {s, 1, false}};
  EXPECT_FALSE(a.engine->step(dup, &out).is_ok());
  std::vector<Engine::StepItem> too_many = {{s, 41, true}};
  EXPECT_FALSE(a.engine->step(too_many, &out).is_ok());
  std::vector<Engine::StepItem> over_budget = {{s, 33, true}};
  Status st = a.engine->step(over_budget, &out);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("limit of 32"), std::string::npos) << st.message();
  EXPECT_EQ(a.engine->seq_pending(s), 40);
  std::vector<int32_t> oov = {151936};
  EXPECT_FALSE(a.engine->seq_append(s, oov).is_ok());
  EXPECT_FALSE(a.engine->seq_append(s, random_ids(500, 4)).is_ok());  // past the 512 context
  EXPECT_EQ(a.engine->seq_tokens(s).size(), 40u);
}

// The core promise of continuous batching: each of 8 concurrent greedy requests gets exactly the
// tokens it gets when served alone.
TEST(Scheduler, ConcurrentGreedyRequestsMatchAlone) {
  const int kJobs = 8;
  std::vector<GenerationParams> params;
  for (int i = 0; i < kJobs; ++i) params.push_back(greedy(random_ids(10 + 7 * i, 100 + i), 12));
  std::vector<Outcome> alone;
  {
    Stack s = make_stack(64, 8);
    Metrics m;
    Scheduler sch(*s.engine, *s.tok, m, sched_opts());
    sch.start();
    for (auto& p : params) {
      auto job = std::make_shared<Job>(p);
      ASSERT_TRUE(sch.submit(job).is_ok());
      alone.push_back(collect(*job));
      ASSERT_EQ(alone.back().finish, "length");
    }
  }
  Stack s = make_stack(64, 8);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts());
  const auto jobs = submit_all(sch, params);
  ASSERT_FALSE(HasFailure());
  sch.start();  // all queued before the first step: they run together
  for (int i = 0; i < kJobs; ++i) {
    Outcome o = collect(*jobs[size_t(i)]);
    EXPECT_EQ(o.finish, "length");
    EXPECT_EQ(o.ids, alone[size_t(i)].ids) << "job " << i;
    EXPECT_EQ(o.text, alone[size_t(i)].text) << "job " << i;
  }
  EXPECT_EQ(m.generation_tokens.load(), uint64_t(kJobs * 12));
}

// The device sampler in the scheduler (Engine::step_sample; by default on CUDA, forced here on the
// CPU backend's reference op): concurrent seeded requests with different sampling settings, prompts
// prefilled in chunks beside running streams, give exactly the tokens of the host path; a request
// asking for logprobs (its logits row on the host) makes its row of each step a host row, same tokens.
TEST(Scheduler, DeviceSamplerGivesTheHostPathsTokens) {
  std::vector<GenerationParams> params;
  for (int i = 0; i < 6; ++i) {
    GenerationParams p = greedy(random_ids(9 + 13 * i, 700 + i), 14);
    p.sampling.temperature = i == 0 ? 0.0f : 0.7f + 0.1f * float(i);
    p.sampling.top_k = i % 2 ? 50 : 0;
    p.sampling.top_p = i == 3 ? 0.9f : 1.0f;
    p.sampling.repetition_penalty = i >= 4 ? 1.25f : 1.0f;
    p.sampling.seed = uint64_t(40 + i);
    params.push_back(p);
  }
  auto run = [&](const char* device_sampler, bool with_logprobs) {
    setenv("ANVIL_CUDA_DEVICE_SAMPLER", device_sampler, 1);
    Stack s = make_stack(32, 8);
    Metrics m;
    Scheduler sch(*s.engine, *s.tok, m, sched_opts(24));
    std::vector<std::shared_ptr<Job>> jobs;
    for (size_t i = 0; i < params.size(); ++i) {
      GenerationParams p = params[i];
      if (with_logprobs && i == 2) p.top_logprobs = 0;
      jobs.push_back(std::make_shared<Job>(p));
      EXPECT_TRUE(sch.submit(jobs.back()).is_ok());
    }
    sch.start();
    std::vector<std::vector<int32_t>> ids;
    for (auto& j : jobs) {
      Outcome o = collect(*j);
      EXPECT_EQ(o.finish, "length") << o.error.message();
      ids.push_back(o.ids);
    }
    sch.stop();
    unsetenv("ANVIL_CUDA_DEVICE_SAMPLER");
    return ids;
  };
  const auto host = run("0", false);
  for (auto& v : host) ASSERT_EQ(v.size(), 14u);
  EXPECT_EQ(run("1", false), host) << "device sampler";
  EXPECT_EQ(run("1", true), host) << "device sampler with one request asking for logprobs";
}

// A mixed step (Engine::step_sample with row modes): in a batch of seeded requests where some need
// host work on their logits (logprobs, presence/frequency penalties, JSON mode) and the others
// differ in ignore_eos, only the former's logits rows come to the host and are sampled there; the
// others are sampled on the device (forced here on the CPU backend's reference op). Every request
// gets the tokens it gets alone and the tokens of the all-host path, and the logits rows copied
// (Metrics::logit_rows_to_host) are exactly the host requests' tokens.
TEST(Scheduler, MixedStepCopiesOnlyTheHostRowsLogits) {
  std::vector<GenerationParams> params;
  for (int i = 0; i < 7; ++i) {
    GenerationParams p = greedy(random_ids(6 + 5 * i, 900 + i), 12);
    p.sampling.temperature = i == 0 ? 0.0f : 0.6f + 0.1f * float(i);
    p.sampling.top_k = i % 2 ? 40 : 0;
    p.sampling.top_p = i == 5 ? 0.9f : 1.0f;
    p.sampling.repetition_penalty = i >= 5 ? 1.2f : 1.0f;
    p.sampling.seed = uint64_t(60 + i);
    params.push_back(p);
  }
  params[1].top_logprobs = 3;
  params[2].presence_penalty = 0.5f, params[2].frequency_penalty = 0.25f;
  params[3].json_object = true, params[3].ignore_eos = false;  // (the API refuses json_object with ignore_eos)
  params[4].ignore_eos = false;
  params[6].ignore_eos = false;
  auto needs_host = [](const GenerationParams& p) {
    return p.top_logprobs >= 0 || p.presence_penalty != 0 || p.frequency_penalty != 0 || p.json_object;
  };
  struct Run {
    std::vector<Outcome> out;
    uint64_t rows_to_host = 0;
  };
  // The requests together (queued before the first step), or each alone.
  auto run = [&](const char* device_sampler, bool together) {
    setenv("ANVIL_CUDA_DEVICE_SAMPLER", device_sampler, 1);
    Run r;
    Stack s = make_stack(64, 8);
    Metrics m;
    Scheduler sch(*s.engine, *s.tok, m, sched_opts());
    std::vector<std::shared_ptr<Job>> jobs;
    if (together) {
      for (auto& p : params) {
        jobs.push_back(std::make_shared<Job>(p));
        EXPECT_TRUE(sch.submit(jobs.back()).is_ok());
      }
      sch.start();
      for (auto& j : jobs) r.out.push_back(collect(*j));
    } else {
      sch.start();
      for (auto& p : params) {
        jobs.push_back(std::make_shared<Job>(p));
        EXPECT_TRUE(sch.submit(jobs.back()).is_ok());
        r.out.push_back(collect(*jobs.back()));
      }
    }
    sch.stop();
    unsetenv("ANVIL_CUDA_DEVICE_SAMPLER");
    uint64_t all_rows = 0, host_rows = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_TRUE(r.out[i].finish == "length" || r.out[i].finish == "stop") << i << ": " << r.out[i].error.message();
      all_rows += uint64_t(jobs[i]->completion_tokens());  // one logits row per sampled token
      if (needs_host(params[i])) host_rows += uint64_t(jobs[i]->completion_tokens());
    }
    r.rows_to_host = m.logit_rows_to_host.load();
    EXPECT_EQ(r.rows_to_host, std::string(device_sampler) == "1" ? host_rows : all_rows)
        << "device sampler " << device_sampler << (together ? ", together" : ", alone");
    return r;
  };
  const Run host = run("0", true), mixed = run("1", true), alone = run("1", false);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(mixed.out[i].ids, alone.out[i].ids) << "request " << i << ": mixed step vs alone";
    EXPECT_EQ(mixed.out[i].ids, host.out[i].ids) << "request " << i << ": mixed step vs the host path";
    EXPECT_EQ(mixed.out[i].text, host.out[i].text) << "request " << i;
    EXPECT_EQ(mixed.out[i].finish, host.out[i].finish) << "request " << i;
  }
  EXPECT_LT(mixed.rows_to_host, host.rows_to_host) << "the plain rows stayed on the device";
  EXPECT_GT(mixed.rows_to_host, 0u);
}

// With a 16-token step budget, a 300-token prompt is prefilled over ~20 steps while a running
// stream keeps getting one token per step: the short request finishes before the long one's
// first token. (Prefilling the whole prompt in one step would give the long one its first token
// at step 2.)
TEST(Scheduler, ChunkedPrefillDoesNotStallRunningStreams) {
  Stack s = make_stack(64, 4);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts(16));
  auto short_job = std::make_shared<Job>(greedy(random_ids(5, 7), 10));
  auto long_job = std::make_shared<Job>(greedy(random_ids(300, 8), 3));
  ASSERT_TRUE(sch.submit(short_job).is_ok());
  ASSERT_TRUE(sch.submit(long_job).is_ok());
  sch.start();
  Outcome a = collect(*short_job), b = collect(*long_job);
  ASSERT_EQ(a.finish, "length");
  ASSERT_EQ(b.finish, "length");
  EXPECT_GE(b.first_step, 300 / 16);
  EXPECT_LT(a.done_step, b.first_step);
  EXPECT_EQ(a.done_step, 10);  // one token per step, every step
}

// A pool too small for all requests at once: sequences are preempted and recomputed, and every
// request still gets the tokens it gets alone.
TEST(Scheduler, FullPoolPreemptsAndKeepsOutputs) {
  std::vector<GenerationParams> params;
  for (int i = 0; i < 4; ++i) params.push_back(greedy(random_ids(40, 200 + i), 30));
  std::vector<Outcome> alone;
  {
    Stack s = make_stack(64, 4);
    Metrics m;
    Scheduler sch(*s.engine, *s.tok, m, sched_opts());
    sch.start();
    for (auto& p : params) {
      auto job = std::make_shared<Job>(p);
      ASSERT_TRUE(sch.submit(job).is_ok());
      alone.push_back(collect(*job));
    }
  }
  // Each request needs 5 pages of 16 at its end (70 tokens); 12 pages hold two of them.
  Stack s = make_stack(64, 4, /*kv_pages=*/12, /*prefix_cache=*/false);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts());
  const auto jobs = submit_all(sch, params);
  ASSERT_FALSE(HasFailure());
  sch.start();
  for (size_t i = 0; i < jobs.size(); ++i) {
    Outcome o = collect(*jobs[i]);
    EXPECT_EQ(o.finish, "length") << o.error.message();
    EXPECT_EQ(o.ids, alone[i].ids) << "job " << i;
  }
  EXPECT_GT(m.preemptions.load(), 0u);
  ASSERT_TRUE(sch.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(sch.kv_pages_used(), 0);
}

TEST(Scheduler, RequestLargerThanThePoolFailsAlone) {
  Stack s = make_stack(64, 2, /*kv_pages=*/4, /*prefix_cache=*/false);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts());
  sch.start();
  auto big = std::make_shared<Job>(greedy(random_ids(100, 9), 5));  // 7 pages > 4
  auto ok = std::make_shared<Job>(greedy(random_ids(20, 10), 5));
  ASSERT_TRUE(sch.submit(big).is_ok());
  ASSERT_TRUE(sch.submit(ok).is_ok());
  Outcome b = collect(*big), o = collect(*ok);
  EXPECT_EQ(b.error.code(), StatusCode::kOutOfMemory) << b.finish;
  EXPECT_NE(b.error.message().find("KV cache"), std::string::npos) << b.error.message();
  EXPECT_EQ(o.finish, "length");
}

TEST(Scheduler, CancelledJobFreesItsPages) {
  Stack s = make_stack(64, 2, 0, /*prefix_cache=*/false);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts());
  sch.start();
  auto job = std::make_shared<Job>(greedy(random_ids(50, 11), 400));
  ASSERT_TRUE(sch.submit(job).is_ok());
  std::vector<JobEvent> evs;
  while (evs.empty()) job->wait(&evs, std::chrono::milliseconds(100));
  EXPECT_LT(s.engine->pool().n_free(), s.engine->pool().n_pages());
  job->cancel();
  Outcome o = collect(*job);
  EXPECT_EQ(o.finish, "cancelled");
  EXPECT_LT(job->completion_tokens(), 400);
  sch.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  EXPECT_EQ(sch.running(), 0);
  EXPECT_EQ(sch.kv_pages_used(), 0);
  EXPECT_EQ(m.cancelled.load(), 1u);
}

TEST(Scheduler, StopStringEndsTheTextBeforeIt) {
  Stack s = make_stack(64, 2);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts());
  sch.start();
  auto prompt = random_ids(12, 12);
  auto j1 = std::make_shared<Job>(greedy(prompt, 20));
  ASSERT_TRUE(sch.submit(j1).is_ok());
  Outcome full = collect(*j1);
  ASSERT_GT(full.text.size(), 20u);
  // A stop string from the middle of the greedy text: the output is everything before it.
  const std::string stop = full.text.substr(full.text.size() / 2, 3);
  GenerationParams p = greedy(prompt, 20);
  p.stop = {stop};
  auto j2 = std::make_shared<Job>(p);
  ASSERT_TRUE(sch.submit(j2).is_ok());
  Outcome cut = collect(*j2);
  EXPECT_EQ(cut.finish, "stop");
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_LT(cut.ids.size(), full.ids.size());
}

TEST(Scheduler, QueueLimitAndDrainRefuse) {
  Stack s = make_stack(64, 2);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts(0, /*max_queue=*/2));
  // Not started: jobs stay queued. The first two take the two free sequences; two more wait, and
  // only those count as waiting (anvil_requests_waiting: it counted the first two too).
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(sch.submit(std::make_shared<Job>(greedy({1, 2}, 2))).is_ok()) << i;
    EXPECT_EQ(sch.queued(), std::max(0, i + 1 - 2)) << i;
  }
  Status st = sch.submit(std::make_shared<Job>(greedy({1, 2}, 2)));
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("busy"), std::string::npos);
  sch.begin_drain();
  EXPECT_FALSE(sch.submit(std::make_shared<Job>(greedy({1, 2}, 2))).is_ok());
}

// --max-queue bounds the requests that wait for a sequence, not those that find one free: with
// --max-queue 0 every request was refused, an idle server's too ("0 requests are already waiting").
TEST(Scheduler, MaxQueueZeroTakesRequestsWhileASequenceIsFree) {
  Stack s = make_stack(64, 2);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts(0, /*max_queue=*/0));
  EXPECT_TRUE(sch.submit(std::make_shared<Job>(greedy({1, 2}, 2))).is_ok());
  EXPECT_TRUE(sch.submit(std::make_shared<Job>(greedy({1, 2}, 2))).is_ok());
  Status st = sch.submit(std::make_shared<Job>(greedy({1, 2}, 2)));  // no sequence left, no queue place
  EXPECT_EQ(st.code(), StatusCode::kOutOfMemory);
  EXPECT_NE(st.message().find("0 requests are already waiting"), std::string::npos) << st.message();
  // Started, the two finish; their sequences are free again and the next two are taken.
  sch.start();
  for (int round = 0; round < 2; ++round) {
    std::vector<std::shared_ptr<Job>> jobs;
    for (int i = 0; i < 2; ++i) {
      jobs.push_back(std::make_shared<Job>(greedy({1, 2, 3}, 2)));
      // A sequence is free once the earlier round's jobs have ended (bounded wait for the loop).
      Status sub = sch.submit(jobs.back());
      for (int t = 0; t < 200 && !sub.is_ok(); ++t) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        sub = sch.submit(jobs.back());
      }
      ASSERT_TRUE(sub.is_ok()) << "round " << round << " job " << i << ": " << sub.message();
    }
    for (auto& job : jobs)
      for (bool done = false; !done;) {
        std::vector<JobEvent> evs;
        job->wait(&evs, std::chrono::milliseconds(200));
        for (auto& e : evs) done |= e.kind != JobEvent::kDelta;
      }
  }
}

TEST(Scheduler, LogprobsAreTheRawDistribution) {
  Stack s = make_stack(64, 2);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts());
  sch.start();
  auto prompt = random_ids(9, 13);
  GenerationParams p = greedy(prompt, 1);
  p.top_logprobs = 3;
  auto job = std::make_shared<Job>(p);
  ASSERT_TRUE(sch.submit(job).is_ok());
  std::vector<TokenInfo> got;
  for (bool done = false; !done;) {
    std::vector<JobEvent> evs;
    job->wait(&evs, std::chrono::milliseconds(200));
    for (auto& e : evs) {
      for (auto& t : e.tokens) got.push_back(t);
      done |= e.kind != JobEvent::kDelta;
    }
  }
  ASSERT_EQ(got.size(), 1u);
  // Reference: the logits of the prompt from extend(), log-softmax in double.
  Stack r = make_stack(64, 2);
  int seq = *r.engine->seq_create();
  std::vector<float> l;
  ASSERT_TRUE(r.engine->extend(seq, prompt, &l).is_ok());
  double mx = *std::max_element(l.begin(), l.end()), sum = 0;
  for (float x : l) sum += std::exp(double(x) - mx);
  const int best = argmax(l.data(), l.size());
  EXPECT_EQ(got[0].id, best);
  EXPECT_NEAR(got[0].logprob, l[size_t(best)] - mx - std::log(sum), 1e-3);
  ASSERT_EQ(got[0].top.size(), 3u);
  EXPECT_EQ(got[0].top[0].id, best);
  EXPECT_GE(got[0].top[0].logprob, got[0].top[1].logprob);
  EXPECT_GE(got[0].top[1].logprob, got[0].top[2].logprob);
}

// A durable store in `dir` (through `env` when given; a writer's queue of `queue_pages` when > 0)
// attached to s's engine and pool.
// retry_ms when >= 0: KVStoreOptions::retry_ms.
static std::unique_ptr<KVStore> attach_store(Stack& s, const std::string& dir, Env* env = nullptr, int queue_pages = 0,
                                             int retry_ms = -1) {
  KVStoreOptions so;
  so.dir = dir;
  so.flush_ms = 5;
  so.env = env;
  if (queue_pages > 0) so.queue_pages = queue_pages;
  if (retry_ms >= 0) so.retry_ms = retry_ms;
  auto opened = KVStore::open(so);
  EXPECT_TRUE(opened.is_ok()) << opened.status().message();
  if (!opened.is_ok()) return nullptr;
  std::unique_ptr<KVStore> store = std::move(opened).value();
  EXPECT_TRUE(store->attach(*s.backend, s.engine->pool().view(), s.engine->cache_root()).is_ok());
  s.engine->set_page_store(store.get());
  return store;
}
// Its counterpart: everything queued committed, the store's pool pages back, the engine detached.
static void detach_store(Stack& s, KVStore& store) {
  store.flush();
  store.reap(s.engine->pool(), true);
  s.engine->set_page_store(nullptr);
}

// Sessions recorded while a full pool preempts them: a preempted job's recording is detached and
// bound to its new sequence on readmission, so each session ends up with exactly its prompt and
// every token it sampled, durable up to the last one (whose KV was never computed).
TEST(Scheduler, SessionsRecordAcrossPreemption) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_sched_sess_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  Stack s = make_stack(64, 4, /*kv_pages=*/12, /*prefix_cache=*/false);  // as FullPoolPreemptsAndKeepsOutputs
  std::unique_ptr<KVStore> store = attach_store(s, dir);
  ASSERT_TRUE(store);
  Metrics m;
  auto opts = sched_opts();
  opts.store = store.get();
  std::vector<std::shared_ptr<Job>> jobs;
  std::vector<Outcome> out;
  {
    Scheduler sch(*s.engine, *s.tok, m, opts);
    for (int i = 0; i < 4; ++i) {
      auto p = greedy(random_ids(40, 200 + i), 30);
      p.session = "s" + std::to_string(i);
      jobs.push_back(std::make_shared<Job>(p));
      ASSERT_TRUE(sch.submit(jobs.back()).is_ok());
    }
    sch.start();
    for (auto& j : jobs) {
      out.push_back(collect(*j));
      EXPECT_TRUE(j->session_recorded());
      auto d = store->session_finish(j->params.session, "m");  // what the HTTP side does at the end
      ASSERT_TRUE(d.is_ok()) << d.status().message();
    }
    EXPECT_GT(m.preemptions.load(), 0u) << "the pool was meant to be too small for all four";
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(out[i].finish, "length") << out[i].error.message();
    auto info = store->get_session(jobs[i]->params.session);
    ASSERT_TRUE(info.is_ok() && *info);
    std::vector<int32_t> want = jobs[i]->params.prompt;
    want.insert(want.end(), out[i].ids.begin(), out[i].ids.end());
    EXPECT_EQ((*info)->tokens, want) << "session " << i;
    EXPECT_EQ((*info)->durable_pos, int(want.size()) - 1) << "session " << i;
    EXPECT_EQ((*info)->meta, "m");
  }
  detach_store(s, *store);
  store.reset();
  fs::remove_all(dir);
}

// A request that arrives while the store's writer still holds the last request's pages (a slow
// disk: here appends held) is served at once: going idle, the scheduler takes back what the writer
// has copied in short waits, not by waiting for the disk (on the H200 that wait was ~200 ms after a
// 4,096-token prompt, and the next request's time to first token with it). The pages still come
// back when the disk does.
TEST(Scheduler, IdleReapDoesNotHoldTheNextRequest) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_sched_reap_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  Stack s = make_stack(64, 4);
  FaultEnv env;
  std::unique_ptr<KVStore> store = attach_store(s, dir, &env);
  ASSERT_TRUE(store);
  Metrics m;
  auto opts = sched_opts();
  opts.store = store.get();
  {
    Scheduler sch(*s.engine, *s.tok, m, opts);
    sch.start();
    env.hold_appends(true);  // the writer copies a page, then waits in its append: the rest stay held
    auto first = std::make_shared<Job>(greedy(random_ids(100, 301), 4));  // 6 full pages
    ASSERT_TRUE(sch.submit(first).is_ok());
    Outcome o1 = collect(*first);
    EXPECT_EQ(o1.finish, "length") << o1.error.message();
    auto second = std::make_shared<Job>(greedy(random_ids(20, 302), 4));
    ASSERT_TRUE(sch.submit(second).is_ok());
    // Bounded: with the old wait for the writer this never finished while the appends were held.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    bool done = false;
    std::vector<JobEvent> evs;
    while (!done && std::chrono::steady_clock::now() < deadline) {
      evs.clear();
      second->wait(&evs, std::chrono::milliseconds(50));
      for (auto& e : evs) done |= e.kind != JobEvent::kDelta;
    }
    EXPECT_TRUE(done) << "the second request waited for the store's writer";
    // The case was real: the writer had pages queued behind the held append, none written.
    EXPECT_GE(store->counters().pages_enqueued.load(), 6);
    EXPECT_EQ(store->counters().pages_written.load(), 0);
    env.hold_appends(false);
    // Idle again: the pages come back as the writer finishes.
    EXPECT_TRUE(sch.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(20)));
    EXPECT_EQ(sch.kv_pages_used(), sch.kv_prefix_pages()) << "pages still out of the pool on an idle server";
  }
  detach_store(s, *store);
  store.reset();
  fs::remove_all(dir);
}

namespace {
// The largest |x - y| over two logit vectors of one size (1e30 when they differ in size or are empty).
float max_abs_diff(const std::vector<float>& x, const std::vector<float>& y) {
  if (x.size() != y.size() || x.empty()) return 1e30f;
  float d = 0.0f;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
  return d;
}
struct Restored {
  int from_store = -1;    // tokens of the prompt a fresh engine took from the store
  float max_diff = 1e30f; // its last logits against an engine without a store
};
// A restart: a new stack with the store in `dir` reopened extends `prompt`; its logits are compared
// with a stack that computes everything (so a page restored with the wrong KV would show).
Restored restored_after_restart(const std::string& dir, const std::vector<int32_t>& prompt) {
  Restored r;
  std::vector<float> want, got;
  {
    Stack s = make_stack(64, 4);
    auto seq = s.engine->seq_create();
    EXPECT_TRUE(seq.is_ok() && s.engine->extend(*seq, prompt, &want, nullptr).is_ok());
  }
  Stack s = make_stack(64, 4);
  std::unique_ptr<KVStore> store = attach_store(s, dir);
  if (!store) return r;
  auto seq = s.engine->seq_create();
  EXPECT_TRUE(seq.is_ok());
  EXPECT_TRUE(s.engine->extend(*seq, prompt, &got, nullptr).is_ok());
  r.from_store = s.engine->seq_store_tokens(*seq);
  r.max_diff = max_abs_diff(got, want);
  s.engine->seq_release(*seq);
  detach_store(s, *store);
  return r;
}
// The logits of a prompt computed with part of its KV restored against all of it computed: the
// same KV values, so the same logits up to the order of the sums of other chunk shapes (measured:
// 0 on this CPU backend; a page of another prompt's KV moves them by far more than this).
constexpr float kRestoredLogitTol = 1e-3f;
}  // namespace

// A burst of full pages larger than the store's queue (a long prompt while the disk is slow: here
// the appends are held and the queue holds 4) drops pages, and a restore stops at the first missing
// page of a chain. The engine offers each dropped page again while its prefix cache holds it:
// persist_dropped (what `anvil generate/run` do before detaching the store, and `anvil serve` at
// shutdown) hands every one over, so after a restart the whole prompt comes from the store.
TEST(EngineStore, DroppedPagesAreOfferedAgainBeforeDetach) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_drop_detach_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto prompt = random_ids(200, 401);  // 12 full pages of 16 (the 200th token is computed)
  {
    Stack s = make_stack(64, 4);
    FaultEnv env;
    std::unique_ptr<KVStore> store = attach_store(s, dir, &env, /*queue_pages=*/4);
    ASSERT_TRUE(store);
    env.hold_appends(true);  // the writer takes one page and waits in its append
    auto seq = s.engine->seq_create();
    ASSERT_TRUE(seq.is_ok());
    std::vector<float> logits;
    ASSERT_TRUE(s.engine->extend(*seq, prompt, &logits, nullptr).is_ok());
    const int64_t dropped = store->counters().pages_dropped.load();
    EXPECT_GT(dropped, 0) << "12 pages against 1 in the writer and 4 in the queue";
    EXPECT_EQ(s.engine->offer_dropped(), size_t(dropped)) << "a full queue takes no page back";
    env.hold_appends(false);
    s.engine->persist_dropped();
    EXPECT_EQ(s.engine->offer_dropped(), 0u);
    EXPECT_EQ(store->counters().pages_reoffered.load(), dropped);
    store->flush();
    EXPECT_EQ(store->counters().pages_written.load(), 12);
    s.engine->seq_release(*seq);
    detach_store(s, *store);
  }
  const Restored r = restored_after_restart(dir, prompt);
  EXPECT_EQ(r.from_store, 192) << "every full page of the prompt restored";
  EXPECT_LE(r.max_diff, kRestoredLogitTol);
  fs::remove_all(dir);
}

// A dropped page evicted from the prefix cache before it could be offered again is forgotten: its
// pool page now holds another prompt's KV, which must never be written under the old key. Here
// the first prompt's dropped pages are evicted for the second prompt while the queue is still full.
TEST(EngineStore, DroppedPageEvictedMeanwhileIsForgotten) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_drop_evict_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto first = random_ids(200, 402);  // 12 full pages and a partial one
  std::vector<int32_t> second;
  int full_b = 0;
  {
    Stack s = make_stack(64, 4, /*kv_pages=*/20);
    FaultEnv env;
    std::unique_ptr<KVStore> store = attach_store(s, dir, &env, /*queue_pages=*/4);
    ASSERT_TRUE(store);
    env.hold_appends(true);  // held through both prompts: no dropped page can be offered meanwhile
    std::vector<float> logits;
    auto a = s.engine->seq_create();
    ASSERT_TRUE(a.is_ok());
    // One full page first, and the writer stuck on it, so that exactly 4 of the other 11 fill the
    // queue and 7 are dropped whatever the threads' timing (a writer that took its page late left
    // room in the queue for the second prompt, and the pool then waited on the held writer).
    const std::vector<int32_t> head(first.begin(), first.begin() + 17), rest(first.begin() + 17, first.end());
    ASSERT_TRUE(s.engine->extend(*a, head, &logits, nullptr).is_ok());
    for (int i = 0; i < 5000 && env.appends_waiting() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(env.appends_waiting(), 1) << "the writer never took the first page";
    ASSERT_TRUE(s.engine->extend(*a, rest, &logits, nullptr).is_ok());
    s.engine->seq_release(*a);
    const int64_t dropped_a = store->counters().pages_dropped.load();
    ASSERT_GT(dropped_a, 0);
    // The second prompt takes every free page and then every page that only the index holds: the
    // first prompt's dropped ones (the rest are held by the store's queue). Exactly that many, so
    // the pool never waits for the held writer.
    const int pages_b = int(s.engine->pool().n_free() + dropped_a);
    full_b = pages_b - 1;
    second = random_ids(16 * pages_b - 8, 403);
    auto b = s.engine->seq_create();
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE(s.engine->extend(*b, second, &logits, nullptr).is_ok());
    EXPECT_EQ(store->counters().pages_dropped.load() - dropped_a, full_b) << "the queue stayed full";
    env.hold_appends(false);
    s.engine->persist_dropped();
    store->flush();
    EXPECT_EQ(store->counters().pages_reoffered.load(), full_b) << "only the second prompt's pages were still cached";
    EXPECT_EQ(store->counters().pages_written.load(), 12 - dropped_a + full_b);
    s.engine->seq_release(*b);
    detach_store(s, *store);
  }
  const Restored ra = restored_after_restart(dir, first), rb = restored_after_restart(dir, second);
  EXPECT_LT(ra.from_store, 192) << "the first prompt's evicted pages were not written";
  EXPECT_LE(ra.max_diff, kRestoredLogitTol);
  EXPECT_EQ(rb.from_store, 16 * full_b);
  EXPECT_LE(rb.max_diff, kRestoredLogitTol);
  fs::remove_all(dir);
}

// A restarted engine loads the store's most recently used prefixes into its prefix index before
// any request (what `anvil serve --kv-warm` does before listening): a prompt that repeats one then
// takes its KV from memory, with the logits of a full recompute. The most recent prefix comes
// first, a prefix shared by two is loaded once, and a budget cuts the last one taken short (the
// rest then comes from the store on demand, as without warming).
namespace {
// Makes every catalog commit of the store in `dir` fail (a full disk fails SQLite's COMMIT; here a
// trigger fails the commit's last statement, through a connection of the test's), or lets them be.
void fail_commits(const std::string& dir, bool on) {
  SqliteDb db;
  ASSERT_TRUE(db.open(dir + "/catalog.db", 10000).is_ok());
  ASSERT_TRUE(db.exec(on ? "CREATE TRIGGER fail_commit BEFORE UPDATE OF committed_end ON segments "
                           "BEGIN SELECT RAISE(ABORT, 'injected: the disk is full'); END"
                         : "DROP TRIGGER fail_commit")
                  .is_ok());
}
// Problems `anvil kv verify` would report on the store in `dir`.
std::vector<std::string> verify_store(const std::string& dir) {
  KVStoreOptions o;
  o.dir = dir;
  o.repair = false;
  auto st = KVStore::open(o);
  if (!st.is_ok()) return {st.status().message()};
  std::vector<std::string> problems;
  int64_t records = 0;
  Status v = (*st)->verify(&problems, &records);
  if (!v.is_ok() && problems.empty()) problems.push_back(v.message());
  return problems;
}
}  // namespace

// The pages of a batch whose catalog commit failed (a full disk) were lost for good: the writer
// dropped them, and the engine, whose prefix cache still held them, never offered them again, so
// the store never had the prompt (every restart recomputed it) although the disk had room again.
// Now the store hands them back (PageStore::take_failed) once a commit stores a page again, and
// the engine offers them as it offers dropped ones: a restart finds the whole prompt, with the KV a
// fresh computation gives. While the store has not recovered (and the retry interval, an hour
// here, has not passed), nothing is offered: no retry at every step. The store verifies clean.
TEST(EngineStore, PagesOfAFailedCommitAreOfferedAgainOnceTheStoreRecovers) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_failed_commit_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto first = random_ids(200, 404), second = random_ids(100, 405);  // 12 and 6 full pages
  {
    Stack s = make_stack(64, 4);
    std::unique_ptr<KVStore> store = attach_store(s, dir, nullptr, 0, /*retry_ms=*/3'600'000);
    ASSERT_TRUE(store);
    fail_commits(dir, true);
    std::vector<float> logits;
    auto a = s.engine->seq_create();
    ASSERT_TRUE(a.is_ok());
    ::testing::internal::CaptureStderr();
    ASSERT_TRUE(s.engine->extend(*a, first, &logits, nullptr).is_ok());
    store->flush();
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(err.find("catalog commit failed"), std::string::npos) << err;
    EXPECT_GE(store->counters().write_errors.load(), 1);
    EXPECT_EQ(store->counters().pages_failed.load(), 12);
    s.engine->seq_release(*a);
    EXPECT_EQ(s.engine->offer_dropped(), 0u);
    EXPECT_EQ(store->counters().pages_reoffered.load(), 0) << "offered again before the store recovered";
    fail_commits(dir, false);
    // A later request: its pages commit, so the store can write again.
    auto b = s.engine->seq_create();
    ASSERT_TRUE(b.is_ok());
    ASSERT_TRUE(s.engine->extend(*b, second, &logits, nullptr).is_ok());
    store->flush();
    s.engine->seq_release(*b);
    EXPECT_EQ(s.engine->offer_dropped(), 0u);  // (the server does this while idle; a step does it too)
    EXPECT_EQ(store->counters().pages_reoffered.load(), 12) << "the failed commit's pages were not offered again";
    store->flush();
    EXPECT_EQ(store->counters().pages_failed.load(), 12);
    detach_store(s, *store);
  }
  const Restored r = restored_after_restart(dir, first);
  EXPECT_EQ(r.from_store, 192) << "the pages of the failed commit never reached the store";
  EXPECT_LE(r.max_diff, kRestoredLogitTol);
  EXPECT_EQ(verify_store(dir), std::vector<std::string>{});
  fs::remove_all(dir);
}

// The same for pages whose append failed (no space left on the device): before the store is
// detached (what anvil generate/run do on exit, and anvil serve at shutdown) every page that failed
// is offered once more, whether or not the store wrote anything since, so a disk that has room
// again by then gets the prompt; a restart finds all of it.
TEST(EngineStore, PagesOfAFailedWriteAreOfferedAgainBeforeDetach) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_failed_write_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto prompt = random_ids(200, 406);
  {
    Stack s = make_stack(64, 4);
    FaultEnv env;
    std::unique_ptr<KVStore> store = attach_store(s, dir, &env, 0, /*retry_ms=*/3'600'000);
    ASSERT_TRUE(store);
    env.set_space_left(0);
    auto seq = s.engine->seq_create();
    ASSERT_TRUE(seq.is_ok());
    std::vector<float> logits;
    ::testing::internal::CaptureStderr();
    ASSERT_TRUE(s.engine->extend(*seq, prompt, &logits, nullptr).is_ok());
    store->flush();
    (void)::testing::internal::GetCapturedStderr();
    EXPECT_EQ(store->counters().pages_failed.load(), 12);
    EXPECT_EQ(s.engine->offer_dropped(), 0u);
    EXPECT_EQ(store->counters().pages_reoffered.load(), 0);
    env.set_space_left(-1);
    s.engine->persist_dropped();
    EXPECT_EQ(store->counters().pages_reoffered.load(), 12);
    s.engine->seq_release(*seq);
    detach_store(s, *store);
  }
  const Restored r = restored_after_restart(dir, prompt);
  EXPECT_EQ(r.from_store, 192) << "the pages whose write failed never reached the store";
  EXPECT_LE(r.max_diff, kRestoredLogitTol);
  EXPECT_EQ(verify_store(dir), std::vector<std::string>{});
  fs::remove_all(dir);
}

TEST(EngineStore, WarmFromStoreLoadsTheRecentPrefixesIntoTheIndex) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_warm_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto a = random_ids(200, 501);  // 12 full pages of 16
  auto b = a;
  const auto tail = random_ids(104, 502);
  std::copy(tail.begin(), tail.end(), b.begin() + 96);  // b shares a's first 6 pages
  std::vector<float> want_a, want_b;
  {
    Stack s = make_stack(64, 4);
    auto sa = s.engine->seq_create(), sb = s.engine->seq_create();
    ASSERT_TRUE(s.engine->extend(*sa, a, &want_a, nullptr).is_ok());
    ASSERT_TRUE(s.engine->extend(*sb, b, &want_b, nullptr).is_ok());
  }
  {
    Stack s = make_stack(64, 4);
    std::unique_ptr<KVStore> store = attach_store(s, dir);
    ASSERT_TRUE(store);
    std::vector<float> logits;
    auto sa = s.engine->seq_create();
    ASSERT_TRUE(s.engine->extend(*sa, a, &logits, nullptr).is_ok());
    s.engine->seq_release(*sa);
    store->flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // b's pages are the more recent
    auto sb = s.engine->seq_create();
    ASSERT_TRUE(s.engine->extend(*sb, b, &logits, nullptr).is_ok());
    s.engine->seq_release(*sb);
    detach_store(s, *store);
    EXPECT_EQ(store->counters().pages_written.load(), 18);
  }
  {  // First a budget of 8 pages: b's first 8 (the more recent prefix), so a finds its 6 shared
     // pages in memory and the other 6 in the store. (Restores count as uses: the store's LRU order
     // changes with every run, so this one comes first.)
    Stack s = make_stack(64, 4);
    std::unique_ptr<KVStore> store = attach_store(s, dir);
    ASSERT_TRUE(store);
    const Engine::Warmed w = s.engine->warm_from_store(8);
    EXPECT_EQ(w.pages, 8u);
    std::vector<float> got;
    auto seq = s.engine->seq_create();
    ASSERT_TRUE(s.engine->extend(*seq, a, &got, nullptr).is_ok());
    EXPECT_EQ(s.engine->seq_cached_tokens(*seq), 192);
    // Every cached token came from the store: 6 pages loaded ahead (first used here), 6 on demand.
    EXPECT_EQ(s.engine->seq_store_tokens(*seq), 192);
    EXPECT_EQ(store->counters().restored_pages.load(), 8 + 6);
    EXPECT_LE(max_abs_diff(got, want_a), kRestoredLogitTol);
    s.engine->seq_release(*seq);
    detach_store(s, *store);
  }
  {  // Everything fits: both prefixes in memory, none of their tokens from the store.
    Stack s = make_stack(64, 4);
    std::unique_ptr<KVStore> store = attach_store(s, dir);
    ASSERT_TRUE(store);
    const Engine::Warmed w = s.engine->warm_from_store(1000);
    EXPECT_EQ(w.prefixes, 2u);
    EXPECT_EQ(w.pages, 18u);
    EXPECT_EQ(s.engine->pool().prefix_entries(), 18u);
    EXPECT_EQ(s.engine->pool().n_free(), s.engine->pool().n_pages() - 18) << "only the index holds them";
    // b, then a (which shares b's first 6 pages), then b again: no page restored on demand; a
    // loaded page counts as from the store for its first user only, as an on-demand restore would.
    const std::vector<int32_t>* prompts[] = {&b, &a, &b};
    const int from_store[] = {192, 96, 0};
    for (int k = 0; k < 3; ++k) {
      const std::vector<int32_t>* p = prompts[k];
      std::vector<float> got;
      auto seq = s.engine->seq_create();
      ASSERT_TRUE(s.engine->extend(*seq, *p, &got, nullptr).is_ok());
      EXPECT_EQ(s.engine->seq_cached_tokens(*seq), 192);
      EXPECT_EQ(s.engine->seq_store_tokens(*seq), from_store[k]) << "prompt " << k;
      EXPECT_LE(max_abs_diff(got, p == &a ? want_a : want_b), kRestoredLogitTol);
      s.engine->seq_release(*seq);
    }
    EXPECT_EQ(store->counters().restored_pages.load(), 18) << "all of them loaded ahead, none on demand";
    detach_store(s, *store);
  }
  {  // Nothing to warm without the prefix cache (nowhere to keep the pages).
    Stack s = make_stack(64, 4, 0, /*prefix_cache=*/false);
    std::unique_ptr<KVStore> store = attach_store(s, dir);
    ASSERT_TRUE(store);
    EXPECT_EQ(s.engine->warm_from_store(1000).pages, 0u);
    EXPECT_EQ(s.engine->pool().n_free(), s.engine->pool().n_pages());
    detach_store(s, *store);
  }
  fs::remove_all(dir);
}

// The server: pages its store dropped under load are offered again once it is idle and the queue
// drains, so a restart restores the whole prompt although the disk was stalled while it ran.
TEST(Scheduler, IdleServerWritesThePagesItsStoreDropped) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_sched_drop_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto prompt = random_ids(200, 404);
  {
    Stack s = make_stack(64, 4);
    FaultEnv env;
    std::unique_ptr<KVStore> store = attach_store(s, dir, &env, /*queue_pages=*/4);
    ASSERT_TRUE(store);
    Metrics m;
    auto opts = sched_opts();
    opts.store = store.get();
    {
      Scheduler sch(*s.engine, *s.tok, m, opts);
      sch.start();
      env.hold_appends(true);
      auto job = std::make_shared<Job>(greedy(prompt, 4));
      ASSERT_TRUE(sch.submit(job).is_ok());
      Outcome o = collect(*job);
      EXPECT_EQ(o.finish, "length") << o.error.message();
      EXPECT_GT(store->counters().pages_dropped.load(), 0);
      env.hold_appends(false);  // the disk comes back while the server is idle
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (store->counters().pages_written.load() < 12 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(store->counters().pages_written.load(), 12) << "the idle server caught up";
      EXPECT_GT(store->counters().pages_reoffered.load(), 0);
      EXPECT_TRUE(sch.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(20)));
    }
    detach_store(s, *store);
  }
  const Restored r = restored_after_restart(dir, prompt);
  EXPECT_EQ(r.from_store, 192);
  EXPECT_LE(r.max_diff, kRestoredLogitTol);
  fs::remove_all(dir);
}

// Pages whose write failed (no space left on the device) are retried by an idle server: it wakes
// when the store's retry is due (retry_ms after the failure, doubled while writes keep failing)
// and offers them again, without a request. It offered them only when a step ran (or at
// shutdown), so on a server without traffic they stayed unwritten after the disk had room again,
// and a kill -9 lost them. While the disk stays full the retries back off (no busy loop), and
// once it has room the pages become durable: a restart restores the whole prompt.
TEST(Scheduler, IdleServerRetriesThePagesWhoseWriteFailed) {
  namespace fs = std::filesystem;
  const std::string dir = (fs::temp_directory_path() / ("anvil_sched_retry_" + std::to_string(::getpid()))).string();
  fs::remove_all(dir);
  const auto prompt = random_ids(200, 407);  // 12 full pages
  {
    Stack s = make_stack(64, 4);
    FaultEnv env;
    std::unique_ptr<KVStore> store = attach_store(s, dir, &env, 0, /*retry_ms=*/50);
    ASSERT_TRUE(store);
    Metrics m;
    auto opts = sched_opts();
    opts.store = store.get();
    {
      Scheduler sch(*s.engine, *s.tok, m, opts);
      sch.start();
      env.set_space_left(0);  // a full disk
      ::testing::internal::CaptureStderr();
      auto job = std::make_shared<Job>(greedy(prompt, 4));
      ASSERT_TRUE(sch.submit(job).is_ok());
      Outcome o = collect(*job);
      EXPECT_EQ(o.finish, "length") << o.error.message();
      ASSERT_TRUE(sch.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(20)));
      const uint64_t steps = m.steps.load();
      // Idle, the disk still full: retried, but backing off (50, 100, 200, 400 ms ...: a handful of
      // rounds of 12 pages in a second, not one per loop).
      const auto full_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
      while (std::chrono::steady_clock::now() < full_until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const int64_t offered_while_full = store->counters().pages_reoffered.load();
      EXPECT_GE(offered_while_full, 12) << "the idle server never retried the failed pages";
      EXPECT_LE(offered_while_full, 12 * 8) << "retried without backing off";
      EXPECT_EQ(store->counters().pages_written.load(), 0);
      env.set_space_left(-1);  // room again; no request comes
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (store->counters().pages_written.load() < 12 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      (void)::testing::internal::GetCapturedStderr();
      EXPECT_EQ(store->counters().pages_written.load(), 12) << "the idle server did not write the failed pages";
      EXPECT_EQ(m.steps.load(), steps) << "a step ran: the retry was not the idle server's";
      // Durable without a detach (what a kill -9 would leave): the store's own commits.
      store->flush();
    }
    detach_store(s, *store);
  }
  const Restored r = restored_after_restart(dir, prompt);
  EXPECT_EQ(r.from_store, 192) << "the failed pages never reached the store";
  EXPECT_LE(r.max_diff, kRestoredLogitTol);
  fs::remove_all(dir);
}

// Completions' echo with logprobs: the prompt's event comes first, once, with every prompt token's
// log-probability (the first with none), equal to the log-softmax of extend()'s logits for that
// prompt (the engine's contract: a token's logits do not depend on its batch); the prompt is
// computed in 8-token steps, the first job's prompt again by a later job (no prefix from the cache:
// its rows are needed), and in a pool too small for all four, so that jobs are preempted before and
// after their prompt's event; the generated tokens are those of the same request alone.
TEST(Scheduler, EchoScoresEveryPromptTokenAcrossChunksAndPreemption) {
  std::vector<GenerationParams> params;
  for (int i = 0; i < 4; ++i) {
    params.push_back(greedy(random_ids(40, i == 3 ? 300 : 300 + i), 30));  // job 3: job 0's prompt again
    params.back().echo = true;
    params.back().top_logprobs = 2;
  }
  // The reference: every prompt row's logits from extend(), log-softmax in double.
  Stack r = make_stack(64, 4);
  const size_t V = size_t(r.model->config.vocab_size);
  std::vector<std::vector<double>> want(params.size());
  std::vector<std::vector<int32_t>> alone_ids(params.size());
  for (size_t j = 0; j < params.size(); ++j) {
    int seq = *r.engine->seq_create();
    std::vector<float> last, all;
    ASSERT_TRUE(r.engine->extend(seq, params[j].prompt, &last, &all).is_ok());
    for (size_t i = 1; i < params[j].prompt.size(); ++i) {
      const float* row = all.data() + (i - 1) * V;
      double mx = *std::max_element(row, row + V), sum = 0;
      for (size_t k = 0; k < V; ++k) sum += std::exp(double(row[k]) - mx);
      want[j].push_back(double(row[params[j].prompt[i]]) - mx - std::log(sum));
    }
    r.engine->seq_release(seq);
  }
  {
    Stack s = make_stack(64, 4);
    Metrics m;
    Scheduler sch(*s.engine, *s.tok, m, sched_opts());
    sch.start();
    for (size_t j = 0; j < params.size(); ++j) {
      GenerationParams p = params[j];
      p.echo = false;
      auto job = std::make_shared<Job>(p);
      ASSERT_TRUE(sch.submit(job).is_ok());
      alone_ids[j] = collect(*job).ids;
    }
  }
  // Each request needs 5 pages of 16 at its end (70 tokens); 12 pages hold two of them.
  Stack s = make_stack(64, 4, /*kv_pages=*/12, /*prefix_cache=*/true);
  Metrics m;
  Scheduler sch(*s.engine, *s.tok, m, sched_opts(/*step_tokens=*/8));
  const auto jobs = submit_all(sch, params);
  ASSERT_FALSE(HasFailure());
  sch.start();
  for (size_t j = 0; j < jobs.size(); ++j) {
    std::vector<TokenInfo> prompt, gen;
    int prompt_events = 0;
    bool ended = false, prompt_first = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!ended && std::chrono::steady_clock::now() < deadline) {
      std::vector<JobEvent> evs;
      jobs[j]->wait(&evs, std::chrono::milliseconds(200));
      for (auto& e : evs) {
        if (e.has_prompt) {
          ++prompt_events;
          prompt_first &= gen.empty();
          prompt = e.prompt;
        }
        for (auto& t : e.tokens) gen.push_back(t);
        if (e.kind != JobEvent::kDelta) {
          ended = true;
          EXPECT_EQ(e.kind, JobEvent::kDone) << e.error.message();
        }
      }
    }
    ASSERT_TRUE(ended) << "job " << j;
    EXPECT_EQ(prompt_events, 1) << "job " << j;
    EXPECT_TRUE(prompt_first) << "job " << j;
    ASSERT_EQ(prompt.size(), params[j].prompt.size()) << "job " << j;
    EXPECT_TRUE(std::isnan(prompt[0].logprob));
    EXPECT_EQ(prompt[0].id, params[j].prompt[0]);
    for (size_t i = 1; i < prompt.size(); ++i) {
      EXPECT_EQ(prompt[i].id, params[j].prompt[i]);
      EXPECT_NEAR(prompt[i].logprob, want[j][i - 1], 1e-6) << "job " << j << " token " << i;
      ASSERT_EQ(prompt[i].top.size(), 2u);
      EXPECT_GE(prompt[i].top[0].logprob, prompt[i].top[1].logprob);
      EXPECT_GE(prompt[i].top[0].logprob, prompt[i].logprob - 1e-6);
    }
    std::vector<int32_t> ids;
    for (auto& t : gen) ids.push_back(t.id);
    EXPECT_EQ(ids, alone_ids[j]) << "job " << j;
  }
  EXPECT_GT(m.preemptions.load(), 0u) << "the pool was meant to be too small for all four";
  EXPECT_EQ(jobs[3]->cached_tokens(), 0) << "an echo's prompt takes nothing from the prefix cache";
  ASSERT_TRUE(sch.wait_idle(std::chrono::steady_clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(sch.kv_pages_used(), sch.kv_prefix_pages()) << "every page not in the prefix cache is free";
}
