#include "tokenizer/post_processor.h"

#include <algorithm>

namespace anvil::tok {

namespace {

using json = nlohmann::json;

Result<int32_t> checked_id(const json& v, int vocab_size, const std::string& where) {
  if (!v.is_number_integer()) return invalid_argument(where + ": expected a token id (an integer)");
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id >= vocab_size)
    return invalid_argument(where + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                            std::to_string(vocab_size) + ")");
  return int32_t(id);
}

// Bert/Roberta's "cls"/"sep": ["<s>", 0].
Result<int32_t> token_pair_id(const json& j, const char* key, int vocab_size, const std::string& where) {
  const std::string w = where + "." + key;
  if (!j.contains(key) || !j[key].is_array() || j[key].size() != 2 || !j[key][0].is_string())
    return invalid_argument(w + ": expected [token, id]");
  return checked_id(j[key][1], vocab_size, w + "[1]");
}

}  // namespace

Result<PostProcessor> PostProcessor::from_json(const json& j, int vocab_size) {
  PostProcessor p;
  if (j.is_null()) return p;
  const std::string where = "post_processor";
  // Nested Sequences flatten: each step applies to the previous step's output.
  std::vector<std::pair<const json*, std::string>> pending{{&j, where}};
  for (size_t k = 0; k < pending.size(); ++k) {
    const json& e = *pending[k].first;
    const std::string w = pending[k].second;  // a copy: pending grows below
    if (!e.is_object() || !e.contains("type") || !e["type"].is_string())
      return invalid_argument(w + ": expected an object with a \"type\"");
    const std::string type = e["type"].get<std::string>();
    if (type == "ByteLevel") continue;  // offsets only
    if (type == "Sequence") {
      if (!e.contains("processors") || !e["processors"].is_array())
        return invalid_argument(w + ".processors: expected an array");
      std::vector<std::pair<const json*, std::string>> inner;
      for (size_t i = 0; i < e["processors"].size(); ++i)
        inner.push_back({&e["processors"][i], w + ".processors[" + std::to_string(i) + "]"});
      pending.insert(pending.begin() + std::ptrdiff_t(k) + 1, inner.begin(), inner.end());
      continue;
    }
    if (type == "BertProcessing" || type == "RobertaProcessing") {
      ANVIL_ASSIGN_OR_RETURN(int32_t cls, token_pair_id(e, "cls", vocab_size, w));
      ANVIL_ASSIGN_OR_RETURN(int32_t sep, token_pair_id(e, "sep", vocab_size, w));
      p.steps_.push_back({Piece{false, {cls}}, Piece{true, {}}, Piece{false, {sep}}});
      continue;
    }
    if (type == "TemplateProcessing") {
      if (!e.contains("single") || !e["single"].is_array()) return invalid_argument(w + ".single: expected an array");
      const json* specials = e.contains("special_tokens") ? &e["special_tokens"] : nullptr;
      if (specials && !specials->is_object() && !specials->is_null())
        return invalid_argument(w + ".special_tokens: expected an object");
      Step step;
      for (size_t i = 0; i < e["single"].size(); ++i) {
        const json& piece = e["single"][i];
        const std::string pw = w + ".single[" + std::to_string(i) + "]";
        if (piece.is_object() && piece.contains("Sequence") && piece["Sequence"].is_object()) {
          const json& id = piece["Sequence"].value("id", json());
          if (id != "A")
            return invalid_argument(pw + ": a single-sequence template can only hold sequence \"A\", got " + id.dump());
          step.push_back(Piece{true, {}});
        } else if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
                   piece["SpecialToken"].contains("id") && piece["SpecialToken"]["id"].is_string()) {
          const std::string name = piece["SpecialToken"]["id"].get<std::string>();
          if (!specials || !specials->is_object() || !specials->contains(name))
            return invalid_argument(pw + ": special token \"" + name + "\" is not in " + w + ".special_tokens");
          const json& st = (*specials)[name];
          const std::string sw = w + ".special_tokens[\"" + name + "\"].ids";
          if (!st.is_object() || !st.contains("ids") || !st["ids"].is_array()) return invalid_argument(sw + ": expected an array");
          Piece lit;
          for (size_t t = 0; t < st["ids"].size(); ++t) {
            ANVIL_ASSIGN_OR_RETURN(int32_t id, checked_id(st["ids"][t], vocab_size, sw + "[" + std::to_string(t) + "]"));
            lit.ids.push_back(id);
          }
          step.push_back(std::move(lit));
        } else {
          return invalid_argument(pw + ": expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": {\"id\": \"A\"}}");
        }
      }
      // tokenizers repeats (or drops) the sequence even with add_special_tokens=False, which
      // encode() without special tokens does not reproduce; no real template does this.
      if (std::count_if(step.begin(), step.end(), [](const Piece& x) { return x.is_sequence; }) != 1)
        return invalid_argument(w + ".single: the template must hold sequence $A exactly once");
      p.steps_.push_back(std::move(step));
      continue;
    }
    return invalid_argument(w + ": post-processor \"" + type + "\" is not supported (supported: TemplateProcessing, "
                            "BertProcessing, RobertaProcessing, ByteLevel, Sequence)");
  }
  // tokenizers hands the next processor of a Sequence the previous one's output as separate pieces
  // (one encoding per template piece), so a second token-adding step sees a pair or panics; real
  // files chain ByteLevel with one template at most.
  if (p.steps_.size() > 1)
    return invalid_argument(where + ": a Sequence with more than one token-adding processor (" +
                            std::to_string(p.steps_.size()) + ") is not supported");
  return p;
}

PostProcessor PostProcessor::from_flags(std::optional<int32_t> bos, std::optional<int32_t> eos) {
  PostProcessor p;
  Step step;
  if (bos) step.push_back(Piece{false, {*bos}});
  step.push_back(Piece{true, {}});
  if (eos) step.push_back(Piece{false, {*eos}});
  p.steps_.push_back(std::move(step));
  return p;
}

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  for (const Step& step : steps_) {
    std::vector<int32_t> out;
    for (const Piece& piece : step) {
      if (piece.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), piece.ids.begin(), piece.ids.end());
    }
    ids = std::move(out);
  }
  return ids;
}

bool PostProcessor::adds_tokens() const {
  for (const Step& step : steps_)
    for (const Piece& piece : step)
      if (!piece.is_sequence && !piece.ids.empty()) return true;
  return false;
}

}  // namespace anvil::tok
