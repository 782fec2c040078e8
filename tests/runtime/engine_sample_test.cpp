// Engine::decode_sample (the sampler on the backend, with the penalty history kept as device counts)
// against the host path it replaces: decode() logits + one host Sampler per sequence, with the
// sequence's tokens as history. Runs on the CPU backend, whose sample_rows is the reference of the
// CUDA kernel, so the engine's side (count updates across steps and windows, sequence slots
// reused, the random stream, batching rows with different parameters) is checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine_test_util.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace anvil::testing {
namespace {

std::vector<SamplingParams> configs() {
  std::vector<SamplingParams> out(4);
  out[0].temperature = 0.8f, out[0].top_k = 40, out[0].top_p = 0.9f, out[0].repetition_penalty = 1.3f,
  out[0].repetition_window = 6, out[0].seed = 1;
  out[1].temperature = 1.2f, out[1].min_p = 0.05f, out[1].seed = 2;
  out[2].temperature = 0.0f, out[2].repetition_penalty = 1.5f, out[2].repetition_window = 3;  // greedy + penalty
  out[3].temperature = 1.0f, out[3].top_p = 0.95f, out[3].repetition_penalty = 0.4f, out[3].repetition_window = 4,
  out[3].seed = 3;
  return out;
}

// Decodes `steps` tokens for each of the sequences (batched together) on both paths and returns the
// device path's tokens; the host path's must be equal.
void run_both(Engine& host_e, Engine& dev_e, const std::vector<std::vector<int32_t>>& prompts,
              const std::vector<SamplingParams>& ps, int steps, const std::vector<int32_t>& suppress) {
  const size_t n = prompts.size();
  std::vector<int> hs, ds;
  std::vector<Sampler> host_s, dev_s;  // dev_s only supplies the random stream
  std::vector<int32_t> ht, dt;
  for (size_t i = 0; i < n; ++i) {
    auto a = host_e.seq_create(), b = dev_e.seq_create();
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    hs.push_back(*a), ds.push_back(*b);
    host_s.emplace_back(ps[i]), dev_s.emplace_back(ps[i]);
    host_s.back().set_suppressed(suppress), dev_s.back().set_suppressed(suppress);
    std::vector<float> hl, dl;
    ASSERT_TRUE(host_e.extend(*a, prompts[i], &hl).is_ok());
    ASSERT_TRUE(dev_e.extend(*b, prompts[i], &dl).is_ok());
    ht.push_back(host_s.back().sample(hl.data(), int(hl.size()), host_e.seq_tokens(*a)));
    dt.push_back(dev_s.back().sample(dl.data(), int(dl.size()), dev_e.seq_tokens(*b)));
    ASSERT_EQ(ht.back(), dt.back());
  }
  const int V = host_e.model().config().vocab_size;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> logits;
    ASSERT_TRUE(host_e.decode(hs, ht, &logits).is_ok());
    std::vector<uint64_t> u(n);
    for (size_t i = 0; i < n; ++i) u[i] = ps[i].temperature > 0 ? dev_s[i].next_random53() : 0;
    std::vector<int32_t> next;
    Status st = dev_e.decode_sample(ds, dt, ps, u, suppress, &next);
    ASSERT_TRUE(st.is_ok()) << st.message();
    for (size_t i = 0; i < n; ++i) {
      ht[i] = host_s[i].sample(logits.data() + i * size_t(V), V, host_e.seq_tokens(hs[i]));
      ASSERT_EQ(next[i], ht[i]) << "sequence " << i << " step " << step;
    }
    dt = next;
  }
  for (size_t i = 0; i < n; ++i) host_e.seq_release(hs[i]), dev_e.seq_release(ds[i]);
}

TEST(EngineSample, DecodeSampleEqualsHostSampler) {
  FixtureOptions o;
  auto h = make_engine(o), d = make_engine(o);
  ASSERT_TRUE(h.engine && d.engine);
  const int V = h.vocab();
  const auto ps = configs();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < ps.size(); ++i) prompts.push_back(random_ids(5 + int(i) * 7, 40 + i, V));
  run_both(*h.engine, *d.engine, prompts, ps, 20, {});
  // Again in the same slots with other prompts: the counts rows of the released sequences must start
  // over, and a suppressed token is honoured.
  std::vector<std::vector<int32_t>> prompts2;
  for (size_t i = 0; i < ps.size(); ++i) prompts2.push_back(random_ids(9, 90 + i, V));
  run_both(*h.engine, *d.engine, prompts2, {ps[3], ps[2], ps[1], ps[0]}, 12, {7, 11});
}

