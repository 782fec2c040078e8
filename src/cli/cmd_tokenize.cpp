// anvil tokenize: prints the token ids of a text (--text, else all of stdin) under a model's
// tokenizer.json, exactly as Hugging Face tokenizers' encode(text, add_special_tokens=False).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>

#include "cli/command.h"
#include "format/hf_cache.h"
#include "tokenizer/tokenizer.h"

namespace anvil::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  bool has_text = false;
  bool json = false;
};

// -m: a model directory holding tokenizer.json, or a Hugging Face repo id in the local cache.
int run_tokenize(const TokenizeArgs& a) {
  namespace fs = std::filesystem;
  auto resolved = resolve_model_path(a.model);
  if (!resolved.is_ok()) return fail(resolved.status().message());
  const fs::path dir(*resolved);
  std::error_code ec;
  const fs::path tj = dir / "tokenizer.json";
  if (!fs::is_regular_file(tj, ec)) return fail(tj.string() + ": file not found (the model directory has no tokenizer.json)");
  auto tok = Tokenizer::load(tj.string());
  if (!tok.is_ok()) return fail(tok.status().message());

  std::string text = a.text;
  if (!a.has_text) text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  const std::vector<int32_t> ids = (*tok)->encode(text);

  std::string out = a.json ? "{\"ids\": [" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += a.json ? ", " : " ";
    out += std::to_string(ids[i]);
  }
  out += a.json ? "]}\n" : "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

Command reg("tokenize", "Print the token ids of a text under a model's tokenizer.json", 70, [](CLI::App& sub) {
  auto a = std::make_shared<TokenizeArgs>();
  sub.add_option("-m,--model", a->model, "Model directory containing tokenizer.json, or a Hugging Face repo id in the local cache")->required();
  sub.add_option("--text", a->text, "Text to tokenize (default: read all of stdin)");
  sub.add_flag("--json", a->json, "Print {\"ids\": [...]} instead of space-separated ids");
  return [a, &sub]() {
    a->has_text = sub.count("--text") > 0;
    return run_tokenize(*a);
  };
});

}  // namespace
}  // namespace anvil::cli
