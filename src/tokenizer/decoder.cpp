#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"

namespace anvil::tok {

namespace {

const char kReplacementChar[] = "\xEF\xBF\xBD";  // U+FFFD

// tokenizers' ByteFallback test: a 6-byte "<0xNN>" whose NN parses with u8::from_str_radix(_, 16)
// (which also accepts a leading '+').
bool byte_token(std::string_view t, uint8_t* b) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return false;
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (t[3] == '+') {
    const int lo = hex(t[4]);
    if (lo < 0) return false;
    *b = uint8_t(lo);
    return true;
  }
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return false;
  *b = uint8_t(hi * 16 + lo);
  return true;
}

Result<uint32_t> one_char(const nlohmann::json& j, const char* key, const std::string& path) {
  if (!j.contains(key) || !j[key].is_string()) return invalid_argument(path + "." + key + ": expected a one-character string");
  const std::string s = j[key].get<std::string>();
  uint32_t cp;
  if (s.empty() || utf8_decode_one(s, 0, &cp) != s.size())
    return invalid_argument(path + "." + key + ": expected exactly one character, got \"" + s + "\"");
  return cp;
}

// Calls f(cp, bytes) for each scalar of valid UTF-8 text.
template <class F>
void for_each_char(std::string_view s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0xFFFD;
    size_t n = utf8_decode_one(s, i, &cp);
    if (n == 0) n = 1;
    f(cp, s.substr(i, n));
    i += n;
  }
}

}  // namespace

Status Decoder::parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument(path + ": expected an object with a string \"type\"");
  const std::string type = j["type"].get<std::string>();
  Step s;
  s.kind = Step::kByteLevel;
  if (type == "Sequence") {
    if (!j.contains("decoders") || !j["decoders"].is_array()) return invalid_argument(path + ".decoders: expected an array");
    for (size_t i = 0; i < j["decoders"].size(); ++i)
      ANVIL_RETURN_IF_ERROR(parse_into(j["decoders"][i], path + ".decoders[" + std::to_string(i) + "]", steps));
    return Status::ok();
  } else if (type == "ByteLevel") {
    s.kind = Step::kByteLevel;
  } else if (type == "ByteFallback") {
    s.kind = Step::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = Step::kFuse;
  } else if (type == "Strip") {
    s.kind = Step::kStrip;
    ANVIL_ASSIGN_OR_RETURN(s.ch, one_char(j, "content", path));
    s.content = j["content"].get<std::string>();
    for (const char* k : {"start", "stop"})
      if (!j.contains(k) || !j[k].is_number_unsigned()) return invalid_argument(path + "." + k + ": expected a non-negative integer");
    s.start = j["start"].get<size_t>();
    s.stop = j["stop"].get<size_t>();
  } else if (type == "Replace") {
    s.kind = Step::kReplace;
    if (!j.contains("content") || !j["content"].is_string()) return invalid_argument(path + ".content: expected a string");
    s.content = j["content"].get<std::string>();
    const nlohmann::json p = j.value("pattern", nlohmann::json());
    if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      const std::string lit = p["String"].get<std::string>();
      uint32_t cp;
      s.single_char_pattern = lit.empty() || utf8_decode_one(lit, 0, &cp) == lit.size();
      if (!lit.empty()) {
        ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(lit, true, path + ".pattern.String"));
      }
    } else if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(p["Regex"].get<std::string>(), false, path + ".pattern.Regex"));
    } else {
      return invalid_argument(path + ".pattern: expected {\"String\": string} or {\"Regex\": string}");
    }
  } else if (type == "Metaspace") {
    s.kind = Step::kMetaspace;
    ANVIL_ASSIGN_OR_RETURN(s.ch, one_char(j, "replacement", path));
    std::string scheme = j.contains("prepend_scheme") && j["prepend_scheme"].is_string() ? j["prepend_scheme"].get<std::string>() : "always";
    if (j.contains("add_prefix_space") && j["add_prefix_space"].is_boolean() && !j["add_prefix_space"].get<bool>()) scheme = "never";
    if (scheme != "always" && scheme != "first" && scheme != "never")
      return invalid_argument(path + ".prepend_scheme: \"" + scheme + "\" is not one of always, first, never");
    s.drop_first = scheme != "never";
  } else {
    return unsupported(path + ".type: decoder \"" + type +
                       "\" is not supported (expected ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace or a "
                       "Sequence of those)");
  }
  steps.push_back(std::move(s));
  return Status::ok();
}

