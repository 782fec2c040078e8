#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>

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

std::string Normalizer::apply(std::string_view text) const {
  if (nfc_passes_ == 0 || text.empty()) return std::string(text);
  // Fast path: pure ASCII is already NFC.
  bool ascii = true;
  for (unsigned char c : text)
    if (c >= 0x80) { ascii = false; break; }
  if (ascii) return std::string(text);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), utf8proc_ssize_t(text.size()), &out,
                                          utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return std::string(text);
  std::string r(reinterpret_cast<char*>(out), size_t(n));
  std::free(out);
  return r;
}

}  // namespace anvil::tok
