// Internals of the chat-template engine shared by its lexer, parser, values and evaluator.
// Inside the engine errors are thrown as TemplateError (the evaluator is deeply recursive and
// nearly every operation can fail); ChatTemplate::compile/render turn them into Status, so no
// exception crosses the module boundary.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace anvil::chat_template_detail {

struct TemplateError {
  std::string message;  // already formatted: "chat template: ... at line N"
};
[[noreturn]] void fail(const std::string& what, int line);

// ---- values: the Python objects a template sees ----
struct Value;
struct Args;
using ValueList = std::vector<Value>;
// A Python dict: insertion-ordered (key, value) pairs. Keys are any hashable value (str, int,
// float, bool, None, tuples of those) and compare like Python's (1 == 1.0 == True is one key).
struct ValueDict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const std::string& key) const;  // a str key
  Value* find(const std::string& key);
  const Value* find(const Value& key) const;  // any key (an unhashable one is simply absent)
  void set(const std::string& key, Value v);
  void set(const Value& key, Value v, int line);  // errors on an unhashable key, like Python
};
using Callable = std::function<Value(Args&, int line)>;

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                      // kString; for kUndefined: the hint for the error message;
                                      // kCallable: how it prints when not "<function name>" (a
                                      // macro: <Macro 'name'>); a range (kList): its repr
  std::shared_ptr<const ValueList> list;  // kList (is_tuple: repr with parentheses)
  bool is_tuple = false;
  std::shared_ptr<ValueDict> dict;    // kDict (never mutated after creation) and kNamespace (mutable)
  std::shared_ptr<const Callable> fn;  // kCallable
  std::string fn_name;                // kCallable: its name; kList: see kGroupTuple below

  Value() = default;
  Value(const Value&) = default;
  Value(Value&&) noexcept = default;
  Value& operator=(const Value&) = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value();  // iterative: a value nested without bound at run time must not overflow the stack

  static Value undefined(std::string hint = "") { Value v; v.s = std::move(hint); return v; }
  static Value none() { Value v; v.kind = Kind::kNone; return v; }
  static Value boolean(bool x) { Value v; v.kind = Kind::kBool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.kind = Kind::kInt; v.i = x; return v; }
  static Value floating(double x) { Value v; v.kind = Kind::kFloat; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.kind = Kind::kString; v.s = std::move(x); return v; }
  static Value make_list(ValueList items, bool tuple = false);
  static Value make_dict(ValueDict d);
  static Value callable(std::string name, Callable c);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Python-style binding: the value of parameter `name` at position `index`, or nullptr.
  const Value* get(size_t index, const std::string& name) const;
};

Value from_json(const nlohmann::ordered_json& j);
bool truthy(const Value& v);
std::string type_name(const Value& v);           // "str", "dict", "list", ... as Python names them
std::string to_str(const Value& v, int line);    // Python str(); undefined prints as ""
std::string repr(const Value& v, int line);      // Python repr()
std::string py_float_repr(double d);
// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
// indent < 0 means None; indent_str overrides the per-level indent text when set.
std::string to_json(const Value& v, int indent, const std::string* indent_str, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys, int line, bool ensure_ascii = false);
// A list Value whose fn_name is this is jinja2's groupby result tuple (grouper, list); one whose
// fn_name is kRange is a Python range (its items, and its repr "range(start, stop[, step])" in s);
// any other non-empty fn_name on a list marks a dict view (dict_keys, dict_values, dict_items).
inline const char* kGroupTuple = "_GroupTuple";
inline const char* kRange = "range";
// A range or a dict view: a list Value that is another Python type (no list concatenation).
inline bool is_list_like_object(const Value& v) {
  return v.kind == Kind::kList && !v.fn_name.empty() && v.fn_name != kGroupTuple;
}
Value make_range(int64_t start, int64_t stop, int64_t step, int line);
bool equals(const Value& a, const Value& b);
bool hashable(const Value& v);  // usable as a dict key (str, number, bool, None, tuple of those)
int compare(const Value& a, const Value& b, int line);  // <0, 0, >0; errors on unorderable types
// Code points of a UTF-8 string (Python strings index by code point).
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

