#include "server/api_request.h"

#include <algorithm>
#include <cctype>

#include <cmath>

namespace anvil::server {

using ojson = nlohmann::ordered_json;

namespace {

ApiError bad(const std::string& param, const std::string& message, const std::string& code = "") {
  ApiError e;
  e.param = param;
  e.message = message;
  e.code = code;
  return e;
}

std::string type_name(const ojson& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Optional fields: absent or null means "not given".
const ojson* field(const ojson& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> get_bool(const ojson& o, const char* key, bool* out) {
  const ojson* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return bad(key, std::string("'") + key + "' must be a boolean, got " + type_name(*v));
  *out = v->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> get_number(const ojson& o, const char* key, double lo, double hi, bool lo_open, float* out,
                                   bool* given = nullptr) {
  const ojson* v = field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number())
    return bad(key, std::string("'") + key + "' must be a number, got " + type_name(*v));
  double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    char b[160];
    std::snprintf(b, sizeof b, "'%s' must be in %s%g, %g], got %g", key, lo_open ? "(" : "[", lo, hi, x);
    return bad(key, b);
  }
  *out = float(x);
  if (given) *given = true;
  return std::nullopt;
}

std::optional<ApiError> get_int(const ojson& o, const char* key, int64_t lo, int64_t hi, int64_t* out,
                                bool* given = nullptr) {
  const ojson* v = field(o, key);
  if (!v) return std::nullopt;
  bool integral = v->is_number_integer() || v->is_number_unsigned() ||
                  (v->is_number_float() && std::isfinite(v->get<double>()) &&
                   v->get<double>() == std::floor(v->get<double>()) && std::fabs(v->get<double>()) < 9e15);
  if (!integral) return bad(key, std::string("'") + key + "' must be an integer, got " + type_name(*v));
  int64_t x;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    x = u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(u);
  } else if (v->is_number_integer()) {
    x = v->get<int64_t>();
  } else {
    x = int64_t(v->get<double>());
  }
  if (x < lo || x > hi)
    return bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                        "], got " + std::to_string(x));
  *out = x;
  if (given) *given = true;
  return std::nullopt;
}

// OpenAI's logit_bias: {"<token id>": bias, ...}, the id a decimal integer string, the bias a number
// in [-100, 100]. Out: the entries by ascending id (SamplingParams::logit_bias); {} is no bias.
std::optional<ApiError> parse_logit_bias(const ojson& lb, int vocab_size, std::vector<LogitBias>* out) {
  if (!lb.is_object())
    return bad("logit_bias", "'logit_bias' must be an object mapping token ids (strings) to biases in [-100, 100], got " +
                                 type_name(lb));
  if (lb.size() > size_t(kMaxLogitBiasEntries))
    return bad("logit_bias", "'logit_bias' takes at most " + std::to_string(kMaxLogitBiasEntries) + " entries, got " +
                                 std::to_string(lb.size()));
  std::vector<LogitBias> v;
  for (auto it = lb.begin(); it != lb.end(); ++it) {
    const std::string& key = it.key();
    const std::string shown = "'logit_bias[\"" + key.substr(0, 40) + "\"]'";
    int64_t id = 0;
    bool ok = !key.empty() && key.size() <= 10;
    for (char c : key) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) id = id * 10 + (c - '0');
    }
    if (!ok || id > INT32_MAX)
      return bad("logit_bias", "'logit_bias' keys must be token ids (decimal integers >= 0), got '" +
                                   key.substr(0, 40) + "'");
    if (vocab_size > 0 && id >= vocab_size)
      return bad("logit_bias", shown + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                   std::to_string(vocab_size) + ")");
    const ojson& x = it.value();
    if (!x.is_number()) return bad("logit_bias", shown + " must be a number, got " + type_name(x));
    const double bias = x.get<double>();
    if (!std::isfinite(bias) || bias < -kMaxLogitBias || bias > kMaxLogitBias) {
      char m[96];
      std::snprintf(m, sizeof m, " must be in [-100, 100], got %g", bias);
      return bad("logit_bias", shown + m);
    }
    v.push_back({int32_t(id), float(bias)});
  }
  std::sort(v.begin(), v.end(), [](const LogitBias& a, const LogitBias& b) { return a.id < b.id; });
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i].id == v[i - 1].id)
      return bad("logit_bias", "'logit_bias' names token " + std::to_string(v[i].id) + " twice");
  *out = std::move(v);
  return std::nullopt;
}

