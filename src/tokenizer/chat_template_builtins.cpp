// Built-in globals, filters, tests and methods of the chat-template engine, each matching what
// jinja2 (and Python's str/dict methods, which jinja2 exposes) returns for JSON-like values.
// Anything missing is an "unsupported filter/test/method" error rather than a guess.
#include "tokenizer/chat_template_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <unordered_map>

#include "tokenizer/chat_template_pystr.h"

namespace anvil::chat_template_detail {

namespace {

const std::string& need_str(const Value& v, const char* what, int line) {
  if (v.is_undefined()) fail(v.s, line);
  if (v.kind != Kind::kString) fail(std::string(what) + " expects a string, got '" + type_name(v) + "'", line);
  return v.s;
}

std::string strip_arg(const Args& a, const std::string& s, bool left, bool right, int line) {
  const Value* chars = a.get(0, "chars");
  if (!chars || chars->kind == Kind::kNone) return py_strip(s, nullptr, left, right);
  return py_strip(s, &need_str(*chars, "strip chars", line), left, right);
}

std::string replace_all(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  if (old.empty()) {
    // Python inserts `with` between every code point (and at both ends).
    std::string out;
    int64_t n = 0;
    for (auto& c : utf8_chars(s)) {
      if (count < 0 || n < count) { out += with; ++n; }
      out += c;
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  std::string out;
  size_t k = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t p = s.find(old, k);
    if (p == std::string::npos) break;
    out += s.substr(k, p - k) + with;
    k = p + old.size();
    ++n;
  }
  return out + s.substr(k);
}

// jinja2's title filter (not str.title): each word split at whitespace, '-', '(', '{', '[' or '<'
// gets its first character uppercased and the rest lowercased.
std::string jinja_title(const std::string& s) {
  std::u32string in = to_u32(s);
  std::string out;
  size_t k = 0;
  auto is_sep = [](char32_t c) { return py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<'; };
  while (k < in.size()) {
    size_t e = k;
    bool sep = is_sep(in[k]);
    while (e < in.size() && is_sep(in[e]) == sep) ++e;
    std::string word = to_utf8(in.substr(k, e - k));
    if (sep) {
      out += word;
    } else {
      std::u32string w = in.substr(k, e - k);
      out += py_upper(to_utf8(w.substr(0, 1))) + py_lower(to_utf8(w.substr(1)));
    }
    k = e;
  }
  return out;
}

int64_t int_arg(const Args& a, size_t i, const char* name, int64_t dflt, int line) {
  const Value* v = a.get(i, name);
  if (!v || v->kind == Kind::kNone) return dflt;
  if (v->kind == Kind::kInt) return v->i;
  if (v->kind == Kind::kBool) return v->b;
  fail(std::string("argument '") + name + "' must be an integer", line);
}

Value items_of(const Value& d) {
  ValueList out;
  for (auto& [k, v] : d.dict->items) out.push_back(Value::make_list({k, v}, true));
  return Value::make_list(std::move(out));
}

[[noreturn]] void int_too_big(const std::string& what, int line) {
  fail(what + " is beyond the template engine's 64-bit integers", line);
}

// int(x) of a finite float, truncated toward zero; past 64 bits is an error, not a wrong number.
int64_t truncate_float(double x, int line) {
  const double t = std::trunc(x);
  if (!(t >= -9223372036854775808.0 && t < 9223372036854775808.0)) int_too_big("int(" + py_float_repr(t) + ")", line);
  return static_cast<int64_t>(t);
}

// jinja2's int filter: int(value, base) for a str, int(value) otherwise; on ValueError/TypeError
// int(float(value)) ("42.23" gives 42); when that fails too, `dflt` (any value, returned as is).
Value to_int(const Value& v, const Value& dflt, const Value& base, int line) {
  switch (v.kind) {
    case Kind::kUndefined: fail(v.s, line);  // Undefined.__int__ raises
    case Kind::kInt: return v;
    case Kind::kBool: return Value::integer(v.b);
    case Kind::kFloat:
      if (std::isinf(v.f)) fail("cannot convert float infinity to integer", line);  // OverflowError is not caught
      if (std::isnan(v.f)) return dflt;
      return Value::integer(truncate_float(v.f, line));
    case Kind::kString: {
      int64_t x = 0;
      bool overflow = false;
      if (base.kind == Kind::kInt || base.kind == Kind::kBool) {  // another base type: TypeError, as a bad string
        if (py_parse_int(v.s, base.kind == Kind::kBool ? base.b : base.i, &x, &overflow)) {
          if (overflow) int_too_big("int('" + v.s + "')", line);
          return Value::integer(x);
        }
      }
      double d = 0;
      if (!py_parse_float(v.s, &d) || !std::isfinite(d)) return dflt;  // ValueError / OverflowError
      return Value::integer(truncate_float(d, line));
    }
    default: return dflt;
  }
}

// jinja2's float filter: float(value), or `dflt` (returned as is) on ValueError/TypeError.
Value to_float(const Value& v, const Value& dflt, int line) {
  switch (v.kind) {
    case Kind::kUndefined: fail(v.s, line);  // Undefined.__float__ raises
    case Kind::kInt: return Value::floating(static_cast<double>(v.i));
    case Kind::kBool: return Value::floating(v.b);
    case Kind::kFloat: return v;
    case Kind::kString: {
      double d = 0;
      return py_parse_float(v.s, &d) ? Value::floating(d) : dflt;
    }
    default: return dflt;
  }
}

// jinja2's round filter: Python's round(value, precision) for 'common' (ties to even: 2.5 gives
// 2.0), else math.ceil/floor(value * 10**precision) / 10**precision, always a float.
Value round_value(const Value& v, const Value* precision, const std::string& method, int line) {
  if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor", line);
  if (!v.is_number()) fail("type " + (v.is_undefined() ? std::string("Undefined") : type_name(v)) + " doesn't define __round__ method", line);
  int64_t prec = 0;
  if (precision && precision->kind != Kind::kInt && precision->kind != Kind::kBool)
    fail("'" + type_name(*precision) + "' object cannot be interpreted as an integer", line);
  if (precision) prec = precision->kind == Kind::kBool ? precision->b : precision->i;
  const bool is_int = v.kind != Kind::kFloat;
  const int64_t iv = v.kind == Kind::kBool ? v.b : v.i;
  const double x = is_int ? static_cast<double>(iv) : v.f;
  if (method == "common") {
    if (!is_int) return Value::floating(py_round_float(x, prec));
    if (prec >= 0) return Value::integer(iv);
    if (prec < -18) return Value::integer(0);  // |int64| < 10^19: every value rounds to 0 (ties: 0 is even)
    int64_t unit = 1;
    for (int64_t k = 0; k < -prec; ++k) unit *= 10;
    int64_t q = iv / unit, r = iv % unit;  // round half to even on the exact integer
    if (r < 0) {
      r += unit;
      --q;
    }
    if (r * 2 > unit || (r * 2 == unit && (q & 1))) ++q;
    int64_t out = 0;
    if (__builtin_mul_overflow(q, unit, &out)) int_too_big("round(" + std::to_string(iv) + ", " + std::to_string(prec) + ")", line);
    return Value::integer(out);
  }
  // 10**precision: an exact int (as a float, correctly rounded) for precision >= 0, else a float pow.
  if (prec > 308) fail("int too large to convert to float", line);
  const double mul = prec >= 0 ? std::strtod(("1e" + std::to_string(prec)).c_str(), nullptr)
                               : std::pow(10.0, static_cast<double>(prec));
  if (mul == 0.0) fail("float division by zero", line);
  if (is_int && prec >= 0) return Value::floating(x);  // floor(int * 10**p) / 10**p is the int itself
  double r = method == "floor" ? std::floor(x * mul) : std::ceil(x * mul);
  if (r == 0) r = 0.0;  // math.floor/ceil return an int: no negative zero (-0.5 ceils to 0.0)
  return Value::floating(r / mul);
}

// jinja2's attribute lookup for filters like map(attribute='a.b') and selectattr.
Value attr_path(const Value& obj, const std::string& path, int line) {
  Value cur = obj;
  size_t k = 0;
  while (true) {
    size_t dot = path.find('.', k);
    std::string part = path.substr(k, dot == std::string::npos ? std::string::npos : dot - k);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? get_item(cur, Value::integer(std::stoll(part)), line) : get_item(cur, Value::string(part), line);
    if (dot == std::string::npos) return cur;
    k = dot + 1;
  }
}

// Sort key honoring jinja2's default case_sensitive=False.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.kind == Kind::kString) return Value::string(py_lower(v.s));
  return v;
}

Value select_like(const Value& seq, Args& a, bool attr_mode, bool select, int line) {
  size_t ai = 0;
  std::string attr;
  if (attr_mode) {
    if (a.pos.empty()) fail("selectattr/rejectattr needs an attribute name", line);
    attr = need_str(a.pos[0], "selectattr attribute", line);
    ai = 1;
  }
  std::string test;
  Args targs;
  if (a.pos.size() > ai) {
    test = need_str(a.pos[ai], "select test name", line);
    targs.pos.assign(a.pos.begin() + ai + 1, a.pos.end());
  }
  ValueList out;
  for (auto& item : iterate(seq, line)) {
    Value v = attr_mode ? attr_path(item, attr, line) : item;
    bool r = test.empty() ? truthy(v) : apply_test(test, v, targs, line);
    if (r == select) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

}  // namespace

std::vector<Value> iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList: return *v.list;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (auto& [k, e] : v.dict->items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> out;
      for (auto& c : utf8_chars(v.s)) out.push_back(Value::string(c));
      return out;
    }
    default: fail("'" + type_name(v) + "' object is not iterable", line);
  }
}

bool contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Kind::kUndefined: return false;
    case Kind::kString:
      if (item.kind != Kind::kString)
        fail("'in <string>' requires string as left operand, not " + type_name(item), line);
      return container.s.find(item.s) != std::string::npos;
    case Kind::kList:
      for (auto& e : *container.list)
        if (equals(e, item)) return true;
      return false;
    case Kind::kDict: case Kind::kNamespace:
      if (!hashable(item)) fail("unhashable type: '" + type_name(item) + "'", line);
      return container.dict->find(item) != nullptr;
    default: fail("argument of type '" + type_name(container) + "' is not iterable", line);
  }
}

