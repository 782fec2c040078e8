// End to end on a checkpoint that ships a SentencePiece-style tokenizer (Mistral-7B / Mixtral's
// tokenizer.json layout: Prepend + Replace normalizer, byte fallback) and a Mistral-Instruct chat
// template: tests/data/sp-tiny-llama, written by scripts/make_sentencepiece_model.py (a tiny random
// Llama; its answers are noise, but every step from chat template to streamed text is real).
// References: the rendered prompts come from transformers' apply_chat_template and their ids from
// `tokenizers` (frozen in expected.json); the streamed text is checked against decode().
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_helpers.h"
#include "kvstore/kvstore.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

using anvil::test::run_anvil;
using anvil::test::shell_quote;
namespace fs = std::filesystem;

namespace {

const std::string kModel = std::string(ANVIL_TEST_DATA) + "/sp-tiny-llama";

nlohmann::json expected() {
  std::ifstream f(kModel + "/expected.json");
  return nlohmann::json::parse(f);
}

nlohmann::json last_json_line(const std::string& out) {
  auto end = out.find_last_not_of('\n');
  if (end == std::string::npos) return nlohmann::json();
  auto start = out.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return nlohmann::json::parse(out.substr(start, end - start + 1), nullptr, false);
}

const anvil::Tokenizer& model_tokenizer() {
  static std::unique_ptr<anvil::Tokenizer> tok = [] {
    auto r = anvil::Tokenizer::load(kModel + "/tokenizer.json");
    EXPECT_TRUE(r.is_ok()) << r.status().message();
    return r.is_ok() ? std::move(r).value() : nullptr;
  }();
  return *tok;
}

std::string csv(const nlohmann::json& ids) {
  std::string s;
  for (const auto& i : ids) s += (s.empty() ? "" : ",") + std::to_string(i.get<int>());
  return s;
}

const char* kQuestion = "Hello, who are you?";

}  // namespace

// The chat template renders as transformers does, and the rendered prompt tokenizes exactly as
// `tokenizers` does ([INST] as special tokens, "▁" prepended to each piece between them).
TEST(SentencePieceModel, ChatPromptRendersAndTokenizesExactly) {
  const auto e = expected();
  for (auto it = e["conversations"].begin(); it != e["conversations"].end(); ++it) {
    SCOPED_TRACE(it.key());
    const fs::path msgs = fs::temp_directory_path() / ("anvil_sp_msgs_" + it.key() + ".json");
    std::ofstream(msgs) << it.value()["messages"].dump();
    auto r = run_anvil({"template", "-m", kModel, "--messages", msgs.string()}, true);
    fs::remove(msgs);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    EXPECT_EQ(r.out, it.value()["text"].get<std::string>());
    auto t = run_anvil({"tokenize", "-m", kModel, "--text", it.value()["text"].get<std::string>(), "--json"}, true);
    ASSERT_EQ(t.exit_code, 0) << t.out;
    EXPECT_EQ(nlohmann::json::parse(t.out)["ids"], it.value()["ids"]);
  }
}

