// StopMatcher: emitted text + stop == input up to the stop, for every way of chunking the input.
#include <gtest/gtest.h>

#include <algorithm>
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


// Markup (a thinking model's <think> tags, a tool call's): a stop string matches only inside the
// text between the tags, or a whole tag, and the tags pass through whole. Only a tag that switches
// is markup (a pair's closing tag inside it, its opening tag outside; a pair only while the pairs
// before it are outside); elsewhere the same characters are text. The reference walks the whole
// text left to right, cuts it into switching tags and the text between them, and runs the plain
// reference on each piece of text.
StopRun reference_markup(const std::vector<std::string>& stops, std::vector<MarkupPair> pairs, const std::string& text) {
  std::string out, seg;
  for (size_t i = 0; i <= text.size();) {
    std::string tag;
    size_t pair = 0;
    for (size_t k = 0; k < pairs.size(); ++k) {
      const std::string& t = pairs[k].inside ? pairs[k].close : pairs[k].open;
      if (text.compare(i, t.size(), t) == 0 && t.size() > tag.size()) {
        tag = t;
        pair = k;
      }
      if (pairs[k].inside) break;
    }
    if (!tag.empty() || i == text.size()) {
      const StopRun r = reference(stops, seg);
      if (r.stopped) return {out + r.emitted, true};
      out += seg;
      seg.clear();
      if (i == text.size()) break;
      if (std::find(stops.begin(), stops.end(), tag) != stops.end()) return {out, true};
      out += tag;
      i += tag.size();
      pairs[pair].inside = !pairs[pair].inside;
    } else {
      seg += text[i++];
    }
  }
  return {out, false};
}

StopRun run_markup(const std::vector<std::string>& stops, const std::vector<MarkupPair>& pairs,
                   const std::vector<std::string>& chunks) {
  StopMatcher m(stops, pairs);
  StopRun r{"", false};
  for (const auto& c : chunks) r.emitted += m.push(c);
  r.emitted += m.flush();
  r.stopped = m.stopped();
  return r;
}

// Every split of `text` into three chunks gives the reference's result.
void check_markup_splits(const std::vector<std::string>& stops, const std::vector<MarkupPair>& pairs,
                         const std::string& text) {
  const StopRun want = reference_markup(stops, pairs, text);
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); j += 3) {
      const StopRun got = run_markup(stops, pairs, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      ASSERT_EQ(got.emitted, want.emitted) << stops[0] << " split at " << i << "," << j << " of " << text;
      ASSERT_EQ(got.stopped, want.stopped) << stops[0] << " in " << text;
    }
}

const MarkupPair kThink{"<think>", "</think>"};
const MarkupPair kTool{"<tool_call>", "</tool_call>"};

TEST(StopMatcher, AtomicTagsAreNeverCut) {
  const std::vector<MarkupPair> tags = {kThink};
  const std::string text = "<think>Let me think</think>\n\nAnswer: <b>yes</b>";
  for (std::vector<std::string> stops :
       {std::vector<std::string>{">"}, {"think"}, {"k>"}, {"/"}, {"<"}, {"</think>"}, {"<think>"}, {"think</think>"},
        {"\n"}, {"b>"}, {"me", ">"}, {"</"}})
    check_markup_splits(stops, tags, text);
  EXPECT_EQ(reference_markup({">"}, tags, text).emitted, text.substr(0, text.find("<b>") + 2));
  EXPECT_EQ(reference_markup({"think"}, tags, text).emitted, "<think>Let me ");
  EXPECT_EQ(reference_markup({"</think>"}, tags, text).emitted, "<think>Let me think");
  // A possible tag start that never completes is text at the end.
  StopMatcher m({"hi"}, tags);
  EXPECT_EQ(m.push("x<thi"), "x");
  EXPECT_EQ(m.flush(), "<t");
  EXPECT_TRUE(m.stopped());
}