Value get_attr(const Value& obj, const std::string& name, int line) {
  switch (obj.kind) {
    case Kind::kUndefined: fail(obj.s, line);
    case Kind::kDict: {
      Value m = method_of(obj, name, line);
      if (m.kind == Kind::kCallable || !m.s.empty()) return m;  // a method, or a refused mutator
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kNamespace: {
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Kind::kList:  // groupby's _GroupTuple(grouper, list) is a named tuple
      if (obj.fn_name == kGroupTuple && (name == "grouper" || name == "list")) return (*obj.list)[name == "list"];
      return method_of(obj, name, line);
    case Kind::kString: return method_of(obj, name, line);
    case Kind::kNone: return Value::undefined("'None' has no attribute '" + name + "'");
    case Kind::kCallable:
      if (obj.fn_name == "dict" && name == "fromkeys")
        return Value::callable("dict.fromkeys", [](Args& a, int l) {
          if (a.pos.empty()) fail("fromkeys expected at least 1 argument, got 0", l);
          Value fill = a.pos.size() > 1 ? a.pos[1] : Value::none();
          ValueDict d;
          for (auto& k : iterate(a.pos[0], l)) d.set(k, fill, l);
          return Value::make_dict(std::move(d));
        });
      return Value::undefined("'function object' has no attribute '" + name + "'");
    default: return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
  }
}

Value get_item(const Value& obj, const Value& key, int line) {
  switch (obj.kind) {
    case Kind::kUndefined: fail(obj.s, line);
    case Kind::kList: case Kind::kString: {
      if (key.kind == Kind::kString) return get_attr(obj, key.s, line);
      // jinja2's undefined for a missing element: "list object has no element 5" (no quotes,
      // unlike "'list object' has no attribute 'x'").
      auto no_element = [&] { return Value::undefined(type_name(obj) + " object has no element " + repr(key, line)); };
      if (is_list_like_object(obj) && obj.fn_name != kRange) return no_element();  // a dict view
      if (key.kind != Kind::kInt && key.kind != Kind::kBool)
        fail("indices must be integers, not " + type_name(key), line);
      int64_t k = key.kind == Kind::kBool ? key.b : key.i;
      if (obj.kind == Kind::kList) {
        int64_t n = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += n;
        if (k < 0 || k >= n) return no_element();
        return (*obj.list)[k];
      }
      std::vector<std::string> chars = utf8_chars(obj.s);
      int64_t n = static_cast<int64_t>(chars.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return no_element();
      return Value::string(chars[k]);
    }
    case Kind::kDict: case Kind::kNamespace: {
      if (key.kind == Kind::kString) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        if (obj.kind == Kind::kDict) {
          Value m = method_of(obj, key.s, line);
          if (m.kind == Kind::kCallable || !m.s.empty()) return m;
        }
        return Value::undefined("'dict object' has no attribute '" + key.s + "'");
      }
      if (const Value* v = obj.dict->find(key)) return *v;
      if (!hashable(key)) fail("unhashable type: '" + type_name(key) + "'", line);
      return Value::undefined("dict object has no element " + repr(key, line));
    }
    default: return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + to_str(key, line) + "'");
  }
}

void check_namespace_name(const std::string& name, int line) {
  if (!name.empty() && name[0] == '_')
    fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + name +
             "'. Please rename the attribute.",
         line);
}

