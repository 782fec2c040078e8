// Evaluator of the chat-template AST: statements, expressions, and the attribute/item/slice
// semantics of jinja2 over Python values. Scoping follows jinja2: a for-loop iteration gets a
// fresh frame (assignments inside never leak out, hence namespace()), if-blocks do not; a macro
// sees the template's top-level frame plus its own.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/chat_template_builtins.h"
#include "tokenizer/chat_template_internal.h"
#include "tokenizer/chat_template_pystr.h"

namespace anvil::chat_template_detail {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

int64_t as_int(const Value& v, const char* what, int line) {
  if (v.kind == Kind::kInt) return v.i;
  if (v.kind == Kind::kBool) return v.b;
  fail(std::string(what) + " must be an integer, got '" + type_name(v) + "'", line);
}

// Python slice normalization (slice.indices(n)): [start:stop:step] of n items as the bounds b, e
// and step st, which select b, b + st, ... up to (excluding) e.
struct SliceBounds {
  int64_t b, e, st;
};
SliceBounds slice_bounds(int64_t n, const Value* start, const Value* stop, const Value* step, int line) {
  int64_t st = (step && step->kind != Kind::kNone) ? as_int(*step, "slice step", line) : 1;
  if (st == 0) fail("slice step cannot be zero", line);
  auto norm = [&](const Value* v, int64_t dflt) -> int64_t {
    if (!v || v->kind == Kind::kNone) return dflt;
    int64_t x = as_int(*v, "slice index", line);
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  return {norm(start, st > 0 ? 0 : n - 1), norm(stop, st > 0 ? n : -1), st};
}

// The indices selected by [start:stop:step] of n items.
std::vector<int64_t> slice_indices(int64_t n, const Value* start, const Value* stop, const Value* step, int line) {
  auto [b, e, st] = slice_bounds(n, start, stop, step, line);
  std::vector<int64_t> out;
  if (st > 0) {
    for (int64_t k = b; k < e; k += st) out.push_back(k);
  } else {
    for (int64_t k = b; k > e; k += st) out.push_back(k);
  }
  return out;
}

class Evaluator {
 public:
  explicit Evaluator(const nlohmann::ordered_json& context) {
    frames_.emplace_back();
    install_globals(frames_[0]);
    if (context.is_object())
      for (auto it = context.begin(); it != context.end(); ++it) frames_[0][it.key()] = from_json(it.value());
  }

  void run(const NodeList& body, std::string& out) {
    if (exec_body(body, out) != Flow::kNormal) fail("'break'/'continue' outside of a for loop", 0);
  }

 private:
  using Frame = std::map<std::string, Value>;

  Value lookup(const std::string& name) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) { frames_.back()[name] = std::move(v); }

  Flow exec_body(const NodeList& body, std::string& out) {
    for (auto& n : body) {
      Flow f = exec(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, std::string& out) {
    Nested nested(this, n.line);
    switch (n.kind) {
      case NodeKind::kText: out += n.text; return Flow::kNormal;
      case NodeKind::kOutput: out += to_str(eval(*n.expr), n.line); return Flow::kNormal;
      case NodeKind::kIf:
        for (auto& [cond, body] : n.branches)
          if (truthy(eval(*cond))) return exec_body(body, out);
        return exec_body(n.else_body, out);
      case NodeKind::kFor: return exec_for(n, out);
      case NodeKind::kSet: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (ns.kind != Kind::kNamespace)
            fail("cannot assign attribute '" + n.attr + "' on '" + n.targets[0] + "': not a namespace", n.line);
          check_namespace_name(n.attr, n.line);
          ns.dict->set(n.attr, std::move(v));
        } else {
          bind_targets(n.targets, v, n.line);
        }
        return Flow::kNormal;
      }
      case NodeKind::kSetBlock: {
        std::string captured;
        Flow f = exec_body(n.body, captured);
        Value v = Value::string(std::move(captured));
        if (n.filter) v = filter_block_value(*n.filter, std::move(v));
        assign(n.targets[0], std::move(v));
        return f;
      }
      case NodeKind::kFilterBlock: {
        std::string captured;
        Flow f = exec_body(n.body, captured);
        out += to_str(filter_block_value(*n.filter, Value::string(std::move(captured))), n.line);
        return f;
      }
      case NodeKind::kWith: {
        std::vector<Value> values;  // evaluated in the outer scope, then bound in the new one
        for (auto& d : n.defaults) values.push_back(eval(*d));
        frames_.emplace_back();
        for (size_t k = 0; k < values.size(); ++k) assign(n.params[k], std::move(values[k]));
        Flow f = exec_body(n.body, out);
        frames_.pop_back();
        return f;
      }
      case NodeKind::kCallBlock: {
        // The caller travels as the keyword argument "caller", as in jinja2.
        Value callee = eval(*n.expr->a);
        Args args = eval_args(*n.expr);
        args.kw.emplace_back("caller", make_caller(n));
        out += to_str(call(callee, args, n.line), n.line);
        return Flow::kNormal;
      }
      case NodeKind::kMacro: define_macro(n); return Flow::kNormal;
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      case NodeKind::kBlock: return exec_body(n.body, out);
    }
    return Flow::kNormal;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    std::vector<Value> items = iterate(v, line);
    if (items.size() != targets.size())
      fail("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(targets.size()) +
               " names",
           line);
    for (size_t k = 0; k < targets.size(); ++k) assign(targets[k], items[k]);
  }

  Flow exec_for(const Node& n, std::string& out) {
    std::vector<Value> all = iterate(eval(*n.expr), n.line);
    std::vector<Value> items;
    if (n.filter) {
      for (auto& v : all) {
        frames_.emplace_back();
        bind_targets(n.targets, v, n.line);
        bool keep = truthy(eval(*n.filter));
        frames_.pop_back();
        if (keep) items.push_back(v);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return exec_body(n.else_body, out);
    // jinja2 clears its "no iteration" flag at the end of the body, so the else block also runs
    // when every iteration left through break/continue before the end (a break in the first one).
    bool body_completed = false;
    const int64_t len = static_cast<int64_t>(items.size());
    auto last_changed = std::make_shared<Value>();  // loop.changed()'s memory (undefined: none yet)
    for (int64_t k = 0; k < len; ++k) {
      frames_.emplace_back();
      ValueDict loop;
      loop.set("index0", Value::integer(k));
      loop.set("index", Value::integer(k + 1));
      loop.set("revindex0", Value::integer(len - k - 1));
      loop.set("revindex", Value::integer(len - k));
      loop.set("first", Value::boolean(k == 0));
      loop.set("last", Value::boolean(k == len - 1));
      loop.set("length", Value::integer(len));
      loop.set("depth", Value::integer(1));
      loop.set("depth0", Value::integer(0));
      loop.set("previtem", k > 0 ? items[k - 1] : Value::undefined("'loop.previtem' is undefined"));
      loop.set("nextitem", k + 1 < len ? items[k + 1] : Value::undefined("'loop.nextitem' is undefined"));
      loop.set("cycle", Value::callable("loop.cycle", [k](Args& a, int line) -> Value {
                 if (a.pos.empty()) fail("loop.cycle() needs at least one argument", line);
                 return a.pos[k % a.pos.size()];
               }));
      // loop.changed(*args): true the first time and whenever the arguments differ from the last call.
      loop.set("changed", Value::callable("loop.changed", [last_changed](Args& a, int line) -> Value {
                 Value now = Value::make_list(a.pos, /*tuple=*/true);
                 if (!last_changed->is_undefined() && equals(*last_changed, now)) return Value::boolean(false);
                 *last_changed = std::move(now);
                 return Value::boolean(true);
               }));
      assign("loop", Value::make_dict(std::move(loop)));
      bind_targets(n.targets, items[k], n.line);
      Flow f = exec_body(n.body, out);
      frames_.pop_back();
      body_completed |= f == Flow::kNormal;
      if (f == Flow::kBreak) break;
    }
    if (!body_completed) return exec_body(n.else_body, out);
    return Flow::kNormal;
  }

  // The filter chain of a {% filter %} / filtered {% set %} block applied to its rendered body.
  Value filter_block_value(const Expr& chain, Value body) {
    frames_.emplace_back();
    assign(kBlockBodyName, std::move(body));
    Value v = eval(chain);
    frames_.pop_back();
    return v;
  }

  // caller() of a {% call %} block: its body, run in the call site's scope plus its parameters.
  Value make_caller(const Node& n) {
    const Node* node = &n;
    auto scope = std::make_shared<std::vector<Frame>>(frames_);
    Value caller = Value::callable("caller", [this, node, scope](Args& args, int line) -> Value {
      DepthGuard guard(this, line);
      std::vector<Frame> saved = std::move(frames_);
      frames_ = *scope;
      frames_.emplace_back();
      bind_params(*node, "caller", args, line);
      std::string out;
      Flow f = exec_body(node->body, out);
      frames_ = std::move(saved);
      if (f != Flow::kNormal) fail("'break'/'continue' outside of a for loop", line);
      return Value::string(std::move(out));
    });
    caller.s = "<Macro anonymous>";  // as jinja2 prints a call block's caller
    return caller;
  }

  // Binds call arguments to a macro's (or caller's) parameters in the current frame, as jinja2's
  // Macro._invoke does: missing ones without default are undefined; extra positional arguments go
  // to varargs and unknown keywords to kwargs when the body reads them, else they are errors.
  void bind_params(const Node& node, const std::string& what, Args& args, int line) {
    const size_t first_default = node.params.size() - node.defaults.size();
    ValueDict extra_kw;
    for (auto& [k, v] : args.kw) {
      if (std::find(node.params.begin(), node.params.end(), k) != node.params.end()) continue;
      if (k == "caller") continue;
      if (!node.catch_kwargs) fail("macro '" + what + "' takes no keyword argument '" + k + "'", line);
      extra_kw.set(k, v);
    }
    if (args.pos.size() > node.params.size() && !node.catch_varargs)
      fail("macro '" + what + "' takes not more than " + std::to_string(node.params.size()) + " argument(s)", line);
    for (size_t p = 0; p < node.params.size(); ++p) {
      const Value* v = args.get(p, node.params[p]);
      if (v) {
        assign(node.params[p], *v);
      } else if (p >= first_default) {
        assign(node.params[p], eval(*node.defaults[p - first_default]));
      } else {
        assign(node.params[p], Value::undefined("parameter '" + node.params[p] + "' was not provided"));
      }
    }
    ValueList rest;
    for (size_t p = node.params.size(); p < args.pos.size(); ++p) rest.push_back(args.pos[p]);
    if (node.catch_varargs) assign("varargs", Value::make_list(std::move(rest), true));
    if (node.catch_kwargs) assign("kwargs", Value::make_dict(std::move(extra_kw)));
  }

  // A macro sees the global frame as it is when called, and, when defined inside another macro, a
  // loop or a with block, that scope's variables as they were at its definition (jinja2's closure).
  void define_macro(const Node& n) {
    const Node* node = &n;
    auto closure = std::make_shared<std::vector<Frame>>(frames_.begin() + 1, frames_.end());
    Value macro = Value::callable(n.name, [this, node, closure](Args& args, int line) -> Value {
             DepthGuard guard(this, line);
             std::vector<Frame> saved = std::move(frames_);
             frames_.clear();
             frames_.push_back(saved[0]);
             for (const Frame& f : *closure) frames_.push_back(f);
             frames_.emplace_back();
             // Itself, as its caller sees it (so it may recurse; not kept in the closure, which
             // would make a reference cycle).
             if (!closure->empty())
               for (auto it = saved.rbegin(); it != saved.rend(); ++it)
                 if (auto m = it->find(node->name); m != it->end()) {
                   assign(node->name, m->second);
                   break;
                 }
             for (auto& [k, v] : args.kw)
               if (k == "caller") assign("caller", v);
             bind_params(*node, node->name, args, line);
             std::string out;
             Flow f = exec_body(node->body, out);
             saved[0] = std::move(frames_[0]);  // the macro may have defined globals (e.g. macros)
             frames_ = std::move(saved);
             if (f != Flow::kNormal) fail("'break'/'continue' outside of a for loop", line);
             return Value::string(std::move(out));
           });
    macro.s = "<Macro '" + n.name + "'>";  // as jinja2 prints a macro object
    assign(n.name, std::move(macro));
  }

  // ---- expressions ----
  Value eval(const Expr& e) {
    Nested nested(this, e.line);
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: return lookup(e.name);
      case ExprKind::kList: case ExprKind::kTuple: {
        ValueList items;
        for (auto& x : e.items) items.push_back(eval(*x));
        return Value::make_list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        ValueDict d;
        for (size_t k = 0; k < e.items.size(); k += 2) {
          Value key = eval(*e.items[k]);
          d.set(key, eval(*e.items[k + 1]), e.line);
        }
        return Value::make_dict(std::move(d));
      }
      case ExprKind::kGetAttr: return get_attr(eval(*e.a), e.name, e.line);
      case ExprKind::kGetItem: return get_item(eval(*e.a), eval(*e.b), e.line);
      case ExprKind::kSlice: {
        Value obj = eval(*e.a);
        Value parts[3];
        const Value* p[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (e.items[k]) {
            parts[k] = eval(*e.items[k]);
            p[k] = &parts[k];
          }
        return slice(obj, p[0], p[1], p[2], e.line);
      }
      case ExprKind::kCall: {
        Value callee = eval(*e.a);
        Args args = eval_args(e);
        return call(callee, args, e.line);
      }
      case ExprKind::kFilter: {
        Value v = eval(*e.a);
        Args args = eval_args(e);
        return apply_filter(e.name, v, args, e.line);
      }
      case ExprKind::kTest: {
        Value v = eval(*e.a);
        Args args = eval_args(e);
        bool r = apply_test(e.name, v, args, e.line);
        return Value::boolean(e.negated ? !r : r);
      }
      case ExprKind::kNeg: case ExprKind::kPos: {
        Value v = eval(*e.a);
        if (v.kind == Kind::kInt || v.kind == Kind::kBool) {
          const int64_t x = v.kind == Kind::kBool ? v.b : v.i;
          if (e.kind == ExprKind::kNeg && x == INT64_MIN) fail("integer overflow in '-' (template integers are 64-bit)", e.line);
          return Value::integer(e.kind == ExprKind::kNeg ? -x : x);
        }
        if (v.kind == Kind::kFloat) return Value::floating(e.kind == ExprKind::kNeg ? -v.f : v.f);
        if (v.is_undefined()) fail(v.s, e.line);
        fail("bad operand type for unary " + std::string(e.kind == ExprKind::kNeg ? "-" : "+") + ": '" + type_name(v) + "'", e.line);
      }
      case ExprKind::kNot: return Value::boolean(!truthy(eval(*e.a)));
      case ExprKind::kAnd: {
        Value l = eval(*e.a);
        return truthy(l) ? eval(*e.b) : l;
      }
      case ExprKind::kOr: {
        Value l = eval(*e.a);
        return truthy(l) ? l : eval(*e.b);
      }
      case ExprKind::kBinary: return binary_op(e.name, eval(*e.a), eval(*e.b), e.line);
      case ExprKind::kCompare: {
        Value left = eval(*e.items[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.items[k + 1]);
          if (!compare_op(e.ops[k], left, right, e.line)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::kCond:
        if (truthy(eval(*e.b))) return eval(*e.a);
        if (e.c) return eval(*e.c);
        return Value::undefined("the inline if-expression has no else branch and its condition was false");
    }
    fail("internal error: unknown expression", e.line);
  }

  // Python's order: positional, *iterable, keyword, **mapping (a keyword given twice is an error).
  Args eval_args(const Expr& e) {
    Args a;
    for (auto& x : e.items) a.pos.push_back(eval(*x));
    if (e.star_args) {
      Value it = eval(*e.star_args);
      if (it.kind != Kind::kUndefined && it.kind != Kind::kList && it.kind != Kind::kDict && it.kind != Kind::kString)
        fail("Value after * must be an iterable, not " + type_name(it), e.line);
      for (Value& v : iterate(it, e.line)) a.pos.push_back(std::move(v));
    }
    for (auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    if (e.star_kwargs) {
      Value m = eval(*e.star_kwargs);
      if (m.is_undefined()) fail(m.s, e.line);
      if (m.kind != Kind::kDict) fail("argument after ** must be a mapping, not " + type_name(m), e.line);
      for (auto& [k, v] : m.dict->items) {
        if (k.kind != Kind::kString) fail("keywords must be strings", e.line);
        for (auto& [name, _] : a.kw)
          if (name == k.s) fail("got multiple values for keyword argument '" + k.s + "'", e.line);
        a.kw.emplace_back(k.s, v);
      }
    }
    return a;
  }

  Value call(const Value& callee, Args& args, int line) {
    if (callee.is_undefined()) fail(callee.s, line);
    if (callee.kind != Kind::kCallable) fail("'" + type_name(callee) + "' object is not callable", line);
    return (*callee.fn)(args, line);
  }

  bool compare_op(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l, line);
    if (op == "not in") return !contains(r, l, line);
    if (l.is_undefined()) fail(l.s, line);
    if (r.is_undefined()) fail(r.s, line);
    int c = compare(l, r, line);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  Value slice(const Value& obj, const Value* start, const Value* stop, const Value* step, int line) {
    if (obj.kind == Kind::kString) {
      std::vector<std::string> chars = utf8_chars(obj.s);
      std::string out;
      for (int64_t k : slice_indices(static_cast<int64_t>(chars.size()), start, stop, step, line)) out += chars[k];
      return Value::string(out);
    }
    if (obj.kind == Kind::kList && obj.fn_name == kRange) {
      // Python: a slice of a range is a range, range(start + b*step, start + e*step, step*st).
      int64_t r_start = 0, r_stop = 0, r_step = 1;
      std::sscanf(obj.s.c_str(), "range(%" SCNd64 ", %" SCNd64 ", %" SCNd64, &r_start, &r_stop, &r_step);
      auto [b, e, st] = slice_bounds(static_cast<int64_t>(obj.list->size()), start, stop, step, line);
      return make_range(r_start + b * r_step, r_start + e * r_step, r_step * st, line);
    }
    if (obj.kind == Kind::kList && (obj.fn_name.empty() || obj.fn_name == kGroupTuple)) {
      ValueList items;
      for (int64_t k : slice_indices(static_cast<int64_t>(obj.list->size()), start, stop, step, line))
        items.push_back((*obj.list)[k]);
      return Value::make_list(std::move(items), obj.is_tuple);
    }
    if (obj.is_undefined()) fail(obj.s, line);
    // jinja2 compiles a slice to a plain Python subscript, so Python's TypeError surfaces.
    if (obj.kind == Kind::kDict) fail("unhashable type: 'slice'", line);
    fail(std::string("'")
             .append(obj.kind == Kind::kList ? obj.fn_name : type_name(obj))
             .append("' object is not subscriptable"),
         line);
  }

  // Macro and caller() nesting is bounded so a runaway recursive macro is an error, not a stack
  // overflow (jinja2 stops with Python's RecursionError).
  static constexpr int kMaxCallDepth = 256;
  struct DepthGuard {
    Evaluator* ev;
    DepthGuard(Evaluator* e, int line) : ev(e) {
      if (++ev->call_depth_ > kMaxCallDepth)
        fail("maximum recursion depth exceeded (macro calls nested deeper than " + std::to_string(kMaxCallDepth) + ")",
             line);
    }
    ~DepthGuard() { --ev->call_depth_; }
  };
  // Every statement and expression being evaluated, macro bodies included: the parser bounds how
  // deep one template nests, but macro calls stack those levels, so their sum is bounded too (about
  // a kilobyte of stack each), making deep recursion through expressions an error, not a crash.
  static constexpr int kMaxEvalDepth = 1024;
  struct Nested {
    Evaluator* ev;
    Nested(Evaluator* e, int line) : ev(e) {
      if (ev->eval_depth_ == kMaxEvalDepth)
        fail("maximum recursion depth exceeded (rendering nested more than " + std::to_string(kMaxEvalDepth) +
                 " statements and expressions deep)",
             line);
      ++ev->eval_depth_;
    }
    ~Nested() { --ev->eval_depth_; }
  };

  std::vector<Frame> frames_;
  int call_depth_ = 0;
  int eval_depth_ = 0;
};

}  // namespace

void check_build_size(int64_t each, int64_t count, int line) {
  if (each > 0 && count > 0 && count > kMaxTemplateBuild / each)
    fail("the template would build " + std::to_string(count) + " x " + std::to_string(each) +
             " bytes (items); a template may build at most " + std::to_string(kMaxTemplateBuild) + " at once",
         line);
}

Value binary_op(const std::string& op, const Value& l, const Value& r, int line) {
  if (op == "~") return Value::string(to_str(l, line) + to_str(r, line));
  if (l.is_undefined()) fail(l.s, line);
  if (r.is_undefined()) fail(r.s, line);
  auto type_error = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'", line);
  };
  if ((op == "+" || op == "*") && (is_list_like_object(l) || is_list_like_object(r))) return type_error();
  if (op == "+") {
    if (l.kind == Kind::kString && r.kind == Kind::kString) return Value::string(l.s + r.s);
    if (l.kind == Kind::kList && r.kind == Kind::kList && l.is_tuple == r.is_tuple) {
      ValueList items = *l.list;
      items.insert(items.end(), r.list->begin(), r.list->end());
      return Value::make_list(std::move(items), l.is_tuple);
    }
    // Python's own wording for str/list/tuple on the left.
    if (l.kind == Kind::kString || l.kind == Kind::kList)
      fail("can only concatenate " + type_name(l) + " (not \"" + type_name(r) + "\") to " + type_name(l), line);
  }
  if (op == "*") {
    const Value* seq = l.kind == Kind::kString || l.kind == Kind::kList ? &l : r.kind == Kind::kString || r.kind == Kind::kList ? &r : nullptr;
    const Value* cnt = seq == &l ? &r : &l;
    if (seq && (cnt->kind == Kind::kInt || cnt->kind == Kind::kBool)) {
      int64_t n = std::max<int64_t>(0, cnt->kind == Kind::kBool ? cnt->b : cnt->i);
      check_build_size(seq->kind == Kind::kString ? int64_t(seq->s.size()) : int64_t(seq->list->size()), n, line);
      if (seq->kind == Kind::kString) {
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += seq->s;
        return Value::string(s);
      }
      ValueList items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return Value::make_list(std::move(items));
    }
  }
  if (op == "%" && l.kind == Kind::kString) return Value::string(percent_format(l.s, r, line));
  if (!l.is_number() || !r.is_number()) return type_error();
  bool both_int = l.kind != Kind::kFloat && r.kind != Kind::kFloat;
  int64_t a = l.kind == Kind::kBool ? l.b : l.i, b = r.kind == Kind::kBool ? r.b : r.i;
  double x = l.kind == Kind::kFloat ? l.f : static_cast<double>(a), y = r.kind == Kind::kFloat ? r.f : static_cast<double>(b);
  // Python integers are unbounded; ours are 64-bit, so overflow is an error, never a wrong number.
  if (both_int && (op == "+" || op == "-" || op == "*")) {
    int64_t res = 0;
    bool overflow = op == "+"   ? __builtin_add_overflow(a, b, &res)
                    : op == "-" ? __builtin_sub_overflow(a, b, &res)
                                : __builtin_mul_overflow(a, b, &res);
    if (overflow) fail("integer overflow in '" + op + "' (template integers are 64-bit)", line);
    return Value::integer(res);
  }
  if (op == "+") return Value::floating(x + y);
  if (op == "-") return Value::floating(x - y);
  if (op == "*") return Value::floating(x * y);
  if (op == "/") {
    if (y == 0) fail(both_int ? "division by zero" : "float division by zero", line);
    return Value::floating(x / y);
  }
  if (op == "//" || op == "%") {
    if (y == 0)
      fail(both_int ? (op == "%" ? "integer modulo by zero" : "integer division or modulo by zero")
                    : (op == "%" ? "float modulo" : "float floor division by zero"),
           line);
    if (both_int) {
      if (a == INT64_MIN && b == -1) {
        if (op == "%") return Value::integer(0);
        fail("integer overflow in '//' (template integers are 64-bit)", line);
      }
      int64_t q = a / b, m = a % b;
      if (m != 0 && ((m < 0) != (b < 0))) {
        --q;
        m += b;
      }
      return Value::integer(op == "//" ? q : m);
    }
    // CPython's float divmod: the remainder takes the divisor's sign (-0.0 included), and the
    // quotient is (x - mod) / y rounded to the nearest integer.
    double mod = std::fmod(x, y), div = (x - mod) / y;
    if (mod != 0) {
      if ((y < 0) != (mod < 0)) {
        mod += y;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, y);
    }
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, x / y);
    }
    return Value::floating(op == "//" ? floordiv : mod);
  }
  if (op == "**") {
    if (both_int && b >= 0) {
      int64_t p = 1, base = a;  // square-and-multiply
      for (int64_t e = b; e > 0;) {
        bool overflow = (e & 1) && __builtin_mul_overflow(p, base, &p);
        e >>= 1;
        overflow = overflow || (e > 0 && __builtin_mul_overflow(base, base, &base));
        if (overflow) fail("integer overflow in '**' (template integers are 64-bit)", line);
      }
      return Value::integer(p);
    }
    if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power", line);
    if (x < 0 && std::isfinite(x) && std::isfinite(y) && y != std::floor(y))
      fail("unsupported: a negative number to a fractional power is complex in Python", line);
    const double r = std::pow(x, y);
    if (std::isinf(r) && std::isfinite(x) && std::isfinite(y)) fail("(34, 'Numerical result out of range')", line);
    return Value::floating(r);
  }
  return type_error();
}

std::string render_program(const Program& program, const nlohmann::ordered_json& context) {
  Evaluator ev(context);
  std::string out;
  ev.run(program.body, out);
  return out;
}

}  // namespace anvil::chat_template_detail