// Engine::step_sample (continuous batching, the server's path) against step() + host Samplers: steps
// that mix a prompt chunk that wants no token, prompts finishing, and decode tokens; sequences
// joining late and leaving early, so the count rows and their windows change between steps.
void step_sample_equals_host(const std::vector<SamplingParams>& ps) {
  FixtureOptions o;
  auto h = make_engine(o), d = make_engine(o);
  ASSERT_TRUE(h.engine && d.engine);
  const int V = h.vocab();
  const std::vector<int32_t> suppress = {5};
  struct Side {
    Engine* e;
    std::vector<int> seq;
    std::vector<Sampler> s;
  } host{h.engine.get(), {}, {}}, dev{d.engine.get(), {}, {}};
  for (Side* side : {&host, &dev})
    for (size_t i = 0; i < ps.size(); ++i) {
      auto q = side->e->seq_create();
      ASSERT_TRUE(q.is_ok());
      side->seq.push_back(*q);
      side->s.emplace_back(ps[i]);
      side->s.back().set_suppressed(suppress);
    }
  // Sequence i joins at step i (its prompt of 4 + 3i tokens; sequence 3's in two chunks), and
  // sequence 1 leaves after step 9.
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < ps.size(); ++i) prompts.push_back(random_ids(4 + 3 * int(i), 300 + i, V));
  int compared = 0;
  for (int step = 0; step < 24; ++step) {
    std::vector<Engine::StepItem> items;
    std::vector<size_t> who;  // the sequence index of each item that wants a token
    for (size_t i = 0; i < ps.size(); ++i) {
      if (step < int(i) || (i == 1 && step > 9)) continue;
      if (step == int(i)) {
        ASSERT_TRUE(host.e->seq_append(host.seq[i], prompts[i]).is_ok());
        ASSERT_TRUE(dev.e->seq_append(dev.seq[i], prompts[i]).is_ok());
      }
      const int pending = host.e->seq_pending(host.seq[i]);
      ASSERT_EQ(pending, dev.e->seq_pending(dev.seq[i]));
      const int n = (i == 3 && step == 3) ? pending - 4 : pending;  // a chunk that does not finish the prompt
      items.push_back({int(i), n, n == pending});
      if (n == pending) who.push_back(i);
    }
    if (who.empty()) continue;
    auto with_seqs = [&](const Side& side) {
      std::vector<Engine::StepItem> v = items;
      for (auto& it : v) it.seq = side.seq[size_t(it.seq)];
      return v;
    };
    std::vector<float> logits;
    ASSERT_TRUE(host.e->step(with_seqs(host), &logits).is_ok());
    std::vector<SamplingParams> rp;
    std::vector<uint64_t> u;
    for (size_t i : who) {
      rp.push_back(ps[i]);
      u.push_back(ps[i].temperature > 0 ? dev.s[i].next_random53() : 0);
    }
    std::vector<int32_t> next;
    Status st = dev.e->step_sample(with_seqs(dev), rp, u, suppress, &next);
    ASSERT_TRUE(st.is_ok()) << st.message();
    ASSERT_EQ(next.size(), who.size());
    for (size_t r = 0; r < who.size(); ++r) {
      const size_t i = who[r];
      const int32_t want = host.s[i].sample(logits.data() + r * size_t(V), V, host.e->seq_tokens(host.seq[i]));
      ASSERT_EQ(next[r], want) << "sequence " << i << " step " << step;
      ASSERT_NE(next[r], 5) << "a suppressed token";
      ASSERT_TRUE(host.e->seq_append(host.seq[i], std::span<const int32_t>(&want, 1)).is_ok());
      ASSERT_TRUE(dev.e->seq_append(dev.seq[i], std::span<const int32_t>(&want, 1)).is_ok());
      ++compared;
    }
  }
  EXPECT_GT(compared, 60);
  std::vector<int32_t> next;
  EXPECT_FALSE(dev.e->step_sample(std::vector<Engine::StepItem>{{dev.seq[0], 1, true}}, {}, {}, {}, &next).is_ok())
      << "one parameter set per sampling item";
}

TEST(EngineSample, StepSampleEqualsHostSamplerOverMixedSteps) { step_sample_equals_host(configs()); }

