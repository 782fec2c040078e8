// Shared helpers for the tokenizer tests: the conformance corpus and the expected results that
// scripts/make_tokenizer_fixtures.py froze from Hugging Face tokenizers.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace anvil::test {

inline std::string tokenizer_data(const std::string& rel) { return std::string(ANVIL_TEST_DATA) + "/tokenizer/" + rel; }

inline std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The tests that run Hugging Face tokenizers from Python as their reference (and skip without it).
inline bool python_tokenizers_available() { return std::system("python3 -c 'import tokenizers' 2>/dev/null") == 0; }
inline constexpr const char* kNoPythonTokenizers =
    "python3 with tokenizers is not installed (scripts/setup.sh puts it in .pydeps)";

// A fresh scratch directory for one test (per process).
inline std::string scratch_dir(const std::string& what) {
  const std::string dir = ::testing::TempDir() + "/" + what + "_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs the Python `script` with `dir` as its argument; the script writes dir/expected.json, which
// is returned (null, with a test failure, when the script fails).
inline nlohmann::json run_python_reference(const std::string& dir, const std::string& script) {
  std::ofstream(dir + "/ref.py") << script;
  if (std::system(("python3 " + dir + "/ref.py " + dir).c_str()) != 0) {
    ADD_FAILURE() << "the Python reference script failed (" << dir << "/ref.py)";
    return nullptr;
  }
  return nlohmann::json::parse(read_text(dir + "/expected.json"));
}

// tokenizers' ids for every text under each tokenizer file dir/NAME.json, loaded once per name:
// {NAME: [[ids of text 0], ...]} (null, with a test failure, when the script fails).
inline nlohmann::json reference_encodings(const std::string& dir, const std::vector<std::string>& names,
                                          const std::vector<std::string>& texts) {
  std::ofstream(dir + "/names.json") << nlohmann::json(names).dump();
  std::ofstream(dir + "/texts.json") << nlohmann::json(texts).dump();
  return run_python_reference(dir,
                              "import json, sys\n"
                              "from tokenizers import Tokenizer\n"
                              "d = sys.argv[1]\n"
                              "texts = json.load(open(d + '/texts.json'))\n"
                              "out = {}\n"
                              "for n in json.load(open(d + '/names.json')):\n"
                              "    tok = Tokenizer.from_file(d + '/' + n + '.json')\n"
                              "    out[n] = [tok.encode(t, add_special_tokens=False).ids for t in texts]\n"
                              "json.dump(out, open(d + '/expected.json', 'w'))\n");
}

inline std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// The generator the script uses for long inputs (same LCG, same part choice).
inline std::string build_long(const nlohmann::json& spec) {
  uint64_t x = spec["seed"].get<uint64_t>();
  const auto parts = spec["parts"].get<std::vector<std::string>>();
  std::string out;
  const int count = spec["count"].get<int>();
  for (int i = 0; i < count; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    out += parts[(x >> 33) % parts.size()];
  }
  return out;
}

inline std::string fnv1a64(const void* data, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001B3ull;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// name -> text for every corpus entry (long ones generated).
inline std::map<std::string, std::string> load_corpus() {
  std::map<std::string, std::string> out;
  for (const auto& e : read_jsonl(tokenizer_data("corpus.jsonl")))
    out[e["name"]] = e.contains("long") ? build_long(e["long"]) : e["text"].get<std::string>();
  return out;
}

// Loaded once per process: the Qwen3 tokenizer.json is 11 MB.
inline const Tokenizer& cached_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    auto r = Tokenizer::load(tokenizer_data(name + "/tokenizer.json"));
    if (!r) {
      std::fprintf(stderr, "cannot load %s: %s\n", name.c_str(), r.status().message().c_str());
      std::abort();
    }
    it = cache.emplace(name, std::move(r).value()).first;
  }
  return *it->second;
}

inline const std::vector<std::string>& fixture_tokenizers() {
  static const std::vector<std::string> names = {"qwen3", "tiny-code", "llama3-style", "gpt2-style",
                                                      "gpt2-prefix-space"};
  return names;
}

}  // namespace anvil::test
