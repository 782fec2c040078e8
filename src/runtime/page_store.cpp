#include "runtime/page_store.h"

namespace anvil {

Hash128 kv_page_key(const Hash128& fingerprint, const Hash128& parent, std::span<const int32_t> tokens) {
  Hasher128 h;
  h.update(fingerprint);
  h.update(parent);
  h.update(tokens.data(), tokens.size_bytes());
  return h.digest();
}

}  // namespace anvil
