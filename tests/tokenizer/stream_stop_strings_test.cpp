// StopMatcher: emitted text + stop == input up to the stop, for every way of chunking the input.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/stop_strings.h"

namespace anvil {
namespace {

struct StopRun {
  std::string emitted;
  bool stopped;
};

StopRun run_chunks(const std::vector<std::string>& stops, const std::vector<std::string>& chunks) {
  StopMatcher m(stops);
  StopRun r{"", false};
  for (const auto& c : chunks) r.emitted += m.push(c);
  r.emitted += m.flush();
  r.stopped = m.stopped();
  return r;
}

// The reference, on the whole text: scan end positions left to right; at the first end position
// where some stop string ends, the text before the earliest-starting such stop string.
StopRun reference(const std::vector<std::string>& stops, const std::string& text) {
  for (size_t e = 1; e <= text.size(); ++e) {
    size_t best = std::string::npos;
    for (const auto& s : stops)
      if (!s.empty() && s.size() <= e && text.compare(e - s.size(), s.size(), s) == 0) best = std::min(best, e - s.size());
    if (best != std::string::npos) return {text.substr(0, best), true};
  }
  return {text, false};
}

void check_all_splits(const std::vector<std::string>& stops, const std::string& text) {
  const StopRun want = reference(stops, text);
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      const StopRun got = run_chunks(stops, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      ASSERT_EQ(got.emitted, want.emitted) << "split at " << i << "," << j << " of " << text;
      ASSERT_EQ(got.stopped, want.stopped);
    }
  }
}

TEST(StopMatcher, StopSpanningChunksAtEverySplitPoint) {
  check_all_splits({"<|im_end|>"}, "Hello world<|im_end|>ignored");
  check_all_splits({"\n\n", "STOP"}, "line one\nline two\n\nafter");
  check_all_splits({"abcabd"}, "xxabcabcabdyy");  // overlapping partial matches
  check_all_splits({"aaa", "aab"}, "aaab");
  check_all_splits({"END"}, "no stop string here, EN");
  check_all_splits({"你好"}, "说你好吗");
}

TEST(StopMatcher, HoldsBackOnlyPossiblePrefixes) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.push("abc<"), "abc");
  EXPECT_EQ(m.push("/"), "");
  EXPECT_EQ(m.push("x"), "</x");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("</s> tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, FirstCompletedStopWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_TRUE(m.stopped());
  // "b" completes before "abcd" would, so it wins even though "abcd" starts earlier.
  StopMatcher n({"abcd", "b"});
  EXPECT_EQ(n.push("xabcd"), "xa");
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, RandomStreamsMatchReference) {
  std::mt19937 rng(7);
  const std::string alphabet = "ab<>/";
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<std::string> stops(1 + rng() % 3);
    for (auto& s : stops)
      for (size_t k = 0, n = 1 + rng() % 4; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    std::string text;
    for (size_t k = 0, n = rng() % 30; k < n; ++k) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> chunks;
    for (size_t p = 0; p < text.size();) {
      const size_t len = std::min(text.size() - p, size_t(rng() % 5));
      chunks.push_back(text.substr(p, len));
      p += len;
    }
    const StopRun want = reference(stops, text), got = run_chunks(stops, chunks);
    ASSERT_EQ(got.emitted, want.emitted) << text;
    ASSERT_EQ(got.stopped, want.stopped) << text;
  }
}

}  // namespace
}  // namespace anvil