Result<Decoder> Decoder::from_json(const nlohmann::json& j, const std::string& path) {
  Decoder d;
  if (j.is_null()) {
    d.separator_ = " ";  // tokenizers: no decoder joins the tokens with spaces
    return d;
  }
  ANVIL_RETURN_IF_ERROR(parse_into(j, path, d.steps_));
  return d;
}

namespace {

const char* step_name(int kind) {
  static const char* const names[] = {"ByteLevel", "ByteFallback", "Fuse", "Strip", "Replace", "Metaspace"};
  return names[kind];
}

// tokenizers' Strip of one token: up to `start` leading and `stop` trailing `content` characters.
std::string strip_chars(std::string_view t, uint32_t ch, size_t start, size_t stop) {
  std::vector<std::string_view> chars;
  std::vector<uint32_t> cps;
  for_each_char(t, [&](uint32_t cp, std::string_view bytes) {
    chars.push_back(bytes);
    cps.push_back(cp);
  });
  size_t b = 0, e = chars.size();
  while (b < start && b < e && cps[b] == ch) ++b;
  for (size_t k = 0; k < stop && e > b && cps[e - 1] == ch; ++k) --e;
  std::string r;
  for (size_t i = b; i < e; ++i) r.append(chars[i]);
  return r;
}

}  // namespace

std::string Decoder::token_bytes(std::string_view token, bool first) const {
  std::string t(token);
  bool fused = false;  // a fusing step came before: later steps see the whole text as one token
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Step::kByteLevel:
        if (auto b = byte_level_to_bytes(t)) t = std::move(*b);
        fused = true;
        break;
      case Step::kFuse:
        fused = true;
        break;
      case Step::kByteFallback: {
        uint8_t b;
        if (!fused && byte_token(t, &b)) t.assign(1, char(b));
        break;
      }
      case Step::kStrip:
        if (!fused && is_valid_utf8(t)) t = strip_chars(t, s.ch, s.start, s.stop);
        break;  // after a fusing step: the text's edges (strip_text_edges)
      case Step::kReplace:
        if (s.regex && is_valid_utf8(t)) {  // a lone byte of a longer character matches no pattern
          std::vector<SplitRange> ranges;
          regex_ranges(*s.regex, t, ranges);
          std::string r;
          for (const auto& x : ranges) r.append(x.is_match ? std::string_view(s.content) : std::string_view(t).substr(x.begin, x.end - x.begin));
          t = std::move(r);
        }
        break;
      case Step::kMetaspace: {
        if (!is_valid_utf8(t)) break;
        // After a fusing step the whole text is Metaspace's first token.
        const bool drop = (first || fused) && s.drop_first;
        std::string r;
        for_each_char(t, [&](uint32_t cp, std::string_view bytes) {
          if (cp != s.ch) r.append(bytes);
          else if (!drop) r.push_back(' ');
        });
        t = std::move(r);
        break;
      }
    }
  }
  return first ? t : separator_ + t;
}

void Decoder::strip_text_edges(std::string& bytes) const {
  bool fused = false;
  for (const Step& s : steps_) {
    if (s.kind == Step::kFuse || s.kind == Step::kByteLevel) fused = true;
    if (s.kind != Step::kStrip || !fused) continue;
    size_t b = 0, e = bytes.size();
    const size_t n = s.content.size();
    for (size_t k = 0; k < s.start && e - b >= n && bytes.compare(b, n, s.content) == 0; ++k) b += n;
    for (size_t k = 0; k < s.stop && e - b >= n && bytes.compare(e - n, n, s.content) == 0; ++k) e -= n;
    bytes = bytes.substr(b, e - b);
  }
}

