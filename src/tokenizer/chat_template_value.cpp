// Values of the chat-template engine and their Python semantics: truthiness, str()/repr(),
// equality and ordering, and json.dumps() as transformers' tojson filter calls it
// (ensure_ascii=False, transformers' default: only '"', '\\' and control characters are escaped;
// ensure_ascii=True also writes every non-ASCII code point as \uXXXX, surrogate pairs above U+FFFF).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "tokenizer/chat_template_internal.h"
#include "tokenizer/chat_template_pystr.h"

namespace anvil::chat_template_detail {

const Value* ValueDict::find(const std::string& key) const {
  for (auto& [k, v] : items)
    if (k.kind == Kind::kString && k.s == key) return &v;
  return nullptr;
}
Value* ValueDict::find(const std::string& key) {
  for (auto& [k, v] : items)
    if (k.kind == Kind::kString && k.s == key) return &v;
  return nullptr;
}
const Value* ValueDict::find(const Value& key) const {
  if (key.kind == Kind::kString) return find(key.s);
  for (auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}
void ValueDict::set(const std::string& key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
  } else {
    items.emplace_back(Value::string(key), std::move(v));
  }
}
void ValueDict::set(const Value& key, Value v, int line) {
  if (!hashable(key)) fail("unhashable type: '" + type_name(key) + "'", line);
  if (const Value* p = find(key)) {
    *const_cast<Value*>(p) = std::move(v);  // Python keeps the first-inserted key object
  } else {
    items.emplace_back(key, std::move(v));
  }
}

namespace {
// Walks over a value (repr, json.dumps, ==, <, hash) recurse once per level. Input is at most
// kMaxInputDepth deep, but a template can nest values further at run time (a namespace attribute
// set to [itself] in a loop), so the walks stop there with an error instead of overflowing the
// stack (Python stops near its recursion limit of 1000 too).
constexpr int kMaxValueDepth = 512;
void check_value_depth(int depth, int line) {
  if (depth > kMaxValueDepth)
    fail("a value nests more than " + std::to_string(kMaxValueDepth) + " levels deep (a list or dict within itself?)",
         line);
}

bool hashable_at(const Value& v, int depth) {
  check_value_depth(depth, 0);
  switch (v.kind) {
    case Kind::kUndefined: case Kind::kNone: case Kind::kBool: case Kind::kInt: case Kind::kFloat:
    case Kind::kString: return true;
    case Kind::kList:
      if (!v.is_tuple) return false;
      for (auto& e : *v.list)
        if (!hashable_at(e, depth + 1)) return false;
      return true;
    default: return false;
  }
}

// Moves the children that `v` alone owns into `out` (and drops v's containers), so that a nested
// value is destroyed level by level in a loop rather than by recursion.
void take_children(Value& v, std::vector<Value>& out) {
  if (v.list && v.list.use_count() == 1) {
    for (Value& e : const_cast<ValueList&>(*v.list))  // created non-const by make_list
      if (e.list || e.dict) out.push_back(std::move(e));
    v.list.reset();
  }
  if (v.dict && v.dict.use_count() == 1) {
    for (auto& [k, e] : v.dict->items) {
      if (k.list) out.push_back(std::move(k));
      if (e.list || e.dict) out.push_back(std::move(e));
    }
    v.dict.reset();
  }
}
}  // namespace

bool hashable(const Value& v) { return hashable_at(v, 0); }

Value::~Value() {
  if (!(list && list.use_count() == 1) && !(dict && dict.use_count() == 1)) return;
  std::vector<Value> pending;
  take_children(*this, pending);
  while (!pending.empty()) {
    Value v = std::move(pending.back());
    pending.pop_back();
    take_children(v, pending);
  }
}

Value Value::make_list(ValueList items, bool tuple) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(items));
  v.is_tuple = tuple;
  return v;
}
Value Value::make_dict(ValueDict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::callable(std::string name, Callable c) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<const Callable>(std::move(c));
  v.fn_name = std::move(name);
  return v;
}

const Value* Args::get(size_t index, const std::string& name) const {
  if (index < pos.size()) return &pos[index];
  for (auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

namespace {
// Input nested deeper than this is refused: the conversion and every walk over it recurse.
constexpr int kMaxInputDepth = 256;

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxInputDepth)
    fail("the input (messages, tools or variables) nests more than " + std::to_string(kMaxInputDepth) + " levels deep", 0);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX))  // refused, not wrapped into a negative number
        fail("the integer " + std::to_string(u) + " in the input is beyond the template engine's 64-bit integers", 0);
      return Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Value::string(it.key()), from_json_at(it.value(), depth + 1));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();
  }
}
}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0.0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList: return !v.list->empty();
    case Kind::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_list_like_object(v) ? v.fn_name : v.is_tuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: scientific when exp < -4 or exp >= 16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(-exp - 1, '0') + digits;
  } else {
    if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
  }
  return neg ? "-" + out : out;
}

