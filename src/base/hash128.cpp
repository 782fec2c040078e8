#include "base/hash128.h"

#include <xxhash.h>

#include <cstdio>

namespace anvil {

static Hash128 from_xxh(XXH128_hash_t h) { return Hash128{h.low64, h.high64}; }

std::string Hash128::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

bool Hash128::from_hex(const std::string& s, Hash128* out) {
  if (s.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = s[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return false;
    parts[i / 16] = (parts[i / 16] << 4) | uint64_t(v);
  }
  out->hi = parts[0];
  out->lo = parts[1];
  return true;
}

Hash128 hash128(const void* data, size_t n) { return from_xxh(XXH3_128bits(data, n)); }

Hasher128::Hasher128() : state_(XXH3_createState()) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }
Hasher128::~Hasher128() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void Hasher128::update(const void* data, size_t n) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, n);
}
Hash128 Hasher128::digest() const { return from_xxh(XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_))); }

}  // namespace anvil
