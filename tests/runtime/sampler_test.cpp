// Sampler: transformers' logits processors (fixtures frozen by scripts/make_sampler_fixtures.py),
// greedy argmax, seeded reproducibility, the sampled distribution (chi-square), parameter errors,
// and the large-vocabulary fast paths against a naive full-sort reference.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "runtime/sampler.h"

using namespace anvil;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(int vocab, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(vocab));
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<double> softmax(const std::vector<float>& l, double temperature) {
  double m = -INFINITY;
  for (float x : l) m = std::max(m, double(x) / temperature);
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); ++i) s += p[i] = std::exp(double(l[i]) / temperature - m);
  for (auto& x : p) x /= s;
  return p;
}

}  // namespace

TEST(Sampler, MatchesTransformersLogitsProcessors) {
  const std::string path = std::string(ANVIL_TEST_DATA) + "/sampler/cases.json";
  std::ifstream f(path);
  ASSERT_TRUE(f) << "cannot open " << path;
  const auto doc = nlohmann::json::parse(f);
  int n = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("name").get<std::string>();
    SCOPED_TRACE(name);
    const auto& jp = c.at("params");
    SamplingParams p;
    p.temperature = jp.at("temperature").get<float>();
    p.top_k = jp.at("top_k").get<int>();
    p.top_p = jp.at("top_p").get<float>();
    p.min_p = jp.at("min_p").get<float>();
    p.repetition_penalty = jp.at("repetition_penalty").get<float>();
    p.repetition_window = jp.at("repetition_window").get<int>();
    ASSERT_TRUE(validate(p).is_ok()) << validate(p).message();
    const auto logits = c.at("logits").get<std::vector<float>>();
    const auto history = c.at("history").get<std::vector<int32_t>>();
    const auto suppressed = c.at("suppressed").get<std::vector<int32_t>>();
    const auto expected = c.at("expected").get<std::vector<float>>();
    const int vocab = int(logits.size());
    ASSERT_EQ(expected.size(), logits.size());

    Sampler s(p);
    s.set_suppressed(suppressed);
    std::vector<float> work = logits;
    const std::vector<float> probs = s.probabilities(work.data(), vocab, history);
    int survivors = 0;
    for (int i = 0; i < vocab; ++i) {
      EXPECT_EQ(probs[size_t(i)] > 0.0f, expected[size_t(i)] > 0.0f) << "token " << i;
      EXPECT_NEAR(probs[size_t(i)], expected[size_t(i)], 2e-6 + 2e-5 * expected[size_t(i)]) << "token " << i;
      survivors += expected[size_t(i)] > 0.0f;
    }

    // The free function removes exactly the same tokens.
    std::vector<float> work2 = logits;
    apply_logit_processors(p, work2.data(), vocab, history, suppressed);
    if (p.temperature > 0.0f)
      for (int i = 0; i < vocab; ++i) EXPECT_EQ(work2[size_t(i)] != kNegInf, expected[size_t(i)] > 0.0f) << "token " << i;

    // Every draw lands on a surviving token.
    for (int t = 0; t < 50; ++t) {
      std::vector<float> w = logits;
      const int32_t tok = s.sample(w.data(), vocab, history);
      ASSERT_GE(tok, 0);
      ASSERT_LT(tok, vocab);
      EXPECT_GT(expected[size_t(tok)], 0.0f) << "sampled removed token " << tok;
    }
    EXPECT_GT(survivors, 0);
    ++n;
  }
  EXPECT_GE(n, 20);
}

TEST(Sampler, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler s(SamplingParams{});  // temperature 0
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto l = random_logits(1000, 3.0f, seed);
    const int32_t expect = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    EXPECT_EQ(s.sample(l.data(), 1000, {}), expect);
  }
  std::vector<float> tie = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  EXPECT_EQ(s.sample(tie.data(), 5, {}), 1);
  s.set_suppressed({1});
  tie = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  EXPECT_EQ(s.sample(tie.data(), 5, {}), 3);
}