namespace {

// Python's repr() of a str: quoted with ' (or " when only ' occurs), backslash escapes for the
// quote, '\\', \t \n \r, and \xhh / \uhhhh / \Uhhhhhhhh for every other character that is not
// printable (controls, format characters like U+200B, separators like U+2028 or U+3000,
// unassigned and private-use code points); printable non-ASCII text as is.
std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : to_u32(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (c >= 0x80 && !py_isprintable(c))) {
      char b[16];
      if (c <= 0xff) std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      else if (c <= 0xffff) std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(b, sizeof b, "\\U%08x", static_cast<unsigned>(c));
      out += b;
    } else {
      out += to_utf8(std::u32string(1, c));
    }
  }
  out += q;
  return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (size_t k = 0; k < s.size(); ++k) {
    unsigned char c = s[k];
    if (ensure_ascii && c >= 0x80) {
      size_t n = (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
      uint32_t cp = n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : n == 4 ? c & 0x07 : c;
      for (size_t j = 1; j < n && k + j < s.size(); ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[k + j]) & 0x3F);
      k += n - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  const std::string* indent_str;
  std::string item_sep, key_sep;
  bool sort_keys;
  int line;
  bool ensure_ascii;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += indent_str ? *indent_str : std::string(indent, ' ');
  }
  bool pretty() const { return indent >= 0 || indent_str; }

  void write(const Value& v, int level) {
    check_value_depth(level, line);
    switch (v.kind) {
      case Kind::kNone: out += "null"; return;
      case Kind::kBool: out += v.b ? "true" : "false"; return;
      case Kind::kInt: out += std::to_string(v.i); return;
      case Kind::kFloat:
        if (std::isnan(v.f)) out += "NaN";
        else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
        else out += py_float_repr(v.f);
        return;
      case Kind::kString: json_string(out, v.s, ensure_ascii); return;
      case Kind::kList: {
        if (!v.fn_name.empty() && v.fn_name != kGroupTuple)
          fail("tojson: Object of type " + v.fn_name + " is not JSON serializable", line);
        if (v.list->empty()) { out += "[]"; return; }
        out += '[';
        bool first = true;
        for (auto& e : *v.list) {
          if (!first) out += item_sep;
          first = false;
          if (pretty()) newline(level + 1);
          write(e, level + 1);
        }
        if (pretty()) newline(level);
        out += ']';
        return;
      }
      case Kind::kDict: case Kind::kNamespace: {
        if (v.kind == Kind::kNamespace) fail("tojson: Object of type Namespace is not JSON serializable", line);
        if (v.dict->items.empty()) { out += "{}"; return; }
        // json.dumps turns int/float/bool/None keys into strings and refuses any other key type.
        std::vector<std::pair<std::string, const Value*>> items;
        for (auto& [k, e] : v.dict->items) {
          std::string key;
          switch (k.kind) {
            case Kind::kString: key = k.s; break;
            case Kind::kNone: key = "null"; break;
            case Kind::kBool: key = k.b ? "true" : "false"; break;
            case Kind::kInt: key = std::to_string(k.i); break;
            case Kind::kFloat: {
              std::string scratch;
              std::swap(out, scratch);
              write(k, 0);
              std::swap(out, scratch);
              key = scratch;
              break;
            }
            default: fail("tojson: keys must be str, int, float, bool or None, not " + type_name(k), line);
          }
          items.emplace_back(std::move(key), &e);
        }
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(), [](auto& a, auto& b) { return a.first < b.first; });
        out += '{';
        bool first = true;
        for (auto& [key, e] : items) {
          if (!first) out += item_sep;
          first = false;
          if (pretty()) newline(level + 1);
          json_string(out, key, ensure_ascii);
          out += key_sep;
          write(*e, level + 1);
        }
        if (pretty()) newline(level);
        out += '}';
        return;
      }
      case Kind::kUndefined: fail("tojson: Object of type Undefined is not JSON serializable", line);
      case Kind::kCallable: fail("tojson: Object of type function is not JSON serializable", line);
    }
  }
};

}  // namespace

std::string to_json(const Value& v, int indent, const std::string* indent_str, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, int line, bool ensure_ascii) {
  JsonWriter w{indent, indent_str, item_sep, key_sep, sort_keys, line, ensure_ascii, {}};
  w.write(v, 0);
  return std::move(w.out);
}