// ---- lexer ----
enum class Tok { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
struct Token {
  Tok type;
  std::string text;  // kText: the data; kName/kOp: the spelling; kString: the decoded value
  int line;
};
std::vector<Token> lex(const std::string& source);

// ---- AST ----
struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
enum class ExprKind {
  kLiteral, kName, kList, kTuple, kDict, kGetAttr, kGetItem, kSlice, kCall, kFilter, kTest,
  kNeg, kPos, kNot, kBinary, kAnd, kOr, kCompare, kCond,
};
struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;                 // kLiteral
  std::string name;              // kName, kGetAttr attribute, kFilter/kTest name, kBinary op
  std::vector<ExprPtr> items;    // kList/kTuple items; kDict keys and values interleaved;
                                 // kCall/kFilter/kTest positional args; kSlice [start, stop, step] (nullable)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall/kFilter/kTest
  ExprPtr star_args, star_kwargs;  // kCall/kFilter/kTest: f(*star_args, **star_kwargs), or null
  ExprPtr a, b, c;               // operands: object / left / right; kCond: a=then, b=cond, c=else
  std::vector<std::string> ops;  // kCompare: ops[k] joins operand k and k+1 (operands in items)
  bool negated = false;          // kTest: "is not"
  int depth = 1;                 // levels of this tree (the parser bounds it by kMaxTemplateNesting)
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;
enum class NodeKind {
  kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kBlock, kFilterBlock, kCallBlock, kWith,
};
// The rendered body of a {% filter %} block or a filtered {% set x | f %} block, as the innermost
// operand of the filter chain (a name no template can spell).
inline const char* kBlockBodyName = "\x01body";
struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;                                  // kText
  ExprPtr expr;                                      // kOutput/kSet value; kFor iterable
  std::vector<std::pair<ExprPtr, NodeList>> branches;  // kIf: (condition, body)...
  NodeList body, else_body;                          // kFor/kSetBlock/kMacro/kBlock body; kIf/kFor else
  std::vector<std::string> targets;                  // kFor/kSet names (several: tuple unpacking)
  std::string attr;                                  // kSet: "ns.attr" target -> targets[0]=ns, attr
  ExprPtr filter;                                    // kFor: "if" condition; kSetBlock/kFilterBlock:
                                                     // the filter chain over kBlockBodyName
  std::string name;                                  // kMacro name
  std::vector<std::string> params;                   // kMacro; kCallBlock: the caller's parameters
  std::vector<ExprPtr> defaults;                     // kMacro/kCallBlock, aligned to the last params;
                                                     // kWith: the values of `params`
  bool catch_varargs = false, catch_kwargs = false;  // kMacro: the body reads varargs / kwargs
};

struct Program {
  NodeList body;
};
// Blocks inside blocks, and expressions inside expressions (brackets, operands, filter chains),
// nest at most this deep: the parser, the evaluator and the tree's destructor all recurse, so a
// deeper template is a compile error, never a stack overflow. jinja2 itself stops far sooner
// (Python's recursion limit: about 70 nested brackets or 98 nested blocks).
constexpr int kMaxTemplateNesting = 256;
// A string or list a template builds by repetition or padding ('a' * n, center(n), ...) holds at
// most this many bytes (or items): more is an error naming the size, never an allocation that
// exhausts memory. No chat template builds anything near it.
constexpr int64_t kMaxTemplateBuild = int64_t(64) << 20;
// Fails when `count` pieces of `each` bytes (items) would exceed kMaxTemplateBuild.
void check_build_size(int64_t each, int64_t count, int line);
std::unique_ptr<Program> parse(const std::vector<Token>& tokens);

// ---- evaluator ----
std::string render_program(const Program& program, const nlohmann::ordered_json& context);
// l <op> r for + - * / // % ** ~, with Python's semantics and errors (the sum filter adds with it).
Value binary_op(const std::string& op, const Value& l, const Value& r, int line);

}  // namespace anvil::chat_template_detail