TEST(Sampler, NoTokenPossibleReturnsMinusOne) {
  for (float t : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = t;
    Sampler s(p);
    s.set_suppressed({0, 1, 2});
    std::vector<float> l = {1.0f, 2.0f, 3.0f};
    EXPECT_EQ(s.sample(l.data(), 3, {}), -1) << "temperature " << t;
  }
}

TEST(Sampler, FixedSeedIsReproducible) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 42;
  const auto base = random_logits(500, 1.5f, 3);
  auto draw = [&](uint64_t seed) {
    SamplingParams q = p;
    q.seed = seed;
    Sampler s(q);
    std::vector<int32_t> out;
    for (int i = 0; i < 300; ++i) {
      auto l = base;
      out.push_back(s.sample(l.data(), 500, {}));
    }
    return out;
  };
  const auto a = draw(42), b = draw(42), c = draw(43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // More than one distinct token: the draws really are random.
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 5u);
}

// Frequencies of temperature sampling match softmax(logits / T): Pearson chi-square with 11 degrees
// of freedom against the 0.1% critical value 31.26. The same counts against softmax(logits) (the
// wrong temperature) must be rejected, which shows the test can fail.
TEST(Sampler, TemperatureFrequenciesMatchSoftmaxChiSquare) {
  const std::vector<float> logits = {1.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.5f, -0.5f, 0.8f, 0.2f, 1.2f, -2.0f, 0.9f};
  const int vocab = int(logits.size());
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 12345;
  Sampler s(p);
  const int draws = 120000;
  std::vector<int> counts(static_cast<size_t>(vocab), 0);
  for (int i = 0; i < draws; ++i) {
    auto l = logits;
    const int32_t t = s.sample(l.data(), vocab, {});
    ASSERT_GE(t, 0);
    ++counts[size_t(t)];
  }
  auto chi2 = [&](const std::vector<double>& prob) {
    double x = 0;
    for (int i = 0; i < vocab; ++i) {
      const double e = prob[size_t(i)] * draws;
      x += (counts[size_t(i)] - e) * (counts[size_t(i)] - e) / e;
    }
    return x;
  };
  const double critical = 31.26;
  EXPECT_LT(chi2(softmax(logits, 0.7)), critical);
  EXPECT_GT(chi2(softmax(logits, 1.0)), critical);
  EXPECT_GT(chi2(softmax(logits, 0.6)), critical);
}

