// A "scripted" model for tests that need known output from a model (a thinking model's tags among
// them): anvil synth's tiny Qwen3 (its tokenizer and chat template) with every layer's output
// projections (o_proj, down_proj) zeroed, so the last hidden state is the normed embedding of the
// last token alone, and an embedding / untied lm_head made so that the next token is a fixed
// function of the last one. A script is a list of chains (after token S, write t1, t2, ...); after
// any token not in a chain the model writes <|im_end|>. Qwen3's generation prompt ends with "\n"
// (198; with enable_thinking=false, "</think>\n\n": 271), which is where a reply's chain starts.
// Shared by the cli and server tests (header only).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace anvil::test {

struct ScriptChain {
  int32_t after;                // the token the chain follows
  std::vector<int32_t> tokens;  // written one after the other
};

// The tokenizer of `anvil synth --shape tiny` (Qwen3's), for writing scripts.
class ScriptTokens {
 public:
  explicit ScriptTokens(const std::string& model_dir)
      : tok_(std::move(Tokenizer::load(model_dir + "/tokenizer.json")).value()) {}
  std::vector<int32_t> text(const std::string& s) const { return tok_->encode(s, false); }
  int32_t id(const std::string& token) const { return *tok_->token_to_id(token); }
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  std::unique_ptr<Tokenizer> tok_;
};

// Writes the tiny synthetic checkpoint to `dir` (anvil synth); "" on success, else why not.
inline std::string synth_tiny(const std::string& dir) {
  std::filesystem::remove_all(dir);
  const std::string cmd = std::string(ANVIL_BINARY) + " synth --shape tiny --quant bf16 --out '" + dir + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0 ? "" : "anvil synth failed: " + cmd;
}

// Turns the synth checkpoint in `dir` into the scripted model of `chains` (in place); "" on
// success, else why not.
inline std::string make_scripted(const std::string& dir, const std::vector<ScriptChain>& chains,
                                 const std::string& default_next = "<|im_end|>") {
  namespace fs = std::filesystem;
  ScriptTokens tk(dir);
  std::map<int32_t, int32_t> next;
  for (const auto& c : chains) {
    int32_t prev = c.after;
    for (int32_t t : c.tokens) {
      auto it = next.find(prev);
      if (it != next.end() && it->second != t) return "the script is ambiguous after token " + std::to_string(prev);
      next[prev] = t;
      prev = t;
    }
  }
  std::set<int32_t> used;
  for (auto [a, b] : next) used.insert(a), used.insert(b);
  const std::string path = dir + "/model.safetensors";
  std::ifstream in(path, std::ios::binary);
  uint64_t hlen = 0;
  in.read(reinterpret_cast<char*>(&hlen), 8);
  std::string htext(hlen, '\0');
  in.read(htext.data(), std::streamsize(hlen));
  auto header = nlohmann::ordered_json::parse(htext);
  const auto& emb_info = header["model.embed_tokens.weight"];
  const int64_t V = emb_info["shape"][0], H = emb_info["shape"][1];
  if (int64_t(used.size()) >= H) return "the script uses more tokens than the hidden size";
  std::map<int32_t, int64_t> dim;
  for (int32_t t : used) dim[t] = int64_t(dim.size());
  const int64_t kDefault = H - 1;  // the dimension every other token's embedding is
  const uint16_t kOne = 0x3F80, kTen = 0x4120;  // bf16 1.0, 10.0
  std::vector<uint16_t> emb(size_t(V * H), 0), lm(size_t(V * H), 0);
  for (int64_t t = 0; t < V; ++t) emb[size_t(t * H + kDefault)] = kOne;
  for (auto [t, d] : dim) {
    emb[size_t(t * H + kDefault)] = 0;
    emb[size_t(t * H + d)] = kOne;
  }
  const int32_t dn = tk.id(default_next);
  for (auto [a, b] : next) lm[size_t(int64_t(b) * H + dim[a])] = kTen;
  for (auto [t, d] : dim)
    if (!next.count(t)) lm[size_t(int64_t(dn) * H + d)] = kTen;
  lm[size_t(int64_t(dn) * H + kDefault)] = kTen;

  nlohmann::ordered_json out_header = nlohmann::ordered_json::object();
  std::vector<std::string> blobs;
  uint64_t off = 0;
  auto add = [&](const std::string& name, const nlohmann::ordered_json& shape, std::string bytes) {
    out_header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {off, off + bytes.size()}}};
    off += bytes.size();
    blobs.push_back(std::move(bytes));
  };
  const uint64_t base = 8 + hlen;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") continue;
    const uint64_t s = (*it)["data_offsets"][0], e = (*it)["data_offsets"][1];
    std::string raw(e - s, '\0');
    in.seekg(std::streamoff(base + s));
    in.read(raw.data(), std::streamsize(raw.size()));
    if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos)
      std::fill(raw.begin(), raw.end(), '\0');
    if (name == "model.norm.weight")
      for (size_t i = 0; i + 1 < raw.size(); i += 2) std::memcpy(&raw[i], &kOne, 2);
    if (name == "model.embed_tokens.weight")
      raw.assign(reinterpret_cast<const char*>(emb.data()), emb.size() * 2);
    if (name == "lm_head.weight") continue;
    add(name, (*it)["shape"], std::move(raw));
  }
  add("lm_head.weight", {V, H}, std::string(reinterpret_cast<const char*>(lm.data()), lm.size() * 2));
  in.close();
  std::string hj = out_header.dump();
  hj.append((8 - hj.size() % 8) % 8, ' ');
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    const uint64_t n = hj.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(hj.data(), std::streamsize(hj.size()));
    for (const auto& b : blobs) out.write(b.data(), std::streamsize(b.size()));
    if (!out) return "cannot write " + path;
  }
  nlohmann::ordered_json cfg = nlohmann::ordered_json::parse(std::ifstream(dir + "/config.json"));
  cfg["tie_word_embeddings"] = false;
  std::ofstream(dir + "/config.json") << cfg.dump(1);
  return "";
}

