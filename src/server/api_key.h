// The API key check of `anvil serve --api-key`: a request carries the key as
// `Authorization: Bearer KEY` (the scheme in any case, as RFC 9110 §11.1 makes auth schemes
// case-insensitive, and any spaces or tabs around the key) or, as llama-server also takes it,
// `X-Api-Key: KEY`. Either one carrying the key is enough. Keys are compared in constant time.
#pragma once
#include <string>

namespace anvil::server {

enum class ApiKeyCheck {
  kOk,
  kMissing,    // neither header, or both empty
  kNotBearer,  // an Authorization header of another scheme (Basic ...), or a bare value
  kWrong,      // a key, not this one
};

// `authorization` and `x_api_key`: the headers' values ("" when absent).
ApiKeyCheck check_api_key(const std::string& authorization, const std::string& x_api_key, const std::string& key);

// The 401 message for a failed check (never quotes what the client sent: it may be a secret).
std::string api_key_error_message(ApiKeyCheck c);

}  // namespace anvil::server