TEST(Sampler, BadParametersNameTheParameter) {
  auto expect_error = [](SamplingParams p, const std::string& name) {
    const Status st = validate(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name;
    EXPECT_NE(st.message().find("'" + name + "'"), std::string::npos) << st.message();
    EXPECT_FALSE(Sampler::create(p).is_ok()) << name;
  };
  SamplingParams p;
  p.temperature = -0.1f; expect_error(p, "temperature");
  p = {}; p.temperature = NAN; expect_error(p, "temperature");
  p = {}; p.temperature = INFINITY; expect_error(p, "temperature");
  p = {}; p.top_k = -1; expect_error(p, "top_k");
  p = {}; p.top_p = 0.0f; expect_error(p, "top_p");
  p = {}; p.top_p = 1.5f; expect_error(p, "top_p");
  p = {}; p.min_p = 1.0f; expect_error(p, "min_p");
  p = {}; p.min_p = -0.1f; expect_error(p, "min_p");
  p = {}; p.repetition_penalty = 0.0f; expect_error(p, "repetition_penalty");
  p = {}; p.repetition_penalty = -1.0f; expect_error(p, "repetition_penalty");
  p = {}; p.repetition_window = -2; expect_error(p, "repetition_window");
  p = {}; p.logit_bias = {{5, 1.0f}, {5, 2.0f}}; expect_error(p, "logit_bias");     // an id twice
  p = {}; p.logit_bias = {{7, 1.0f}, {5, 2.0f}}; expect_error(p, "logit_bias");     // not ascending
  p = {}; p.logit_bias = {{-1, 1.0f}}; expect_error(p, "logit_bias");
  p = {}; p.logit_bias = {{1, 100.5f}}; expect_error(p, "logit_bias");
  p = {}; p.logit_bias = {{1, -101.0f}}; expect_error(p, "logit_bias");
  p = {}; p.logit_bias = {{1, NAN}}; expect_error(p, "logit_bias");
  p = {};
  for (int i = 0; i <= kMaxLogitBiasEntries; ++i) p.logit_bias.push_back({i, 1.0f});
  expect_error(p, "logit_bias");
  p.logit_bias.pop_back();
  EXPECT_TRUE(validate(p).is_ok());
  p = {}; p.logit_bias = {{0, -100.0f}, {3, 100.0f}}; EXPECT_TRUE(validate(p).is_ok());
  p = {}; EXPECT_TRUE(validate(p).is_ok());
  p.temperature = 0.7f; p.top_k = 40; p.top_p = 1.0f; p.min_p = 0.0f; p.repetition_penalty = 1.1f;
  EXPECT_TRUE(Sampler::create(p).is_ok());
}

// Qwen3 vocabulary size: top-k (heap) and top-p (incremental sort) against a naive full stable sort
// that follows transformers' definitions literally.
TEST(Sampler, LargeVocabMatchesNaiveReference) {
  const int vocab = 151936;
  auto base = random_logits(vocab, 2.0f, 99);
  for (int i = 0; i < 40; ++i) base[size_t(i * 3000)] += 9.0f;  // a peaked head, like a real LM
  base[77] = base[3000];                                         // a tie inside the head

  // Naive reference survivors.
  auto reference = [&](const SamplingParams& p) {
    std::vector<float> l(base);
    for (auto& x : l) x /= p.temperature;
    std::vector<bool> alive(size_t(vocab), true);
    if (p.top_k > 0) {
      std::vector<float> sorted(l);
      std::sort(sorted.begin(), sorted.end(), std::greater<float>());
      for (int i = 0; i < vocab; ++i) alive[size_t(i)] = l[size_t(i)] >= sorted[size_t(p.top_k - 1)];
    }
    if (p.top_p < 1.0f) {
      std::vector<int> idx;
      for (int i = 0; i < vocab; ++i)
        if (alive[size_t(i)]) idx.push_back(i);
      std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[size_t(a)] < l[size_t(b)]; });
      double m = l[size_t(idx.back())], s = 0, cum = 0;
      for (int i : idx) s += std::exp(double(l[size_t(i)]) - m);
      for (size_t j = 0; j + 1 < idx.size(); ++j) {
        cum += std::exp(double(l[size_t(idx[j])]) - m) / s;
        if (float(cum) <= float(1.0 - double(p.top_p))) alive[size_t(idx[j])] = false;
      }
    }
    return alive;
  };

  struct Case { float t; int k; float top_p; };
  for (Case c : {Case{1.0f, 40, 1.0f}, Case{0.8f, 0, 0.9f}, Case{1.3f, 0, 0.99f}, Case{0.7f, 500, 0.95f}}) {
    SamplingParams p;
    p.temperature = c.t;
    p.top_k = c.k;
    p.top_p = c.top_p;
    SCOPED_TRACE("T=" + std::to_string(c.t) + " k=" + std::to_string(c.k) + " top_p=" + std::to_string(c.top_p));
    Sampler s(p);
    auto l = base;
    const auto t0 = std::chrono::steady_clock::now();
    const auto probs = s.probabilities(l.data(), vocab, {});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto alive = reference(p);
    int mismatches = 0, n_alive = 0;
    for (int i = 0; i < vocab; ++i) {
      mismatches += (probs[size_t(i)] > 0.0f) != alive[size_t(i)];
      n_alive += alive[size_t(i)];
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_GT(n_alive, 1);
    std::printf("  vocab %d T=%.2f top_k=%d top_p=%.2f: %d survivors, %.2f ms\n", vocab, c.t, c.k, c.top_p, n_alive, ms);
  }
  // Greedy over the full vocabulary: one pass.
  Sampler g(SamplingParams{});
  auto l = base;
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t tok = g.sample(l.data(), vocab, {});
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(tok, int32_t(std::max_element(base.begin(), base.end()) - base.begin()));
  std::printf("  vocab %d greedy: %.3f ms\n", vocab, ms);
}