// The parameters chat and completions share.
std::optional<ApiError> parse_common(const ojson& b, const RequestDefaults& d, ApiRequest* r) {
  if (const ojson* m = field(b, "model")) {
    if (!m->is_string()) return bad("model", "'model' must be a string, got " + type_name(*m));
    r->model = m->get<std::string>();
    if (r->model != d.model_id && r->model != d.model_alt) {
      ApiError e = bad("model", "The model '" + r->model + "' does not exist; this server serves '" + d.model_id + "'",
                       "model_not_found");
      e.status = 404;
      return e;
    }
  }
  int64_t n = 1;
  if (auto e = get_int(b, "n", 1, kMaxChoices, &n)) return e;
  r->n = int(n);
  // max_completion_tokens is the newer name; when both are given they must agree.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    int64_t v = 0;
    bool given = false;
    // Completions may ask for no token at all, with echo (checked there): the prompt scored alone.
    if (auto e = get_int(b, key, r->chat ? 1 : 0, d.max_context, &v, &given)) {
      if (e->message.find("must be in") != std::string::npos)
        e->message += " (the context is " + std::to_string(d.max_context) + " tokens)";
      return e;
    }
    if (given) {
      if (r->max_tokens && *r->max_tokens != int(v))
        return bad(key, "'max_tokens' and 'max_completion_tokens' disagree");
      r->max_tokens = int(v);
    }
  }
  GenerationParams& g = r->gen;
  g.sampling = d.sampling;
  if (auto e = get_number(b, "temperature", 0, 2, false, &g.sampling.temperature)) return e;
  if (auto e = get_number(b, "top_p", 0, 1, true, &g.sampling.top_p)) return e;
  if (auto e = get_number(b, "min_p", 0, 1, false, &g.sampling.min_p)) return e;
  if (g.sampling.min_p >= 1) return bad("min_p", "'min_p' must be below 1");
  int64_t top_k = 0;
  bool top_k_given = false;
  if (auto e = get_int(b, "top_k", -1, 1 << 30, &top_k, &top_k_given)) return e;
  if (top_k_given) g.sampling.top_k = top_k < 0 ? 0 : int(top_k);  // -1 = off (vLLM)
  // seed: 0 to 2^64-1 as the CLI's --seed, or -1 (or null) for a random one, as llama-server; other
  // negative ones are taken modulo 2^64 (OpenAI's SDKs send any 64-bit integer).
  if (const ojson* v = field(b, "seed"); v && v->is_number_unsigned()) {
    g.sampling.seed = v->get<uint64_t>();
    r->seed_given = true;
  } else {
    int64_t seed = 0;
    bool given = false;
    if (auto e = get_int(b, "seed", INT64_MIN, INT64_MAX, &seed, &given)) return e;
    if (given && seed == -1) {
      r->seed_random = true;
    } else if (given) {
      g.sampling.seed = uint64_t(seed);
      r->seed_given = true;
    }
  }
  if (auto e = get_number(b, "presence_penalty", -2, 2, false, &g.presence_penalty)) return e;
  if (auto e = get_number(b, "frequency_penalty", -2, 2, false, &g.frequency_penalty)) return e;
  if (auto e = get_number(b, "repetition_penalty", 0, 10, true, &g.sampling.repetition_penalty)) return e;
  if (const ojson* s = field(b, "stop")) {
    if (s->is_string()) {
      g.stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      if (s->size() > 16) return bad("stop", "'stop' takes at most 16 strings, got " + std::to_string(s->size()));
      for (size_t i = 0; i < s->size(); ++i) {
        if (!(*s)[i].is_string())
          return bad("stop", "'stop[" + std::to_string(i) + "]' must be a string, got " + type_name((*s)[i]));
        g.stop.push_back((*s)[i].get<std::string>());
      }
    } else {
      return bad("stop", "'stop' must be a string or an array of strings, got " + type_name(*s));
    }
    for (auto& x : g.stop)
      if (x.empty()) return bad("stop", "'stop' strings must not be empty");
  }
  if (auto e = get_bool(b, "stream", &r->stream)) return e;
  if (const ojson* so = field(b, "stream_options")) {
    if (!so->is_object()) return bad("stream_options", "'stream_options' must be an object, got " + type_name(*so));
    if (auto e = get_bool(*so, "include_usage", &r->include_usage)) {
      e->param = "stream_options.include_usage";
      e->message = "'stream_options.include_usage' must be a boolean";
      return e;
    }
    // As OpenAI and vLLM: options for a stream need one (an empty object asks for nothing).
    if (!so->empty() && !r->stream)
      return bad("stream_options", "'stream_options' is only allowed with 'stream': true");
  }
  if (auto e = get_bool(b, "ignore_eos", &g.ignore_eos)) return e;
  if (const ojson* s = field(b, "session")) {
    if (!s->is_string()) return bad("session", "'session' must be a string, got " + type_name(*s));
    if (!valid_session_name(s->get<std::string>()))
      return bad("session", "'session' must be 1 to 128 characters of A-Z a-z 0-9 . _ - (not starting with . or -), "
                            "got '" + s->get<std::string>().substr(0, 200) + "'");
    r->session = s->get<std::string>();
    if (r->n > 1) return bad("n", "a session's turn has one reply: 'n' must be 1 with 'session'");
  }
  if (const ojson* rf = field(b, "response_format")) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      return bad("response_format", "'response_format' must be an object with a string 'type'");
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_schema")
      return bad("response_format", "'response_format' type 'json_schema' is not supported: anvil constrains a reply "
                                    "to JSON syntax only; use {\"type\": \"json_object\"} and describe the schema "
                                    "in the prompt");
    if (type != "text" && type != "json_object")
      return bad("response_format", "'response_format' type '" + type.substr(0, 100) +
                                        "' is not supported; use 'text' or 'json_object'");
    g.json_object = type == "json_object";
    // After the object only an end-of-sequence token may come, which ignore_eos forbids.
    if (g.json_object && g.ignore_eos)
      return bad("response_format", "'response_format' json_object ends the reply with the end-of-sequence token once "
                                    "the object is closed; it cannot be combined with 'ignore_eos'");
  }
  if (const ojson* lb = field(b, "logit_bias"))
    if (auto e = parse_logit_bias(*lb, d.vocab_size, &g.sampling.logit_bias)) return e;
  return std::nullopt;
}