// Engine::step_sample with row modes (the server's mixed step): rows sampled on the host (their
// logits come back, in row order) beside rows sampled on the device, and device rows suppressing
// `suppress` beside device rows that do not. Against step() + a host Sampler per row: each device
// row's token is the Sampler's with that row's own suppression, each host row's logits are step()'s
// row bit for bit (so its Sampler picks the same token), and only the host rows' logits leave the
// backend (Engine::logit_rows_to_host).
TEST(EngineSample, StepSampleMixesHostRowsAndDeviceRows) {
  FixtureOptions o;
  o.engine.max_seqs = 6;
  auto h = make_engine(o), d = make_engine(o);
  ASSERT_TRUE(h.engine && d.engine);
  const int V = h.vocab();
  auto ps = configs();
  ps.push_back(ps[0]), ps.back().seed = 9;
  ps.push_back(ps[1]), ps.back().seed = 10;
  // Rows 1, 3 and 4 on the host (3 and 4 adjacent: one copy); rows 2 (greedy) and 5 sample on the
  // device without suppression, row 0 with it.
  std::vector<Engine::RowMode> modes(ps.size());
  for (size_t i : {1, 3, 4}) modes[i].host = true;
  for (size_t i : {2, 4, 5}) modes[i].suppress = false;
  const size_t n_host = 3;
  std::vector<int> hs, ds;
  std::vector<Sampler> host_s, dev_s;  // dev_s: the device rows' random streams, the host rows' samplers
  for (size_t i = 0; i < ps.size(); ++i) {
    auto a = h.engine->seq_create(), b = d.engine->seq_create();
    ASSERT_TRUE(a.is_ok() && b.is_ok());
    hs.push_back(*a), ds.push_back(*b);
    host_s.emplace_back(ps[i]), dev_s.emplace_back(ps[i]);
    const auto prompt = random_ids(5 + 2 * int(i), 500 + i, V);
    ASSERT_TRUE(h.engine->seq_append(*a, prompt).is_ok());
    ASSERT_TRUE(d.engine->seq_append(*b, prompt).is_ok());
  }
  std::vector<int32_t> suppress;
  int compared = 0, unsuppressed_hits = 0;
  for (int step = 0; step < 16; ++step) {
    std::vector<Engine::StepItem> hi, di;
    for (size_t i = 0; i < ps.size(); ++i) {
      hi.push_back({hs[i], h.engine->seq_pending(hs[i]), true});
      di.push_back({ds[i], d.engine->seq_pending(ds[i]), true});
    }
    const uint64_t h0 = h.engine->logit_rows_to_host(), d0 = d.engine->logit_rows_to_host();
    std::vector<float> logits;
    ASSERT_TRUE(h.engine->step(hi, &logits).is_ok());
    EXPECT_EQ(h.engine->logit_rows_to_host() - h0, ps.size()) << "step(): every row";
    if (step == 0) {
      // The suppressed ids: the 8 likeliest of each unsuppressed device row's first logits, so those
      // rows sample some of them (and the suppressing rows would too, were they not suppressed).
      for (size_t i : {0, 2, 5}) {
        std::vector<int32_t> idx(size_t(V), 0);
        for (int t = 0; t < V; ++t) idx[size_t(t)] = t;
        const float* l = logits.data() + i * size_t(V);
        std::partial_sort(idx.begin(), idx.begin() + 8, idx.end(), [&](int32_t x, int32_t y) { return l[x] > l[y]; });
        suppress.insert(suppress.end(), idx.begin(), idx.begin() + 8);
      }
      std::sort(suppress.begin(), suppress.end());
      suppress.erase(std::unique(suppress.begin(), suppress.end()), suppress.end());
      for (size_t i = 0; i < ps.size(); ++i)
        if (modes[i].suppress) host_s[i].set_suppressed(suppress), dev_s[i].set_suppressed(suppress);
    }
    std::vector<uint64_t> u;
    for (size_t i = 0; i < ps.size(); ++i)
      u.push_back(!modes[i].host && ps[i].temperature > 0 ? dev_s[i].next_random53() : 0);
    std::vector<int32_t> next;
    std::vector<float> host_logits;
    Status st = d.engine->step_sample(di, ps, u, suppress, &next, modes, &host_logits);
    ASSERT_TRUE(st.is_ok()) << st.message();
    EXPECT_EQ(d.engine->logit_rows_to_host() - d0, n_host) << "step_sample: the host rows only";
    ASSERT_EQ(next.size(), ps.size());
    ASSERT_EQ(host_logits.size(), n_host * size_t(V));
    size_t k = 0;  // the next host row's place in host_logits
    for (size_t i = 0; i < ps.size(); ++i) {
      float* hl = logits.data() + i * size_t(V);
      int32_t got = next[i];
      if (modes[i].host) {
        ASSERT_EQ(got, -1) << "a host row is not sampled on the device";
        ASSERT_EQ(std::memcmp(host_logits.data() + k * size_t(V), hl, size_t(V) * sizeof(float)), 0)
            << "row " << i << " step " << step << ": not step()'s logits";
        got = dev_s[i].sample(host_logits.data() + k * size_t(V), V, d.engine->seq_tokens(ds[i]));
        ++k;
      }
      const int32_t want = host_s[i].sample(hl, V, h.engine->seq_tokens(hs[i]));
      ASSERT_EQ(got, want) << "row " << i << " step " << step;
      const bool in_suppress = std::binary_search(suppress.begin(), suppress.end(), want);
      if (modes[i].suppress) ASSERT_FALSE(in_suppress) << "row " << i << " sampled a suppressed id";
      else unsuppressed_hits += in_suppress && !modes[i].host;
      ASSERT_TRUE(h.engine->seq_append(hs[i], std::span<const int32_t>(&want, 1)).is_ok());
      ASSERT_TRUE(d.engine->seq_append(ds[i], std::span<const int32_t>(&want, 1)).is_ok());
      ++compared;
    }
  }
  EXPECT_EQ(compared, 16 * int(ps.size()));
  EXPECT_GT(unsuppressed_hits, 0) << "the rows that do not suppress never sampled a suppressed id: the test "
                                     "cannot tell per-row suppression from none";
  // Bad modes are refused before the step: one per sampling row, and host rows need a buffer.
  std::vector<Engine::StepItem> one = {{ds[0], 1, true}};
  const SamplingParams p0 = ps[0];
  const uint64_t u0 = 0;
  std::vector<int32_t> next;
  const std::vector<Engine::RowMode> two(2), host_row = {Engine::RowMode{true, true}};
  EXPECT_FALSE(d.engine->step_sample(one, {&p0, 1}, {&u0, 1}, {}, &next, two, nullptr).is_ok());
  Status st = d.engine->step_sample(one, {&p0, 1}, {&u0, 1}, {}, &next, host_row, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("host rows"), std::string::npos) << st.message();
  EXPECT_EQ(d.engine->seq_pending(ds[0]), 1) << "nothing computed";
}