TEST(Sampler, RepetitionPenaltyOncePerDistinctTokenWithinWindow) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  p.repetition_window = 3;
  Sampler s(p);
  std::vector<float> l = {4.0f, -4.0f, 4.0f, 4.0f, 1.0f};
  const std::vector<int32_t> history = {3, 1, 1, 0, -5, 99};  // window: {0, -5, 99}; out-of-range ids ignored
  s.sample(l.data(), 5, history);
  EXPECT_EQ(l, (std::vector<float>{2.0f, -4.0f, 4.0f, 4.0f, 1.0f}));
  p.repetition_window = 0;
  Sampler all(p);
  l = {4.0f, -4.0f, 4.0f, 4.0f, 1.0f};
  all.sample(l.data(), 5, history);
  EXPECT_EQ(l, (std::vector<float>{2.0f, -8.0f, 4.0f, 2.0f, 1.0f}));
}

// logit_bias: -100 on the greedy token hands the pick to the runner-up; +100 on any token forces it,
// greedy and sampled; a bias outside the vocabulary is ignored by the sampler (callers refuse it).
TEST(Sampler, LogitBiasMovesTheGreedyPickAndForcesATokenWhenSampling) {
  const int vocab = 5000;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(vocab, 3.0f, seed);
    std::vector<int32_t> order(static_cast<size_t>(vocab));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    SamplingParams p;
    auto w = logits;
    ASSERT_EQ(Sampler(p).sample(w.data(), vocab, {}), order[0]);
    p.logit_bias = {{order[0], -100.0f}};
    w = logits;
    EXPECT_EQ(Sampler(p).sample(w.data(), vocab, {}), order[1]) << "seed " << seed;
    // +100 on a token far down the list forces it, greedy and at temperature 1 (every other token's
    // weight is then below the sampler's 2^-44 floor).
    const int32_t low = order[size_t(vocab / 2 + seed)];
    p.logit_bias = {{std::min(low, order[0]), 0.0f}, {std::max(low, order[0]), 0.0f}};
    for (auto& b : p.logit_bias) b.bias = b.id == low ? 100.0f : -3.0f;
    ASSERT_TRUE(validate(p).is_ok());
    w = logits;
    EXPECT_EQ(Sampler(p).sample(w.data(), vocab, {}), low);
    p.temperature = 1.0f;
    p.seed = seed;
    Sampler s(p);
    for (int t = 0; t < 20; ++t) {
      w = logits;
      EXPECT_EQ(s.sample(w.data(), vocab, {}), low);
    }
    // The distribution moves exactly as softmax(logits + bias) says.
    p.logit_bias = {{order[0], -2.5f}, {low, 4.0f}};
    if (order[0] > low) std::swap(p.logit_bias[0], p.logit_bias[1]);
    w = logits;
    const auto probs = Sampler(p).probabilities(w.data(), vocab, {});
    std::vector<float> biased = logits;
    biased[size_t(order[0])] += -2.5f;
    biased[size_t(low)] += 4.0f;
    const auto want = softmax(biased, 1.0);
    for (int i = 0; i < vocab; ++i) ASSERT_NEAR(probs[size_t(i)], want[size_t(i)], 1e-6 + 1e-5 * want[size_t(i)]) << i;
  }
  // An id outside the vocabulary changes nothing.
  SamplingParams p;
  p.logit_bias = {{vocab + 3, 100.0f}};
  auto a = random_logits(vocab, 3.0f, 99), b = a;
  Sampler(SamplingParams{}).sample(a.data(), vocab, {});
  Sampler(p).sample(b.data(), vocab, {});
  EXPECT_EQ(a, b);
}