// Content part types that carry media: refused, since anvil's models read text.
bool is_media_part(const std::string& type) {
  static const char* const kMedia[] = {"image_url", "input_image", "input_audio", "audio_url", "video_url",
                                       "file",      "input_file",  "image_embeds", "audio_embeds"};
  for (const char* m : kMedia)
    if (type == m) return true;
  return false;
}

// Message content as the template wants it: a string, or null. Text parts are "text", and also
// "input_text" / "output_text" (the Responses API's names, which some clients send to chat
// completions; vLLM takes them too); an assistant message's "refusal" parts are its text. The parts
// that are not empty are joined with "\n", as vLLM ("string" content format) and llama.cpp's server
// (a template that takes string content) join them, so that the same request renders the same
// prompt on either; mlx-lm's server joins them with "", which runs two blocks' words together.
std::optional<ApiError> flatten_content(const ojson& c, const std::string& where, const std::string& role, ojson* out) {
  if (c.is_null() || c.is_string()) {
    *out = c;
    return std::nullopt;
  }
  if (!c.is_array()) return bad("messages", "'" + where + ".content' must be a string or an array of content parts, got " + type_name(c));
  static const std::string kSendText = "send the content as a string or as text parts ({\"type\": \"text\", \"text\": ...})";
  std::string text;
  for (size_t j = 0; j < c.size(); ++j) {
    const ojson& p = c[j];
    std::string pw = where + ".content[" + std::to_string(j) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      return bad("messages", "'" + pw + "' must be an object with a string 'type'");
    std::string type = p["type"].get<std::string>();
    const char* key = "text";
    if (type == "refusal") {
      if (role != "assistant")
        return bad("messages", "'" + pw + ".type' 'refusal' is only valid in an assistant message; " + kSendText);
      key = "refusal";
    } else if (is_media_part(type)) {
      return bad("messages", "'" + pw + ".type' '" + type + "' is not supported: this model reads text only; " + kSendText);
    } else if (type != "text" && type != "input_text" && type != "output_text") {
      return bad("messages", "'" + pw + ".type' '" + type + "' is not a content part type anvil knows; " + kSendText);
    }
    if (!p.contains(key) || !p[key].is_string())
      return bad("messages", "'" + pw + "." + key + "' must be a string (a part of type '" + type + "')");
    const std::string& part = p[key].get_ref<const std::string&>();
    if (part.empty()) continue;  // vLLM drops an empty part: no separator for it
    if (!text.empty()) text += '\n';
    text += part;
  }
  *out = text;
  return std::nullopt;
}