// OpenAI's logit_bias on the device path: rows with and without biases in one batch, greedy and
// sampled, the bias pushing the model's favourite tokens away (-100) and others up.
std::vector<SamplingParams> biased_configs() {
  auto ps = configs();
  ps[0].logit_bias = {{1, 5.0f}, {4, -100.0f}, {9, 2.5f}, {20, -1.25f}};
  // ps[1]: none (a row without a bias between biased ones)
  ps[2].repetition_penalty = 1.0f;  // greedy with a bias alone
  ps[2].logit_bias = {{2, 3.0f}, {6, 7.5f}, {13, -4.0f}};
  ps[3].logit_bias = {{0, 100.0f}};
  for (const SamplingParams& p : ps) EXPECT_TRUE(validate(p).is_ok()) << validate(p).message();
  return ps;
}

TEST(EngineSample, DecodeSampleWithLogitBiasEqualsHostSampler) {
  FixtureOptions o;
  auto h = make_engine(o), d = make_engine(o);
  ASSERT_TRUE(h.engine && d.engine);
  const auto ps = biased_configs();
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < ps.size(); ++i) prompts.push_back(random_ids(5 + int(i) * 3, 70 + i, h.vocab()));
  run_both(*h.engine, *d.engine, prompts, ps, 16, {});
  // The same slots with the rows' parameters rotated: the device biases follow the rows.
  run_both(*h.engine, *d.engine, prompts, {ps[1], ps[2], ps[3], ps[0]}, 10, {3});
}

TEST(EngineSample, StepSampleWithLogitBiasEqualsHostSampler) { step_sample_equals_host(biased_configs()); }