namespace {

// `active`: the containers being printed, outermost first. A namespace can hold itself (directly
// or through a list), and Python prints a container met again inside itself as [...] / {...}.
std::string repr_at(const Value& v, int line, std::vector<const void*>& active) {
  check_value_depth(static_cast<int>(active.size()), line);
  auto entered = [&](const void* p) { return std::find(active.begin(), active.end(), p) != active.end(); };
  switch (v.kind) {
    case Kind::kString: return repr_string(v.s);
    case Kind::kList: {
      if (v.fn_name == kRange) return v.s;
      if (!v.fn_name.empty() && v.fn_name != kGroupTuple) {  // a dict view: dict_keys([...])
        // (_GroupTuple prints as a plain tuple, as jinja2 defines it)
        Value plain = v;
        plain.fn_name.clear();
        return v.fn_name + "(" + repr_at(plain, line, active) + ")";
      }
      if (entered(v.list.get())) return v.is_tuple ? "(...)" : "[...]";
      active.push_back(v.list.get());
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr_at((*v.list)[k], line, active);
      }
      active.pop_back();
      if (v.is_tuple && v.list->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case Kind::kDict: case Kind::kNamespace: {
      const bool ns = v.kind == Kind::kNamespace;  // jinja2: f"<Namespace {self.__attrs!r}>"
      if (entered(v.dict.get())) return ns ? "<Namespace {...}>" : "{...}";
      active.push_back(v.dict.get());
      std::string out = ns ? "<Namespace {" : "{";
      bool first = true;
      for (auto& [k, e] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr_at(k, line, active) + ": " + repr_at(e, line, active);
      }
      active.pop_back();
      return out + (ns ? "}>" : "}");
    }
    case Kind::kUndefined: return "Undefined";  // jinja2's Undefined.__repr__ (str() of it is "")
    default: return to_str(v, line);
  }
}

}  // namespace

std::string repr(const Value& v, int line) {
  std::vector<const void*> active;
  return repr_at(v, line, active);
}

std::string to_str(const Value& v, int line) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return py_float_repr(v.f);
    case Kind::kString: return v.s;
    case Kind::kCallable: return v.s.empty() ? "<function " + v.fn_name + ">" : v.s;
    default: return repr(v, line);
  }
}

namespace {

bool equals_at(const Value& a, const Value& b, int depth) {
  check_value_depth(depth, 0);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) {
      double x = a.kind == Kind::kFloat ? a.f : a.kind == Kind::kBool ? a.b : static_cast<double>(a.i);
      double y = b.kind == Kind::kFloat ? b.f : b.kind == Kind::kBool ? b.b : static_cast<double>(b.i);
      return x == y;
    }
    int64_t x = a.kind == Kind::kBool ? a.b : a.i, y = b.kind == Kind::kBool ? b.b : b.i;
    return x == y;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined: case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList: {
      if (a.is_tuple != b.is_tuple || a.list->size() != b.list->size()) return false;
      if ((a.fn_name == kRange) != (b.fn_name == kRange)) return false;  // range(2) != [0, 1]
      if (a.list == b.list) return true;  // the same object (Python compares items by identity first)
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals_at((*a.list)[k], (*b.list)[k], depth + 1)) return false;
      return true;
    }
    case Kind::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      if (a.dict == b.dict) return true;
      for (auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals_at(v, *o, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    case Kind::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

int compare_at(const Value& a, const Value& b, int line, int depth) {
  check_value_depth(depth, line);
  if (a.is_number() && b.is_number()) {
    double x = a.kind == Kind::kFloat ? a.f : a.kind == Kind::kBool ? a.b : static_cast<double>(a.i);
    double y = b.kind == Kind::kFloat ? b.f : b.kind == Kind::kBool ? b.b : static_cast<double>(b.i);
    if (a.kind != Kind::kFloat && b.kind != Kind::kFloat) {
      int64_t p = a.kind == Kind::kBool ? a.b : a.i, q = b.kind == Kind::kBool ? b.b : b.i;
      return p < q ? -1 : p > q ? 1 : 0;
    }
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::kString && b.kind == Kind::kString) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.kind == Kind::kList && b.kind == Kind::kList) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;  // Python: the first unequal items decide
      int c = compare_at((*a.list)[k], (*b.list)[k], line, depth + 1);
      if (c) return c;
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'", line);
}

}  // namespace

bool equals(const Value& a, const Value& b) { return equals_at(a, b, 0); }
int compare(const Value& a, const Value& b, int line) { return compare_at(a, b, line, 0); }

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t k = 0; k < s.size();) {
    unsigned char c = s[k];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    n = std::min(n, s.size() - k);
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace anvil::chat_template_detail
