#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <vector>

namespace anvil::tok {

Result<Normalizer> Normalizer::from_json(const nlohmann::json& j, const std::string& path) {
  Normalizer n;
  if (j.is_null()) return n;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return invalid_argument(path + ": expected an object with a string \"type\"");
  const std::string type = j["type"].get<std::string>();
  if (type == "NFC") {
    n.nfc_passes_ = 1;
    return n;
  }
  if (type == "Sequence") {
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      return invalid_argument(path + ".normalizers: expected an array");
    for (size_t i = 0; i < j["normalizers"].size(); ++i) {
      ANVIL_ASSIGN_OR_RETURN(Normalizer inner, from_json(j["normalizers"][i], path + ".normalizers[" + std::to_string(i) + "]"));
      n.nfc_passes_ += inner.nfc_passes_;
    }
    return n;
  }
  return unsupported(path + ".type: normalizer \"" + type + "\" is not supported (expected null, NFC or a Sequence of NFC)");
}

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

}  // namespace

std::string Normalizer::apply(std::string_view text) const {
  if (nfc_passes_ == 0 || text.empty()) return std::string(text);
  const std::vector<bool>& inert = nfc_inert();
  std::string out;
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
    if (n <= 0) return std::string(text);  // invalid UTF-8: not normalized (callers pass valid text)
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
  return out;
}

}  // namespace anvil::tok
