// 128-bit content hashes (XXH3-128): the identity of a KV page (its chain key) and of a model
// (its fingerprint). 128 bits so that accidental collisions are out of reach; they are still not
// cryptographic, so every user of a page key also stores and compares the page's token ids (a key
// match alone is never trusted).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace anvil {

struct Hash128 {
  uint64_t lo = 0, hi = 0;
  bool is_zero() const { return lo == 0 && hi == 0; }
  friend bool operator==(const Hash128& a, const Hash128& b) { return a.lo == b.lo && a.hi == b.hi; }
  friend bool operator!=(const Hash128& a, const Hash128& b) { return !(a == b); }
  friend bool operator<(const Hash128& a, const Hash128& b) { return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo; }
  // 32 lower-case hex digits, high half first (the form stored in catalogs and metadata).
  std::string hex() const;
  // Parses hex(); false on anything else.
  static bool from_hex(const std::string& s, Hash128* out);
};

struct Hash128Hasher {  // for unordered containers
  size_t operator()(const Hash128& h) const { return size_t(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

// One-shot hash of a byte range.
Hash128 hash128(const void* data, size_t n);

// Streaming hash: update() any number of times, then digest(). Feeding the same bytes in any split
// gives the same digest as hash128() over their concatenation.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(const Hasher128&) = delete;
  Hasher128& operator=(const Hasher128&) = delete;
  void update(const void* data, size_t n);
  void update(const Hash128& h) { update(&h, sizeof h); }
  template <class T>
  void update_pod(const T& v) { update(&v, sizeof v); }
  Hash128 digest() const;

 private:
  void* state_;
};

}  // namespace anvil