// A bias naming a token outside the model's vocabulary is refused before the step, naming logit_bias.
TEST(EngineSample, LogitBiasOutsideTheVocabularyIsAnError) {
  FixtureOptions o;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  auto s = f.engine->seq_create();
  ASSERT_TRUE(s.is_ok());
  std::vector<float> l;
  ASSERT_TRUE(f.engine->extend(*s, random_ids(4, 1, f.vocab()), &l).is_ok());
  const int seq = *s;
  const int32_t tok = 5;
  SamplingParams p;
  p.logit_bias = {{f.vocab(), 1.0f}};
  const uint64_t u = 0;
  std::vector<int32_t> next;
  Status st = f.engine->decode_sample({&seq, 1}, {&tok, 1}, {&p, 1}, {&u, 1}, {}, &next);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("logit_bias"), std::string::npos) << st.message();
  EXPECT_EQ(f.engine->seq_tokens(seq).size(), 4u) << "nothing appended";
  p.logit_bias = {{f.vocab() - 1, 1.0f}};
  EXPECT_TRUE(f.engine->decode_sample({&seq, 1}, {&tok, 1}, {&p, 1}, {&u, 1}, {}, &next).is_ok());
}

// generate() with a greedy logit bias: the device greedy path (decode_greedy, which has no bias)
// must not be taken, on either switch setting. The tokens equal a step-by-step host reference
// (decode + Sampler), and differ from the unbiased run's.
TEST(EngineSample, GenerateGreedyWithLogitBiasEqualsHostReference) {
  FixtureOptions o;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  const int V = f.vocab();
  GenerateRequest req;
  req.prompt = random_ids(9, 17, V);
  req.max_new_tokens = 12;
  auto gen = [&](const char* device) {
    setenv("ANVIL_CUDA_DEVICE_SAMPLER", device, 1);
    auto s = f.engine->seq_create();
    EXPECT_TRUE(s.is_ok());
    auto r = generate(*f.engine, *s, req, nullptr);
    f.engine->seq_release(*s);
    unsetenv("ANVIL_CUDA_DEVICE_SAMPLER");
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? r->ids : std::vector<int32_t>{};
  };
  const auto plain = gen("0");
  ASSERT_EQ(plain.size(), 12u);
  // Push away the unbiased run's tokens after its first, and favour a few others.
  for (size_t i = 1; i < plain.size(); ++i) req.sampling.logit_bias.push_back({plain[i], -100.0f});
  for (int32_t id : {3, 8, 15}) req.sampling.logit_bias.push_back({id, 1.5f});
  std::sort(req.sampling.logit_bias.begin(), req.sampling.logit_bias.end(),
            [](const LogitBias& a, const LogitBias& b) { return a.id < b.id; });
  req.sampling.logit_bias.erase(std::unique(req.sampling.logit_bias.begin(), req.sampling.logit_bias.end(),
                                            [](const LogitBias& a, const LogitBias& b) { return a.id == b.id; }),
                                req.sampling.logit_bias.end());
  ASSERT_TRUE(validate(req.sampling).is_ok());
  // The reference: every step's logits on the host, the bias added, the argmax.
  std::vector<int32_t> want;
  {
    auto s = f.engine->seq_create();
    ASSERT_TRUE(s.is_ok());
    std::vector<float> l;
    ASSERT_TRUE(f.engine->extend(*s, req.prompt, &l).is_ok());
    for (int i = 0; i < req.max_new_tokens; ++i) {
      for (const LogitBias& b : req.sampling.logit_bias) l[size_t(b.id)] += b.bias;
      const int32_t id = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
      want.push_back(id);
      int seq = *s;
      ASSERT_TRUE(f.engine->decode({&seq, 1}, {&id, 1}, &l).is_ok());
    }
    f.engine->seq_release(*s);
  }
  EXPECT_NE(want, plain);
  EXPECT_EQ(gen("0"), want) << "host path";
  EXPECT_EQ(gen("1"), want) << "device sampler path";
}

