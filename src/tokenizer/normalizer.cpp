#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/unicode_class.h"

namespace anvil::tok {

namespace {

// nfc_inert()[cp] is true when NFC cannot change cp or let it interact with its neighbours: it is a
// starter (ccc 0), has no canonical decomposition, is not a composition exclusion, and is never the
// non-first part of a canonical decomposition (so it cannot compose with a preceding character).
// Hangul jamo compose algorithmically and are treated as not inert. A text splits into independent
// NFC segments before every inert code point, so only segments containing other code points need
// utf8proc.
const std::vector<bool>& nfc_inert() {
  static const std::vector<bool> table = [] {
    std::vector<bool> t(0x110000, true);
    for (int32_t cp = 0; cp < 0x110000; ++cp) {
      const utf8proc_property_t* p = utf8proc_get_property(cp);
      if (p->combining_class != 0 || p->comp_exclusion) t[size_t(cp)] = false;
      if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {  // canonical decomposition
        t[size_t(cp)] = false;
        utf8proc_int32_t buf[8];
        int boundclass = 0;
        const utf8proc_ssize_t n = utf8proc_decompose_char(cp, buf, 8, UTF8PROC_DECOMPOSE, &boundclass);
        for (utf8proc_ssize_t i = 1; i > 0 && i < n && i < 8; ++i) t[size_t(buf[i])] = false;
      }
    }
    for (int32_t cp = 0x1100; cp <= 0x11FF; ++cp) t[size_t(cp)] = false;  // conjoining jamo
    for (int32_t cp = 0xAC00; cp <= 0xD7A3; ++cp) t[size_t(cp)] = false;  // syllables compose with trailing jamo
    for (int32_t cp = 0xD7B0; cp <= 0xD7FF; ++cp) t[size_t(cp)] = false;
    return t;
  }();
  return table;
}

void nfc_segment(std::string_view seg, std::string& out) {
  utf8proc_uint8_t* buf = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(seg.data()), utf8proc_ssize_t(seg.size()),
                                          &buf, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) out.append(seg);  // invalid UTF-8: left as is
  else out.append(reinterpret_cast<char*>(buf), size_t(n));
  std::free(buf);
}


void nfc(std::string_view text, std::string& out) {
  const std::vector<bool>& inert = nfc_inert();
  out.reserve(text.size());
  size_t copied = 0;     // text[0, copied) is already in out
  size_t seg_start = 0;  // start of the current segment (at an inert code point, or 0)
  bool seg_dirty = false;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = uint8_t(text[i]);
    if (c < 0x80) {  // ASCII is inert
      if (seg_dirty) {
        nfc_segment(text.substr(seg_start, i - seg_start), out);
        copied = i;
        seg_dirty = false;
      }
      seg_start = i++;
      continue;
    }
    utf8proc_int32_t cp;
    const utf8proc_ssize_t n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                                utf8proc_ssize_t(text.size() - i), &cp);
    if (n <= 0) {  // invalid UTF-8: not normalized (callers pass valid text)
      out.assign(text);
      return;
    }
    if (inert[size_t(cp)]) {
      if (seg_dirty) {
        nfc_segment(text.substr(seg_start, i - seg_start), out);
        copied = i;
        seg_dirty = false;
      }
      seg_start = i;
    } else if (!seg_dirty) {
      out.append(text.substr(copied, seg_start - copied));
      copied = seg_start;
      seg_dirty = true;
    }
    i += size_t(n);
  }
  if (seg_dirty) nfc_segment(text.substr(seg_start), out);
  else out.append(text.substr(copied));
}

void utf8proc_form(std::string_view text, utf8proc_option_t opts, std::string& out) {
  utf8proc_uint8_t* buf = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          utf8proc_ssize_t(text.size()), &buf, utf8proc_option_t(UTF8PROC_STABLE | opts));
  if (n < 0) out.assign(text);
  else out.assign(reinterpret_cast<char*>(buf), size_t(n));
  std::free(buf);
}

// Calls f(cp, byte_offset, byte_len) for each scalar of valid UTF-8 text.
template <class F>
void for_each_cp(std::string_view s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0xFFFD;
    size_t n = utf8_decode_one(s, i, &cp);
    if (n == 0) n = 1;
    f(cp, i, n);
    i += n;
  }
}

}  // namespace

