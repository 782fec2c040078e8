// The special tokens of a raw prompt: Tokenizer::encode(text, add_special_tokens=true) against
// tests/data/tokenizer/postproc/cases.jsonl (scripts/make_tokenizer_fixtures.py --post-processors):
// `tokenizers`' encode(add_special_tokens=True) for every family fixture and for the post-processor
// types real files use (Llama 3's Sequence[ByteLevel, Template], Mistral's Template, Bert, Roberta,
// nested Sequence, multi-id specials), and transformers for tokenizer_config.json's
// add_bos_token/add_eos_token. Plus the errors a malformed post-processor or config gets.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer_config.h"
#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The case's tokenizer: the base tokenizer.json with its post_processor replaced, then the
// config's flags applied through a temporary model directory (as the CLI and server load it).
std::unique_ptr<Tokenizer> case_tokenizer(const json& c) {
  const std::string base = test::tokenizer_data(c["base"].get<std::string>() + "/tokenizer.json");
  auto tok = [&]() -> Result<std::unique_ptr<Tokenizer>> {
    if (!c.contains("post_processor")) return Tokenizer::load(base);
    json d = json::parse(read_text(base));
    d["post_processor"] = c["post_processor"];
    return Tokenizer::from_json_text(d.dump(), base);
  }();
  EXPECT_TRUE(tok.is_ok()) << tok.status().message();
  if (!tok.is_ok()) return nullptr;
  if (c.contains("tokenizer_config")) {
    const fs::path dir = fs::temp_directory_path() / ("anvil_postproc_" + c["name"].get<std::string>());
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer_config.json") << c["tokenizer_config"].dump();
    auto cfg = load_tokenizer_config(dir.string());
    fs::remove_all(dir);
    EXPECT_TRUE(cfg.is_ok()) << cfg.status().message();
    if (!cfg.is_ok()) return nullptr;
    Status st = apply_special_token_flags(*cfg, tok->get());
    EXPECT_TRUE(st.is_ok()) << st.message();
  }
  return std::move(tok).value();
}

TEST(TokenizerPostProcessor, MatchesReferenceForEveryCase) {
  const auto corpus = test::load_corpus();
  const auto cases = test::read_jsonl(test::tokenizer_data("postproc/cases.jsonl"));
  ASSERT_GE(cases.size(), 20u);
  int with_specials = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>() + " (reference: " + c["reference"].get<std::string>() + ")");
    auto tok = case_tokenizer(c);
    ASSERT_NE(tok, nullptr);
    bool adds = false;
    for (const auto& t : c["texts"]) {
      SCOPED_TRACE(t["name"].get<std::string>());
      const std::string& text = corpus.at(t["name"].get<std::string>());
      const auto want = t["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/true), want);
      EXPECT_EQ(tok->encode(text, /*add_special_tokens=*/false), t["plain_ids"].get<std::vector<int32_t>>());
      adds = adds || want != t["plain_ids"].get<std::vector<int32_t>>();
    }
    EXPECT_EQ(tok->post_processor().adds_tokens(), adds);
    with_specials += adds;
  }
  EXPECT_GE(with_specials, 12) << "the fixture lost the cases that add tokens";
}

// Qwen's ByteLevel post-processor adds nothing: its raw prompts are unchanged by the flag.
TEST(TokenizerPostProcessor, QwenAddsNothing) {
  const Tokenizer& q = test::cached_tokenizer("qwen3");
  EXPECT_FALSE(q.post_processor().adds_tokens());
  EXPECT_EQ(q.encode("Hello <|im_start|>", true), q.encode("Hello <|im_start|>", false));
}

Status load_with_post_processor(const json& pp) {
  json d = json::parse(read_text(test::tokenizer_data("comp-bpe/tokenizer.json")));
  d["post_processor"] = pp;
  return Tokenizer::from_json_text(d.dump(), "comp-bpe").status();
}

TEST(TokenizerPostProcessor, RefusesWhatItCannotApply) {
  auto expect_error = [](const json& pp, const std::string& needle) {
    Status st = load_with_post_processor(pp);
    EXPECT_FALSE(st.is_ok()) << pp.dump();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  expect_error({{"type", "NoSuchProcessor"}}, "post-processor \"NoSuchProcessor\" is not supported");
  expect_error({{"type", "BertProcessing"}, {"cls", {"<s>", 1}}}, "post_processor.sep: expected [token, id]");
  expect_error({{"type", "RobertaProcessing"}, {"cls", {"<s>", 100000}}, {"sep", {"</s>", 2}}},
               "post_processor.cls[1]: token id 100000 is outside the vocabulary");
  const json seq_a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  const json seq_b = {{"Sequence", {{"id", "B"}, {"type_id", 1}}}};
  const json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  expect_error({{"type", "TemplateProcessing"}, {"single", {seq_a, seq_b}}, {"special_tokens", json::object()}},
               "post_processor.single[1]: a single-sequence template can only hold sequence \"A\"");
  expect_error({{"type", "TemplateProcessing"}, {"single", {bos, seq_a}}, {"special_tokens", json::object()}},
               "post_processor.single[0]: special token \"<s>\" is not in post_processor.special_tokens");
  expect_error({{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, {{"type", "Bogus"}}}}},
               "post_processor.processors[1]: post-processor \"Bogus\"");
  expect_error({{"type", "TemplateProcessing"}, {"single", {seq_a, seq_a}}, {"special_tokens", json::object()}},
               "post_processor.single: the template must hold sequence $A exactly once");
  // tokenizers feeds a template's output pieces to the next processor as a pair (or panics).
  expect_error({{"type", "Sequence"},
                {"processors", {{{"type", "BertProcessing"}, {"cls", {"<s>", 1}}, {"sep", {"</s>", 2}}},
                                {{"type", "TemplateProcessing"}, {"single", {seq_a}}, {"special_tokens", json::object()}}}}},
               "a Sequence with more than one token-adding processor (2) is not supported");
  // The accepted forms load.
  EXPECT_TRUE(load_with_post_processor(nullptr).is_ok());
  EXPECT_TRUE(load_with_post_processor({{"type", "ByteLevel"}, {"add_prefix_space", false}}).is_ok());
}

Status apply_config(const json& cfg) {
  const fs::path dir = fs::temp_directory_path() / "anvil_postproc_cfg";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
  auto c = load_tokenizer_config(dir.string());
  fs::remove_all(dir);
  if (!c.is_ok()) return c.status();
  auto tok = Tokenizer::load(test::tokenizer_data("sp-llama/tokenizer.json"));  // no post-processor
  if (!tok.is_ok()) return tok.status();
  return apply_special_token_flags(*c, tok->get());
}

TEST(TokenizerPostProcessor, ConfigFlagErrorsNameTheField) {
  Status st = apply_config({{"add_bos_token", true}, {"bos_token", "<nope>"}});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("add_bos_token is true but bos_token \"<nope>\" is not in tokenizer.json's vocabulary"),
            std::string::npos)
      << st.message();
  st = apply_config({{"add_eos_token", "yes"}, {"eos_token", "</s>"}});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("field 'add_eos_token' must be true, false or null"), std::string::npos) << st.message();
  EXPECT_TRUE(apply_config({{"add_bos_token", nullptr}, {"bos_token", "<s>"}}).is_ok());
}

}  // namespace
}  // namespace anvil
