// The tokenizer.json "normalizer": null, NFC, or a Sequence of those (applied in order).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"

namespace anvil::tok {

class Normalizer {
 public:
  // `j` is the "normalizer" field (may be null). Errors name the field path.
  static Result<Normalizer> from_json(const nlohmann::json& j, const std::string& path = "normalizer");
  bool is_identity() const { return nfc_passes_ == 0; }
  // Invalid UTF-8 input is passed through unchanged (utf8proc rejects it).
  std::string apply(std::string_view text) const;

 private:
  int nfc_passes_ = 0;  // NFC is idempotent, but we record it as given
};

}  // namespace anvil::tok