// generate() with ANVIL_CUDA_DEVICE_SAMPLER=1 takes the device path and gives the host path's tokens.
TEST(EngineSample, GenerateWithTheSwitchEqualsHostPath) {
  FixtureOptions o;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  for (const SamplingParams& p : configs()) {
    GenerateRequest req;
    req.prompt = random_ids(11, 5, f.vocab());
    req.max_new_tokens = 16;
    req.sampling = p;
    req.eos_ids = {3};
    req.ignore_eos = true;
    auto once = [&](bool device) {
      if (device) setenv("ANVIL_CUDA_DEVICE_SAMPLER", "1", 1);
      else setenv("ANVIL_CUDA_DEVICE_SAMPLER", "0", 1);
      auto s = f.engine->seq_create();
      EXPECT_TRUE(s.is_ok());
      auto r = generate(*f.engine, *s, req, nullptr);
      f.engine->seq_release(*s);
      unsetenv("ANVIL_CUDA_DEVICE_SAMPLER");
      EXPECT_TRUE(r.is_ok()) << r.status().message();
      return r.is_ok() ? r->ids : std::vector<int32_t>{};
    };
    const auto host = once(false), dev = once(true);
    EXPECT_EQ(host.size(), 16u);
    EXPECT_EQ(dev, host) << "T=" << p.temperature;
  }
  EXPECT_FALSE(device_sampler_enabled(f.engine->model().backend())) << "off by default on the CPU";
  setenv("ANVIL_CUDA_DEVICE_SAMPLER", "1", 1);
  EXPECT_TRUE(device_sampler_enabled(f.engine->model().backend()));
  unsetenv("ANVIL_CUDA_DEVICE_SAMPLER");
}

TEST(EngineSample, BadArgumentsAreErrors) {
  FixtureOptions o;
  auto f = make_engine(o);
  ASSERT_TRUE(f.engine);
  auto s = f.engine->seq_create();
  ASSERT_TRUE(s.is_ok());
  std::vector<float> l;
  ASSERT_TRUE(f.engine->extend(*s, random_ids(4, 1, f.vocab()), &l).is_ok());
  const int seq = *s;
  const int32_t tok = 5;
  SamplingParams bad;
  bad.top_p = 0.0f;
  const uint64_t u = 0;
  std::vector<int32_t> next;
  Status st = f.engine->decode_sample({&seq, 1}, {&tok, 1}, {&bad, 1}, {&u, 1}, {}, &next);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("top_p"), std::string::npos) << st.message();
  const int missing = 3;
  SamplingParams ok;
  st = f.engine->decode_sample({&missing, 1}, {&tok, 1}, {&ok, 1}, {&u, 1}, {}, &next);
  EXPECT_FALSE(st.is_ok());
  st = f.engine->decode_sample({&seq, 1}, {&tok, 1}, {}, {}, {}, &next);
  EXPECT_FALSE(st.is_ok());
}

}  // namespace
}  // namespace anvil::testing

namespace anvil::testing {
namespace {

// A checkpoint with NaN weights makes every logit NaN. generate() then says so (an internal error
// naming the logits and the weights), not that the sampling filters removed every token: greedy
// decoding has no filter to blame.
TEST(EngineSample, NanWeightsAreReportedAsNonFiniteLogits) {
  auto m = shared_model("tiny:bf16");
  ASSERT_TRUE(m);
  ModelWeights w = m->weights;
  ASSERT_EQ(w.final_norm.dtype, DType::kBF16);
  std::vector<uint16_t> nan_norm(size_t(w.final_norm.n), 0x7FC0);  // bf16 quiet NaN
  w.final_norm.data = nan_norm.data();
  auto backend = make_cpu_backend(2);
  auto up = upload_weights(w, *backend);
  ASSERT_TRUE(up.is_ok()) << up.status().message();
  auto tf = Transformer::create(m->config, *up, *backend, 64);
  ASSERT_TRUE(tf.is_ok()) << tf.status().message();
  FixtureOptions o;
  auto e = Engine::create(**tf, m->fingerprint, o.engine);
  ASSERT_TRUE(e.is_ok()) << e.status().message();
  for (float temperature : {0.0f, 0.8f}) {
    auto s = (*e)->seq_create();
    ASSERT_TRUE(s.is_ok());
    GenerateRequest req;
    req.prompt = random_ids(5, 1, m->config.vocab_size);
    req.max_new_tokens = 4;
    req.sampling.temperature = temperature;
    req.sampling.top_p = 0.9f;
    auto r = generate(**e, *s, req, nullptr);
    ASSERT_FALSE(r.is_ok()) << "T=" << temperature;
    EXPECT_EQ(r.status().code(), StatusCode::kInternal);
    EXPECT_NE(r.status().message().find("no token has a finite logit"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("NaN/Inf"), std::string::npos) << r.status().message();
    (*e)->seq_release(*s);
  }
}

}  // namespace
}  // namespace anvil::testing
