// tokenizers compiles Split and ByteLevel patterns with Oniguruma, whose Unicode data is 16.0;
// anvil compiles them with PCRE2 10.42, whose tables are 14.0. onig_to_pcre2 adds what changed
// category since (src/tokenizer/unicode_delta.inc, scripts/make_unicode_delta.py) to \p{X}, \P{X},
// \d and \w, and spells scripts out as Unicode 16.0 ranges (unicode_scripts.inc,
// scripts/make_unicode_scripts.py). These tests compare with tokenizers run from Python (they skip without it): which code
// points each pattern matches, and how the Qwen3 tokenizer and copies of it with other patterns
// encode texts of Unicode 15 and 16 characters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tokenizer/byte_level.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer_fixtures.h"

namespace anvil {
namespace {

using nlohmann::json;
using test::tokenizer_data;

using test::read_text;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

// The code points of `cps` (in order) that matches of `pattern` cover, as inclusive ranges.
Ranges anvil_matched(const std::string& pattern, const std::vector<uint32_t>& cps, const std::string& text,
                     const std::vector<size_t>& byte_of) {
  auto re = tok::compile_regex(pattern, false, pattern);
  EXPECT_TRUE(re.is_ok()) << re.status().message();
  if (!re.is_ok()) return {};
  std::vector<tok::SplitRange> ranges;
  tok::regex_ranges(**re, text, ranges);
  Ranges out;
  size_t k = 0;  // index into cps of the range's start
  for (const auto& r : ranges) {
    while (k < cps.size() && byte_of[k] < r.begin) ++k;
    for (; k < cps.size() && byte_of[k] < r.end; ++k) {
      if (!r.is_match) continue;
      if (!out.empty() && out.back().second + 1 == cps[k]) out.back().second = cps[k];
      else out.push_back({cps[k], cps[k]});
    }
  }
  return out;
}

std::string first_differences(const Ranges& a, const Ranges& b) {
  auto expand = [](const Ranges& r) {
    std::vector<uint32_t> v;
    for (auto [x, y] : r)
      for (uint32_t c = x; c <= y; ++c) v.push_back(c);
    return v;
  };
  const auto va = expand(a), vb = expand(b);
  std::vector<uint32_t> d;
  std::set_symmetric_difference(va.begin(), va.end(), vb.begin(), vb.end(), std::back_inserter(d));
  std::string out = std::to_string(d.size()) + " code points differ:";
  char buf[16];
  for (size_t i = 0; i < d.size() && i < 12; ++i) {
    std::snprintf(buf, sizeof(buf), " U+%04X", d[i]);
    out += buf;
  }
  return out;
}

// Every general-category spelling Oniguruma takes, \d and \w, in and out of classes, negated and
// not: the code points each matches in a text of every scalar value of planes 0-3 and 14 (all of
// assigned Unicode but private use; ANVIL_UNICODE_ALL_PLANES=1 takes all 17 planes) are exactly
// those tokenizers' Oniguruma matches; so are negated categories inside classes (which PCRE2
// cannot subtract from a class), nested classes and intersections, \h, and script properties.
TEST(OnigurumaUnicode16, PropertyEscapesMatchTheCodePointsTokenizersDoes) {
  if (!test::python_tokenizers_available()) GTEST_SKIP() << test::kNoPythonTokenizers;
  const bool all_planes = std::getenv("ANVIL_UNICODE_ALL_PLANES") && std::string(std::getenv("ANVIL_UNICODE_ALL_PLANES")) == "1";
  std::vector<uint32_t> cps;
  for (uint32_t c = 0; c < 0x110000; ++c) {
    if (c >= 0xD800 && c < 0xE000) continue;
    if (!all_planes && c >= 0x40000 && (c < 0xE0000 || c >= 0xE1000)) continue;
    cps.push_back(c);
  }
  std::string text;
  std::vector<size_t> byte_of;
  for (uint32_t c : cps) {
    byte_of.push_back(text.size());
    tok::append_utf8(text, c);
  }
  const std::vector<std::string> patterns = {
      R"(\p{L})",   R"(\p{Lu})",  R"(\p{Ll})",  R"(\p{Lt})",  R"(\p{Lm})", R"(\p{Lo})", R"(\p{LC})", R"(\p{M})",
      R"(\p{Mn})",  R"(\p{Mc})",  R"(\p{Me})",  R"(\p{N})",   R"(\p{Nd})", R"(\p{Nl})", R"(\p{No})", R"(\p{P})",
      R"(\p{Pd})",  R"(\p{Po})",  R"(\p{Ps})",  R"(\p{S})",   R"(\p{Sm})", R"(\p{So})", R"(\p{Sk})", R"(\p{Z})",
      R"(\p{Zs})",  R"(\p{C})",   R"(\p{Cc})",  R"(\p{Cf})",  R"(\p{Cn})", R"(\p{Co})",
      // negations and Oniguruma's long names and aliases (PCRE2 10.42 knows none of those names)
      R"(\P{L})", R"(\p{^N})", R"(\P{^Lu})", R"(\P{Mn})", R"(\P{Mc})", R"(\P{Cn})", R"(\P{C})", R"(\p{Letter})",
      R"(\p{Uppercase_Letter})", R"(\p{lowercase letter})", R"(\p{Cased-Letter})", R"(\p{Other_Letter})",
      R"(\p{Combining_Mark})", R"(\p{Nonspacing_Mark})", R"(\p{Number})", R"(\p{Decimal_Number})", R"(\p{digit})",
      R"(\p{Other_Number})", R"(\p{Punctuation})", R"(\p{punct})", R"(\p{Other_Symbol})", R"(\p{Math_Symbol})",
      R"(\p{Separator})", R"(\p{Other})", R"(\p{Format})", R"(\p{Unassigned})", R"(\p{^Letter})",
      // escapes, and classes as real patterns write them
      R"(\d)", R"(\D)", R"(\w)", R"(\W)", R"([\w])", R"([^\w])", R"([\d_])", R"([^\d])", R"([\p{L}\p{N}])",
      R"([^\s\p{L}\p{N}])", R"([^\r\n\p{L}\p{N}])", R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])",
      R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])", R"([\p{P}\p{S}])", R"([^\p{L}\p{P}\p{S}])", R"([\P{Cn}x])", R"([\P{C}x])",
      R"((?i)\p{Lu})",
      // negated categories, \D and \W inside classes (PCRE2 cannot take characters out of a class:
      // these become lookahead expressions), nested classes and intersections
      R"([\P{L}x])", R"([\P{Nd}])", R"([\p{Mn}])", R"([\p{Cn}])", R"([^\P{L}])", R"([\P{N}\s])",
      R"([^\p{L}\P{N}])", R"([\p{^L}\P{^Lu}])", R"([\W\d])", R"([^\W])", R"([^\D])", R"([\D_])",
      R"([a-c[\P{L}&&[^\s]]])", R"([\p{L}&&[^a-z]])", R"([^\P{L}&&[^\p{Han}]])", R"([\h])", R"(\H)",
      // scripts: Unicode 16.0's Script property (PCRE2's is Unicode 14.0 Script_Extensions)
      R"(\p{Han})", R"(\p{Hani})", R"(\P{Han})", R"([\P{han}x])", R"(\p{Hiragana})", R"(\p{Katakana})",
      R"(\p{Hangul})", R"(\p{Thai})", R"(\p{Latin})", R"(\p{Cyrillic})", R"(\p{Greek})", R"(\p{Arabic})",
      R"(\p{Hebrew})", R"(\p{Devanagari})", R"(\p{Common})", R"(\p{Inherited})", R"(\p{Qaai})", R"(\p{Unknown})",
      R"(\p{Garay})", R"(\p{Kawi})", R"(\p{Nag Mundari})", R"(\p{Khitan_Small_Script})", R"(\p{^Latin})",
      R"([\p{Han}\p{Hiragana}\p{Katakana}])", R"([^\p{Latin}\s])", R"((?i)\p{Greek})", R"((?i)[\p{Greek}])",
  };
  const std::string dir = test::scratch_dir("onig_unicode16");
  std::ofstream(dir + "/patterns.json") << json(patterns).dump();
  std::ofstream(dir + "/cps.json") << json(cps).dump();
  const std::string py =
      "import json, sys\n"
      "from tokenizers import Regex, pre_tokenizers as pt\n"
      "d = sys.argv[1]\n"
      "cps = json.load(open(d + '/cps.json'))\n"
      "chunks = [cps[i:i + 65536] for i in range(0, len(cps), 65536)]  # each match is one character\n"
      "out = []\n"
      "for p in json.load(open(d + '/patterns.json')):\n"
      "    split, r = pt.Split(Regex(p), 'removed', invert=True), []\n"
      "    for chunk in chunks:\n"
      "        for _, (a, b) in split.pre_tokenize_str(''.join(map(chr, chunk))):\n"
      "            for c in chunk[a:b]:\n"
      "                if r and r[-1][1] + 1 == c: r[-1][1] = c\n"
      "                else: r.append([c, c])\n"
      "    out.append(r)\n"
      "json.dump(out, open(d + '/expected.json', 'w'))\n";
  const json want = test::run_python_reference(dir, py);
  ASSERT_FALSE(want.is_null());
  ASSERT_EQ(want.size(), patterns.size());
  size_t compared = 0;
  for (size_t i = 0; i < patterns.size(); ++i) {
    const Ranges w = want[i].get<Ranges>();
    const Ranges got = anvil_matched(patterns[i], cps, text, byte_of);
    EXPECT_EQ(got, w) << patterns[i] << ": " << first_differences(got, w);
    ++compared;
  }
  std::printf("compared %zu patterns over %zu code points\n", compared, cps.size());
  std::filesystem::remove_all(dir);
}

