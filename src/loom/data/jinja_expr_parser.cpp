// Expressions of chat templates: conditional, boolean, comparison, arithmetic, unary, postfix
// (attribute, subscript, slice, call), filter and test syntax, following jinja2's parser.
#include <cerrno>
#include <cstdlib>

#include "loom/data/jinja_expr_parser.h"

namespace loom::data::jinja {

ExprPtr ExprParser::parse_tuple(bool with_condexpr) {
  const int line = cur().line;
  ExprPtr first = parse_expression(with_condexpr);
  if (!at_op(",")) return first;
  auto t = node(ExprKind::kTuple, line);
  t->args.push_back(std::move(first));
  while (skip_op(",")) {
    if (cur().kind == TokenKind::kBlockEnd || cur().kind == TokenKind::kVarEnd || at_op(")")) break;
    t->args.push_back(parse_expression(with_condexpr));
  }
  return t;
}

ExprPtr ExprParser::parse_expression(bool with_condexpr) {
  DepthGuard guard(*this);
  if (!with_condexpr) return parse_or();
  ExprPtr e = parse_or();
  while (at_name("if")) {
    auto c = node(ExprKind::kCondition, cur().line);
    ++p_;
    c->args.push_back(parse_or());
    c->args.push_back(std::move(e));
    c->args.push_back(skip_name("else") ? parse_expression(true) : nullptr);
    e = std::move(c);
  }
  return e;
}

ExprPtr ExprParser::binary(const std::string& op, ExprPtr a, ExprPtr b, int line) {
  auto e = node(ExprKind::kBinary, line);
  e->name = op;
  e->args.push_back(std::move(a));
  e->args.push_back(std::move(b));
  return e;
}

ExprPtr ExprParser::parse_left_assoc(const char* op, ExprPtr (ExprParser::*next)()) {
  ExprPtr e = (this->*next)();
  while (at_name(op)) {
    const int line = t_[p_++].line;
    e = binary(op, std::move(e), (this->*next)(), line);
  }
  return e;
}

ExprPtr ExprParser::parse_or() { return parse_left_assoc("or", &ExprParser::parse_and); }

ExprPtr ExprParser::parse_and() { return parse_left_assoc("and", &ExprParser::parse_not); }

ExprPtr ExprParser::parse_not() {
  if (at_name("not")) {
    DepthGuard guard(*this);
    auto e = node(ExprKind::kUnary, t_[p_++].line);
    e->name = "not";
    e->args.push_back(parse_not());
    return e;
  }
  return parse_compare();
}

ExprPtr ExprParser::parse_compare() {
  const int line = cur().line;
  ExprPtr first = parse_math1();
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (cur().kind == TokenKind::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                         cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      op = t_[p_++].text;
    } else if (skip_name("in")) {
      op = "in";
    } else if (at_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
      p_ += 2;
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(ExprKind::kCompare, line);
      cmp->args.push_back(std::move(first));
    }
    cmp->ops.push_back(op);
    cmp->args.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

template <class Next>
ExprPtr ExprParser::parse_left_assoc(std::initializer_list<const char*> ops, Next next) {
  ExprPtr e = (this->*next)();
  while (true) {
    const char* hit = nullptr;
    for (const char* op : ops)
      if (at_op(op)) hit = op;
    if (!hit) return e;
    const int line = t_[p_++].line;
    e = binary(hit, std::move(e), (this->*next)(), line);
  }
}
ExprPtr ExprParser::parse_math1() { return parse_left_assoc({"+", "-"}, &ExprParser::parse_concat); }
ExprPtr ExprParser::parse_concat() { return parse_left_assoc({"~"}, &ExprParser::parse_math2); }
ExprPtr ExprParser::parse_math2() { return parse_left_assoc({"*", "/", "//", "%"}, &ExprParser::parse_pow); }
ExprPtr ExprParser::parse_pow() { return parse_left_assoc({"**"}, &ExprParser::parse_unary_filtered); }
ExprPtr ExprParser::parse_unary_filtered() { return parse_unary(true); }

ExprPtr ExprParser::parse_unary(bool with_filter) {
  DepthGuard guard(*this);
  ExprPtr e;
  if (at_op("-") || at_op("+")) {
    e = node(ExprKind::kUnary, cur().line);
    e->name = t_[p_++].text;
    e->args.push_back(parse_unary(false));
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
}

ExprPtr ExprParser::parse_primary() {
  const Token& t = cur();
  auto e = node(ExprKind::kConst, t.line);
  switch (t.kind) {
    case TokenKind::kName:
      ++p_;
      if (t.text == "true" || t.text == "True") {
        e->literal = Value::boolean(true);
      } else if (t.text == "false" || t.text == "False") {
        e->literal = Value::boolean(false);
      } else if (t.text == "none" || t.text == "None") {
        e->literal = Value::none();
      } else {
        e->kind = ExprKind::kName;
        e->name = t.text;
      }
      return e;
    case TokenKind::kString: {
      std::string s;
      while (cur().kind == TokenKind::kString) s += t_[p_++].text;  // adjacent literals concatenate
      e->literal = Value::string(std::move(s));
      return e;
    }
    case TokenKind::kInt: {
      errno = 0;
      const long long v = std::strtoll(t.text.c_str(), nullptr, 10);
      if (errno == ERANGE) error(t.line, "integer literal " + t.text + " does not fit in 64 bits");
      e->literal = Value::integer(v);
      ++p_;
      return e;
    }
    case TokenKind::kFloat:
      e->literal = Value::real(std::strtod(t.text.c_str(), nullptr));
      ++p_;
      return e;
    default: break;
  }
  if (skip_op("(")) {
    if (skip_op(")")) {
      e->kind = ExprKind::kTuple;
      return e;
    }
    ExprPtr inner = parse_expression(true);
    if (at_op(",")) {
      e->kind = ExprKind::kTuple;
      e->args.push_back(std::move(inner));
      while (skip_op(",") && !at_op(")")) e->args.push_back(parse_expression(true));
      inner = std::move(e);
    }
    expect_op(")");
    return inner;
  }
  if (skip_op("[")) {
    e->kind = ExprKind::kList;
    while (!skip_op("]")) {
      e->args.push_back(parse_expression(true));
      if (!at_op("]")) expect_op(",");
    }
    return e;
  }
  if (skip_op("{")) {
    e->kind = ExprKind::kDict;
    while (!skip_op("}")) {
      e->args.push_back(parse_expression(true));
      expect_op(":");
      e->args.push_back(parse_expression(true));
      if (!at_op("}")) expect_op(",");
    }
    return e;
  }
  error(t.line, "unexpected " + describe(t) + " in an expression");
}

ExprPtr ExprParser::parse_postfix(ExprPtr e) {
  while (true) {
    const int line = cur().line;
    if (skip_op(".")) {
      if (cur().kind == TokenKind::kInt) {  // x.0 is x[0]
        auto g = node(ExprKind::kGetitem, line);
        g->args.push_back(std::move(e));
        g->args.push_back(parse_primary());
        e = std::move(g);
        continue;
      }
      auto g = node(ExprKind::kGetattr, line);
      g->name = expect_name();
      g->args.push_back(std::move(e));
      e = std::move(g);
    } else if (skip_op("[")) {
      e = parse_subscript(std::move(e), line);
    } else if (at_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::parse_subscript(ExprPtr target, int line) {
  ExprPtr start = at_op(":") ? nullptr : parse_expression(true);
  if (start && skip_op("]")) {
    auto g = node(ExprKind::kGetitem, line);
    g->args.push_back(std::move(target));
    g->args.push_back(std::move(start));
    return g;
  }
  expect_op(":");
  auto s = node(ExprKind::kSlice, line);
  s->args.push_back(std::move(target));
  s->args.push_back(std::move(start));
  s->args.push_back(at_op(":") || at_op("]") ? nullptr : parse_expression(true));
  ExprPtr step;
  if (skip_op(":") && !at_op("]")) step = parse_expression(true);
  s->args.push_back(std::move(step));
  expect_op("]");
  return s;
}

// Parses "(args)" into `e` (whose args[0] is already the callee or operand).
void ExprParser::parse_call_args(Expr& e) {
  expect_op("(");
  while (!skip_op(")")) {
    if (at_op("*") || at_op("**")) error(cur().line, "unsupported *args/**kwargs in a call");
    if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOp && peek().text == "=") {
      std::string key = t_[p_].text;
      p_ += 2;
      e.kwargs.emplace_back(std::move(key), parse_expression(true));
    } else {
      if (!e.kwargs.empty()) error(cur().line, "positional argument after a keyword argument");
      e.args.push_back(parse_expression(true));
    }
    if (!at_op(")")) expect_op(",");
  }
}

ExprPtr ExprParser::parse_call(ExprPtr callee) {
  auto c = node(ExprKind::kCall, cur().line);
  c->args.push_back(std::move(callee));
  parse_call_args(*c);
  return c;
}

ExprPtr ExprParser::parse_filter_expr(ExprPtr e) {
  while (true) {
    if (skip_op("|")) {
      e = parse_filter_chain(std::move(e));
    } else if (at_name("is")) {
      e = parse_test(std::move(e));
    } else if (at_op("(")) {
      e = parse_call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::parse_filter_chain(ExprPtr operand) {
  do {
    const int line = cur().line;
    std::string fname = expect_name();
    if (!is_known_filter(fname)) error(line, "unsupported filter '" + fname + "'");
    auto f = node(ExprKind::kFilter, line);
    f->name = std::move(fname);
    f->args.push_back(std::move(operand));
    if (at_op("(")) parse_call_args(*f);
    operand = std::move(f);
  } while (skip_op("|"));
  return operand;
}

ExprPtr ExprParser::parse_test(ExprPtr operand) {
  auto t = node(ExprKind::kTest, cur().line);
  ++p_;  // "is"
  t->negated = skip_name("not");
  const int line = cur().line;
  t->name = expect_name();
  if (!is_known_test(t->name)) error(line, "unsupported test '" + t->name + "'");
  t->args.push_back(std::move(operand));
  if (at_op("(")) {
    parse_call_args(*t);
  } else if ((cur().kind == TokenKind::kName || cur().kind == TokenKind::kString || cur().kind == TokenKind::kInt ||
              cur().kind == TokenKind::kFloat || at_op("[") || at_op("{")) &&
             !at_name("else") && !at_name("or") && !at_name("and")) {
    if (at_name("is")) error(cur().line, "tests cannot be chained with 'is'");
    t->args.push_back(parse_postfix(parse_primary()));
  }
  return t;
}

}  // namespace loom::data::jinja