Value make_range(int64_t start, int64_t stop, int64_t step, int line) {
  if ((stop - start) / step > 100000) fail("range() too large (sandbox limit is 100000 items)", line);
  ValueList items;
  for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) items.push_back(Value::integer(k));
  Value out = Value::make_list(std::move(items));
  out.fn_name = kRange;
  out.s = "range(" + std::to_string(start) + ", " + std::to_string(stop) +
          (step == 1 ? std::string() : ", " + std::to_string(step)) + ")";
  return out;
}

void install_globals(std::map<std::string, Value>& frame) {
  frame["range"] = Value::callable("range", [](Args& a, int line) {
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = int_arg(a, 0, "stop", 0, line);
    } else if (a.pos.size() >= 2) {
      start = int_arg(a, 0, "start", 0, line);
      stop = int_arg(a, 1, "stop", 0, line);
      step = int_arg(a, 2, "step", 1, line);
    } else {
      fail("range() expects 1 to 3 arguments", line);
    }
    if (step == 0) fail("range() step must not be zero", line);
    return make_range(start, stop, step, line);
  });
  auto make_mapping = [](Args& a, int line, Kind kind) {
    ValueDict d;
    for (auto& p : a.pos) {
      if (p.kind != Kind::kDict) fail("namespace()/dict() positional argument must be a dict", line);
      for (auto& [k, v] : p.dict->items) d.set(k, v, line);
    }
    for (auto& [k, v] : a.kw) d.set(k, v);
    Value out = Value::make_dict(std::move(d));
    out.kind = kind;
    // transformers' TemplateNamespace refuses underscore-prefixed attribute names.
    if (kind == Kind::kNamespace)
      for (auto& [k, v] : out.dict->items) check_namespace_name(k.s, line);
    return out;
  };
  frame["namespace"] = Value::callable("namespace", [make_mapping](Args& a, int line) {
    return make_mapping(a, line, Kind::kNamespace);
  });
  frame["dict"] = Value::callable("dict", [make_mapping](Args& a, int line) { return make_mapping(a, line, Kind::kDict); });
  frame["raise_exception"] = Value::callable("raise_exception", [](Args& a, int line) -> Value {
    std::string msg = a.pos.empty() ? "" : to_str(a.pos[0], line);
    throw TemplateError{"chat template: raise_exception: " + msg};
  });
  frame["strftime_now"] = Value::callable("strftime_now", [](Args& a, int line) {
    if (a.pos.empty()) fail("strftime_now() needs a format", line);
    const std::string& fmt = need_str(a.pos[0], "strftime_now", line);
    // The local time now, as transformers' strftime_now; ANVIL_TEMPLATE_NOW=SECONDS (since the Unix
    // epoch) pins it, so a prompt that a template dates renders the same on any day (the template
    // conformance test compares with renderings frozen on one day).
    std::time_t now = std::time(nullptr);
    if (const char* e = std::getenv("ANVIL_TEMPLATE_NOW"); e && *e) {
      char* end = nullptr;
      const long long v = std::strtoll(e, &end, 10);
      if (end && *end == '\0') now = static_cast<std::time_t>(v);
    }
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

Value apply_filter(const std::string& name, const Value& v, Args& a, int line) {
  if (name == "tojson") {
    const Value* ea = a.get(0, "ensure_ascii");
    const Value* ind = a.get(1, "indent");
    const Value* sep = a.get(2, "separators");
    const Value* sk = a.get(3, "sort_keys");
    int indent = -1;
    const std::string* indent_str = nullptr;
    if (ind && ind->kind == Kind::kInt) indent = static_cast<int>(std::max<int64_t>(0, ind->i));
    else if (ind && ind->kind == Kind::kString) indent_str = &ind->s;
    else if (ind && ind->kind != Kind::kNone) fail("tojson: indent must be an integer or string", line);
    bool pretty = indent >= 0 || indent_str;
    std::string item_sep = pretty ? "," : ", ", key_sep = ": ";
    if (sep && sep->kind != Kind::kNone) {
      if (sep->kind != Kind::kList || sep->list->size() != 2) fail("tojson: separators must be a pair of strings", line);
      item_sep = need_str((*sep->list)[0], "tojson separators", line);
      key_sep = need_str((*sep->list)[1], "tojson separators", line);
    }
    return Value::string(to_json(v, indent, indent_str, item_sep, key_sep, sk && truthy(*sk), line, ea && truthy(*ea)));
  }
  if (name == "length" || name == "count") {
    switch (v.kind) {
      case Kind::kUndefined: return Value::integer(0);
      case Kind::kString: return Value::integer(static_cast<int64_t>(utf8_length(v.s)));
      case Kind::kList: return Value::integer(static_cast<int64_t>(v.list->size()));
      case Kind::kDict: return Value::integer(static_cast<int64_t>(v.dict->items.size()));
      default: fail("object of type '" + type_name(v) + "' has no len()", line);
    }
  }
  if (name == "string") return Value::string(to_str(v, line));
  if (name == "trim") return Value::string(strip_arg(a, to_str(v, line), true, true, line));
  if (name == "upper") return Value::string(py_upper(to_str(v, line)));
  if (name == "lower") return Value::string(py_lower(to_str(v, line)));
  if (name == "title") return Value::string(jinja_title(to_str(v, line)));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v, line)));
  if (name == "safe") return v;
  if (name == "indent") {
    const Value* w = a.get(0, "width");
    const int64_t n = w && w->kind == Kind::kString ? 0 : std::max<int64_t>(0, int_arg(a, 0, "width", 4, line));
    check_build_size(1, n, line);
    std::string ind = w && w->kind == Kind::kString ? w->s : std::string(static_cast<size_t>(n), ' ');
    const Value* first = a.get(1, "first");
    const Value* blank = a.get(2, "blank");
    Args none;
    Value lines_v = (*method_of(Value::string(to_str(v, line) + "\n"), "splitlines", line).fn)(none, line);
    const ValueList& lines = *lines_v.list;
    std::string out;
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) out += "\n";
      bool indent_it = k > 0 && (!lines[k].s.empty() || (blank && truthy(*blank)));
      out += (indent_it ? ind : "") + lines[k].s;
    }
    return Value::string((first && truthy(*first) ? ind : "") + out);
  }
  if (name == "truncate") {
    std::u32string s = to_u32(to_str(v, line));
    int64_t length = int_arg(a, 0, "length", 255, line);
    const Value* kill = a.get(1, "killwords");
    const Value* end_v = a.get(2, "end");
    std::u32string end = to_u32(end_v ? to_str(*end_v, line) : "...");
    int64_t leeway = int_arg(a, 3, "leeway", 5, line);
    if (length < static_cast<int64_t>(end.size())) fail("expected length >= " + std::to_string(end.size()) + ", got " + std::to_string(length), line);
    if (leeway < 0) fail("expected leeway >= 0, got " + std::to_string(leeway), line);
    if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(to_utf8(s));
    std::u32string head = s.substr(0, static_cast<size_t>(length) - end.size());
    if (!(kill && truthy(*kill))) {
      size_t sp = head.rfind(U' ');
      if (sp != std::u32string::npos) head = head.substr(0, sp);
    }
    return Value::string(to_utf8(head + end));
  }
  if (name == "center") {
    Args ca;
    ca.pos.push_back(Value::integer(int_arg(a, 0, "width", 80, line)));
    return (*method_of(Value::string(to_str(v, line)), "center", line).fn)(ca, line);
  }
  if (name == "wordcount") {  // len(re.findall(r"\w+", s))
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : to_u32(to_str(v, line))) {
      Args none;
      bool w = c == U'_' || (*method_of(Value::string(to_utf8(std::u32string(1, c))), "isalnum", line).fn)(none, line).b;
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "batch" || name == "slice") {
    int64_t count = int_arg(a, 0, name == "batch" ? "linecount" : "slices", 0, line);
    if (count <= 0) fail(name + " needs a positive count", line);
    const Value* fill = a.get(1, "fill_with");
    bool do_fill = fill && fill->kind != Kind::kNone;
    std::vector<Value> seq = iterate(v, line);
    ValueList out;
    if (name == "batch") {
      for (size_t k = 0; k < seq.size(); k += static_cast<size_t>(count)) {
        ValueList row(seq.begin() + k, seq.begin() + std::min(seq.size(), k + static_cast<size_t>(count)));
        while (do_fill && static_cast<int64_t>(row.size()) < count) row.push_back(*fill);
        out.push_back(Value::make_list(std::move(row)));
      }
    } else {
      int64_t len = static_cast<int64_t>(seq.size()), per = len / count, extra = len % count, offset = 0;
      for (int64_t k = 0; k < count; ++k) {
        int64_t start = offset + k * per;
        if (k < extra) ++offset;
        int64_t stop = offset + (k + 1) * per;
        ValueList part(seq.begin() + start, seq.begin() + stop);
        if (do_fill && k >= extra) part.push_back(*fill);
        out.push_back(Value::make_list(std::move(part)));
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "attr") {  // a Python attribute only (a dict's methods, not its keys)
    if (a.pos.empty()) fail("attr filter needs a name", line);
    std::string attr = to_str(a.pos[0], line);
    if (v.kind == Kind::kString || v.kind == Kind::kList || v.kind == Kind::kDict) {
      Value m = method_of(v, attr, line);
      if (m.kind == Kind::kCallable || (v.kind == Kind::kDict && !m.s.empty())) return m;
    }
    return Value::undefined("'" + type_name(v) + " object' has no attribute '" + attr + "'");
  }
  if (name == "format") {  // jinja2: soft_str(value) % (kwargs or args)
    if (!a.kw.empty() && !a.pos.empty()) fail("can't handle positional and keyword arguments at the same time", line);
    std::string fmt = to_str(v, line);
    if (!a.kw.empty()) {
      ValueDict d;
      for (auto& [k, x] : a.kw) d.set(k, x);
      return Value::string(percent_format(fmt, Value::make_dict(std::move(d)), line));
    }
    return Value::string(percent_format(fmt, Value::make_list(a.pos, /*tuple=*/true), line));
  }
  if (name == "replace") {
    if (a.pos.size() < 2) fail("replace filter needs two arguments", line);
    return Value::string(replace_all(to_str(v, line), to_str(a.pos[0], line), to_str(a.pos[1], line),
                                     int_arg(a, 2, "count", -1, line)));
  }
  if (name == "default" || name == "d") {
    const Value* dv = a.get(0, "default_value");
    const Value* boolean = a.get(1, "boolean");
    bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dv ? *dv : Value::string("")) : v;
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(v, line);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string s = sep ? to_str(*sep, line) : "", out;
    bool first = true;
    for (auto& e : iterate(v, line)) {
      if (!first) out += s;
      first = false;
      out += to_str(attr ? attr_path(e, to_str(*attr, line), line) : e, line);
    }
    return Value::string(out);
  }
  if (name == "list") return Value::make_list(iterate(v, line));
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list({});
    if (v.kind != Kind::kDict) fail("Can only get item pairs from a mapping.", line);
    return items_of(v);
  }
  if (name == "int") {
    const Value* d = a.get(0, "default");
    const Value* base = a.get(1, "base");
    return to_int(v, d ? *d : Value::integer(0), base ? *base : Value::integer(10), line);
  }
  if (name == "float") {
    const Value* d = a.get(0, "default");
    return to_float(v, d ? *d : Value::floating(0.0), line);
  }
  if (name == "abs") {
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
      const int64_t x = v.kind == Kind::kBool ? v.b : v.i;
      if (x == INT64_MIN) fail("integer overflow in abs() (template integers are 64-bit)", line);
      return Value::integer(x < 0 ? -x : x);
    }
    if (v.kind == Kind::kFloat) return Value::floating(std::fabs(v.f));
    fail("bad operand type for abs(): '" + type_name(v) + "'", line);
  }
  if (name == "round") {
    const Value* method = a.get(1, "method");
    return round_value(v, a.get(0, "precision"), method ? to_str(*method, line) : "common", line);
  }
  if (name == "select" || name == "reject") return select_like(v, a, false, name == "select", line);
  if (name == "selectattr" || name == "rejectattr") return select_like(v, a, true, name == "selectattr", line);
  if (name == "map") {
    const Value* attr = nullptr;
    for (auto& [k, x] : a.kw)
      if (k == "attribute") attr = &x;
    ValueList out;
    if (attr) {
      const Value* dflt = nullptr;
      for (auto& [k, x] : a.kw)
        if (k == "default") dflt = &x;
      for (auto& e : iterate(v, line)) {
        Value r = attr_path(e, to_str(*attr, line), line);
        out.push_back(r.is_undefined() && dflt ? *dflt : r);
      }
      return Value::make_list(std::move(out));
    }
    if (a.pos.empty()) fail("map filter needs a filter name or attribute=", line);
    std::string f = need_str(a.pos[0], "map filter name", line);
    Args fargs;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    fargs.kw = a.kw;
    for (auto& e : iterate(v, line)) out.push_back(apply_filter(f, e, fargs, line));
    return Value::make_list(std::move(out));
  }
  if (name == "groupby") {  // jinja2: sort by the key, then group runs of equal keys
    if (a.pos.empty() && !a.get(0, "attribute")) fail("groupby needs an attribute", line);
    std::string attr = to_str(*a.get(0, "attribute"), line);
    const Value* dflt = a.get(1, "default");
    const Value* cs = a.get(2, "case_sensitive");
    bool case_sensitive = cs && truthy(*cs);
    auto key_of = [&](const Value& e) {
      Value k = attr_path(e, attr, line);
      if (k.is_undefined() && dflt) k = *dflt;
      return k;
    };
    std::vector<Value> items = iterate(v, line);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return compare(sort_key(key_of(x), case_sensitive), sort_key(key_of(y), case_sensitive), line) < 0;
    });
    ValueList out;
    for (size_t k = 0; k < items.size();) {
      Value key = sort_key(key_of(items[k]), case_sensitive);
      ValueList group;
      size_t j = k;
      for (; j < items.size() && equals(sort_key(key_of(items[j]), case_sensitive), key); ++j) group.push_back(items[j]);
      // The grouper is the first member's own key (not its lowercased form).
      Value g = Value::make_list({key_of(items[k]), Value::make_list(std::move(group))}, /*tuple=*/true);
      g.fn_name = kGroupTuple;
      out.push_back(std::move(g));
      k = j;
    }
    return Value::make_list(std::move(out));
  }
  if (name == "unique") {  // a set of keys: unhashable ones are Python's TypeError
    const Value* cs = a.get(0, "case_sensitive");
    const Value* attr = a.get(1, "attribute");
    ValueList out, keys;
    for (auto& e : iterate(v, line)) {
      Value k = sort_key(attr && attr->kind != Kind::kNone ? attr_path(e, to_str(*attr, line), line) : e, cs && truthy(*cs));
      if (!hashable(k)) fail("unhashable type: '" + type_name(k) + "'", line);
      if (std::none_of(keys.begin(), keys.end(), [&](const Value& x) { return equals(x, k); })) {
        keys.push_back(k);
        out.push_back(e);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "reverse") {
    if (v.kind == Kind::kString) {
      std::vector<std::string> cs = utf8_chars(v.s);
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value::string(out);
    }
    std::vector<Value> items = iterate(v, line);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "sort") {
    const Value* rev = a.get(0, "reverse");
    const Value* cs = a.get(1, "case_sensitive");
    const Value* attr = a.get(2, "attribute");
    std::vector<Value> items = iterate(v, line);
    bool case_sensitive = cs && truthy(*cs);
    auto key = [&](const Value& e) {
      return sort_key(attr ? attr_path(e, to_str(*attr, line), line) : e, case_sensitive);
    };
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& x, const Value& y) { return compare(key(x), key(y), line) < 0; });
    if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "dictsort") {
    if (v.kind != Kind::kDict) fail("dictsort expects a mapping", line);
    const Value* cs = a.get(0, "case_sensitive");
    const Value* by = a.get(1, "by");
    const Value* rev = a.get(2, "reverse");
    const std::string by_what = by ? to_str(*by, line) : "key";
    if (by_what != "key" && by_what != "value") fail("You can only sort by either \"key\" or \"value\"", line);
    bool by_value = by_what == "value";
    std::vector<Value> items = *items_of(v).list;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return compare(sort_key((*x.list)[by_value], cs && truthy(*cs)), sort_key((*y.list)[by_value], cs && truthy(*cs)), line) < 0;
    });
    if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "sum") {  // Python's sum(values, start): start + v0 + v1 ... with the + operator
    const Value* attr = a.get(0, "attribute");
    const Value* start = a.get(1, "start");
    Value acc = start ? *start : Value::integer(0);
    if (acc.kind == Kind::kString) fail("sum() can't sum strings [use ''.join(seq) instead]", line);
    for (auto& e : iterate(v, line))
      acc = binary_op("+", acc, attr && attr->kind != Kind::kNone ? attr_path(e, to_str(*attr, line), line) : e, line);
    return acc;
  }
  if (name == "min" || name == "max") {  // the first smallest/largest, by attribute, case-insensitive
    const Value* cs = a.get(0, "case_sensitive");
    const Value* attr = a.get(1, "attribute");
    const bool case_sensitive = cs && truthy(*cs);
    auto key = [&](const Value& e) {
      return sort_key(attr && attr->kind != Kind::kNone ? attr_path(e, to_str(*attr, line), line) : e, case_sensitive);
    };
    std::vector<Value> items = iterate(v, line);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    Value best = items[0];
    for (auto& e : items) {
      int c = compare(key(e), key(best), line);
      if (name == "min" ? c < 0 : c > 0) best = e;
    }
    return best;
  }
  fail("unsupported filter '" + name + "'", line);
}