// The Digits pre-tokenizer is Rust's char::is_numeric, whose tables in tokenizers 0.23.3 are
// Unicode 17.0; anvil's is utf8proc's (Unicode 15.0) corrected by unicode_rust.inc. Over every
// code point of planes 0-3 and 14, each followed by "x", the pieces are exactly tokenizers' (the
// digits new in 16.0 and 17.0, U+10D40.. Garay, U+11DE0.., U+16FF4.., included).
TEST(RustUnicode17, DigitsPreTokenizerIsolatesTheCodePointsTokenizersDoes) {
  if (!test::python_tokenizers_available()) GTEST_SKIP() << test::kNoPythonTokenizers;
  std::string text;
  for (uint32_t c = 0; c < 0xE1000; ++c) {
    if ((c >= 0xD800 && c < 0xE000) || (c >= 0x40000 && c < 0xE0000)) continue;
    tok::append_utf8(text, c);
    text += 'x';
  }
  const std::string dir = test::scratch_dir("rust_unicode17");
  std::ofstream(dir + "/text.txt", std::ios::binary) << text;
  const json want = test::run_python_reference(
      dir,
      "import json, sys\n"
      "from tokenizers import pre_tokenizers as pt\n"
      "d = sys.argv[1]\n"
      "text = open(d + '/text.txt', encoding='utf-8', newline='').read()\n"
      "out = [p for p, _ in pt.Digits(individual_digits=True).pre_tokenize_str(text)]\n"
      "json.dump(out, open(d + '/expected.json', 'w'))\n");
  ASSERT_FALSE(want.is_null());
  auto pre = tok::PreTokenizer::from_json(json{{"type", "Digits"}, {"individual_digits", true}});
  ASSERT_TRUE(pre.is_ok()) << pre.status().message();
  std::vector<std::string> got;
  pre->split(text, got);
  const auto expected = want.get<std::vector<std::string>>();
  EXPECT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size() && i < expected.size(); ++i) {
    if (got[i] == expected[i]) continue;
    uint32_t a = 0, b = 0;
    tok::utf8_decode_one(got[i], 0, &a);
    tok::utf8_decode_one(expected[i], 0, &b);
    ADD_FAILURE() << "piece " << i << " differs: anvil's starts with U+" << std::hex << a << " (" << got[i].size()
                  << " bytes), tokenizers' with U+" << b << " (" << expected[i].size() << " bytes)";
    break;
  }
  std::filesystem::remove_all(dir);
}

