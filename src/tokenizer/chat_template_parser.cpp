// Parser for the chat-template Jinja subset: tokens -> AST. Operator precedence follows jinja2's
// parser (lowest first): inline if, or, and, not, comparisons/in, + -, ~, * / // %, **,
// unary - +, then postfix (.attr [index] (call)) and filters/tests (| name, is name).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <set>
#include <string>
#include <vector>

#include "tokenizer/chat_template_internal.h"

namespace anvil::chat_template_detail {

namespace {

ExprPtr make_expr(ExprKind k, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->line = line;
  return e;
}

std::unique_ptr<Node> make_node(NodeKind k, int line) {
  auto n = std::make_unique<Node>();
  n->kind = k;
  n->line = line;
  return n;
}

std::string describe(const Token& t) {
  switch (t.type) {
    case Tok::kEof: return "end of template";
    case Tok::kVarEnd: return "end of print statement '}}'";
    case Tok::kBlockEnd: return "end of statement block '%}'";
    case Tok::kString: return "string";
    case Tok::kInt: case Tok::kFloat: return "number '" + t.text + "'";
    default: return "'" + t.text + "'";
  }
}

// Whether a name is read anywhere in an expression / statement list (jinja2 gives a macro
// varargs/kwargs only when its body refers to them).
bool references(const Expr& e, const std::string& name) {
  if (e.kind == ExprKind::kName && e.name == name) return true;
  for (auto& x : e.items)
    if (x && references(*x, name)) return true;
  for (auto& [k, x] : e.kwargs)
    if (x && references(*x, name)) return true;
  for (const ExprPtr* x : {&e.a, &e.b, &e.c})
    if (*x && references(**x, name)) return true;
  return false;
}

bool references(const NodeList& body, const std::string& name) {
  for (auto& n : body) {
    if (n->expr && references(*n->expr, name)) return true;
    if (n->filter && references(*n->filter, name)) return true;
    for (auto& [cond, b] : n->branches)
      if ((cond && references(*cond, name)) || references(b, name)) return true;
    if (references(n->body, name) || references(n->else_body, name)) return true;
    for (auto& d : n->defaults)
      if (references(*d, name)) return true;
  }
  return false;
}

class Parser {
 public:
  explicit Parser(const std::vector<Token>& toks) : t_(toks) {}

  std::unique_ptr<Program> run() {
    auto prog = std::make_unique<Program>();
    std::string end;
    prog->body = subparse({}, &end, "", 0);
    return prog;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  Token next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()), cur().line);
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail("expected a name, got " + describe(cur()), cur().line);
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail("expected end of statement block '%}', got " + describe(cur()), cur().line);
    ++i_;
  }

  [[noreturn]] static void too_deep(int line) {
    fail("the template nests more than " + std::to_string(kMaxTemplateNesting) +
             " levels deep (blocks, brackets or chained operators)",
         line);
  }
  // One level of the parser's own recursion (a block's body, a bracketed or nested expression, a
  // unary operator): bounded, so a pathological template is an error rather than a stack overflow.
  struct Nest {
    Parser* p;
    Nest(Parser* parser, int line) : p(parser) {
      if (p->nesting_ == kMaxTemplateNesting) too_deep(line);
      ++p->nesting_;
    }
    ~Nest() { --p->nesting_; }
  };
  // Records the depth of a finished expression node from its operands. Left-nested chains
  // (a + b + c ..., x.a.b ..., x|f|g ...) deepen the tree without parser recursion, and the
  // evaluator and the destructor recurse over it: a tree past the limit is refused too.
  static ExprPtr finish(ExprPtr e) {
    int d = 0;
    for (auto& x : e->items)
      if (x) d = std::max(d, x->depth);
    for (auto& [k, x] : e->kwargs)
      if (x) d = std::max(d, x->depth);
    for (const ExprPtr* x : {&e->a, &e->b, &e->c, &e->star_args, &e->star_kwargs})
      if (*x) d = std::max(d, (*x)->depth);
    e->depth = d + 1;
    if (e->depth > kMaxTemplateNesting) too_deep(e->line);
    return e;
  }