// Seeded draws with a logit bias (and every other processor) against an independent Python
// reference (tests/runtime/logit_bias_reference.py: its own float32 rounding, math.exp, its own
// sort-based top-k/top-p): the same token for every draw of every case.
TEST(Sampler, SeededDrawsWithLogitBiasMatchPythonReference) {
  if (std::system("python3 -c 'import json, math, struct' >/dev/null 2>&1") != 0) GTEST_SKIP() << "python3 is missing";
  const int vocab = 300;
  nlohmann::json cases = nlohmann::json::array();
  std::vector<std::vector<int32_t>> got;
  std::mt19937 rng(7);
  const float temps[] = {0.0f, 0.7f, 1.0f, 1.6f};
  const int ks[] = {0, 5, 40};
  const float top_ps[] = {1.0f, 0.9f, 0.5f};
  int n_cases = 0;
  for (float t : temps)
    for (int k : ks)
      for (float top_p : top_ps)
        for (int variant = 0; variant < 3; ++variant) {
          SamplingParams p;
          p.temperature = t, p.top_k = k, p.top_p = top_p;
          p.min_p = variant == 2 ? 0.05f : 0.0f;
          p.repetition_penalty = variant == 1 ? 1.3f : 1.0f;
          p.seed = rng();
          auto logits = random_logits(vocab, 2.0f, rng());
          std::vector<int32_t> history;
          for (int i = 0; i < 10; ++i) history.push_back(int32_t(rng() % 60));
          // Biases of every size on a dozen ids, the top tokens among them.
          std::set<int32_t> ids;
          while (ids.size() < 12) ids.insert(int32_t(rng() % vocab));
          const int32_t top = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
          ids.insert(top);
          std::uniform_real_distribution<float> ud(-8.0f, 8.0f);
          for (int32_t id : ids) p.logit_bias.push_back({id, id == top ? -100.0f : std::round(ud(rng) * 64) / 64});
          if (variant == 0) p.logit_bias.back().bias = 100.0f;
          ASSERT_TRUE(validate(p).is_ok());
          const std::vector<int32_t> suppressed = {int32_t(rng() % vocab)};
          Sampler s(p);
          s.set_suppressed(suppressed);
          std::mt19937_64 stream(p.seed);  // the 53-bit numbers the sampler draws with
          std::vector<uint64_t> random;
          std::vector<int32_t> picks;
          for (int d = 0; d < 25; ++d) {
            auto w = logits;
            picks.push_back(s.sample(w.data(), vocab, history));
            random.push_back(t > 0 ? stream() >> 11 : 0);
          }
          got.push_back(picks);
          nlohmann::json c;
          c["logits"] = logits;
          nlohmann::json bias = nlohmann::json::object();
          for (const LogitBias& b : p.logit_bias) bias[std::to_string(b.id)] = b.bias;
          c["bias"] = bias;
          c["history"] = history;
          c["suppressed"] = suppressed;
          c["temperature"] = t, c["top_k"] = k, c["top_p"] = top_p, c["min_p"] = p.min_p;
          c["repetition_penalty"] = p.repetition_penalty;
          c["random"] = random;
          cases.push_back(c);
          ++n_cases;
        }
  const std::string path = testing::TempDir() + "anvil_logit_bias_cases.json";
  std::ofstream(path) << cases.dump();
  const std::string cmd = "python3 " + std::string(ANVIL_SOURCE_DIR) + "/tests/runtime/logit_bias_reference.py " + path;
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_TRUE(f);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(f), 0) << out;
  std::remove(path.c_str());
  const auto want = nlohmann::json::parse(out);
  ASSERT_EQ(want.size(), got.size());
  int off_top = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(want[i].get<std::vector<int32_t>>(), got[i]) << "case " << i << ": " << cases[i]["temperature"] << " k "
                                                          << cases[i]["top_k"] << " top_p " << cases[i]["top_p"];
    for (int32_t id : got[i]) off_top += cases[i]["bias"].value(std::to_string(id), 0.0f) != -100.0f;
  }
  EXPECT_EQ(n_cases, 108);
  EXPECT_GT(off_top, 1000);
}