std::vector<std::string> Decoder::edge_strip_contents() const {
  std::vector<std::string> out;
  bool fused = false;
  for (const Step& s : steps_) {
    if (s.kind == Step::kFuse || s.kind == Step::kByteLevel) fused = true;
    if (s.kind == Step::kStrip && fused) out.push_back(s.content);
  }
  return out;
}

Status Decoder::check_exact_token_bytes() const {
  bool fused = false, byte_level = false, byte_fallback = false, edge_strip = false;
  std::string fuser;
  for (const Step& s : steps_) {
    const std::string name = step_name(s.kind);
    auto refuse = [&](const std::string& why) {
      return unsupported("the decoder's " + name + " step " + why + ", so a token's bytes depend on its neighbours");
    };
    if (edge_strip && s.kind != Step::kStrip && s.kind != Step::kFuse) return refuse("comes after a Strip of the whole text");
    if (fused && (s.kind == Step::kByteFallback || s.kind == Step::kByteLevel ||
                  (s.kind == Step::kReplace && !s.single_char_pattern)))
      return refuse("comes after " + fuser + ", where it acts on the whole text");
    if (byte_level && (s.kind == Step::kReplace || s.kind == Step::kMetaspace))
      return refuse("comes after ByteLevel, where it reads bytes that are not yet characters");
    if (s.kind == Step::kStrip && !fused && byte_fallback)
      return refuse("comes after ByteFallback and before any Fuse, where it strips a run of byte tokens as one token");
    if (s.kind == Step::kStrip && fused) edge_strip = true;
    if (s.kind == Step::kByteFallback) byte_fallback = true;
    if (s.kind == Step::kByteLevel) byte_level = true;
    if ((s.kind == Step::kFuse || s.kind == Step::kByteLevel) && !fused) {
      fused = true;
      fuser = name;
    }
  }
  return Status::ok();
}

DecodeStream::DecodeStream(const Decoder& d) : d_(d), st_(d.steps_.size() + 1) {}

void DecodeStream::push(std::string_view token, std::string& out) { feed(0, token, true, out); }

void DecodeStream::finish(std::string& out) {
  end(0, out);
  st_.assign(d_.steps_.size() + 1, State{});
}

void DecodeStream::sink(std::string_view frag, bool last, std::string& out) {
  State& s = st_.back();
  if (!s.open) {
    if (s.tokens++ > 0) out += d_.separator_;
    s.open = true;
  }
  out.append(frag);
  if (last) s.open = false;
}

