// Server-sent events of a streamed reply, for the HTTP tests.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil::test {

// Parses an SSE body into its data payloads (without "[DONE]"); *done says whether it ended. A
// payload that is not JSON is kept as a discarded value (is_discarded()), for the caller to assert.
inline std::vector<nlohmann::json> sse_events(const std::string& body, bool* done) {
  std::vector<nlohmann::json> out;
  *done = false;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string d = body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (d == "[DONE]") *done = true;
    else out.push_back(nlohmann::json::parse(d, nullptr, false));
  }
  return out;
}

}  // namespace anvil::test