// The code points new in Unicode 15 and 16 that the texts below draw from (no pair of them
// composes under NFC, which Qwen3's normalizer applies): CJK Extensions H and I, Kawi, Nag Mundari,
// Garay (digits, letters of both cases, marks, a dash, symbols), Kaktovik numerals, the outlined
// digits, Sunuwar, Ol Onal, Egyptian format controls and Extension A, Latin and Cyrillic additions,
// Arabic additions, Devanagari Extension A punctuation, legacy computing symbols, and U+1171E
// (Ahom, Mn in 14.0, Mc in 16.0).
const std::vector<std::pair<uint32_t, uint32_t>> kNewRanges = {
    {0x31350, 0x323AF}, {0x2EBF0, 0x2EE5D}, {0x11F00, 0x11F10}, {0x11F12, 0x11F3A}, {0x11F3E, 0x11F59},
    {0x1E4D0, 0x1E4F9}, {0x10D40, 0x10D65}, {0x10D69, 0x10D85}, {0x10D8E, 0x10D8F}, {0x1D2C0, 0x1D2D3},
    {0x1CCF0, 0x1CCF9}, {0x11BC0, 0x11BE1}, {0x11BF0, 0x11BF9}, {0x1E5D0, 0x1E5FA}, {0x13439, 0x1343F},
    {0x13460, 0x143FA}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC}, {0x1C89, 0x1C8A}, {0x1DF25, 0x1DF2A},
    {0x1E030, 0x1E06D}, {0x0897, 0x0897}, {0x10EC2, 0x10EC4}, {0x10EFC, 0x10EFC}, {0x11B00, 0x11B09},
    {0x1CC00, 0x1CCEF}, {0x1171E, 0x1171E},
};

