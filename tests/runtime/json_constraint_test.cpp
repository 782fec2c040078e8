// JSON mode: the byte automaton (runtime/json_constraint.h) against Python's json module
// (tests/runtime/json_mode_reference.py), the trie mask (runtime/json_mask.h) against testing every
// token, and the Sampler's allowed mask.
#include <gtest/gtest.h>

#include <cstdio>
#include <deque>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <unordered_set>

#include "runtime/json_constraint.h"
#include "runtime/json_mask.h"
#include "runtime/sampler.h"

namespace anvil {
namespace {

std::string run_command(const std::string& cmd, int* rc) {
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    *rc = -1;
    return {};
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  *rc = pclose(f);
  return out;
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(char(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string to_hex(std::string_view s) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) out += d[c >> 4], out += d[c & 15];
  return out;
}

bool has_python() { return std::system("python3 -c 'import json' >/dev/null 2>&1") == 0; }
std::string reference() { return "python3 " + std::string(ANVIL_SOURCE_DIR) + "/tests/runtime/json_mode_reference.py"; }

struct StateHash {
  size_t operator()(const JsonAutomaton& a) const { return size_t(a.hash()); }
};

// The shortest way to finish a text in state `s`, over a few bytes that close every construct
// (a breadth-first search of the automaton's states; of the openers only '{', which the start needs).
// "" when there is none, which for a state the automaton accepted is a bug.
std::optional<std::string> completion(const JsonAutomaton& s) {
  if (s.complete()) return std::string();
  const std::string alphabet = std::string("{\"}]0:elrusadc\\") + "\x80\x90\xA0";
  std::deque<std::pair<JsonAutomaton, std::string>> q{{s, ""}};
  std::unordered_set<JsonAutomaton, StateHash> seen{s};
  while (!q.empty()) {
    auto [st, path] = q.front();
    q.pop_front();
    for (char c : alphabet) {
      JsonAutomaton n = st;
      if (!n.push(uint8_t(c)) || !seen.insert(n).second) continue;
      if (n.complete()) return path + c;
      q.push_back({n, path + c});
    }
  }
  return std::nullopt;
}

// Every generated text (valid ones, their mutants and truncations, hand-written traps) gets the
// reference's verdict; every rejection happens no earlier than the first changed byte of a mutant
// (the bytes before it are a prefix of a valid text) and no later than it should: the bytes before
// the rejected one, finished by the shortest completion, are accepted by Python too. The same for
// every text that ends unfinished.
TEST(JsonAutomaton, AgreesWithPythonJson) {
  if (!has_python()) GTEST_SKIP() << "python3 is missing";
  int rc = 0;
  const std::string corpus = run_command(reference() + " corpus 20240611 6000", &rc);
  ASSERT_EQ(rc, 0) << corpus;
  std::istringstream in(corpus);
  std::string line;
  int n = 0, valid = 0, rejected_inside = 0, multibyte = 0, escapes = 0;
  std::vector<std::string> finished;  // prefix + completion: each must be valid
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string hex;
    int verdict = 0;
    size_t safe = 0;
    ls >> hex >> verdict >> safe;
    const std::string text = from_hex(hex);
    ++n;
    valid += verdict;
    for (unsigned char c : text) multibyte += c >= 0x80;
    escapes += text.find("\\u") != std::string::npos;
    JsonAutomaton a;
    size_t at = 0;
    const bool ok = a.push(text, &at);
    EXPECT_EQ(ok && a.complete(), verdict == 1) << "text " << n << ": " << text << " (rejected at byte " << at << ")";
    if (ok && a.complete()) continue;
    if (!ok) {
      EXPECT_GE(at, std::min(safe, text.size())) << "rejected too early: " << text;
      rejected_inside += at < text.size();
    }
    JsonAutomaton b;
    ASSERT_TRUE(b.push(std::string_view(text).substr(0, at)));
    auto tail = completion(b);
    ASSERT_TRUE(tail.has_value()) << "accepted a prefix with no completion: " << text.substr(0, at);
    finished.push_back(text.substr(0, at) + *tail);
  }
  EXPECT_EQ(n, 6000);
  EXPECT_GT(valid, 1000);
  EXPECT_GT(rejected_inside, 1000);
  EXPECT_GT(multibyte, 1000);
  EXPECT_GT(escapes, 500);
  const std::string path = ::testing::TempDir() + "anvil_json_completions.txt";
  {
    std::ofstream f(path);
    for (const std::string& t : finished) f << to_hex(t) << "\n";
  }
  const std::string verdicts = run_command(reference() + " check " + path, &rc);
  ASSERT_EQ(rc, 0) << verdicts;
  std::remove(path.c_str());
  std::istringstream vin(verdicts);
  size_t i = 0;
  for (std::string v; std::getline(vin, v); ++i) {
    ASSERT_LT(i, finished.size());
    EXPECT_EQ(v, "1") << "the automaton accepted the prefix of " << finished[i] << " which Python cannot complete";
  }
  EXPECT_EQ(i, finished.size());
}

TEST(JsonAutomaton, RejectsAtTheOffendingByte) {
  struct Case {
    std::string text;
    size_t at;  // index of the first refused byte
  };
  const Case cases[] = {
      {"[]", 0},                          // the top level is an object
      {"{\"a\":01}", 6},                  // a leading zero
      {"{\"a\":1.}", 7},                  // a fraction needs a digit
      {"{\"a\":-x}", 6},
      {"{\"a\":1e+}", 8},
      {"{\"a\":\"\\ud800x\"}", 12},       // a high surrogate without its low one
      {"{\"a\":\"\\udc00\"}", 9},         // a low surrogate alone
      {"{\"a\":\"\\ud800\\u0041\"}", 14},
      {"{\"a\":\"\x01\"}", 6},            // a raw control character
      {"{\"a\":\"\xC0\x80\"}", 6},        // overlong
      {"{\"a\":\"\xE0\x80\x80\"}", 7},    // overlong, caught at its second byte
      {"{\"a\":\"\xED\xA0\x80\"}", 7},    // an encoded surrogate
      {"{\"a\":\"\xF4\x90\x80\x80\"}", 7},  // above U+10FFFF
      {"{\"a\":\"\xC3\"}", 7},            // a character cut short
      {"{\"a\":tru}", 8},
      {"{\"a\":1,}", 7},
      {"{\"a\":[1}", 7},
      {"{}\n", 2},                        // nothing after the object
      {"{}{}", 2},
  };
  for (const Case& c : cases) {
    JsonAutomaton a;
    size_t at = 0;
    EXPECT_FALSE(a.push(c.text, &at)) << c.text;
    EXPECT_EQ(at, c.at) << c.text;
  }
}

TEST(JsonAutomaton, BoundsNestingAndWhitespace) {
  std::string deep = "{\"a\":";
  for (int i = 1; i < kJsonMaxDepth; ++i) deep += "[";
  JsonAutomaton a;
  ASSERT_TRUE(a.push(deep));
  EXPECT_EQ(a.depth(), kJsonMaxDepth);
  JsonAutomaton b = a;
  EXPECT_FALSE(b.push('['));
  b = a;
  EXPECT_FALSE(b.push('{'));
  b = a;
  EXPECT_TRUE(b.push('1'));
  JsonAutomaton w;
  EXPECT_TRUE(w.push(std::string(kJsonMaxLeadingWhitespace, '\n')));
  EXPECT_FALSE(JsonAutomaton(w).push(' ')) << "more whitespace before the object";
  EXPECT_TRUE(w.push("{" + std::string(kJsonMaxWhitespace, ' ')));
  EXPECT_FALSE(w.push(' '));
  JsonAutomaton v;
  EXPECT_TRUE(v.push("{" + std::string(kJsonMaxWhitespace, '\n') + "\"k\"" + std::string(kJsonMaxWhitespace, '\t')));
  EXPECT_FALSE(v.push('\t'));
}

// A small vocabulary: every single byte plus multi-byte tokens that cross JSON's tokens, strings'
// ends, escapes and UTF-8 characters.
std::vector<std::string> small_vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, char(b)));
  for (const char* t : {"{\"", "\":", "\"}", " {", "\n  ", "  ", "true", "false", "null", "},{\"", "\\u00", "\\ud83d",
                        "\\ude00", "\xC3\xA9", "\xE4\xB8", "\xAD\"", "\xF0\x9F", "\x98\x80", "\": \"", "\"]", "[\"",
                        "123", "0.5", "e+", "-1", "\"}\n", "}}", "]}", "\", \"", "\\n", "\\\"", "na", "me", "{\"name\":"})
    v.push_back(t);
  v.push_back("");  // a special token (no bytes)
  v.push_back("");  // EOS
  return v;
}

