// Tokenizer encode throughput (MB/s of UTF-8 input, one thread) on ~1 MB of mixed text: the
// conformance corpus (prose, code, whitespace runs, CJK, emoji, special tokens) interleaved with
// generated words (Zipf-distributed over a 50k-word lexicon, so the pre-token cache sees natural
// reuse, not only repeats). BM_EncodeUniformWords is the cache-hostile worst case.
// Target: >= 10 MB/s with the Qwen3 tokenizer.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

std::vector<std::string> corpus_texts() {
  std::vector<std::string> texts;
  std::ifstream f(std::string(ANVIL_TEST_DATA) + "/tokenizer/corpus.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("text") && !j["text"].get<std::string>().empty()) texts.push_back(j["text"]);
  }
  if (texts.empty()) texts.push_back("The quick brown fox jumps over the lazy dog.\n");
  return texts;
}

// Generated words from syllables. zipf=true: a 50,000-word lexicon drawn with Zipf(1.0)
// frequencies, like natural text; zipf=false: every word uniformly random over ~350k spellings,
// which defeats the pre-token cache (a worst case, not the target).
std::string mixed_text(size_t target_bytes, bool zipf) {
  const std::vector<std::string> texts = corpus_texts();
  static const char* syl[] = {"ka", "lo", "mi", "ne", "tra", "por", "ex", "ion", "de", "su", "qu", "an",
                              "re", "th", "ing", "st", "ver", "al", "cy", "bo", "zu", "pe", "ri", "ful"};
  uint64_t x = 12345;
  auto next = [&]() { return (x = x * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  auto make_word = [&]() {
    std::string w;
    for (uint64_t s = 0, n = 1 + next() % 4; s < n; ++s) w += syl[next() % (sizeof syl / sizeof *syl)];
    return w;
  };
  std::vector<std::string> lexicon;
  std::vector<double> cdf;
  if (zipf) {
    double acc = 0;
    for (int r = 1; r <= 50000; ++r) {
      lexicon.push_back(make_word());
      acc += 1.0 / r;
      cdf.push_back(acc);
    }
  }
  auto word = [&]() -> std::string {
    if (!zipf) return make_word();
    const double u = double(next() % 1000000007) / 1000000007.0 * cdf.back();
    return lexicon[size_t(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin())];
  };
  std::string out;
  while (out.size() < target_bytes) {
    if (next() % 4 == 0) {
      out += texts[next() % texts.size()];
    } else {
      for (int w = 0; w < 12; ++w) {
        out += ' ';
        out += word();
        if (next() % 8 == 0) out += next() % 2 ? "," : ".\n";
      }
    }
  }
  return out;
}

const anvil::Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<anvil::Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) {
    auto r = anvil::Tokenizer::load(std::string(ANVIL_TEST_DATA) + "/tokenizer/" + name + "/tokenizer.json");
    if (!r) {
      std::fprintf(stderr, "%s\n", r.status().message().c_str());
      std::abort();
    }
    slot = std::move(r).value();
  }
  return *slot;
}

void encode_bench(benchmark::State& state, const std::string& name, bool zipf = true) {
  const anvil::Tokenizer& tok = tokenizer(name);
  const std::string text = mixed_text(1 << 20, zipf);
  size_t ids = 0;
  for (auto _ : state) {
    auto v = tok.encode(text);
    ids = v.size();
    benchmark::DoNotOptimize(v.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
  state.counters["bytes_per_token"] = double(text.size()) / double(ids ? ids : 1);
}

void BM_EncodeMixed_Qwen3(benchmark::State& s) { encode_bench(s, "qwen3"); }
void BM_EncodeMixed_TinyCode(benchmark::State& s) { encode_bench(s, "tiny-code"); }
void BM_EncodeUniformWords_Qwen3(benchmark::State& s) { encode_bench(s, "qwen3", false); }
// SentencePiece-style BPE in Mistral / Mixtral's layout (no pre-tokenizer: each piece between
// special tokens is one BPE word, merged with the heap path), a 900-piece vocab with byte fallback.
void BM_EncodeMixed_SentencePiece(benchmark::State& s) { encode_bench(s, "sp-llama"); }

void decode_bench(benchmark::State& state, const std::string& name) {
  const anvil::Tokenizer& tok = tokenizer(name);
  const std::string text = mixed_text(1 << 20, true);
  const auto ids = tok.encode(text);
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
}

void BM_Decode_Qwen3(benchmark::State& s) { decode_bench(s, "qwen3"); }
// The decoder chain Replace, ByteFallback, Fuse, Strip (the streaming implementation).
void BM_Decode_SentencePiece(benchmark::State& s) { decode_bench(s, "sp-llama"); }

void BM_Load_Qwen3(benchmark::State& state) {
  for (auto _ : state) {
    auto r = anvil::Tokenizer::load(std::string(ANVIL_TEST_DATA) + "/tokenizer/qwen3/tokenizer.json");
    benchmark::DoNotOptimize(r.is_ok());
  }
}

BENCHMARK(BM_EncodeMixed_Qwen3)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeMixed_TinyCode)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeUniformWords_Qwen3)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeMixed_SentencePiece)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Decode_Qwen3)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Decode_SentencePiece)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Load_Qwen3)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace

BENCHMARK_MAIN();