// Texts mixing those with ASCII letters, digits, spaces and punctuation and older letters and
// digits: hand-written ones, then `random_count` drawn with a fixed seed.
std::vector<std::string> unicode16_texts(int random_count) {
  auto u = [](std::initializer_list<uint32_t> cps) {
    std::string s;
    for (uint32_t c : cps) tok::append_utf8(s, c);
    return s;
  };
  std::vector<std::string> texts = {
      " " + u({0x1D2C0}),                              // Kaktovik numeral after a space
      "abc" + u({0x31350, 0x31351}) + "def",           // CJK Extension H inside ASCII letters
      u({0x2EBF0}) + " x " + u({0x2EE5D, 0x4E2D}),     // Extension I, next to an old ideograph
      "Hello " + u({0x10D50, 0x10D70, 0x10D71}) + "!",  // Garay capital then small letters
      u({0x10D40, 0x10D41}) + "12" + u({0x1CCF0}) + "3",  // Garay and outlined digits among ASCII ones
      "x" + u({0x11F04, 0x11F34, 0x11F50, 0x11F51}),   // Kawi letters, sign, digits
      u({0x1E4D0, 0x1E4EC, 0x1E4F0}) + " ok",          // Nag Mundari letter, mark, digit
      u({0x1D2C0, 0x1D2C1, 0x1D2C2}) + "7",            // a run of Kaktovik numerals
      "A" + u({0xA7CB}) + "b" + u({0xA7CD}) + "C",     // Latin letters new in 16
      "s" + u({0x1171E}) + "t " + u({0x11700, 0x1171E}),  // Ahom U+1171E (Mn -> Mc)
      u({0x13460, 0x13439, 0x13461}),                  // Egyptian Extension A and a format control
      "a" + u({0x0897}) + "b",                         // an Arabic mark new in 16
      u({0x1CC00, 0x1CC01}) + "==" + u({0x11B00}),     // legacy computing symbols, Devanagari Ext-A punct
      "I'M " + u({0x10D50}) + "'s " + u({0x10D6E}) + "-",  // contractions, Garay dash
      "\t" + u({0x1E5D0}) + "\n\n" + u({0x11BF0}) + " ",   // Ol Onal, Sunuwar digit, newlines
  };
  std::vector<std::string> pool = {"a", "Z", "q", "ing", "7", "42", " ", "  ", ",", ".", "'s", "\n", "_", "-", "(",
                                   u({0x4E2D}), u({0xE9}), u({0x660}), u({0x301}), u({0x3000})};
  std::vector<uint32_t> fresh;
  for (auto [a, b] : kNewRanges) {
    const uint32_t step = b - a > 64 ? (b - a) / 61 : 1;  // a sample of the large blocks
    for (uint32_t c = a; c <= b; c += step) fresh.push_back(c);
    fresh.push_back(b);
  }
  std::mt19937 rng(16);
  for (int i = 0; i < random_count; ++i) {
    std::string t;
    const int len = 1 + rng() % 12;
    for (int k = 0; k < len; ++k) {
      if (rng() % 2) t += u({fresh[rng() % fresh.size()]});
      else t += pool[rng() % pool.size()];
    }
    texts.push_back(t);
  }
  return texts;
}

