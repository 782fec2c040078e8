// anvil tokenize: prints the token ids of a text (-p TEXT, -f FILE, else all of stdin) under a model's
// tokenizer.json, exactly as Hugging Face tokenizers' encode(text, add_special_tokens=False);
// --add-special-tokens: with the special tokens a raw prompt gets (BOS/EOS; tokenizer_config.json's
// add_bos_token/add_eos_token apply as in transformers), i.e. what `anvil generate --raw` feeds.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <string>

#include "base/optional_file.h"
#include "cli/command.h"
#include "cli/common.h"
#include "format/hf_cache.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_config.h"

namespace anvil::cli {
namespace {

struct TokenizeArgs {
  std::string model, revision;
  PromptOptions text;
  bool json = false, add_special = false;
};

// -m: a model directory holding tokenizer.json, or a Hugging Face repo id in the local cache.
int run_tokenize(const TokenizeArgs& a) {
  namespace fs = std::filesystem;
  auto resolved = resolve_model_path(a.model, a.revision, ModelFiles::kTokenizer);
  if (!resolved.is_ok()) return fail(resolved.status().message());
  const fs::path dir(*resolved);
  const fs::path tj = dir / "tokenizer.json";
  if (!path_present(tj.string()))  // a link to nothing is there: Tokenizer::load names it
    return fail(tj.string() + ": file not found (the model directory has no tokenizer.json)");
  auto tok = Tokenizer::load(tj.string());
  if (!tok.is_ok()) return fail(tok.status().message());
  if (a.add_special && path_present((dir / "tokenizer_config.json").string())) {
    auto cfg = load_tokenizer_config(dir.string());
    if (!cfg.is_ok()) return fail(cfg.status().message());
    if (Status st = apply_special_token_flags(*cfg, tok->get()); !st.is_ok()) return fail(st.message());
  }

  // Unlike a prompt, an empty text is fine here: it has no tokens.
  std::string text;
  if (a.text.text || a.text.file) {
    auto t = read_prompt(a.text, /*allow_empty=*/true);
    if (!t.is_ok()) return fail(t.status().message());
    text = **t;
  } else {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  const std::vector<int32_t> ids = (*tok)->encode(text, a.add_special);

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
  add_revision_option(sub, a->revision);
  add_prompt_options(sub, a->text, "Text to tokenize (default: all of stdin)");
  sub.add_option_function<std::string>("--text", [a](const std::string& v) { a->text.text = v; })
      ->group("");  // the old spelling, hidden
  sub.add_flag("--add-special-tokens", a->add_special,
               "Add the special tokens a raw prompt gets (BOS/EOS), as encode(text, add_special_tokens=True)");
  sub.add_flag("--json", a->json, "Print {\"ids\": [...]} instead of space-separated ids");
  return [a]() { return run_tokenize(*a); };
});

}  // namespace
}  // namespace anvil::cli