// The thinking model of these tests: after the generation prompt it always writes kThinkReply,
// its reasoning and answer (a character split over two byte-level tokens among them), then
// <|im_end|>. With enable_thinking=false (prompt "...</think>\n\n") it writes the answer alone.
inline const std::string kThinkReasoning = "Let me think";
inline const std::string kThinkAnswer = "Answer: \xF0\x9F\x98\x80 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x92\xBB \xE4\xB8\xAD";
inline const std::string kThinkReply = "<think>" + kThinkReasoning + "</think>\n\n" + kThinkAnswer;

inline std::string lstrip_newlines(std::string s) {
  s.erase(0, std::min(s.size(), s.find_first_not_of('\n')));
  return s;
}

// What the think model's reply comes to under one stop string, by the rule of stop_strings.h: it
// matches inside the reasoning or the answer, or a whole tag, never inside a tag or across one.
// The answer is trimmed of its leading newlines (the reasoning shaper's rule).
inline void think_reply_under_stop(const std::string& stop, std::string* reasoning, std::string* answer) {
  const std::string& R = kThinkReasoning;
  const std::string C = kThinkReply.substr(kThinkReply.find("</think>") + 8);
  reasoning->clear(), answer->clear();
  if (stop == "<think>") {
  } else if (stop == "</think>") {
    *reasoning = R;
  } else if (size_t at = R.find(stop); at != std::string::npos) {
    *reasoning = R.substr(0, at);
  } else if (size_t at = C.find(stop); at != std::string::npos) {
    *reasoning = R, *answer = lstrip_newlines(C.substr(0, at));
  } else {
    *reasoning = R, *answer = lstrip_newlines(C);
  }
}

inline std::string make_think_model(const std::string& dir) {
  if (std::string e = synth_tiny(dir); !e.empty()) return e;
  ScriptTokens tk(dir);
  std::vector<int32_t> think = {tk.id("<think>")};
  for (int32_t t : tk.text(kThinkReasoning)) think.push_back(t);
  think.push_back(tk.id("</think>"));
  think.push_back(tk.text("\n\n").at(0));
  return make_scripted(dir, {{tk.text("\n").at(0), think}, {tk.text("\n\n").at(0), tk.text(kThinkAnswer)}});
}

// A model that writes the tags where they switch nothing (as a random-weight model may): after the
// generation prompt, kStrayTagsReply, a "</think>" with no reasoning open and a "</tool_call>" with
// no call open, both text of the answer; then <|im_end|>.
inline const std::string kStrayTagsReply = "Hi</think> there</tool_call> now";

inline std::string make_stray_tags_model(const std::string& dir) {
  if (std::string e = synth_tiny(dir); !e.empty()) return e;
  ScriptTokens tk(dir);
  std::vector<int32_t> reply = tk.text("Hi");
  reply.push_back(tk.id("</think>"));
  for (int32_t t : tk.text(" there")) reply.push_back(t);
  reply.push_back(tk.id("</tool_call>"));
  for (int32_t t : tk.text(" now")) reply.push_back(t);
  return make_scripted(dir, {{tk.text("\n").at(0), reply}});
}

// A model that writes "Hi" and then the first two bytes of an emoji (F0 9F, byte-level tokens of
// their own) after the generation prompt, then <|im_end|>: with -n 3 / max_tokens 3 the reply ends
// inside the character, which decodes to U+FFFD.
inline std::string make_cut_char_model(const std::string& dir) {
  if (std::string e = synth_tiny(dir); !e.empty()) return e;
  ScriptTokens tk(dir);
  auto byte_token = [&](uint8_t b) {
    std::string s;
    tok::append_utf8(s, tok::byte_to_codepoint()[b]);
    return tk.id(s);
  };
  std::vector<int32_t> reply = tk.text("Hi");
  reply.push_back(byte_token(0xF0));
  reply.push_back(byte_token(0x9F));
  return make_scripted(dir, {{tk.text("\n").at(0), reply}});
}

}  // namespace anvil::test