// The Qwen3 tokenizer, and its model under other pre-tokenizers (patterns of \p{Lu}, \p{Ll},
// \p{N}, \P{L}; Oniguruma's long names and \d; \w and \W; the GPT-2 pattern of ByteLevel
// use_regex; the Whitespace pre-tokenizer, which is the regex crate's \w+|[^\w\s]+; \pL, which
// Oniguruma reads as the letters "pL"; scripts; negated categories inside classes and
// intersections), encode texts of Unicode 15 and 16 characters as tokenizers
// does.
TEST(OnigurumaUnicode16, Qwen3EncodesNewCharactersAsTokenizers) {
  if (!test::python_tokenizers_available()) GTEST_SKIP() << test::kNoPythonTokenizers;
  const std::string dir = test::scratch_dir("onig_unicode16_enc");
  const json base = json::parse(read_text(tokenizer_data("qwen3/tokenizer.json")));
  ASSERT_EQ(base["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
  const json byte_level = base["pre_tokenizer"]["pretokenizers"][1];
  auto with_split = [&](const std::string& pattern) {
    json j = base;
    j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
    return j;
  };
  std::vector<std::pair<std::string, json>> variants = {
      {"qwen3", base},
      {"cased",
       with_split(R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re)?|)"
                  R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}{1,3}|)"
                  R"( ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+|\P{L})")},
      {"long-names", with_split(R"(\p{Uppercase_Letter}\p{Lowercase_Letter}*|\p{Letter}+|\d+|\p{Number}|\p{^L}+)")},
      {"words", with_split(R"(\w+|\s+|[^\s\w]+|\W)")},
      {"literal-p", with_split(R"(\pL+|\PN|\p{L}+|\P{L})")},
      {"scripts", with_split(R"(\p{Han}+|[\p{Hiragana}\p{Katakana}]+|\p{Latin}+|[^\p{Han}\p{Latin}\s]+|\s+)")},
      {"class-negations", with_split(R"([^\P{L}\p{Lu}]+|[\P{L}&&\P{N}&&\S]+|[\D&&[^\P{N}]]+|\s+)")},
  };
  json gpt2 = base;
  gpt2["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  variants.push_back({"bytelevel-regex", gpt2});
  json ws = base;
  ws["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Whitespace"}}, byte_level})}};
  variants.push_back({"whitespace", ws});

  std::vector<std::string> texts = unicode16_texts(400);
  for (const char* t : {"pLL pL", "PNN P", "apLb"}) texts.push_back(t);
  std::vector<std::string> names;
  for (const auto& [name, j] : variants) {
    std::ofstream(dir + "/" + name + ".json") << j.dump();
    names.push_back(name);
  }
  const json want = test::reference_encodings(dir, names, texts);
  ASSERT_FALSE(want.is_null());
  size_t code_points = 0;
  for (const auto& t : texts)
    for (char c : t) code_points += (uint8_t(c) & 0xC0) != 0x80;
  for (const auto& [name, j] : variants) {
    auto tok = Tokenizer::from_json_text(j.dump(), name);
    ASSERT_TRUE(tok.is_ok()) << name << ": " << tok.status().message();
    int failures = 0;
    for (size_t i = 0; i < texts.size() && failures < 10; ++i) {
      const json got((*tok)->encode(texts[i], false));
      EXPECT_EQ(got, want[name][i]) << name << ": " << json(texts[i]).dump();
      failures += got != want[name][i];
    }
  }
  std::printf("compared %zu texts (%zu code points) under %zu tokenizers\n", texts.size(), code_points, variants.size());
  std::filesystem::remove_all(dir);
}