std::optional<ApiError> parse_messages(const ojson& b, ApiRequest* r) {
  const ojson* ms = field(b, "messages");
  if (!ms) return bad("messages", "'messages' is required");
  if (!ms->is_array()) return bad("messages", "'messages' must be an array, got " + type_name(*ms));
  if (ms->empty()) return bad("messages", "'messages' must not be empty");
  for (size_t i = 0; i < ms->size(); ++i) {
    const ojson& m = (*ms)[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad("messages", "'" + where + "' must be an object, got " + type_name(m));
    if (!m.contains("role") || !m["role"].is_string()) return bad("messages", "'" + where + ".role' must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role == "function")
      return bad("messages", "'" + where + ".role' 'function' (OpenAI's deprecated function calling) is not supported: "
                                 "send a tool's result as role 'tool' with the 'tool_call_id' of its call");
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad("messages", "'" + where + ".role' must be one of system, developer, user, assistant, tool; got '" +
                                 role + "'");
    ojson out = ojson::object();
    out["role"] = role;
    ojson content;
    if (auto e = flatten_content(m.contains("content") ? m["content"] : ojson(), where, role, &content)) return e;
    // An assistant turn may have no content (OpenAI asks for it unless there are tool_calls, but
    // clients that replay a history send null, and vLLM takes it): it is an empty one.
    if (content.is_null() && role != "assistant")
      return bad("messages", "'" + where + ".content' is required for role '" + role + "'");
    out["content"] = content.is_null() ? ojson("") : content;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string& k = it.key();
      if (k == "role" || k == "content") continue;
      if (k == "function_call") {
        // The deprecated form of a call in the history: the template knows tool_calls only, so it
        // would be dropped from the prompt. Refused, as the request's 'functions' are.
        if (it->is_null()) continue;
        return bad("messages", "'" + where + ".function_call' (OpenAI's deprecated function calling) is not "
                                   "supported: send the call as 'tool_calls' ([{\"id\": ..., \"type\": \"function\", "
                                   "\"function\": {\"name\": ..., \"arguments\": ...}}]) and its result as a 'tool' message");
      }
      if (k == "tool_calls" && !it->is_null()) {
        if (role != "assistant") return bad("messages", "'" + where + ".tool_calls' is only valid for role 'assistant'");
        if (!it->is_array()) return bad("messages", "'" + where + ".tool_calls' must be an array");
        for (size_t j = 0; j < it->size(); ++j) {
          const ojson& tc = (*it)[j];
          std::string tw = where + ".tool_calls[" + std::to_string(j) + "]";
          if (!tc.is_object() || !tc.contains("function") || !tc["function"].is_object())
            return bad("messages", "'" + tw + "' must be an object with a 'function' object");
          const ojson& f = tc["function"];
          if (!f.contains("name") || !f["name"].is_string()) return bad("messages", "'" + tw + ".function.name' must be a string");
          if (f.contains("arguments") && !f["arguments"].is_string() && !f["arguments"].is_object())
            return bad("messages", "'" + tw + ".function.arguments' must be a JSON string");
        }
      }
      if ((k == "name" || k == "tool_call_id" || k == "reasoning_content") && !it->is_null() && !it->is_string())
        return bad("messages", "'" + where + "." + k + "' must be a string");
      out[k] = *it;
    }
    r->messages.push_back(std::move(out));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const ojson& b, ApiRequest* r) {
  std::string choice = "auto", named;
  if (const ojson* tc = field(b, "tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        return bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                                  "\"function\": {\"name\": ...}}, got '" + choice + "'");
    } else if (tc->is_object()) {
      if (!tc->contains("type") || (*tc)["type"] != "function")
        return bad("tool_choice", "'tool_choice.type' must be 'function'");
      if (!tc->contains("function") || !(*tc)["function"].is_object() || !(*tc)["function"].contains("name") ||
          !(*tc)["function"]["name"].is_string() || (*tc)["function"]["name"].get<std::string>().empty())
        return bad("tool_choice", "'tool_choice.function.name' must be a non-empty string");
      choice = "function";
      named = (*tc)["function"]["name"].get<std::string>();
    } else {
      return bad("tool_choice", "'tool_choice' must be a string or an object, got " + type_name(*tc));
    }
  }
  const ojson* tools = field(b, "tools");
  if (!tools || (tools->is_array() && tools->empty())) {
    if (choice == "required" || choice == "function")
      return bad("tool_choice", "'tool_choice' " + (named.empty() ? std::string("'required'") : "'" + named + "'") +
                                    " needs 'tools' to choose from");
    if (!tools) return std::nullopt;
  }
  if (!tools->is_array()) return bad("tools", "'tools' must be an array, got " + type_name(*tools));
  bool found = false;
  for (size_t i = 0; i < tools->size(); ++i) {
    const ojson& t = (*tools)[i];
    std::string w = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) return bad("tools", "'" + w + "' must be an object");
    if (!t.contains("type") || t["type"] != "function") return bad("tools", "'" + w + ".type' must be 'function'");
    if (!t.contains("function") || !t["function"].is_object()) return bad("tools", "'" + w + ".function' must be an object");
    const ojson& f = t["function"];
    if (!f.contains("name") || !f["name"].is_string() || f["name"].get<std::string>().empty())
      return bad("tools", "'" + w + ".function.name' must be a non-empty string");
    if (f.contains("parameters") && !f["parameters"].is_object() && !f["parameters"].is_null())
      return bad("tools", "'" + w + ".function.parameters' must be an object (a JSON Schema)");
    if (f["name"] == named) found = true;
  }
  if (choice == "function" && !found)
    return bad("tool_choice", "'tool_choice' names function '" + named + "', which is not in 'tools'");
  r->tool_choice = choice;
  if (tools->empty() || choice == "none") return std::nullopt;  // vLLM: tools left out of the prompt for "none"
  if (choice == "function") {  // as vLLM: the prompt offers only the named tool
    r->tools = ojson::array();
    for (const ojson& t : *tools)
      if (t["function"]["name"] == named) r->tools.push_back(t);
    r->forced_tool = named;
  } else {
    r->tools = *tools;
  }
  r->parse_tool_calls = true;
  return std::nullopt;
}

}  // namespace

