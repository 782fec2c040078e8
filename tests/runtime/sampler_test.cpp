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