// tokenizers' NFC/NFD/NFKC/NFKD (the unicode-normalization-alignments crate, Unicode 12-era data)
// and the Debian utf8proc (15.0) both have no data for the characters of Unicode 16: both leave
// them as they are, the Unicode 16 canonical pairs (Todhri, Tulu-Tigalari, Gurung Khema, Kirat Rai)
// and precomposed forms and compatibility characters (outlined letters) included, between older
// characters that both normalize. (Characters of Unicode 12.1 to 15.0 with decompositions or
// combining classes differ: utf8proc normalizes them, tokenizers does not; docs/architecture.md.)
TEST(OnigurumaUnicode16, NormalizersLeaveUnicode16CharactersAsTokenizersDoes) {
  if (!test::python_tokenizers_available()) GTEST_SKIP() << test::kNoPythonTokenizers;
  auto u = [](std::initializer_list<uint32_t> cps) {
    std::string s;
    for (uint32_t c : cps) tok::append_utf8(s, c);
    return s;
  };
  const std::vector<std::pair<uint32_t, uint32_t>> unicode16 = {
      {0x10D40, 0x10D65}, {0x10D69, 0x10D85}, {0x10D8E, 0x10D8F}, {0x105C0, 0x105F3}, {0x11380, 0x113E2},
      {0x16100, 0x16139}, {0x16D40, 0x16D79}, {0x1E5D0, 0x1E5FA}, {0x11BC0, 0x11BE1}, {0x1CCF0, 0x1CCF9},
      {0x1CC00, 0x1CCF9}, {0x13460, 0x13480}, {0xA7CB, 0xA7CD}, {0xA7DA, 0xA7DC}, {0x1C89, 0x1C8A},
      {0x0897, 0x0897}, {0x10EC2, 0x10EC4}, {0x10EFC, 0x10EFC}, {0x11B00, 0x11B09}};
  std::vector<std::string> texts = {u({0x105D2, 0x0307}), u({0x105DA, 0x0307}), u({0x11382, 0x113C9}),
                                    u({0x11384, 0x113BB}), u({0x113C2, 0x113C2}), u({0x16D67, 0x16D67}),
                                    u({0x105C9}), u({0x105E4}), u({0x113C5}), u({0x113C7}), u({0x16D68}),
                                    u({0x1611E, 0x1611F}), u({0x1CCD6, 0x1CCEF}), "e" + u({0x0301, 0x10D69}) + "A" + u({0x030A})};
  std::vector<uint32_t> fresh;
  for (auto [a, b] : unicode16)
    for (uint32_t c = a; c <= b; ++c) fresh.push_back(c);
  const std::vector<std::string> pool = {"e", u({0x0301}), u({0x0323}), "A", u({0x030A}), u({0xFB01}), u({0x2460}),
                                         u({0x1100}), u({0x1161}), u({0xAC00}), " ", "7", u({0x212B})};
  std::mt19937 rng(1600);
  for (int i = 0; i < 300; ++i) {
    std::string t;
    for (int k = 0, len = 1 + int(rng() % 10); k < len; ++k) t += rng() % 2 ? u({fresh[rng() % fresh.size()]}) : pool[rng() % pool.size()];
    texts.push_back(t);
  }
  const std::string dir = test::scratch_dir("onig_unicode16_norm");
  std::ofstream(dir + "/texts.json") << json(texts).dump();
  const json want = test::run_python_reference(
      dir,
      "import json, sys\n"
      "from tokenizers import normalizers as nm\n"
      "d = sys.argv[1]\n"
      "texts = json.load(open(d + '/texts.json'))\n"
      "out = {f: [getattr(nm, f)().normalize_str(t) for t in texts] for f in ('NFC', 'NFD', 'NFKC', 'NFKD')}\n"
      "json.dump(out, open(d + '/expected.json', 'w'))\n");
  ASSERT_FALSE(want.is_null());
  for (const char* form : {"NFC", "NFD", "NFKC", "NFKD"}) {
    auto n = tok::Normalizer::from_json(json{{"type", form}});
    ASSERT_TRUE(n.is_ok()) << n.status().message();
    int failures = 0;
    for (size_t i = 0; i < texts.size() && failures < 5; ++i) {
      const std::string got = n->apply(texts[i]);
      EXPECT_EQ(got, want[form][i].get<std::string>()) << form << ": " << json(texts[i]).dump();
      failures += got != want[form][i].get<std::string>();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace anvil