std::string json_type_name(const ojson& v) { return type_name(v); }

ojson error_body(const ApiError& e) {
  ojson err = ojson::object();
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ojson() : ojson(e.param);
  err["code"] = e.code.empty() ? ojson() : ojson(e.code);
  if (e.extra.is_object())
    for (const auto& [k, v] : e.extra.items()) err[k] = v;
  return ojson{{"error", err}};
}

bool is_valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    int extra;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { extra = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { extra = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { extra = 3; cp = c & 0x07; }
    else return false;
    if (i + size_t(extra) >= n) return false;  // truncated sequence
    for (int k = 1; k <= extra; ++k) {
      if ((p[i + size_t(k)] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + size_t(k)] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static const uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += size_t(extra) + 1;
  }
  return true;
}

// The deepest nesting of arrays and objects in a JSON text (strings skipped), stopping past `limit`.
static int json_depth(const std::string& s, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::optional<ApiError> parse_json_object(const std::string& body, ojson* out) {
  if (!is_valid_utf8(body)) return bad("", "The request body is not valid UTF-8", "invalid_utf8");
  // The chat template and the request's checks walk the value recursively: a deep one would
  // overflow the stack. No request needs more than a few levels (a tool's JSON Schema, a dozen).
  constexpr int kMaxDepth = 128;
  if (json_depth(body, kMaxDepth) > kMaxDepth)
    return bad("", "The request body nests arrays and objects more than " + std::to_string(kMaxDepth) + " levels deep",
               "invalid_json");
  ojson j;
  try {
    j = ojson::parse(body);
  } catch (const nlohmann::json::exception& e) {
    // A syntax error, or a number beyond a double (out_of_range: "number overflow parsing '1e400'").
    // The parser's message quotes what it read last, which can be the whole body: keep its start.
    std::string what = e.what();
    if (what.size() > 300) {
      size_t n = 300;
      while (n > 0 && (static_cast<unsigned char>(what[n]) & 0xC0) == 0x80) --n;  // not inside a UTF-8 character
      what = what.substr(0, n) + "...";
    }
    return bad("", "The request body is not valid JSON: " + what, "invalid_json");
  }
  if (!j.is_object()) return bad("", "The request body must be a JSON object, got " + type_name(j), "invalid_json");
  *out = std::move(j);
  return std::nullopt;
}

std::optional<ApiError> parse_chat_request(const std::string& body, const RequestDefaults& d, ApiRequest* r) {
  ojson b;
  if (auto e = parse_json_object(body, &b)) return e;
  return parse_chat_object(b, d, r);
}

std::optional<ApiError> parse_chat_object(const ojson& b, const RequestDefaults& d, ApiRequest* r) {
  r->chat = true;
  if (auto e = parse_common(b, d, r)) return e;
  if (auto e = parse_messages(b, r)) return e;
  if (auto e = parse_tools(b, r)) return e;
  if (auto e = get_bool(b, "parallel_tool_calls", &r->parallel_tool_calls)) return e;
  // A reply is either tool calls or content; JSON mode constrains the content to one object, which
  // would leave no way to call a tool.
  if (r->gen.json_object && r->parse_tool_calls)
    return bad("response_format", "'response_format' json_object cannot be combined with 'tools' (the reply would be "
                                  "held to a JSON object and could call no tool); leave 'tools' out or set "
                                  "'tool_choice' to 'none'");
  // Honoured by OpenAI but not by anvil: refused rather than ignored, which would answer another
  // request than the client's (no functions offered to the model, no audio written).
  if (const ojson* f = field(b, "functions"))
    if (!f->is_array() || !f->empty())
      return bad("functions", "'functions' (OpenAI's deprecated function calling) is not supported: send them as "
                              "'tools' ([{\"type\": \"function\", \"function\": {...}}])");
  if (const ojson* fc = field(b, "function_call"))
    if (!fc->is_string() || (*fc != "none" && *fc != "auto"))
      return bad("function_call", "'function_call' (OpenAI's deprecated function calling) is not supported: use "
                                  "'tools' and 'tool_choice'");
  if (const ojson* m = field(b, "modalities")) {
    if (!m->is_array()) return bad("modalities", "'modalities' must be an array, got " + type_name(*m));
    for (const ojson& x : *m)
      if (x != "text")
        return bad("modalities", "'modalities' may hold only \"text\" (this model writes text), got " + x.dump());
  }
  if (field(b, "audio")) return bad("audio", "'audio' output is not supported: this model writes text only");
  if (auto e = get_bool(b, "logprobs", &r->logprobs)) return e;
  int64_t top = 0;
  bool top_given = false;
  if (auto e = get_int(b, "top_logprobs", 0, 20, &top, &top_given)) return e;
  if (top_given && !r->logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r->gen.top_logprobs = r->logprobs ? int(top) : -1;
  if (const ojson* k = field(b, "chat_template_kwargs")) {
    if (!k->is_object()) return bad("chat_template_kwargs", "'chat_template_kwargs' must be an object, got " + type_name(*k));
    // The variables the request itself sets: overriding them would render another prompt than the
    // request (and than what a session records).
    for (const char* own : {"messages", "tools", "add_generation_prompt"})
      if (k->contains(own))
        return bad("chat_template_kwargs", std::string("'chat_template_kwargs.") + own +
                                               "' cannot be set: the request's own fields give it");
    r->template_kwargs = *k;
    if (k->contains("enable_thinking")) {
      if (!(*k)["enable_thinking"].is_boolean())
        return bad("chat_template_kwargs", "'chat_template_kwargs.enable_thinking' must be a boolean");
      r->enable_thinking = (*k)["enable_thinking"].get<bool>();
    }
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const std::string& body, const RequestDefaults& d, ApiRequest* r) {
  ojson b;
  if (auto e = parse_json_object(body, &b)) return e;
  r->chat = false;
  if (auto e = parse_common(b, d, r)) return e;
  const ojson* p = field(b, "prompt");
  if (!p) return bad("prompt", "'prompt' is required");
  // name: how the prompt is named in errors ("prompt", or "prompt[k]" of several).
  auto ids_of = [&](const ojson& a, const std::string& name, std::vector<int32_t>* out) -> std::optional<ApiError> {
    if (a.empty() && r->session.empty()) return bad("prompt", "'" + name + "' must not be empty");
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() && !a[i].is_number_unsigned())
        return bad("prompt", "'" + name + "[" + std::to_string(i) + "]' must be a token id (integer), got " + type_name(a[i]));
      int64_t v = a[i].is_number_unsigned() ? int64_t(std::min<uint64_t>(a[i].get<uint64_t>(), INT64_MAX)) : a[i].get<int64_t>();
      if (v < 0 || v > INT32_MAX) return bad("prompt", "'" + name + "[" + std::to_string(i) + "]' is not a valid token id");
      out->push_back(int32_t(v));
    }
    return std::nullopt;
  };
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    // An empty prompt only continues a session's document (checked against the session later).
    if (r->prompt_text.empty() && r->session.empty()) return bad("prompt", "'prompt' must not be empty");
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    // Several prompts (strings or token id lists, mixed): a choice for each (and n for each).
    if (p->size() > size_t(kMaxChoices))
      return bad("prompt", "'prompt' holds " + std::to_string(p->size()) + " prompts; at most " +
                               std::to_string(kMaxChoices) + " per request");
    for (size_t k = 0; k < p->size(); ++k) {
      const ojson& e = (*p)[k];
      const std::string name = p->size() == 1 ? "prompt" : "prompt[" + std::to_string(k) + "]";
      ApiRequest::Prompt one;
      if (e.is_string()) {
        one.text = e.get<std::string>();
        if (one.text.empty() && r->session.empty()) return bad("prompt", "'" + name + "' must not be empty");
      } else if (e.is_array()) {
        if (auto err = ids_of(e, name, &one.ids)) return err;
        one.is_ids = true;
      } else {
        return bad("prompt", "'prompt[" + std::to_string(k) + "]' must be a string or an array of token ids, got " +
                                 type_name(e));
      }
      if (k == 0) r->prompt_text = std::move(one.text), r->prompt_ids = std::move(one.ids), r->prompt_is_ids = one.is_ids;
      else r->more_prompts.push_back(std::move(one));
    }
  } else if (p->is_array()) {
    if (auto e = ids_of(*p, "prompt", &r->prompt_ids)) return e;
    r->prompt_is_ids = true;
  } else {
    return bad("prompt", "'prompt' must be a string, an array of strings or an array of token ids, got " + type_name(*p));
  }
  if (auto e = get_bool(b, "add_special_tokens", &r->add_special_tokens)) return e;
  int64_t lp = 0;
  bool lp_given = false;
  if (auto e = get_int(b, "logprobs", 0, 20, &lp, &lp_given)) return e;
  r->logprobs = lp_given;
  r->gen.top_logprobs = lp_given ? int(lp) : -1;
  if (auto e = get_bool(b, "echo", &r->gen.echo)) return e;
  if (r->n * (1 + int(r->more_prompts.size())) > kMaxChoices)
    return bad("n", "'n' (" + std::to_string(r->n) + ") times the " + std::to_string(1 + r->more_prompts.size()) +
                        " prompts asks for more than " + std::to_string(kMaxChoices) + " choices");
  if (!r->more_prompts.empty() && !r->session.empty())
    return bad("prompt", "a session's turn continues its document with one prompt, not several");
  // A session's prompt is its whole document so far: what an echo would repeat is ambiguous.
  if (r->gen.echo && !r->session.empty())
    return bad("echo", "'echo' cannot be combined with 'session' (the prompt continues the session's document)");
  if (r->max_tokens && *r->max_tokens == 0 && !r->gen.echo)
    return bad("max_tokens", "'max_tokens' 0 generates nothing: it needs 'echo' (the prompt and its log-probabilities alone)");
  if (const ojson* s = field(b, "suffix"))
    if (!s->is_string() || !s->get<std::string>().empty()) return bad("suffix", "'suffix' is not supported");
  int64_t best_of = 1;
  if (auto e = get_int(b, "best_of", 1, 1, &best_of)) return e;
  return std::nullopt;
}

}  // namespace anvil::server