  // Parses nodes until a block tag named in `ends`; its name is stored in *end (tag name consumed,
  // the rest of that tag is left to the caller).
  NodeList subparse(const std::set<std::string>& ends, std::string* end, const std::string& opener, int open_line) {
    Nest nest(this, cur().line);
    NodeList body;
    while (true) {
      const Token& tok = cur();
      if (tok.type == Tok::kEof) {
        if (ends.empty()) return body;
        std::string want;
        for (auto& e : ends) want += (want.empty() ? "'" : ", '") + e + "'";
        fail("unexpected end of template: expected " + want + " to close '" + opener + "' opened at line " +
                 std::to_string(open_line),
             tok.line);
      }
      if (tok.type == Tok::kText) {
        auto n = make_node(NodeKind::kText, tok.line);
        n->text = tok.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (tok.type == Tok::kVarBegin) {
        ++i_;
        auto n = make_node(NodeKind::kOutput, tok.line);
        n->expr = parse_tuple(true);
        if (cur().type != Tok::kVarEnd) fail("expected '}}', got " + describe(cur()), cur().line);
        ++i_;
        body.push_back(std::move(n));
      } else if (tok.type == Tok::kBlockBegin) {
        ++i_;
        if (cur().type != Tok::kName) fail("expected a tag name after '{%', got " + describe(cur()), cur().line);
        std::string name = cur().text;
        if (ends.count(name)) {
          ++i_;
          *end = name;
          return body;
        }
        static const std::set<std::string> kEndTags = {"endif", "endfor", "endset", "endmacro", "else", "elif",
                                                       "endgeneration", "endfilter", "endcall", "endwith"};
        if (!ends.empty() && kEndTags.count(name)) {
          std::string want;
          for (auto& e : ends) want += (want.empty() ? "'" : ", '") + e + "'";
          fail("unexpected '" + name + "': expected " + want + " to close '" + opener + "' opened at line " +
                   std::to_string(open_line),
               cur().line);
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(tok), tok.line);
      }
    }
  }

  std::unique_ptr<Node> parse_statement() {
    Token tag = next();
    const std::string& n = tag.text;
    if (n == "if") return parse_if(tag.line);
    if (n == "for") return parse_for(tag.line);
    if (n == "set") return parse_set(tag.line);
    if (n == "macro") return parse_macro(tag.line);
    if (n == "break" || n == "continue") {
      auto node = make_node(n == "break" ? NodeKind::kBreak : NodeKind::kContinue, tag.line);
      expect_block_end();
      return node;
    }
    if (n == "filter") {
      auto node = make_node(NodeKind::kFilterBlock, tag.line);
      node->filter = parse_filter_chain(tag.line);
      expect_block_end();
      std::string end;
      node->body = subparse({"endfilter"}, &end, "filter", tag.line);
      expect_block_end();
      return node;
    }
    if (n == "call") return parse_call_block(tag.line);
    if (n == "with") {  // {% with a = x, b = y %}...{% endwith %}: a scope of its own
      auto node = make_node(NodeKind::kWith, tag.line);
      while (cur().type != Tok::kBlockEnd) {
        if (!node->params.empty()) expect_op(",");
        node->params.push_back(expect_name());
        expect_op("=");
        node->defaults.push_back(parse_expression());
      }
      expect_block_end();
      std::string end;
      node->body = subparse({"endwith"}, &end, "with", tag.line);
      expect_block_end();
      return node;
    }
    if (n == "generation") {  // transformers' AssistantTracker: renders its body unchanged
      expect_block_end();
      auto node = make_node(NodeKind::kBlock, tag.line);
      std::string end;
      node->body = subparse({"endgeneration"}, &end, "generation", tag.line);
      expect_block_end();
      return node;
    }
    static const std::set<std::string> kEnds = {"endif", "endfor", "endset", "endmacro", "else", "elif",
                                                "endgeneration", "endfilter", "endcall", "endwith"};
    if (kEnds.count(n)) fail("unexpected '" + n + "' (no open block it could close)", tag.line);
    fail("unsupported tag '" + n + "'", tag.line);
  }

  std::unique_ptr<Node> parse_if(int line) {
    auto node = make_node(NodeKind::kIf, line);
    ExprPtr cond = parse_tuple(false);
    while (true) {
      expect_block_end();
      std::string end;
      NodeList body = subparse({"elif", "else", "endif"}, &end, "if", line);
      node->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple(false);
        continue;
      }
      if (end == "else") {
        expect_block_end();
        node->else_body = subparse({"endif"}, &end, "if", line);
      }
      expect_block_end();
      return node;
    }
  }

