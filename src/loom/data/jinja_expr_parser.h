// The chat-template parser's token cursor and expression grammar (jinja2's precedence: filters
// and tests bind tighter than arithmetic, `-x ** 2` is `(-x) ** 2`). The statement parser in
// jinja_parser.cpp derives from it; only the two parser files include this header.
#pragma once
#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/data/jinja_ast.h"
#include "loom/data/jinja_lexer.h"

namespace loom::data::jinja {

inline constexpr int kMaxParseDepth = 100;  // nesting of expressions and of blocks; deeper input is refused

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, const std::string& name) : t_(std::move(tokens)), name_(name) {}

 protected:
  struct DepthGuard {
    ExprParser& p;
    explicit DepthGuard(ExprParser& parser) : p(parser) {
      if (++p.depth_ > kMaxParseDepth)
        p.error(p.cur().line,
                "nesting deeper than " + std::to_string(kMaxParseDepth) + " levels; simplify the template");
    }
    ~DepthGuard() { --p.depth_; }
  };

  [[noreturn]] void error(int line, const std::string& what) const {
    fail("chat-template", name_, ":", line, ": ", what);
  }
  const Token& cur() const { return t_[p_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_op(const char* op) const { return cur().kind == TokenKind::kOp && cur().text == op; }
  bool at_name(const char* n) const { return cur().kind == TokenKind::kName && cur().text == n; }
  bool skip_op(const char* op) { return at_op(op) ? (++p_, true) : false; }
  bool skip_name(const char* n) { return at_name(n) ? (++p_, true) : false; }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kEnd: return "end of template";
      case TokenKind::kBlockEnd: return "'%}'";
      case TokenKind::kVarEnd: return "'}}'";
      case TokenKind::kText: return "text";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) error(cur().line, std::string("expected '") + op + "', found " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::kName) error(cur().line, "expected a name, found " + describe(cur()));
    return t_[p_++].text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::kBlockEnd) error(cur().line, "expected '%}', found " + describe(cur()));
    ++p_;
  }

  static ExprPtr node(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  ExprPtr parse_tuple(bool with_condexpr);
  ExprPtr parse_expression(bool with_condexpr);
  // "name(args) | name(args) ...", the first pipe already consumed (or, in a filter block, "filter").
  ExprPtr parse_filter_chain(ExprPtr operand);

  std::vector<Token> t_;
  size_t p_ = 0;
  const std::string& name_;
  int depth_ = 0;

 private:
  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, int line);
  // `next (op next)*`, left-associative: the boolean operators' levels.
  ExprPtr parse_left_assoc(const char* op, ExprPtr (ExprParser::*next)());
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  template <class Next>
  ExprPtr parse_left_assoc(std::initializer_list<const char*> ops, Next next);
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary_filtered();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr target, int line);
  void parse_call_args(Expr& e);
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_filter_expr(ExprPtr e);
  ExprPtr parse_test(ExprPtr operand);
};

}  // namespace loom::data::jinja
