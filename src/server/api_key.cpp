#include "server/api_key.h"

#include <cctype>
#include <cstdint>
#include <string_view>

namespace anvil::server {

namespace {

bool is_ows(char c) { return c == ' ' || c == '\t'; }

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && is_ows(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ows(s.back())) s.remove_suffix(1);
  return s;
}

// Constant time in the length of `given` (what the client sent), whatever it holds.
bool constant_time_equal(std::string_view given, std::string_view key) {
  unsigned char d = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) d |= uint8_t(given[i] ^ (i < key.size() ? key[i] : 0));
  return d == 0;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

ApiKeyCheck check_api_key(const std::string& authorization, const std::string& x_api_key, const std::string& key) {
  const std::string_view auth = trim_ows(authorization), xkey = trim_ows(x_api_key);
  if (auth.empty() && xkey.empty()) return ApiKeyCheck::kMissing;
  bool bearer = false;
  std::string_view token;
  if (!auth.empty()) {
    // credentials = auth-scheme 1*SP token68 (RFC 9110 §11.4); spaces or tabs, as many as sent.
    size_t sp = 0;
    while (sp < auth.size() && !is_ows(auth[sp])) ++sp;
    if (iequals(auth.substr(0, sp), "Bearer")) {
      bearer = true;
      token = trim_ows(auth.substr(sp));
      if (!token.empty() && constant_time_equal(token, key)) return ApiKeyCheck::kOk;
    }
  }
  if (!xkey.empty() && constant_time_equal(xkey, key)) return ApiKeyCheck::kOk;
  if (xkey.empty() && !bearer) return ApiKeyCheck::kNotBearer;
  if (xkey.empty() && token.empty()) return ApiKeyCheck::kMissing;  // "Bearer" and no key
  return ApiKeyCheck::kWrong;
}

std::string api_key_error_message(ApiKeyCheck c) {
  switch (c) {
    case ApiKeyCheck::kMissing: return "Missing API key: send 'Authorization: Bearer <key>' (or 'X-Api-Key: <key>')";
    case ApiKeyCheck::kNotBearer:
      return "The Authorization header must use the Bearer scheme: send 'Authorization: Bearer <key>'";
    default: return "Invalid API key";
  }
}

}  // namespace anvil::server
