#include "server/responses_items.h"

#include <algorithm>
#include <charconv>
#include <vector>

namespace anvil::server {

using ojson = nlohmann::ordered_json;

namespace {

// A message's content as parts of `kind` (input_text or output_text): a string becomes one part; parts
// are kept as the request gave them (their text types as `kind`, a refusal as it is).
ojson parts(const ojson& content, const char* kind) {
  auto part = [&](const std::string& text) {
    ojson p = {{"type", kind}, {"text", text}};
    if (std::string(kind) == "output_text") p["annotations"] = ojson::array(), p["logprobs"] = ojson::array();
    return p;
  };
  ojson out = ojson::array();
  if (content.is_string()) {
    out.push_back(part(content.get<std::string>()));
  } else if (content.is_array()) {
    for (const ojson& p : content) {
      if (p.is_object() && p.contains("text") && p["text"].is_string() && p.value("type", "") != "refusal")
        out.push_back(part(p["text"].get<std::string>()));
      else
        out.push_back(p);
    }
  }
  return out;
}

bool has_text(const ojson& content) {
  if (content.is_string()) return !content.get_ref<const std::string&>().empty();
  return content.is_array() && !content.empty();
}

ApiError bad(const std::string& param, const std::string& message) {
  ApiError e;
  e.param = param;
  e.message = message;
  return e;
}

}  // namespace

ojson input_items(const ojson& conversation, const std::string& response_id) {
  const std::string base = response_id.rfind("resp_", 0) == 0 ? response_id.substr(5) : response_id;
  ojson items = ojson::array();
  auto add = [&](const char* prefix, ojson item) {
    ojson it = ojson::object();
    it["id"] = std::string(prefix) + base + "_" + std::to_string(items.size());
    for (auto i = item.begin(); i != item.end(); ++i) it[i.key()] = std::move(i.value());
    it["status"] = "completed";
    items.push_back(std::move(it));
  };
  if (!conversation.is_array()) return items;
  for (size_t i = 0; i + 1 < conversation.size(); ++i) {  // (the last message is the reply)
    const ojson& m = conversation[i];
    if (!m.is_object()) continue;
    const std::string role = m.value("role", "");
    const ojson content = m.contains("content") ? m["content"] : ojson();
    if (role == "tool") {
      add("fco_", {{"type", "function_call_output"},
                   {"call_id", m.value("tool_call_id", "")},
                   {"output", content.is_null() ? ojson("") : content}});
    } else if (role == "assistant") {
      if (m.contains("reasoning_content") && m["reasoning_content"].is_string())
        add("rs_", {{"type", "reasoning"},
                    {"summary", ojson::array()},
                    {"content", ojson::array({{{"type", "reasoning_text"}, {"text", m["reasoning_content"]}}})}});
      if (has_text(content) || !m.contains("tool_calls"))
        add("msg_", {{"type", "message"}, {"role", "assistant"}, {"content", parts(content, "output_text")}});
      if (m.contains("tool_calls") && m["tool_calls"].is_array())
        for (const ojson& c : m["tool_calls"]) {
          const ojson fn = c.contains("function") ? c["function"] : ojson::object();
          add("fc_", {{"type", "function_call"},
                      {"call_id", c.value("id", "")},
                      {"name", fn.value("name", "")},
                      {"arguments", fn.value("arguments", "")}});
        }
    } else {
      add("msg_", {{"type", "message"}, {"role", role}, {"content", parts(content, "input_text")}});
    }
  }
  return items;
}

std::variant<ojson, ApiError> input_items_page(const ojson& items, const std::optional<std::string>& limit,
                                               const std::optional<std::string>& order,
                                               const std::optional<std::string>& after) {
  int n = 20;
  if (limit) {
    const char* b = limit->data();
    const char* e = b + limit->size();
    auto [p, ec] = std::from_chars(b, e, n);
    if (ec != std::errc() || p != e || n < 1 || n > 100)
      return bad("limit", "'limit' must be an integer from 1 to 100, got '" + limit->substr(0, 40) + "'");
  }
  bool asc = false;
  if (order) {
    if (*order != "asc" && *order != "desc")
      return bad("order", "'order' must be 'asc' or 'desc', got '" + order->substr(0, 40) + "'");
    asc = *order == "asc";
  }
  std::vector<const ojson*> seq;
  for (const ojson& it : items) seq.push_back(&it);
  if (!asc) std::reverse(seq.begin(), seq.end());
  size_t from = 0;
  if (after) {
    size_t at = 0;
    while (at < seq.size() && (*seq[at])["id"] != *after) ++at;
    if (at == seq.size())
      return bad("after", "'after' names no input item of this response: '" + after->substr(0, 100) + "'");
    from = at + 1;
  }
  ojson data = ojson::array();
  for (size_t i = from; i < seq.size() && data.size() < size_t(n); ++i) data.push_back(*seq[i]);
  const bool more = from + data.size() < seq.size();
  ojson page = ojson::object();
  page["object"] = "list";
  page["data"] = data;
  page["first_id"] = data.empty() ? ojson() : data.front()["id"];
  page["last_id"] = data.empty() ? ojson() : data.back()["id"];
  page["has_more"] = more;
  return page;
}

}  // namespace anvil::server
