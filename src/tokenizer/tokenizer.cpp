#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include "base/optional_file.h"
#include "tokenizer/byte_level.h"

namespace anvil {

namespace {

// The ByteLevel decoder's rule: a token whose characters are all in the byte table becomes those
// bytes; any other token contributes its UTF-8 text unchanged.
std::string decoded_bytes(const std::string& token) {
  if (auto b = tok::byte_level_to_bytes(token)) return *b;
  return token;
}

Result<std::vector<tok::AddedToken>> parse_added(const nlohmann::json& j) {
  std::vector<tok::AddedToken> out;
  if (j.is_null()) return out;
  if (!j.is_array()) return invalid_argument("added_tokens: expected an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object()) return invalid_argument(where + ": expected an object");
    if (!e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0)
      return invalid_argument(where + ".id: expected a non-negative integer");
    if (e["id"].get<int64_t>() > tok::kMaxTokenId)
      return invalid_argument(where + ".id: " + e["id"].dump() + " is too large (at most " +
                              std::to_string(tok::kMaxTokenId) + ")");
    if (!e.contains("content") || !e["content"].is_string()) return invalid_argument(where + ".content: expected a string");
    tok::AddedToken t;
    t.id = e["id"].get<int32_t>();
    t.content = e["content"].get<std::string>();
    auto flag = [&](const char* k, bool d) { return e.contains(k) && e[k].is_boolean() ? e[k].get<bool>() : d; };
    t.special = flag("special", false);
    t.lstrip = flag("lstrip", false);
    t.rstrip = flag("rstrip", false);
    t.single_word = flag("single_word", false);
    t.normalized = flag("normalized", !t.special);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& path) {
  // A file that is there but unreadable (a link to a missing blob, no permission) says so.
  ANVIL_ASSIGN_OR_RETURN(std::optional<std::string> text, read_optional_file(path));
  if (!text) return not_found(path + ": cannot open tokenizer file: not found");
  return from_json_text(*text, path);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json_text(const std::string& text, const std::string& label) {
  auto fail = [&](const Status& s) { return s.with_context(label); };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail(invalid_argument("malformed JSON (expected a tokenizer.json object)"));
  if (!j.is_object()) return fail(invalid_argument("expected a JSON object at the top level"));
  if (!j.contains("model")) return fail(invalid_argument("model: missing"));

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  {
    auto n = tok::Normalizer::from_json(j.value("normalizer", nlohmann::json()));
    if (!n) return fail(n.status());
    t->normalizer_ = std::move(n).value();
  }
  {
    auto p = tok::PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()));
    if (!p) return fail(p.status());
    t->pretokenizer_ = std::move(p).value();
  }
  {
    auto d = tok::Decoder::from_json(j.value("decoder", nlohmann::json()));
    if (!d) return fail(d.status());
    t->decoder_ = std::move(d).value();
  }
  {
    // tokenizers applies the byte-to-unicode mapping in the ByteLevel pre-tokenizer; without one,
    // the model sees Unicode text.
    const auto alphabet = t->pretokenizer_.has_byte_level() ? tok::BpeModel::Alphabet::kBytes : tok::BpeModel::Alphabet::kChars;
    auto m = tok::BpeModel::from_json(j["model"], alphabet);
    if (!m) return fail(m.status());
    t->model_ = std::move(m).value();
  }
  {
    auto a = parse_added(j.value("added_tokens", nlohmann::json()));
    if (!a) return fail(a.status());
    t->added_ = std::move(a).value();
  }

  // Id tables: model vocab first, added tokens override (as tokenizers' id_to_token does).
  const auto& vocab = t->model_->id_to_token();
  int32_t max_id = int32_t(vocab.size()) - 1;
  for (const auto& a : t->added_) max_id = std::max(max_id, a.id);
  t->vocab_size_ = max_id + 1;
  t->token_text_.assign(size_t(t->vocab_size_), std::string());
  t->known_.assign(size_t(t->vocab_size_), 0);
  t->special_.assign(size_t(t->vocab_size_), 0);
  const std::optional<int32_t> empty_token_id = t->model_->token_to_id("");  // a vocab may map "" too
  for (size_t id = 0; id < vocab.size(); ++id) {
    t->token_text_[id] = vocab[id];
    t->known_[id] = !vocab[id].empty() || empty_token_id == int32_t(id);
  }
  std::vector<std::string> raw_pat, norm_pat;
  std::vector<tok::AddedToken> raw_tok, norm_tok;
  for (const auto& a : t->added_) {
    // tokenizers (0.23) decodes a normalized added token as its normalized form.
    t->token_text_[a.id] = a.normalized ? t->normalizer_.apply(a.content) : a.content;
    t->known_[a.id] = 1;
    t->special_[a.id] = a.special;
    t->added_by_content_[a.content] = a.id;
    if (a.content.empty()) continue;
    if (a.normalized) {
      norm_pat.push_back(t->normalizer_.apply(a.content));
      norm_tok.push_back(a);
    } else {
      raw_pat.push_back(a.content);
      raw_tok.push_back(a);
    }
  }
  t->byte_level_only_ = t->decoder_.is_byte_level_only();
  t->token_bytes_.resize(t->token_text_.size());
  for (size_t id = 0; id < t->token_text_.size(); ++id)
    t->token_bytes_[id] = t->byte_level_only_ ? decoded_bytes(t->token_text_[id]) : t->decoder_.token_bytes(t->token_text_[id]);
  {
    const nlohmann::json post = j.value("post_processor", nlohmann::json());
    auto p = tok::PostProcessor::from_json(post, t->vocab_size_);
    if (!p) return fail(p.status());
    t->post_ = std::move(p).value();
    t->has_json_post_ = !post.is_null();
  }
  t->raw_matcher_ = tok::AddedTokenMatcher(std::move(raw_pat), std::move(raw_tok));
  t->normalized_matcher_ = tok::AddedTokenMatcher(std::move(norm_pat), std::move(norm_tok));
  return t;
}

void Tokenizer::encode_plain(std::string_view text, bool at_origin, std::vector<int32_t>& out) const {
  bool keeps_start = true;
  const std::string norm = normalizer_.apply(text, &keeps_start);
  at_origin = at_origin && keeps_start;
  std::vector<tok::TextSplit> splits;
  if (normalized_matcher_.empty()) splits.push_back({-1, 0, norm.size()});
  else normalized_matcher_.split(norm, splits);
  std::vector<std::string> words;
  for (const auto& s : splits) {
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    words.clear();
    pretokenizer_.split(std::string_view(norm).substr(s.begin, s.end - s.begin), words, at_origin && s.begin == 0);
    for (const auto& w : words) model_->encode_word(w, out);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids = encode_text(text);
  return add_special_tokens ? post_.apply(std::move(ids)) : ids;
}

std::vector<int32_t> Tokenizer::encode_text(std::string_view text) const {
  std::string repaired;
  if (!tok::is_valid_utf8(text)) {
    repaired = tok::utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (raw_matcher_.empty()) {
    encode_plain(text, true, out);
    return out;
  }
  std::vector<tok::TextSplit> splits;
  raw_matcher_.split(text, splits);
  for (const auto& s : splits) {
    if (s.id >= 0) out.push_back(s.id);
    else encode_plain(text.substr(s.begin, s.end - s.begin), s.begin == 0, out);
  }
  return out;
}

const std::string* Tokenizer::token_text(int32_t id) const {
  return id >= 0 && id < vocab_size_ && known_[size_t(id)] ? &token_text_[size_t(id)] : nullptr;
}

std::string Tokenizer::token_raw_bytes(int32_t id) const { return token_text(id) ? token_bytes_[size_t(id)] : ""; }

std::string Tokenizer::join_raw_bytes(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  bool first = true;
  for (int32_t id : ids) {
    const std::string* t = token_text(id);
    if (!t || (skip_special && is_special(id))) continue;
    out += first ? decoder_.token_bytes(*t, true) : token_bytes_[size_t(id)];
    first = false;
  }
  decoder_.strip_text_edges(out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  if (byte_level_only_) {  // ByteLevel decoder: lossy UTF-8 of the tokens' bytes
    std::string bytes;
    for (int32_t id : ids) {
      if (!token_text(id) || (skip_special && is_special(id))) continue;
      bytes += token_bytes_[size_t(id)];
    }
    return tok::utf8_lossy(bytes);
  }
  tok::DecodeStream stream(decoder_);
  std::string out;
  for (int32_t id : ids) {
    const std::string* t = token_text(id);
    if (!t || (skip_special && is_special(id))) continue;
    stream.push(*t, out);
  }
  stream.finish(out);
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = added_by_content_.find(std::string(token));
  if (it != added_by_content_.end()) return it->second;
  return model_->token_to_id(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = token_text(id);
  return t ? *t : std::string();
}

bool Tokenizer::is_special(int32_t id) const { return id >= 0 && id < vocab_size_ && special_[size_t(id)]; }

}  // namespace anvil