Status Normalizer::parse_into(const nlohmann::json& j, const std::string& path, std::vector<Step>& steps) {
  if (j.is_null()) return Status::ok();
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument(path + ": expected an object with a string \"type\"");
  const std::string type = j["type"].get<std::string>();
  auto str_field = [&](const char* k, std::string* out) -> Status {
    if (!j.contains(k) || !j[k].is_string()) return invalid_argument(path + "." + k + ": expected a string");
    *out = j[k].get<std::string>();
    return Status::ok();
  };
  Step s;
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return invalid_argument(path + ".normalizers: expected an array");
    for (size_t i = 0; i < j["normalizers"].size(); ++i)
      ANVIL_RETURN_IF_ERROR(parse_into(j["normalizers"][i], path + ".normalizers[" + std::to_string(i) + "]", steps));
    return Status::ok();
  } else if (type == "NFC") {
    s.kind = Step::kNfc;
  } else if (type == "NFD") {
    s.kind = Step::kNfd;
  } else if (type == "NFKC") {
    s.kind = Step::kNfkc;
  } else if (type == "NFKD") {
    s.kind = Step::kNfkd;
  } else if (type == "Lowercase") {
    s.kind = Step::kLowercase;
  } else if (type == "Strip") {
    s.kind = Step::kStrip;
    for (const char* k : {"strip_left", "strip_right"})
      if (!j.contains(k) || !j[k].is_boolean()) return invalid_argument(path + "." + k + ": expected a boolean");
    s.left = j["strip_left"].get<bool>();
    s.right = j["strip_right"].get<bool>();
  } else if (type == "Prepend") {
    s.kind = Step::kPrepend;
    ANVIL_RETURN_IF_ERROR(str_field("prepend", &s.content));
  } else if (type == "Replace") {
    s.kind = Step::kReplace;
    ANVIL_RETURN_IF_ERROR(str_field("content", &s.content));
    const nlohmann::json p = j.value("pattern", nlohmann::json());
    if (p.is_object() && p.contains("String") && p["String"].is_string()) {
      const std::string lit = p["String"].get<std::string>();
      if (lit.empty()) return Status::ok();  // tokenizers: an empty pattern matches nothing
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(lit, true, path + ".pattern.String"));
    } else if (p.is_object() && p.contains("Regex") && p["Regex"].is_string()) {
      ANVIL_ASSIGN_OR_RETURN(s.regex, compile_regex(p["Regex"].get<std::string>(), false, path + ".pattern.Regex"));
    } else {
      return invalid_argument(path + ".pattern: expected {\"String\": string} or {\"Regex\": string}");
    }
  } else {
    return unsupported(path + ".type: normalizer \"" + type +
                       "\" is not supported (expected null, NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend "
                       "or a Sequence of those)");
  }
  steps.push_back(std::move(s));
  return Status::ok();
}

Result<Normalizer> Normalizer::from_json(const nlohmann::json& j, const std::string& path) {
  Normalizer n;
  ANVIL_RETURN_IF_ERROR(parse_into(j, path, n.steps_));
  return n;
}

bool Normalizer::apply_step(const Step& s, std::string_view in, std::string& out) {
  out.clear();
  switch (s.kind) {
    case Step::kNfc: nfc(in, out); return true;
    case Step::kNfd: utf8proc_form(in, UTF8PROC_DECOMPOSE, out); return true;
    case Step::kNfkc: utf8proc_form(in, utf8proc_option_t(UTF8PROC_COMPOSE | UTF8PROC_COMPAT), out); return true;
    case Step::kNfkd: utf8proc_form(in, utf8proc_option_t(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), out); return true;
    case Step::kLowercase:
      out.reserve(in.size());
      for_each_cp(in, [&](uint32_t cp, size_t i, size_t n) {
        if (cp < 0x80) out.push_back(char(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
        else if (n == 1) out.push_back(in[i]);
        else append_lowercase(out, cp);
      });
      return true;
    case Step::kStrip: {
      // Rust's trim_start / trim_end: whole scalars with the White_Space property.
      size_t b = 0, e = in.size();
      if (s.left) {
        for (uint32_t cp; b < e;) {
          const size_t n = utf8_decode_one(in, b, &cp);
          if (n == 0 || !is_whitespace_cp(cp)) break;
          b += n;
        }
      }
      if (s.right) {
        while (e > b) {
          size_t k = e - 1;
          while (k > b && (uint8_t(in[k]) & 0xC0) == 0x80) --k;
          uint32_t cp;
          if (utf8_decode_one(in, k, &cp) != e - k || !is_whitespace_cp(cp)) break;
          e = k;
        }
      }
      out.assign(in.substr(b, e - b));
      return b == 0;
    }
    case Step::kPrepend:
      if (!in.empty()) out = s.content;  // tokenizers prepends only to a non-empty string
      out.append(in);
      return true;  // the prepended text is aligned with the first character
    case Step::kReplace: {
      if (!s.regex) {
        out.assign(in);
        return true;
      }
      std::vector<SplitRange> ranges;
      regex_ranges(*s.regex, in, ranges);
      for (const auto& r : ranges) out.append(r.is_match ? std::string_view(s.content) : in.substr(r.begin, r.end - r.begin));
      // Replacement text takes the alignment of what it replaces; empty content deletes.
      return ranges.empty() || !ranges[0].is_match || !s.content.empty();
    }
  }
  return false;  // not reached: every Step::Kind returns above
}

std::string Normalizer::apply(std::string_view text, bool* keeps_start) const {
  if (keeps_start) *keeps_start = true;
  if (steps_.empty() || text.empty()) return std::string(text);
  std::string cur, next;
  std::string_view in = text;
  for (const Step& s : steps_) {
    if (!apply_step(s, in, next) && keeps_start) *keeps_start = false;
    cur.swap(next);
    in = cur;
  }
  return cur;
}

}  // namespace anvil::tok