bool apply_test(const std::string& name, const Value& v, Args& a, int line) {
  auto arg = [&]() -> const Value& {
    if (a.pos.empty()) fail("test '" + name + "' needs an argument", line);
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Kind::kNone;
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "true") return v.kind == Kind::kBool && v.b;
  if (name == "false") return v.kind == Kind::kBool && !v.b;
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.kind == Kind::kString;
  if (name == "mapping") return v.kind == Kind::kDict;
  if (name == "iterable") return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString || v.is_undefined();
  if (name == "sequence") return v.kind == Kind::kList || v.kind == Kind::kDict || v.kind == Kind::kString || v.is_undefined();
  if (name == "callable") return v.kind == Kind::kCallable || v.is_undefined();  // jinja2's Undefined has __call__
  // jinja2: value % 2 == 0, value % 2 == 1, value % num == 0 (floats too: 1.5 is divisibleby 0.5).
  if (name == "even") return equals(binary_op("%", v, Value::integer(2), line), Value::integer(0));
  if (name == "odd") return equals(binary_op("%", v, Value::integer(2), line), Value::integer(1));
  if (name == "divisibleby") return equals(binary_op("%", v, arg(), line), Value::integer(0));
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg());
  if (name == "ne" || name == "!=") return !equals(v, arg());
  if (name == "sameas") {
    const Value& o = arg();
    if (v.kind == Kind::kNone || v.kind == Kind::kBool || o.kind == Kind::kNone || o.kind == Kind::kBool)
      return v.kind == o.kind && (v.kind != Kind::kBool || v.b == o.b);
    return equals(v, o);
  }
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg(), line) < 0;
  if (name == "le" || name == "<=") return compare(v, arg(), line) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg(), line) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg(), line) >= 0;
  if (name == "in") return contains(arg(), v, line);
  if (name == "lower" || name == "upper") {  // jinja2: str(value).islower() / .isupper()
    Args none;
    Value m = method_of(Value::string(to_str(v, line)), name == "upper" ? "isupper" : "islower", line);
    return (*m.fn)(none, line).b;
  }
  fail("unsupported test '" + name + "'", line);
}

}  // namespace anvil::chat_template_detail
