#include "server/responses_request.h"

namespace anvil::server {

using ojson = nlohmann::ordered_json;

namespace {

ApiError bad(const std::string& param, const std::string& message) {
  ApiError e;
  e.param = param;
  e.message = message;
  return e;
}

// Optional fields: absent or null means "not given".
const ojson* field(const ojson& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

bool nonempty_string(const ojson& o, const char* key) {
  return o.contains(key) && o[key].is_string() && !o[key].get_ref<const std::string&>().empty();
}

// A message's content: a string, or parts whose text chat reads (input_text / output_text / text,
// an assistant's refusal). Checked here, so that an error names the input item; passed on as given,
// so the template sees what a chat request with the same parts renders.
std::optional<ApiError> check_content(const ojson& c, const std::string& where, const std::string& role) {
  if (c.is_string()) return std::nullopt;
  if (!c.is_array())
    return bad("input", "'" + where + ".content' must be a string or an array of content parts, got " + json_type_name(c));
  for (size_t j = 0; j < c.size(); ++j) {
    const ojson& p = c[j];
    const std::string pw = where + ".content[" + std::to_string(j) + "]";
    if (!p.is_object() || !p.contains("type") || !p["type"].is_string())
      return bad("input", "'" + pw + "' must be an object with a string 'type'");
    const std::string type = p["type"].get<std::string>();
    const char* key = "text";
    if (type == "refusal" && role == "assistant") {
      key = "refusal";
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return bad("input", "'" + pw + ".type' '" + type + "' is not supported: this model reads text only; send "
                          "{\"type\": \"input_text\", \"text\": ...}");
    } else if (type != "input_text" && type != "output_text" && type != "text") {
      return bad("input", "'" + pw + ".type' '" + type.substr(0, 100) + "' is not a content part anvil reads; send " +
                              "{\"type\": \"input_text\", \"text\": ...}");
    }
    if (!p.contains(key) || !p[key].is_string())
      return bad("input", "'" + pw + "." + key + "' must be a string (a part of type '" + type + "')");
  }
  return std::nullopt;
}

// The text of a function_call_output's output: a string, or input_text parts joined as chat joins parts.
std::optional<ApiError> output_text_of(const ojson& o, const std::string& where, ojson* out) {
  if (o.is_string()) {
    *out = o;
    return std::nullopt;
  }
  if (!o.is_array()) return bad("input", "'" + where + ".output' must be a string, got " + json_type_name(o));
  if (auto e = check_content(o, where, "tool")) {
    // (check_content names ".content"; here the parts are the output's)
    const std::string from = where + ".content", to = where + ".output";
    for (size_t at = e->message.find(from); at != std::string::npos; at = e->message.find(from, at + to.size()))
      e->message.replace(at, from.size(), to);
    return e;
  }
  *out = o;
  return std::nullopt;
}

// instructions + input -> chat messages.
std::optional<ApiError> input_messages(const ojson& b, ojson* messages) {
  *messages = ojson::array();
  if (const ojson* ins = field(b, "instructions")) {
    if (!ins->is_string())
      return bad("instructions", "'instructions' must be a string, got " + json_type_name(*ins));
    if (!ins->get_ref<const std::string&>().empty()) messages->push_back({{"role", "system"}, {"content", *ins}});
  }
  const ojson* in = field(b, "input");
  if (!in) return bad("input", "'input' is required (a string, or an array of input items)");
  if (in->is_string()) {
    messages->push_back({{"role", "user"}, {"content", *in}});
    return std::nullopt;
  }
  if (!in->is_array()) return bad("input", "'input' must be a string or an array of input items, got " + json_type_name(*in));
  if (in->empty()) return bad("input", "'input' must not be empty");
  std::string reasoning;   // a reasoning item's text, for the next assistant turn
  bool open_turn = false;  // the last message is an assistant turn that a function_call joins
  auto assistant_turn = [&](ojson m) {
    if (!reasoning.empty()) m["reasoning_content"] = reasoning;
    reasoning.clear();
    messages->push_back(std::move(m));
  };
  for (size_t i = 0; i < in->size(); ++i) {
    const ojson& it = (*in)[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) return bad("input", "'" + where + "' must be an object, got " + json_type_name(it));
    std::string type = "message";  // EasyInputMessage: {role, content} without a type
    if (const ojson* t = field(it, "type")) {
      if (!t->is_string()) return bad("input", "'" + where + ".type' must be a string");
      type = t->get<std::string>();
    }
    if (type == "message") {
      if (!it.contains("role") || !it["role"].is_string()) return bad("input", "'" + where + ".role' must be a string");
      const std::string role = it["role"].get<std::string>();
      if (role != "user" && role != "system" && role != "developer" && role != "assistant")
        return bad("input", "'" + where + ".role' must be one of user, system, developer, assistant; got '" +
                                role.substr(0, 100) + "' (a tool's result is a function_call_output item)");
      if (!it.contains("content") || it["content"].is_null())
        return bad("input", "'" + where + ".content' is required");
      if (auto e = check_content(it["content"], where, role)) return e;
      ojson m = {{"role", role}, {"content", it["content"]}};
      if (role == "assistant") {
        assistant_turn(std::move(m));
        open_turn = true;
      } else {
        messages->push_back(std::move(m));
        open_turn = false;
      }
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name"})
        if (!nonempty_string(it, k)) return bad("input", "'" + where + "." + k + "' must be a non-empty string");
      if (!it.contains("arguments") || !it["arguments"].is_string())
        return bad("input", "'" + where + ".arguments' must be a string (the call's arguments as JSON text)");
      ojson call = {{"id", it["call_id"]},
                    {"type", "function"},
                    {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      // The calls of one turn (parallel calls, or the text before them) are one assistant message,
      // as the model wrote them.
      if (!open_turn) {
        assistant_turn({{"role", "assistant"}, {"content", ""}});
        open_turn = true;
      }
      ojson& last = messages->back();
      if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
      last["tool_calls"].push_back(std::move(call));
    } else if (type == "function_call_output") {
      if (!nonempty_string(it, "call_id")) return bad("input", "'" + where + ".call_id' must be a non-empty string");
      if (!it.contains("output") || it["output"].is_null())
        return bad("input", "'" + where + ".output' is required (the function's result)");
      ojson content;
      if (auto e = output_text_of(it["output"], where, &content)) return e;
      messages->push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", content}});
      open_turn = false;
    } else if (type == "reasoning") {
      // Its text (content: reasoning_text parts) goes with the assistant turn that follows, as chat's
      // reasoning_content; a summary is not the reasoning, and nothing anvil writes is encrypted.
      if (const ojson* c = field(it, "content")) {
        if (!c->is_array()) return bad("input", "'" + where + ".content' must be an array of reasoning_text parts");
        for (size_t j = 0; j < c->size(); ++j) {
          const ojson& p = (*c)[j];
          if (!p.is_object() || !p.contains("text") || !p["text"].is_string())
            return bad("input", "'" + where + ".content[" + std::to_string(j) + "]' must be a reasoning_text part "
                                "({\"type\": \"reasoning_text\", \"text\": ...})");
          if (!reasoning.empty()) reasoning += '\n';
          reasoning += p["text"].get<std::string>();
        }
      }
      open_turn = false;
    } else if (type == "item_reference") {
      return bad("input", "'" + where + "' is an item_reference: anvil keeps no item ids (send the item itself, or "
                          "continue a stored response with previous_response_id)");
    } else {
      return bad("input", "'" + where + ".type' '" + type.substr(0, 100) +
                              "' is not supported; anvil takes message, function_call, function_call_output and "
                              "reasoning items");
    }
  }
  return std::nullopt;
}

// tools and tool_choice in the Responses shape -> chat's; *echo_tools: the tools as the response repeats them.
std::optional<ApiError> translate_tools(const ojson& b, ojson* chat, ojson* echo_tools) {
  *echo_tools = ojson::array();
  if (const ojson* ts = field(b, "tools")) {
    if (!ts->is_array()) return bad("tools", "'tools' must be an array, got " + json_type_name(*ts));
    ojson out = ojson::array();
    for (size_t i = 0; i < ts->size(); ++i) {
      const ojson& t = (*ts)[i];
      const std::string w = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("type") || !t["type"].is_string())
        return bad("tools", "'" + w + "' must be an object with a string 'type'");
      const std::string type = t["type"].get<std::string>();
      if (type != "function")
        return bad("tools", "'" + w + ".type' '" + type.substr(0, 100) +
                                "' is not supported: anvil runs no hosted tools; declare a function ({\"type\": "
                                "\"function\", \"name\": ..., \"parameters\": {...}})");
      if (t.contains("function"))
        return bad("tools", "'" + w + "' is in the Chat Completions shape: the Responses API takes name, description "
                                "and parameters at the top level of the tool");
      if (!nonempty_string(t, "name")) return bad("tools", "'" + w + ".name' must be a non-empty string");
      if (const ojson* d = field(t, "description"); d && !d->is_string())
        return bad("tools", "'" + w + ".description' must be a string");
      if (const ojson* p = field(t, "parameters"); p && !p->is_object())
        return bad("tools", "'" + w + ".parameters' must be an object (a JSON Schema)");
      if (const ojson* s = field(t, "strict"); s && !s->is_boolean())
        return bad("tools", "'" + w + ".strict' must be a boolean");
      ojson f = {{"name", t["name"]}};
      if (field(t, "description")) f["description"] = t["description"];
      if (field(t, "parameters")) f["parameters"] = t["parameters"];
      out.push_back({{"type", "function"}, {"function", f}});
      ojson e = {{"type", "function"}, {"name", t["name"]}};
      e["description"] = field(t, "description") ? t["description"] : ojson();
      e["parameters"] = field(t, "parameters") ? t["parameters"] : ojson();
      e["strict"] = field(t, "strict") ? t["strict"] : ojson();
      echo_tools->push_back(std::move(e));
    }
    (*chat)["tools"] = std::move(out);
  }
  if (const ojson* tc = field(b, "tool_choice")) {
    if (tc->is_string()) {
      (*chat)["tool_choice"] = *tc;  // auto, none, required: chat checks the value
    } else if (tc->is_object()) {
      const ojson* t = field(*tc, "type");
      if (!t || *t != "function")
        return bad("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                                  "\"name\": ...}" + std::string(t && t->is_string() ? ", got type '" +
                                                                        t->get<std::string>().substr(0, 100) + "'" : ""));
      if (!nonempty_string(*tc, "name"))
        return bad("tool_choice", "'tool_choice.name' must be a non-empty string (the function to call)");
      (*chat)["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*tc)["name"]}}}};
    } else {
      return bad("tool_choice", "'tool_choice' must be a string or an object, got " + json_type_name(*tc));
    }
  }
  return std::nullopt;
}

// A chat error as the Responses request's: its own names for the fields it translated.
ApiError renamed(ApiError e) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"max_tokens", "max_output_tokens"}, {"response_format", "text.format"}, {"messages", "input"}};
  for (const auto& [from, to] : kNames) {
    if (e.param != from) continue;
    e.param = to;
    const std::string f = std::string("'") + from, t = std::string("'") + to;
    for (size_t at = e.message.find(f); at != std::string::npos; at = e.message.find(f, at + t.size()))
      e.message.replace(at, f.size(), t);
  }
  return e;
}

}  // namespace

std::optional<ApiError> parse_responses_request(const std::string& body, const RequestDefaults& d, ApiRequest* r,
                                                ResponsesEcho* echo) {
  ojson b;
  if (auto e = parse_json_object(body, &b)) return e;
  // A stored response is continued by its id (response_store.h; the server checks that it has it).
  if (const ojson* p = field(b, "previous_response_id")) {
    if (!p->is_string() || p->get_ref<const std::string&>().empty() || p->get_ref<const std::string&>().size() > 200)
      return bad("previous_response_id", "'previous_response_id' must be a response id (a non-empty string)");
    echo->previous_response_id = p->get<std::string>();
  }
  if (field(b, "conversation"))
    return bad("conversation", "'conversation' is not supported: send the conversation as 'input' items, "
                               "continue a stored response with 'previous_response_id', or keep it server-side with "
                               "anvil's 'session' extension");
  if (const ojson* bg = field(b, "background"); bg && *bg != false)
    return bad("background", "'background' is not supported: anvil answers while the request waits (or streams)");
  if (field(b, "prompt"))
    return bad("prompt", "'prompt' (a stored prompt template) is not supported: send 'instructions' and 'input'");
  if (const ojson* t = field(b, "truncation"); t && *t != "disabled")
    return bad("truncation", "'truncation' must be 'disabled': anvil does not cut a conversation to fit the context "
                             "(a prompt too long is refused)");
  if (field(b, "max_tool_calls"))
    return bad("max_tool_calls", "'max_tool_calls' is not supported; 'parallel_tool_calls': false keeps one call");
  if (const ojson* t = field(b, "top_logprobs"); t && *t != 0)
    return bad("top_logprobs", "'top_logprobs' is not supported on /v1/responses (use /v1/chat/completions' logprobs)");
  if (const ojson* inc = field(b, "include")) {
    if (!inc->is_array()) return bad("include", "'include' must be an array, got " + json_type_name(*inc));
    for (const ojson& x : *inc)
      if (x != "reasoning.encrypted_content")  // nothing is encrypted: reasoning items carry their text
        return bad("include", "'include' value " + x.dump().substr(0, 100) + " is not supported (anvil takes "
                              "\"reasoning.encrypted_content\" only, and its reasoning items carry their text)");
  }
  if (const ojson* m = field(b, "metadata")) {
    if (!m->is_object()) return bad("metadata", "'metadata' must be an object, got " + json_type_name(*m));
    if (m->size() > 16) return bad("metadata", "'metadata' takes at most 16 keys");
    for (auto it = m->begin(); it != m->end(); ++it)
      if (!it->is_string()) return bad("metadata", "'metadata." + it.key().substr(0, 64) + "' must be a string");
  }
  if (const ojson* s = field(b, "store")) {
    if (!s->is_boolean()) return bad("store", "'store' must be a boolean, got " + json_type_name(*s));
    echo->store = s->get<bool>();
  }
  if (const ojson* u = field(b, "user"); u && !u->is_string())
    return bad("user", "'user' must be a string, got " + json_type_name(*u));
  // Chat's names for what the Responses API names otherwise: refused with the name to use, not ignored.
  static const std::pair<const char*, const char*> kChatNames[] = {
      {"messages", "'input' (and 'instructions')"}, {"max_tokens", "'max_output_tokens'"},
      {"max_completion_tokens", "'max_output_tokens'"}, {"response_format", "'text': {\"format\": {...}}"}};
  for (const auto& [name, use] : kChatNames)
    if (field(b, name))
      return bad(name, std::string("'") + name + "' is a Chat Completions field; the Responses API takes " + use);

  ojson chat = ojson::object();
  for (const char* k : {"model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "logit_bias", "ignore_eos", "stream",
                        "parallel_tool_calls", "chat_template_kwargs", "session"})
    if (b.contains(k)) chat[k] = b[k];
  if (b.contains("max_output_tokens")) chat["max_tokens"] = b["max_output_tokens"];
  ojson messages;
  if (auto e = input_messages(b, &messages)) return e;
  chat["messages"] = std::move(messages);
  ojson echo_tools;
  if (auto e = translate_tools(b, &chat, &echo_tools)) return e;

  ojson text = {{"format", {{"type", "text"}}}};
  if (const ojson* t = field(b, "text")) {
    if (!t->is_object()) return bad("text", "'text' must be an object, got " + json_type_name(*t));
    if (const ojson* f = field(*t, "format")) {
      if (!f->is_object() || !f->contains("type") || !(*f)["type"].is_string())
        return bad("text.format", "'text.format' must be an object with a string 'type'");
      const std::string type = (*f)["type"].get<std::string>();
      if (type == "json_schema")
        return bad("text.format", "'text.format' type 'json_schema' is not supported: anvil constrains a reply to "
                                  "JSON syntax only; use {\"type\": \"json_object\"} and describe the schema in the "
                                  "input");
      if (type != "text" && type != "json_object")
        return bad("text.format", "'text.format' type '" + type.substr(0, 100) +
                                      "' is not supported; use 'text' or 'json_object'");
      chat["response_format"] = {{"type", type}};
      text["format"] = {{"type", type}};
    }
    if (const ojson* v = field(*t, "verbosity")) text["verbosity"] = *v;  // a hint anvil does not act on
  }
  ojson reasoning = {{"effort", nullptr}, {"summary", nullptr}};
  if (const ojson* rs = field(b, "reasoning")) {
    if (!rs->is_object()) return bad("reasoning", "'reasoning' must be an object, got " + json_type_name(*rs));
    if (const ojson* eff = field(*rs, "effort")) {
      static const char* const kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
      bool known = false;
      for (const char* k : kEfforts) known = known || *eff == k;
      if (!known)
        return bad("reasoning.effort", "'reasoning.effort' must be one of none, minimal, low, medium, high, xhigh");
      reasoning["effort"] = *eff;
      // "none" turns the template's thinking off (Qwen3's enable_thinking); the other levels are the
      // model's own (anvil has no budget for reasoning), as chat's reasoning_effort.
      if (*eff == "none") {
        ojson& kw = chat["chat_template_kwargs"];
        if (kw.is_null()) kw = ojson::object();
        if (kw.is_object()) {
          if (kw.contains("enable_thinking") && kw["enable_thinking"] != false)
            return bad("reasoning.effort", "'reasoning.effort' 'none' disagrees with "
                                           "'chat_template_kwargs.enable_thinking'");
          kw["enable_thinking"] = false;
        }
      }
    }
    if (const ojson* s = field(*rs, "summary")) reasoning["summary"] = *s;
  }

  if (auto e = parse_chat_object(chat, d, r)) return renamed(*e);

  ojson& f = echo->fields;
  f = ojson::object();
  f["instructions"] = field(b, "instructions") ? b["instructions"] : ojson();
  f["max_output_tokens"] = r->max_tokens ? ojson(*r->max_tokens) : ojson();
  f["metadata"] = field(b, "metadata") ? b["metadata"] : ojson::object();
  f["parallel_tool_calls"] = r->parallel_tool_calls;
  f["reasoning"] = reasoning;
  f["store"] = false;  // until the server stores it (http_server.cpp)
  f["temperature"] = r->gen.sampling.temperature;
  f["text"] = text;
  if (const ojson* tc = field(b, "tool_choice")) f["tool_choice"] = *tc;
  else f["tool_choice"] = "auto";
  f["tools"] = echo_tools;
  f["top_p"] = r->gen.sampling.top_p;
  f["truncation"] = "disabled";
  f["user"] = field(b, "user") ? b["user"] : ojson();
  return std::nullopt;
}

}  // namespace anvil::server