void DecodeStream::feed(size_t i, std::string_view frag, bool last, std::string& out) {
  if (i == d_.steps_.size()) return sink(frag, last, out);
  const Decoder::Step& step = d_.steps_[i];
  State& s = st_[i];
  switch (step.kind) {
    case Decoder::Step::kByteLevel: {  // fuses everything into one token, decoded lossily
      s.buf.append(frag);
      if (!last) return;
      auto bytes = byte_level_to_bytes(s.buf);
      s.held += bytes ? *bytes : s.buf;
      s.buf.clear();
      const size_t done = utf8_complete_prefix(s.held);
      if (done == 0) return;
      const std::string text = utf8_lossy(std::string_view(s.held).substr(0, done));
      s.held.erase(0, done);
      return feed(i + 1, text, false, out);
    }
    case Decoder::Step::kFuse:
      return feed(i + 1, frag, false, out);
    case Decoder::Step::kByteFallback: {
      s.buf.append(frag);
      if (!last) return;
      const std::string tok = std::move(s.buf);
      s.buf.clear();
      uint8_t b;
      if (byte_token(tok, &b)) {
        s.held.push_back(char(b));
        return;
      }
      if (!s.held.empty()) {  // the run ends: one token if it is valid UTF-8, else U+FFFD per byte
        const std::string run = std::move(s.held);
        s.held.clear();
        if (is_valid_utf8(run)) feed(i + 1, run, true, out);
        else
          for (size_t k = 0; k < run.size(); ++k) feed(i + 1, kReplacementChar, true, out);
      }
      return feed(i + 1, tok, true, out);
    }
    case Decoder::Step::kStrip: {
      if (!s.open) {
        s.open = true;
        s.in_prefix = true;
        s.strip_left = step.start;
        s.held.clear();
        s.held_count = 0;
      }
      std::string text;
      for_each_char(frag, [&](uint32_t cp, std::string_view bytes) {
        if (s.in_prefix && s.strip_left > 0 && cp == step.ch) {
          --s.strip_left;
          return;
        }
        s.in_prefix = false;
        if (step.stop > 0 && cp == step.ch) {  // may be among the last `stop` characters
          s.held.append(bytes);
          if (++s.held_count > step.stop) {
            text += step.content;
            s.held.erase(0, step.content.size());
            --s.held_count;
          }
          return;
        }
        text += s.held;
        s.held.clear();
        s.held_count = 0;
        text.append(bytes);
      });
      if (last) {
        s.open = false;  // the held trailing characters are stripped
        s.held.clear();
        s.held_count = 0;
        return feed(i + 1, text, true, out);
      }
      if (!text.empty()) feed(i + 1, text, false, out);
      return;
    }
    case Decoder::Step::kReplace: {
      auto apply = [&](std::string_view t) {
        if (!step.regex) return std::string(t);
        std::vector<SplitRange> ranges;
        regex_ranges(*step.regex, t, ranges);
        std::string r;
        for (const auto& x : ranges) r.append(x.is_match ? std::string_view(step.content) : t.substr(x.begin, x.end - x.begin));
        return r;
      };
      if (step.single_char_pattern) return feed(i + 1, apply(frag), last, out);
      s.buf.append(frag);
      if (!last) return;
      const std::string text = apply(s.buf);
      s.buf.clear();
      return feed(i + 1, text, true, out);
    }
    case Decoder::Step::kMetaspace: {
      if (!s.open) {
        s.open = true;
        ++s.tokens;
      }
      // tokenizers drops every replacement character of the first token (not only a leading one).
      const bool drop = s.tokens == 1 && step.drop_first;
      std::string text;
      for_each_char(frag, [&](uint32_t cp, std::string_view bytes) {
        if (cp != step.ch) text.append(bytes);
        else if (!drop) text.push_back(' ');
      });
      if (last) s.open = false;
      return feed(i + 1, text, last, out);
    }
  }
}

void DecodeStream::end(size_t i, std::string& out) {
  if (i == d_.steps_.size()) return;
  const Decoder::Step& step = d_.steps_[i];
  State& s = st_[i];
  switch (step.kind) {
    case Decoder::Step::kByteLevel: {  // always one token, even for no input
      const std::string text = utf8_lossy(s.held);
      s.held.clear();
      feed(i + 1, text, true, out);
      break;
    }
    case Decoder::Step::kFuse:
      feed(i + 1, "", true, out);
      break;
    case Decoder::Step::kByteFallback:
      if (!s.held.empty()) {
        const std::string run = std::move(s.held);
        s.held.clear();
        if (is_valid_utf8(run)) feed(i + 1, run, true, out);
        else
          for (size_t k = 0; k < run.size(); ++k) feed(i + 1, kReplacementChar, true, out);
      }
      break;
    case Decoder::Step::kStrip:
    case Decoder::Step::kReplace:
    case Decoder::Step::kMetaspace:
      break;  // tokens are complete when a step ends: nothing is pending here
  }
  end(i + 1, out);
}

}  // namespace anvil::tok