void expect_mask_matches_brute_force(const JsonVocab& vocab, const JsonAutomaton& s, const std::vector<uint64_t>& mask,
                                     int upto) {
  for (int id = 0; id < upto; ++id) {
    JsonAutomaton t = s;
    const std::string& b = vocab.bytes(id);
    const bool ok = !b.empty() && !s.complete() && t.push(b);
    ASSERT_EQ(mask_has(mask, id), ok) << "token " << id << " '" << b << "'";
  }
}

// Along random walks (random allowed tokens), the trie's mask is exactly the set of tokens whose
// bytes the automaton accepts, it is never empty before the object closes, and it is exactly the
// end-of-sequence ids after.
TEST(JsonMask, EqualsTestingEveryTokenAndNeverEmpties) {
  const std::vector<std::string> bytes = small_vocab();
  const int V = int(bytes.size()) + 5;  // the model's vocabulary may be larger than the tokenizer's
  const int32_t eos = int32_t(bytes.size()) - 1;
  auto vocab = JsonVocab::create(bytes, V, {eos});
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().message();
  std::mt19937 rng(3);
  int completed = 0;
  for (int walk = 0; walk < 200; ++walk) {
    JsonConstraint c(*vocab);
    for (int step = 0; step < 300; ++step) {
      const std::vector<uint64_t>& m = c.allowed();
      std::vector<int32_t> ids;
      for (int id = 0; id < V; ++id)
        if (mask_has(m, id)) ids.push_back(id);
      if (c.complete()) {
        EXPECT_EQ(ids, std::vector<int32_t>{eos});
        ++completed;
        break;
      }
      ASSERT_FALSE(ids.empty()) << "walk " << walk << " step " << step;
      expect_mask_matches_brute_force(**vocab, c.state(), m, V);
      EXPECT_FALSE(mask_has(m, eos));
      // Closing bytes more often as the walk goes on, so that walks finish.
      int32_t pick = ids[rng() % ids.size()];
      if (step > 40 && rng() % 2)
        for (int32_t id : ids)
          if ((*vocab)->bytes(id) == "}" || (*vocab)->bytes(id) == "]" || (*vocab)->bytes(id) == "\"") pick = id;
      ASSERT_TRUE(c.accept(pick));
    }
  }
  EXPECT_GT(completed, 20);
  JsonConstraint c(*vocab);
  EXPECT_FALSE(c.accept(eos));
  EXPECT_FALSE(c.accept(int32_t(bytes.size()) - 2));  // no bytes
  EXPECT_FALSE(c.accept(V - 1));                      // beyond the tokenizer
  EXPECT_FALSE(c.accept('['));
  EXPECT_TRUE(c.accept('{'));
}