// generate --chat feeds the model exactly those ids (same continuation as --ids with them), and the
// text it streams is the tokenizer's decode of the generated ids, whole UTF-8.
TEST(SentencePieceModel, GenerateChatEndToEnd) {
  const auto want = expected()["conversations"]["one_turn"];
  auto chat = run_anvil({"generate", "-m", kModel, "--chat", "-p", kQuestion, "-n", "24", "--temp", "0", "--json"});
  ASSERT_EQ(chat.exit_code, 0) << chat.out;
  const auto jc = last_json_line(chat.out);
  ASSERT_TRUE(jc.is_object()) << chat.out;
  EXPECT_EQ(jc["prompt_tokens"].get<size_t>(), want["ids"].size());
  ASSERT_GT(jc["ids"].size(), 0u);

  auto by_ids = run_anvil({"generate", "-m", kModel, "--ids", csv(want["ids"]), "-n", "24", "--temp", "0", "--json"});
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.out;
  EXPECT_EQ(last_json_line(by_ids.out)["ids"], jc["ids"]);

  const auto ids = jc["ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> shown;  // the answer without a final EOS
  for (int32_t id : ids)
    if (id != 2) shown.push_back(id);
  const std::string text = jc["text"];
  EXPECT_TRUE(anvil::tok::is_valid_utf8(text));
  EXPECT_EQ(text, model_tokenizer().decode(shown, /*skip_special=*/true));
}

// anvil run -p answers one message through the same template and tokenizer: the same greedy
// answer as generate --chat, printed as text.
TEST(SentencePieceModel, RunAnswersOneMessage) {
  auto gen = run_anvil({"generate", "-m", kModel, "--chat", "-p", kQuestion, "-n", "16", "--temp", "0", "--json"});
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  auto run = run_anvil({"run", "-m", kModel, "-p", kQuestion, "-n", "16", "--temp", "0"});
  ASSERT_EQ(run.exit_code, 0) << run.out;
  EXPECT_EQ(run.out, last_json_line(gen.out)["text"].get<std::string>() + "\n");
}

// The streamed text equals `tokenizers`' own decode of the generated ids (run from Python when
// the package is installed).
TEST(SentencePieceModel, StreamedTextMatchesTokenizersDecode) {
  if (std::system("python3 -c 'import tokenizers' >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "python3 with the tokenizers package is not available";
  auto gen = run_anvil({"generate", "-m", kModel, "--chat", "-p", "Tell me a story.", "-n", "48", "--temp", "0.8",
                        "--seed", "3", "--ignore-eos", "--json"});
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  const auto j = last_json_line(gen.out);
  const fs::path out = fs::temp_directory_path() / "anvil_sp_decode.txt";
  const std::string py = "import sys; from tokenizers import Tokenizer; t = Tokenizer.from_file(sys.argv[1]); "
                         "open(sys.argv[3], 'w', encoding='utf-8').write(t.decode([int(x) for x in sys.argv[2].split(',')], "
                         "skip_special_tokens=True))";
  const std::string cmd = "python3 -c " + shell_quote(py) + " " + shell_quote(kModel + "/tokenizer.json") + " " +
                          shell_quote(csv(j["ids"])) + " " + shell_quote(out.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out, std::ios::binary);
  const std::string ref((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  fs::remove(out);
  EXPECT_EQ(j["text"].get<std::string>(), ref);
}

// The interactive loop (stdin piped): two turns, the second rendered with the first answer and
// "</s>" in the history by the Mistral template; the first answer equals generate --chat's.
TEST(SentencePieceModel, RunTwoTurnsFromStdin) {
  auto gen = run_anvil({"generate", "-m", kModel, "--chat", "-p", kQuestion, "-n", "8", "--temp", "0", "--json"});
  ASSERT_EQ(gen.exit_code, 0) << gen.out;
  const std::string first = last_json_line(gen.out)["text"];
  const std::string cmd = "printf '%s\\n%s\\n/quit\\n' " + shell_quote(kQuestion) + " " + shell_quote("And in French?") +
                          " | " + shell_quote(ANVIL_BINARY) + " run -m " + shell_quote(kModel) +
                          " -n 8 --temp 0 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  // Output: banner, "> " + answer 1 + "\n", "> " + answer 2 + "\n", "> ".
  const size_t a1 = out.find("> ");
  ASSERT_NE(a1, std::string::npos) << out;
  EXPECT_EQ(out.compare(a1 + 2, first.size() + 1, first + "\n"), 0) << out;
  const size_t a2 = out.find("> ", a1 + 2 + first.size());
  ASSERT_NE(a2, std::string::npos) << out;
  EXPECT_NE(out.find("> ", a2 + 2), std::string::npos) << "no prompt after the second answer:\n" << out;
  EXPECT_TRUE(anvil::tok::is_valid_utf8(out));
}

// A raw prompt gets the BOS that tokenizer_config.json's add_bos_token asks for (its tokenizer.json
// has no post-processor, as LlamaConverter writes it): `tokenize --add-special-tokens` is <s> + the
// plain ids, generate --raw feeds exactly those (same greedy continuation as --ids with them), and
// --no-special-tokens feeds the plain ids. The chat path adds none (GenerateChatEndToEnd: its
// prompt is the template's, which starts with <s> once).
TEST(SentencePieceModel, RawPromptStartsWithBos) {
  auto plain = run_anvil({"tokenize", "-m", kModel, "--text", kQuestion, "--json"}, true);
  auto with = run_anvil({"tokenize", "-m", kModel, "--text", kQuestion, "--json", "--add-special-tokens"}, true);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  ASSERT_EQ(with.exit_code, 0) << with.out;
  auto plain_ids = nlohmann::json::parse(plain.out)["ids"];
  auto with_ids = nlohmann::json::parse(with.out)["ids"];
  nlohmann::json want = nlohmann::json::array({1});
  for (const auto& i : plain_ids) want.push_back(i);
  EXPECT_EQ(with_ids, want);

  auto raw = run_anvil({"generate", "-m", kModel, "--raw", "-p", kQuestion, "-n", "12", "--temp", "0", "--json"});
  ASSERT_EQ(raw.exit_code, 0) << raw.out;
  const auto jr = last_json_line(raw.out);
  EXPECT_EQ(jr["prompt_tokens"].get<size_t>(), want.size());
  auto by_ids = run_anvil({"generate", "-m", kModel, "--ids", csv(want), "-n", "12", "--temp", "0", "--json"});
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.out;
  EXPECT_EQ(last_json_line(by_ids.out)["ids"], jr["ids"]);

  auto off = run_anvil({"generate", "-m", kModel, "--raw", "--no-special-tokens", "-p", kQuestion, "-n", "1", "--temp",
                        "0", "--json"});
  ASSERT_EQ(off.exit_code, 0) << off.out;
  EXPECT_EQ(last_json_line(off.out)["prompt_tokens"].get<size_t>(), plain_ids.size());
}

// anvil run's completion mode (the model without its chat template) on a tokenizer that adds a BOS:
// when the text outgrows --ctx, its oldest tokens are dropped after the BOS, which stays (it was
// dropped with them, so every later prompt began mid-text without it). Turn by turn (--resume), each
// prompt is the BOS and the last tokens of the text so far plus the new line (encoded alone); with
// --no-special-tokens the text has no BOS and none is put back.
TEST(SentencePieceModel, RunCompletionModeKeepsTheBosWhenTheTextIsCut) {
  const fs::path dir = fs::temp_directory_path() / ("anvil_sp_nochat_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy(kModel, dir / "model", fs::copy_options::recursive);
  const fs::path cfg_path = dir / "model" / "tokenizer_config.json";
  auto cfg = nlohmann::json::parse(std::ifstream(cfg_path));
  ASSERT_TRUE(cfg.value("add_bos_token", false));
  cfg.erase("chat_template");
  std::ofstream(cfg_path) << cfg.dump();
  const int32_t bos = 1;
  const std::vector<std::string> lines = {"Once upon a time there was a", "and then the dragon came and",
                                          "so it goes on and on and on", "until the end of the story"};
  for (bool special : {true, false}) {
    SCOPED_TRACE(special ? "with the BOS" : "--no-special-tokens");
    const std::string store = (dir / (special ? "store-bos" : "store-plain")).string();
    std::vector<int32_t> text;  // the document after the last turn
    bool dropped = false;
    for (size_t k = 0; k < lines.size(); ++k) {
      std::vector<std::string> args = {"run", "-m", (dir / "model").string(), "-p", lines[k], "-n", "8", "-c", "40",
                                       "--temp", "0", "--kv-store", store, "--session", "s"};
      if (k > 0) args.push_back("--resume");
      if (!special) args.push_back("--no-special-tokens");
      auto r = run_anvil(args, true);
      ASSERT_EQ(r.exit_code, 0) << r.out;
      const size_t at = r.out.find("[anvil] prompt ");
      ASSERT_NE(at, std::string::npos) << r.out;
      const size_t n = std::stoul(r.out.substr(at + 15));
      const bool cut = r.out.find("dropped its first") != std::string::npos;
      dropped = dropped || cut;
      anvil::KVStoreOptions o;
      o.dir = store;
      auto st = anvil::KVStore::open(o);
      ASSERT_TRUE(st.is_ok()) << st.status().message();
      auto s = (*st)->get_session("s");
      ASSERT_TRUE(s.is_ok() && s->has_value());
      ASSERT_GE((*s)->tokens.size(), n);
      const std::vector<int32_t> prompt((*s)->tokens.begin(), (*s)->tokens.begin() + long(n));
      // What the prompt holds: the text so far and the new line (the first line: with the BOS).
      std::vector<int32_t> whole = text;
      if (k == 0 && special) whole.push_back(bos);
      for (int32_t id : model_tokenizer().encode(k == 0 ? lines[k] : "\n" + lines[k], false)) whole.push_back(id);
      std::vector<int32_t> want = whole;
      if (cut) {
        ASSERT_LT(n, whole.size()) << r.out;
        want.assign(whole.end() - long(n) + (special ? 1 : 0), whole.end());
        if (special) want.insert(want.begin(), bos);
      }
      EXPECT_EQ(prompt, want) << "turn " << k << ": " << r.out;
      EXPECT_EQ(!prompt.empty() && prompt[0] == bos, special) << "turn " << k << ": " << r.out;
      auto meta = nlohmann::json::parse((*s)->meta, nullptr, false);
      ASSERT_TRUE(meta.is_object()) << (*s)->meta;
      text = meta["document"].get<std::vector<int32_t>>();
      ASSERT_GE(text.size(), n);
      EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), text.begin())) << "turn " << k;
    }
    EXPECT_TRUE(dropped) << "no turn outgrew --ctx 40: lengthen the lines";
  }
  fs::remove_all(dir);
}