// A tag that switches nothing is text, as the reasoning split and the tool-call parser leave it in
// the output (a random-weight model writes them anywhere): a "</think>" in the content with no
// reasoning open, a "<think>" inside the reasoning, a "<tool_call>" inside a call or inside the
// reasoning. A stop string matches in them as in any other text, so the output never holds the
// stop string. (They were markup wherever they stood: stop "ink" let "x</think>" through whole.)
TEST(StopMatcher, TagsThatSwitchNothingAreText) {
  auto run = [](const std::vector<std::string>& stops, const std::vector<MarkupPair>& pairs, const std::string& text) {
    return run_markup(stops, pairs, {text}).emitted;
  };
  EXPECT_EQ(run({"ink"}, {kThink}, "x</think>y"), "x</th");
  EXPECT_EQ(run({"n"}, {kThink}, "x</think>y"), "x</thi");
  EXPECT_EQ(run({"ink"}, {kThink}, "<think>a<think>b</think>c"), "<think>a<th");
  // The tags that do switch stay whole: the opening <think> and its </think>.
  EXPECT_EQ(run({"ink"}, {kThink}, "<think>a</think>c</think>"), "<think>a</think>c</th");
  // A prompt that opened <think>: the first </think> closes it, a <think> before it is text.
  EXPECT_EQ(run({"<t"}, {MarkupPair{"<think>", "</think>", true}}, "a<think>b</think>"), "a");
  EXPECT_EQ(run({"k>"}, {MarkupPair{"<think>", "</think>", true}}, "a</think>b</think>"), "a</think>b</thin");
  // Tool calls: inside a call its closing tag is markup, another <tool_call> is its text.
  EXPECT_EQ(run({"call"}, {kThink, kTool}, "<tool_call>{<tool_call>}</tool_call>"), "<tool_call>{<tool_");
  // ... and inside the reasoning (which the tool-call parser never sees) tool tags are text too.
  EXPECT_EQ(run({"ol_"}, {kThink, kTool}, "<think><tool_call></think><tool_call>"), "<think><to");
  EXPECT_EQ(run({"ol_"}, {kThink, kTool}, "<think>r</think><tool_call>x</tool_call>"),
            "<think>r</think><tool_call>x</tool_call>");
  // A prefilled call (tool_choice required) starts inside: its </tool_call> is markup, a stray one after it text.
  EXPECT_EQ(run({"/t"}, {kThink, MarkupPair{"<tool_call>", "</tool_call>", true}}, "x\"}</tool_call></tool_call>"),
            "x\"}</tool_call><");
  for (std::vector<std::string> stops : {std::vector<std::string>{"ink"}, {"<"}, {">"}, {"</think>"}, {"/t"}, {"k><"}})
    for (const std::string text : {"a</think>b<think>c<think>d</think>e</think>", "<tool_call>x<think>y</think>z</tool_call>w",
                                   "<think><tool_call></think></tool_call><tool_call></tool_call>"})
      check_markup_splits(stops, {kThink, kTool}, text);
}

TEST(StopMatcher, MarkupRandomStreamsMatchReference) {
  std::mt19937 rng(11);
  const std::vector<std::string> tags = {"<a>", "</a>", "<b>", "</b>"};
  const std::string alphabet = "ab<>/";
  for (int iter = 0; iter < 4000; ++iter) {
    std::vector<std::string> stops(1 + rng() % 3);
    for (auto& s : stops)
      for (size_t k = 0, n = 1 + rng() % 4; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    std::string text;
    for (size_t k = 0, n = rng() % 30; k < n; ++k) {
      if (rng() % 6 == 0) text += tags[rng() % tags.size()];
      else text += alphabet[rng() % alphabet.size()];
    }
    std::vector<std::string> chunks;
    for (size_t p = 0; p < text.size();) {
      const size_t len = std::min(text.size() - p, size_t(rng() % 5));
      chunks.push_back(text.substr(p, len));
      p += len;
    }
    const std::vector<MarkupPair> pairs = {{"<a>", "</a>", rng() % 4 == 0}, {"<b>", "</b>", rng() % 4 == 0}};
    const StopRun got = run_markup(stops, pairs, chunks), want = reference_markup(stops, pairs, text);
    ASSERT_EQ(got.emitted, want.emitted) << text << " stops " << stops[0];
    ASSERT_EQ(got.stopped, want.stopped) << text;
  }
}

}  // namespace
}  // namespace anvil