TEST(JsonMask, RefusesAVocabularyWithoutEos) {
  auto v = JsonVocab::create(small_vocab(), 300, {});
  ASSERT_FALSE(v.is_ok());
  EXPECT_NE(v.status().message().find("end-of-sequence"), std::string::npos) << v.status().message();
  EXPECT_FALSE(JsonVocab::create(small_vocab(), 300, {400}).is_ok());
}

// The Sampler's allowed mask: greedy picks the best allowed token, and a seeded draw picks exactly
// what it picks from logits where the disallowed tokens are -inf already.
TEST(JsonMask, SamplerDrawsFromTheMaskedDistribution) {
  const int V = 1000;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (float t : {0.0f, 0.8f, 1.5f}) {
    SamplingParams p;
    p.temperature = t;
    p.top_p = t > 1.0f ? 0.9f : 1.0f;
    p.seed = 77;
    Sampler masked(p), plain(p);
    for (int step = 0; step < 200; ++step) {
      std::vector<float> logits(V);
      for (float& x : logits) x = nd(rng);
      std::vector<uint64_t> mask((V + 63) / 64, 0);
      for (int id = 0; id < V; ++id)
        if (rng() % 7 == 0) mask[size_t(id) / 64] |= uint64_t(1) << (id % 64);
      std::vector<float> pre = logits;
      for (int id = 0; id < V; ++id)
        if (!mask_has(mask, id)) pre[size_t(id)] = -INFINITY;
      const int32_t best = int32_t(std::max_element(pre.begin(), pre.end()) - pre.begin());
      masked.set_allowed(mask.data());
      const int32_t a = masked.sample(logits.data(), V, {});
      const int32_t b = plain.sample(pre.data(), V, {});
      ASSERT_TRUE(mask_has(mask, a));
      ASSERT_EQ(a, b) << "temperature " << t << " step " << step;
      if (t == 0.0f) EXPECT_EQ(a, best);
    }
  }
}

}  // namespace
}  // namespace anvil