  std::vector<std::string> parse_target_names() {
    std::vector<std::string> names;
    bool paren = skip_op("(");
    names.push_back(expect_name());
    while (skip_op(",")) {
      if (cur().type != Tok::kName || is_name("in")) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  std::unique_ptr<Node> parse_for(int line) {
    auto node = make_node(NodeKind::kFor, line);
    node->targets = parse_target_names();
    if (!skip_name("in")) fail("expected 'in' in for loop, got " + describe(cur()), cur().line);
    node->expr = parse_tuple(false, /*with_condexpr=*/false);
    if (skip_name("if")) node->filter = parse_expression();
    if (is_name("recursive")) fail("unsupported for-loop option 'recursive'", cur().line);
    expect_block_end();
    std::string end;
    node->body = subparse({"else", "endfor"}, &end, "for", line);
    if (end == "else") {
      expect_block_end();
      node->else_body = subparse({"endfor"}, &end, "for", line);
    }
    expect_block_end();
    return node;
  }

  std::unique_ptr<Node> parse_set(int line) {
    std::vector<std::string> names;
    std::string attr;
    names.push_back(expect_name());
    if (skip_op(".")) {
      attr = expect_name();
    } else {
      while (skip_op(",")) names.push_back(expect_name());
    }
    if (skip_op("=")) {
      auto node = make_node(NodeKind::kSet, line);
      node->targets = std::move(names);
      node->attr = attr;
      node->expr = parse_tuple(true);
      expect_block_end();
      return node;
    }
    if (names.size() != 1 || !attr.empty()) fail("a block set takes a single plain name", line);
    auto node = make_node(NodeKind::kSetBlock, line);
    if (is_op("|")) node->filter = parse_filter_chain(line);
    expect_block_end();
    node->targets = std::move(names);
    std::string end;
    node->body = subparse({"endset"}, &end, "set", line);
    expect_block_end();
    return node;
  }

  // "| f(args) | g ..." applied to the block body (kBlockBodyName).
  ExprPtr parse_filter_chain(int line) {
    auto body = make_expr(ExprKind::kName, line);
    body->name = kBlockBodyName;
    if (cur().type == Tok::kName) {  // "{% filter upper %}": the first filter has no leading '|'
      auto f = make_expr(ExprKind::kFilter, line);
      f->name = expect_name();
      if (is_op("(")) parse_args(*f);
      f->a = std::move(body);
      body = finish(std::move(f));
    }
    while (is_op("|")) body = parse_filter_expr(std::move(body));
    return body;
  }

  // {% call(params) macro(args) %}body{% endcall %}: body becomes the macro's caller().
  std::unique_ptr<Node> parse_call_block(int line) {
    auto node = make_node(NodeKind::kCallBlock, line);
    if (is_op("(")) parse_params(*node, line);
    node->expr = parse_expression();
    if (node->expr->kind != ExprKind::kCall) fail("expected a macro call after 'call'", line);
    expect_block_end();
    std::string end;
    node->body = subparse({"endcall"}, &end, "call", line);
    expect_block_end();
    return node;
  }

  void parse_params(Node& node, int line) {
    expect_op("(");
    while (!is_op(")")) {
      if (!node.params.empty()) expect_op(",");
      if (is_op(")")) break;
      node.params.push_back(expect_name());
      if (skip_op("=")) {
        node.defaults.push_back(parse_expression());
      } else if (!node.defaults.empty()) {
        fail("non-default parameter '" + node.params.back() + "' follows a default one", line);
      }
    }
    expect_op(")");
  }

  std::unique_ptr<Node> parse_macro(int line) {
    auto node = make_node(NodeKind::kMacro, line);
    node->name = expect_name();
    parse_params(*node, line);
    expect_block_end();
    std::string end;
    node->body = subparse({"endmacro"}, &end, "macro", line);
    if (cur().type == Tok::kName) ++i_;  // "{% endmacro name %}"
    expect_block_end();
    node->catch_varargs = references(node->body, "varargs");
    node->catch_kwargs = references(node->body, "kwargs");
    return node;
  }

  // ---- expressions ----
  ExprPtr parse_tuple(bool allow_empty_end, bool with_condexpr = true) {
    int line = cur().line;
    ExprPtr first = with_condexpr ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tup = make_expr(ExprKind::kTuple, line);
    tup->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")") || is_name("in")) break;
      tup->items.push_back(with_condexpr ? parse_expression() : parse_or());
    }
    return finish(std::move(tup));
  }

  ExprPtr parse_expression() { return parse_condexpr(); }

  ExprPtr parse_condexpr() {
    int line = cur().line;
    Nest nest(this, line);
    ExprPtr e = parse_or();
    while (skip_name("if")) {
      auto c = make_expr(ExprKind::kCond, line);
      c->b = parse_or();
      c->c = skip_name("else") ? parse_condexpr() : nullptr;
      c->a = std::move(e);
      e = finish(std::move(c));
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto n = make_expr(ExprKind::kOr, next().line);
      n->a = std::move(e);
      n->b = parse_and();
      e = finish(std::move(n));
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto n = make_expr(ExprKind::kAnd, next().line);
      n->a = std::move(e);
      n->b = parse_not();
      e = finish(std::move(n));
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto n = make_expr(ExprKind::kNot, next().line);
      Nest nest(this, n->line);
      n->a = parse_not();
      return finish(std::move(n));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = cur().line;
    ExprPtr e = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                     cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(ExprKind::kCompare, line);
        cmp->items.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    return cmp ? finish(std::move(cmp)) : std::move(e);
  }

  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
    auto n = make_expr(ExprKind::kBinary, line);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return finish(std::move(n));
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token op = next();
      e = binary(op.text, std::move(e), parse_concat(), op.line);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      Token op = next();
      e = binary("~", std::move(e), parse_math2(), op.line);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token op = next();
      e = binary(op.text, std::move(e), parse_pow(), op.line);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      Token op = next();
      e = binary("**", std::move(e), parse_unary(true), op.line);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Token op = next();
      e = make_expr(op.text == "-" ? ExprKind::kNeg : ExprKind::kPos, op.line);
      Nest nest(this, op.line);
      e->a = parse_unary(false);
      e = finish(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& tok = cur();
    int line = tok.line;
    if (tok.type == Tok::kName) {
      std::string n = next().text;
      auto lit = make_expr(ExprKind::kLiteral, line);
      if (n == "true" || n == "True") { lit->literal = Value::boolean(true); return lit; }
      if (n == "false" || n == "False") { lit->literal = Value::boolean(false); return lit; }
      if (n == "none" || n == "None") { lit->literal = Value::none(); return lit; }
      auto e = make_expr(ExprKind::kName, line);
      e->name = n;
      return e;
    }
    if (tok.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += next().text;  // adjacent literals concatenate
      auto lit = make_expr(ExprKind::kLiteral, line);
      lit->literal = Value::string(s);
      return lit;
    }
    if (tok.type == Tok::kInt || tok.type == Tok::kFloat) {
      Token t = next();
      auto lit = make_expr(ExprKind::kLiteral, line);
      try {
        if (t.type == Tok::kInt) {
          lit->literal = Value::integer(std::stoll(t.text));
        } else {  // an underflow is a tiny or zero float (5e-324), as in Python; an overflow an error
          lit->literal = Value::floating(std::strtod(t.text.c_str(), nullptr));
          if (std::isinf(lit->literal.f)) throw std::out_of_range(t.text);
        }
      } catch (...) {
        fail("number literal out of range: " + t.text, line);
      }
      return lit;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make_expr(ExprKind::kTuple, line);
      ExprPtr e = parse_expression();
      if (is_op(",")) {
        auto tup = make_expr(ExprKind::kTuple, line);
        tup->items.push_back(std::move(e));
        while (skip_op(",")) {
          if (is_op(")")) break;
          tup->items.push_back(parse_expression());
        }
        e = finish(std::move(tup));
      }
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto list = make_expr(ExprKind::kList, line);
      while (!is_op("]")) {
        if (!list->items.empty()) expect_op(",");
        if (is_op("]")) break;
        list->items.push_back(parse_expression());
      }
      expect_op("]");
      return finish(std::move(list));
    }
    if (skip_op("{")) {
      auto dict = make_expr(ExprKind::kDict, line);
      while (!is_op("}")) {
        if (!dict->items.empty()) expect_op(",");
        if (is_op("}")) break;
        dict->items.push_back(parse_expression());
        expect_op(":");
        dict->items.push_back(parse_expression());
      }
      expect_op("}");
      return finish(std::move(dict));
    }
    fail("unexpected " + describe(tok), line);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      int line = cur().line;
      if (skip_op(".")) {
        auto g = make_expr(ExprKind::kGetAttr, line);
        if (cur().type == Tok::kName) {
          g->name = next().text;
        } else if (cur().type == Tok::kInt) {  // foo.0 is foo[0]
          g = make_expr(ExprKind::kGetItem, line);
          auto idx = make_expr(ExprKind::kLiteral, line);
          idx->literal = Value::integer(std::stoll(next().text));
          g->b = std::move(idx);
        } else {
          fail("expected an attribute name after '.', got " + describe(cur()), line);
        }
        g->a = std::move(e);
        e = finish(std::move(g));
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, int line) {
    ExprPtr parts[3];
    bool is_slice = false;
    int k = 0;
    while (true) {
      if (is_op(":")) {
        ++i_;
        is_slice = true;
        if (++k > 2) fail("too many ':' in a slice", line);
        continue;
      }
      if (is_op("]")) break;
      if (parts[k]) fail("expected ':' or ']' in subscript, got " + describe(cur()), cur().line);
      parts[k] = parse_expression();
      if (is_op(",")) fail("unsupported construct: tuple subscript", line);
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) fail("empty subscript", line);
      auto g = make_expr(ExprKind::kGetItem, line);
      g->a = std::move(obj);
      g->b = std::move(parts[0]);
      return finish(std::move(g));
    }
    auto s = make_expr(ExprKind::kSlice, line);
    s->a = std::move(obj);
    for (auto& p : parts) s->items.push_back(std::move(p));
    return finish(std::move(s));
  }

  // jinja2's call arguments: positional ones, then keyword ones, with at most one *iterable
  // (after the positional ones) and one **mapping (last).
  void parse_args(Expr& call) {
    expect_op("(");
    auto invalid = [&] { fail("invalid syntax for function call expression", cur().line); };
    while (!is_op(")")) {
      if (!call.items.empty() || !call.kwargs.empty() || call.star_args || call.star_kwargs) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*")) {
        if (call.star_args || call.star_kwargs) invalid();
        ++i_;
        call.star_args = parse_expression();
      } else if (is_op("**")) {
        if (call.star_kwargs) invalid();
        ++i_;
        call.star_kwargs = parse_expression();
      } else if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        if (call.star_kwargs) invalid();
        std::string key = next().text;
        ++i_;
        call.kwargs.emplace_back(key, parse_expression());
      } else {
        if (call.star_args || call.star_kwargs) invalid();
        if (!call.kwargs.empty()) fail("positional argument follows keyword argument", cur().line);
        call.items.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = make_expr(ExprKind::kCall, cur().line);
    c->a = std::move(callee);
    parse_args(*c);
    return finish(std::move(c));
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        int line = next().line;
        auto f = make_expr(ExprKind::kFilter, line);
        f->name = expect_name();
        while (is_op(".")) {  // dotted filter names
          ++i_;
          f->name += "." + expect_name();
        }
        if (is_op("(")) parse_args(*f);
        f->a = std::move(e);
        e = finish(std::move(f));
      } else if (is_name("is")) {
        int line = next().line;
        auto t = make_expr(ExprKind::kTest, line);
        t->negated = skip_name("not");
        t->name = expect_name();
        if (is_op("(")) {
          parse_args(*t);
        } else if (cur().type == Tok::kString || cur().type == Tok::kInt || cur().type == Tok::kFloat ||
                   is_op("[") || is_op("{") || is_op("-") ||
                   (cur().type == Tok::kName && cur().text != "else" && cur().text != "or" &&
                    cur().text != "and" && cur().text != "if" && cur().text != "is" && cur().text != "in" &&
                    cur().text != "not")) {
          // "is divisibleby 3", "is sameas false": one argument without parentheses.
          ExprPtr arg = parse_primary();
          arg = parse_postfix(std::move(arg));
          t->items.push_back(std::move(arg));
        }
        t->a = std::move(e);
        e = finish(std::move(t));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  int nesting_ = 0;
};

}  // namespace

std::unique_ptr<Program> parse(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace anvil::chat_template_detail
