// Python methods of str, list and dict values, as jinja2's ImmutableSandboxedEnvironment exposes
// them to a template: every public non-mutating method; methods that mutate a list or dict
// (append, pop, update, ...) are refused with jinja2's SecurityError message. Arguments bind by
// position or keyword with Python's parameter names; indices and lengths count code points.
#include <utf8proc.h>

#include <algorithm>
#include <set>
#include <string>

#include "tokenizer/chat_template_builtins.h"
#include "tokenizer/chat_template_pystr.h"

namespace anvil::chat_template_detail {

namespace {

const std::string& str_arg(const Value& v, const std::string& method, int line) {
  if (v.is_undefined()) fail(v.s, line);
  if (v.kind != Kind::kString)
    fail(method + "() argument must be str, not " + type_name(v), line);
  return v.s;
}

const Value& need(const Args& a, size_t i, const char* name, const std::string& method, int line) {
  const Value* v = a.get(i, name);
  if (!v) fail(method + "() missing required argument '" + name + "' (pos " + std::to_string(i + 1) + ")", line);
  return *v;
}

int64_t opt_int(const Args& a, size_t i, const char* name, int64_t dflt, const std::string& method, int line) {
  const Value* v = a.get(i, name);
  if (!v || v->kind == Kind::kNone) return dflt;
  if (v->kind == Kind::kInt) return v->i;
  if (v->kind == Kind::kBool) return v->b;
  fail(method + "(): '" + type_name(*v) + "' object cannot be interpreted as an integer", line);
}

// Python's slice-style clamp of [start, end) for a sequence of n items.
void clamp_range(int64_t n, int64_t* start, int64_t* end) {
  if (*start < 0) *start = std::max<int64_t>(0, *start + n);
  if (*end < 0) *end = std::max<int64_t>(0, *end + n);
  *end = std::min(*end, n);
}

// s as code points with the [start, end) window of str.find/count/startswith arguments, clamped
// like a Python slice.
struct Window {
  std::u32string all;
  int64_t start, end;
  bool empty_past_end;  // start > len: Python's find/count see nothing at all
};
Window window(const std::string& s, const Args& a, size_t first_arg, const std::string& method, int line) {
  Window w{to_u32(s), 0, 0, false};
  int64_t n = static_cast<int64_t>(w.all.size());
  w.start = opt_int(a, first_arg, "start", 0, method, line);
  w.end = opt_int(a, first_arg + 1, "end", n, method, line);
  int64_t raw_start = w.start < 0 ? w.start + n : w.start;
  clamp_range(n, &w.start, &w.end);
  w.empty_past_end = raw_start > n;
  return w;
}

int64_t find_in(const Window& w, const std::u32string& sub, bool reverse) {
  if (w.empty_past_end || w.end - w.start < static_cast<int64_t>(sub.size())) return -1;
  std::u32string_view hay(w.all.data() + w.start, static_cast<size_t>(w.end - w.start));
  size_t p = reverse ? hay.rfind(sub) : hay.find(sub);
  return p == std::u32string_view::npos ? -1 : w.start + static_cast<int64_t>(p);
}

Value split_impl(const std::string& s, const Value* sep_v, int64_t maxsplit, bool from_right, int line) {
  std::u32string in = to_u32(s);
  std::vector<std::u32string> parts;
  if (!sep_v || sep_v->kind == Kind::kNone) {
    // Runs of whitespace separate; leading/trailing whitespace yields no empty parts.
    if (!from_right) {
      size_t k = 0;
      while (true) {
        while (k < in.size() && py_isspace(in[k])) ++k;
        if (k >= in.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          size_t e = in.size();
          while (e > k && py_isspace(in[e - 1])) --e;
          parts.push_back(in.substr(k, e - k));
          break;
        }
        size_t e = k;
        while (e < in.size() && !py_isspace(in[e])) ++e;
        parts.push_back(in.substr(k, e - k));
        k = e;
      }
    } else {
      int64_t k = static_cast<int64_t>(in.size());
      while (true) {
        while (k > 0 && py_isspace(in[k - 1])) --k;
        if (k <= 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
          parts.push_back(in.substr(0, k));  // the remainder keeps its leading whitespace
          break;
        }
        int64_t b = k;
        while (b > 0 && !py_isspace(in[b - 1])) --b;
        parts.push_back(in.substr(b, k - b));
        k = b;
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    std::u32string sep = to_u32(str_arg(*sep_v, from_right ? "rsplit" : "split", line));
    if (sep.empty()) fail("empty separator", line);
    if (!from_right) {
      size_t k = 0;
      while (true) {
        size_t p = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) ? std::u32string::npos
                                                                                      : in.find(sep, k);
        if (p == std::u32string::npos) {
          parts.push_back(in.substr(k));
          break;
        }
        parts.push_back(in.substr(k, p - k));
        k = p + sep.size();
      }
    } else {
      size_t end = in.size();
      while (true) {
        size_t p = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) || end < sep.size()
                       ? std::u32string::npos
                       : in.rfind(sep, end - sep.size());
        if (p == std::u32string::npos) {
          parts.push_back(in.substr(0, end));
          break;
        }
        parts.push_back(in.substr(p + sep.size(), end - p - sep.size()));
        end = p;
      }
      std::reverse(parts.begin(), parts.end());
    }
  }
  ValueList out;
  for (auto& p : parts) out.push_back(Value::string(to_utf8(p)));
  return Value::make_list(std::move(out));
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

std::string repeat(const std::u32string& fill, int64_t n) {
  std::u32string r;
  for (int64_t k = 0; k < n; ++k) r += fill;
  return to_utf8(r);
}

std::u32string fill_char(const Args& a, const std::string& method, int line) {
  const Value* f = a.get(1, "fillchar");
  if (!f) return U" ";
  std::u32string c = to_u32(str_arg(*f, method, line));
  if (c.size() != 1) fail("The fill character must be exactly one character long", line);
  return c;
}

// str.isX(): false for "", else every code point passes.
template <typename Pred>
bool all_of_cps(const std::string& s, Pred p) {
  std::u32string u = to_u32(s);
  return !u.empty() && std::all_of(u.begin(), u.end(), p);
}

bool cp_cat(char32_t c, std::initializer_list<utf8proc_category_t> cats) {
  auto k = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return std::find(cats.begin(), cats.end(), k) != cats.end();
}
bool cp_alpha(char32_t c) {
  return cp_cat(c, {UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LL, UTF8PROC_CATEGORY_LT, UTF8PROC_CATEGORY_LM,
                    UTF8PROC_CATEGORY_LO});
}
bool cp_decimal(char32_t c) { return cp_cat(c, {UTF8PROC_CATEGORY_ND}); }
// Python's isdigit: decimals plus the digit-valued No characters (superscripts, circled digits).
bool cp_digit(char32_t c) {
  if (cp_decimal(c)) return true;
  return c == 0xB2 || c == 0xB3 || c == 0xB9 || c == 0x2070 || (c >= 0x2074 && c <= 0x2079) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247C) ||
         (c >= 0x2488 && c <= 0x2490) || (c >= 0x24F5 && c <= 0x24FD) || c == 0x24EA || c == 0x24FF ||
         (c >= 0x2776 && c <= 0x277E) || (c >= 0x2780 && c <= 0x2788) || (c >= 0x278A && c <= 0x2792);
}
bool cp_numeric(char32_t c) {
  return cp_digit(c) || cp_cat(c, {UTF8PROC_CATEGORY_NL, UTF8PROC_CATEGORY_NO});
}
bool cp_upper(char32_t c) { return cp_cat(c, {UTF8PROC_CATEGORY_LU}); }
bool cp_lower(char32_t c) { return cp_cat(c, {UTF8PROC_CATEGORY_LL}); }
bool cp_title(char32_t c) { return cp_cat(c, {UTF8PROC_CATEGORY_LT}); }

Value str_call(const std::string& s, const std::string& name, Args& a, int line) {
  const std::string m = "str." + name;
  if (name == "format") return Value::string(str_format(s, a, line));
  if (name == "format_map") {
    const Value& d = need(a, 0, "mapping", m, line);
    if (d.kind != Kind::kDict) fail("format_map() argument must be a mapping, not " + type_name(d), line);
    Args kw;
    for (auto& [k, v] : d.dict->items)
      if (k.kind == Kind::kString) kw.kw.emplace_back(k.s, v);
    return Value::string(str_format(s, kw, line));
  }
  if (name == "upper") return Value::string(py_upper(s));
  if (name == "lower") return Value::string(py_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "swapcase") return Value::string(py_swapcase(s));
  if (name == "casefold") return Value::string(py_casefold(s));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* c = a.get(0, "chars");
    const std::string* chars = (c && c->kind != Kind::kNone) ? &str_arg(*c, m, line) : nullptr;
    return Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit")
    return split_impl(s, a.get(0, "sep"), opt_int(a, 1, "maxsplit", -1, m, line), name == "rsplit", line);
  if (name == "splitlines") {
    const Value* keep = a.get(0, "keepends");
    bool keepends = keep && truthy(*keep);
    std::u32string in = to_u32(s);
    ValueList parts;
    size_t k = 0;
    while (k < in.size()) {
      size_t e = k;
      while (e < in.size() && !is_line_break(in[e])) ++e;
      size_t next = e;
      if (e < in.size()) next = (in[e] == '\r' && e + 1 < in.size() && in[e + 1] == '\n') ? e + 2 : e + 1;
      parts.push_back(Value::string(to_utf8(in.substr(k, (keepends ? next : e) - k))));
      k = next;
    }
    return Value::make_list(std::move(parts));
  }
  if (name == "startswith" || name == "endswith") {
    const Value& pre = need(a, 0, name == "startswith" ? "prefix" : "suffix", m, line);
    Window w = window(s, a, 1, m, line);
    std::vector<Value> options;
    if (pre.kind == Kind::kList && pre.is_tuple) options = *pre.list;
    else if (pre.kind == Kind::kString) options = {pre};
    else fail(name + " first arg must be str or a tuple of str, not " + type_name(pre), line);
    if (w.empty_past_end) return Value::boolean(false);
    std::u32string_view hay(w.all.data() + w.start, static_cast<size_t>(std::max<int64_t>(0, w.end - w.start)));
    for (auto& o : options) {
      std::u32string p = to_u32(str_arg(o, m, line));
      if (p.size() > hay.size()) continue;
      if (name == "startswith" ? hay.substr(0, p.size()) == p : hay.substr(hay.size() - p.size()) == p)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    std::u32string sub = to_u32(str_arg(need(a, 0, "sub", m, line), m, line));
    Window w = window(s, a, 1, m, line);
    int64_t p = find_in(w, sub, name[0] == 'r');
    if (p < 0 && (name == "index" || name == "rindex")) fail("ValueError: substring not found", line);
    return Value::integer(p);
  }
  if (name == "count") {
    std::u32string sub = to_u32(str_arg(need(a, 0, "sub", m, line), m, line));
    Window w = window(s, a, 1, m, line);
    if (w.empty_past_end) return Value::integer(0);
    int64_t len = std::max<int64_t>(0, w.end - w.start);
    if (sub.empty()) return Value::integer(len + 1);
    std::u32string_view hay(w.all.data() + w.start, static_cast<size_t>(len));
    int64_t n = 0;
    for (size_t p = hay.find(sub); p != std::u32string_view::npos; p = hay.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "replace") {
    std::u32string in = to_u32(s), old = to_u32(str_arg(need(a, 0, "old", m, line), m, line)),
                   with = to_u32(str_arg(need(a, 1, "new", m, line), m, line));
    int64_t count = opt_int(a, 2, "count", -1, m, line);
    std::u32string out;
    int64_t done = 0;
    if (old.empty()) {
      for (char32_t c : in) {
        if (count < 0 || done < count) out += with, ++done;
        out += c;
      }
      if (count < 0 || done < count) out += with;
      return Value::string(to_utf8(out));
    }
    size_t k = 0;
    while (count < 0 || done < count) {
      size_t p = in.find(old, k);
      if (p == std::u32string::npos) break;
      out += in.substr(k, p - k) + with;
      k = p + old.size();
      ++done;
    }
    return Value::string(to_utf8(out + in.substr(k)));
  }
  if (name == "join") {
    std::string out;
    size_t idx = 0;
    for (auto& e : iterate(need(a, 0, "iterable", m, line), line)) {
      if (e.kind != Kind::kString)
        fail("sequence item " + std::to_string(idx) + ": expected str instance, " + type_name(e) + " found", line);
      if (idx++) out += s;
      out += e.s;
    }
    return Value::string(out);
  }
  if (name == "partition" || name == "rpartition") {
    std::string sep = str_arg(need(a, 0, "sep", m, line), m, line);
    if (sep.empty()) fail("empty separator", line);
    size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    if (p == std::string::npos)
      return name == "partition"
                 ? Value::make_list({Value::string(s), Value::string(""), Value::string("")}, true)
                 : Value::make_list({Value::string(""), Value::string(""), Value::string(s)}, true);
    return Value::make_list({Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))},
                            true);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string fix = str_arg(need(a, 0, name == "removeprefix" ? "prefix" : "suffix", m, line), m, line);
    if (fix.empty() || fix.size() > s.size()) return Value::string(s);
    if (name == "removeprefix") return Value::string(s.compare(0, fix.size(), fix) == 0 ? s.substr(fix.size()) : s);
    return Value::string(s.compare(s.size() - fix.size(), fix.size(), fix) == 0 ? s.substr(0, s.size() - fix.size()) : s);
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    int64_t width = opt_int(a, 0, "width", -1, m, line);
    if (!a.get(0, "width")) fail(m + "() missing required argument 'width'", line);
    std::u32string fill = fill_char(a, m, line);
    int64_t len = static_cast<int64_t>(utf8_length(s));
    if (width <= len) return Value::string(s);
    check_build_size(4, width, line);
    int64_t marg = width - len;
    if (name == "ljust") return Value::string(s + repeat(fill, marg));
    if (name == "rjust") return Value::string(repeat(fill, marg) + s);
    int64_t left = marg / 2 + (marg & width & 1);
    return Value::string(repeat(fill, left) + s + repeat(fill, marg - left));
  }
  if (name == "zfill") {
    if (!a.get(0, "width")) fail("str.zfill() missing required argument 'width'", line);
    int64_t width = opt_int(a, 0, "width", 0, m, line);
    int64_t len = static_cast<int64_t>(utf8_length(s));
    if (width <= len) return Value::string(s);
    check_build_size(1, width, line);
    std::string zeros(static_cast<size_t>(width - len), '0');
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) return Value::string(s.substr(0, 1) + zeros + s.substr(1));
    return Value::string(zeros + s);
  }
  if (name == "expandtabs") {
    int64_t tab = opt_int(a, 0, "tabsize", 8, m, line);
    std::u32string in = to_u32(s), out;
    int64_t col = 0;
    for (char32_t c : in) {
      if (c == '\t') {
        if (tab > 0) {
          int64_t n = tab - col % tab;
          out.append(static_cast<size_t>(n), U' ');
          col += n;
        }
      } else {
        out += c;
        col = (c == '\n' || c == '\r') ? 0 : col + 1;
      }
    }
    return Value::string(to_utf8(out));
  }
  if (name == "isdigit") return Value::boolean(all_of_cps(s, cp_digit));
  if (name == "isdecimal") return Value::boolean(all_of_cps(s, cp_decimal));
  if (name == "isnumeric") return Value::boolean(all_of_cps(s, cp_numeric));
  if (name == "isalpha") return Value::boolean(all_of_cps(s, cp_alpha));
  if (name == "isalnum")
    return Value::boolean(all_of_cps(s, [](char32_t c) { return cp_alpha(c) || cp_numeric(c); }));
  if (name == "isspace") return Value::boolean(all_of_cps(s, py_isspace));
  if (name == "isascii") {
    return Value::boolean(std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }));
  }
  if (name == "isupper" || name == "islower") {
    bool cased = false;
    for (char32_t c : to_u32(s)) {
      bool up = cp_upper(c), lo = cp_lower(c), ti = cp_title(c);
      if (name == "isupper" ? (lo || ti) : (up || ti)) return Value::boolean(false);
      cased |= name == "isupper" ? up : lo;
    }
    return Value::boolean(cased);
  }
  if (name == "istitle") {
    bool cased = false, prev_cased = false;
    for (char32_t c : to_u32(s)) {
      if (cp_upper(c) || cp_title(c)) {
        if (prev_cased) return Value::boolean(false);
        prev_cased = cased = true;
      } else if (cp_lower(c)) {
        if (!prev_cased) return Value::boolean(false);
        prev_cased = cased = true;
      } else {
        prev_cased = false;
      }
    }
    return Value::boolean(cased);
  }
  if (name == "isidentifier") {
    std::u32string u = to_u32(s);
    if (u.empty()) return Value::boolean(false);
    for (size_t k = 0; k < u.size(); ++k) {
      char32_t c = u[k];
      bool start = c == '_' || cp_alpha(c) || cp_cat(c, {UTF8PROC_CATEGORY_NL});
      bool cont = start || cp_cat(c, {UTF8PROC_CATEGORY_MN, UTF8PROC_CATEGORY_MC, UTF8PROC_CATEGORY_ND,
                                      UTF8PROC_CATEGORY_PC});
      if (k == 0 ? !start : !cont) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  if (name == "isprintable") {
    for (char32_t c : to_u32(s))
      if (c != ' ' && cp_cat(c, {UTF8PROC_CATEGORY_CC, UTF8PROC_CATEGORY_CF, UTF8PROC_CATEGORY_CS,
                                 UTF8PROC_CATEGORY_CO, UTF8PROC_CATEGORY_CN, UTF8PROC_CATEGORY_ZL,
                                 UTF8PROC_CATEGORY_ZP, UTF8PROC_CATEGORY_ZS}))
        return Value::boolean(false);
    return Value::boolean(true);
  }
  fail("unsupported method 'str." + name + "'", line);
}

const std::set<std::string> kStrMethods = {
    "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
    "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
    "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip",
    "maketrans", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
    "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
    "translate", "upper", "zfill"};
// What ImmutableSandboxedEnvironment refuses (jinja2.sandbox._mutable_spec).
const std::set<std::string> kListMutators = {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove"};
const std::set<std::string> kDictMutators = {"clear", "pop", "popitem", "setdefault", "update"};

// Like jinja2's unsafe_undefined: an undefined value that fails (SecurityError) once used.
Value unsafe(const std::string& attr, const std::string& type) {
  return Value::undefined("access to attribute '" + attr + "' of '" + type + "' object is unsafe.");
}

Value view(ValueList items, const char* name) {
  Value v = Value::make_list(std::move(items));
  v.fn_name = name;  // repr shows dict_keys([...]) etc.
  return v;
}

}  // namespace

Value method_of(const Value& obj, const std::string& name, int line) {
  if (obj.kind == Kind::kString) {
    if (!kStrMethods.count(name)) return Value::undefined("'str object' has no attribute '" + name + "'");
    std::string s = obj.s;
    return Value::callable("str." + name, [s, name](Args& a, int l) { return str_call(s, name, a, l); });
  }
  if (obj.kind == Kind::kList) {
    const std::string type = obj.is_tuple ? "tuple" : "list";
    if (!obj.is_tuple && kListMutators.count(name)) return unsafe(name, type);
    Value self = obj;
    if (name == "index" || name == "count")
      return Value::callable(type + "." + name, [self, name](Args& a, int l) -> Value {
        const Value& x = need(a, 0, "value", name, l);
        const ValueList& items = *self.list;
        if (name == "count")
          return Value::integer(std::count_if(items.begin(), items.end(), [&](const Value& e) { return equals(e, x); }));
        int64_t n = static_cast<int64_t>(items.size()), start = opt_int(a, 1, "start", 0, name, l),
                end = opt_int(a, 2, "stop", n, name, l);
        clamp_range(n, &start, &end);
        for (int64_t k = start; k < end; ++k)
          if (equals(items[k], x)) return Value::integer(k);
        fail("ValueError: " + repr(x, l) + " is not in " + std::string(self.is_tuple ? "tuple" : "list"), l);
      });
    if (name == "copy" && !obj.is_tuple)
      return Value::callable("list.copy", [self](Args&, int) { return Value::make_list(*self.list); });
    return Value::undefined("'" + type + " object' has no attribute '" + name + "'");
  }
  if (obj.kind == Kind::kDict) {
    if (kDictMutators.count(name)) return unsafe(name, "dict");
    Value d = obj;
    if (name == "items")
      return Value::callable("dict.items", [d](Args&, int) {
        ValueList out;
        for (auto& [k, v] : d.dict->items) out.push_back(Value::make_list({k, v}, true));
        return view(std::move(out), "dict_items");
      });
    if (name == "keys" || name == "values")
      return Value::callable("dict." + name, [d, name](Args&, int) {
        ValueList out;
        for (auto& [k, v] : d.dict->items) out.push_back(name == "keys" ? k : v);
        return view(std::move(out), name == "keys" ? "dict_keys" : "dict_values");
      });
    if (name == "get")
      return Value::callable("dict.get", [d](Args& a, int l) {
        const Value& key = need(a, 0, "key", "dict.get", l);
        if (!hashable(key)) fail("unhashable type: '" + type_name(key) + "'", l);
        if (const Value* v = d.dict->find(key)) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    if (name == "copy") return Value::callable("dict.copy", [d](Args&, int) { return Value::make_dict(*d.dict); });
    return Value::undefined();  // not a method: the caller falls back to the key
  }
  return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

}  // namespace anvil::chat_template_detail
