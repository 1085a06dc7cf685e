// Statements of chat templates (for, if, set, macro, filter, generation, break, continue) parsed
// into jinja_ast.h trees. Unknown filters, tests and statements are rejected here, at load, with
// their line; the expression grammar is in jinja_expr_parser.cpp.
#include "loom/data/jinja_expr_parser.h"

namespace loom::data::jinja {
namespace {

class Parser : public ExprParser {
 public:
  using ExprParser::ExprParser;

  Body parse_all() {
    std::string stop;
    return parse_body({}, stop, 0);
  }

 private:
  static StmtPtr stmt(StmtKind k, int line) {
    auto s = std::make_unique<Stmt>();
    s->kind = k;
    s->line = line;
    return s;
  }

  // Parses until `{% <one of stops>` and consumes the stop name (its tag's rest is the caller's).
  Body parse_body(const std::vector<std::string>& stops, std::string& stop, int open_line) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::kEnd) {
        if (stops.empty()) return body;
        error(open_line, "block opened here is never closed with {% " + stops.back() + " %}");
      }
      if (t.kind == TokenKind::kText) {
        auto s = stmt(StmtKind::kText, t.line);
        s->text = t.text;
        body.push_back(std::move(s));
        ++p_;
      } else if (t.kind == TokenKind::kVarBegin) {
        ++p_;
        auto s = stmt(StmtKind::kOutput, t.line);
        s->expr = parse_tuple(true);
        if (cur().kind != TokenKind::kVarEnd) error(cur().line, "expected '}}', found " + describe(cur()));
        ++p_;
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        ++p_;
        const std::string word = cur().kind == TokenKind::kName ? cur().text : "";
        for (const auto& s : stops)
          if (word == s) {
            ++p_;
            stop = word;
            return body;
          }
        body.push_back(parse_statement());
      } else {
        error(t.line, "unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const int line = cur().line;
    const std::string word = expect_name();
    if (word == "for") return parse_for(line);
    if (word == "if") return parse_if(line);
    if (word == "set") return parse_set(line);
    if (word == "macro") return parse_macro(line);
    if (word == "filter") return parse_filter_block(line);
    if (word == "generation") {
      expect_block_end();
      auto s = stmt(StmtKind::kScope, line);
      std::string stop;
      s->body = parse_body({"endgeneration"}, stop, line);
      expect_block_end();
      return s;
    }
    if (word == "break" || word == "continue") {
      if (loop_depth_ == 0) error(line, "'" + word + "' outside a for loop");
      expect_block_end();
      return stmt(word == "break" ? StmtKind::kBreak : StmtKind::kContinue, line);
    }
    static const char* const kUnsupported[] = {"call",  "raw",  "include", "import",     "from", "extends",
                                               "block", "with", "do",      "autoescape", "trans"};
    for (const char* u : kUnsupported)
      if (word == u) error(line, "unsupported statement '" + word + "' (chat templates are rendered without it)");
    if (word.rfind("end", 0) == 0 || word == "else" || word == "elif")
      error(line, "unexpected '{% " + word + " %}' with no open block it could close");
    error(line, "unknown statement '" + word + "'");
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = skip_op("(");
    do {
      if (paren && at_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    return names;
  }

  StmtPtr parse_for(int line) {
    auto s = stmt(StmtKind::kFor, line);
    s->targets = parse_targets();
    if (!skip_name("in")) error(cur().line, "expected 'in' in the for statement, found " + describe(cur()));
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (at_name("recursive")) error(cur().line, "unsupported recursive for loop");
    expect_block_end();
    ++loop_depth_;
    std::string stop;
    s->body = parse_body({"else", "endfor"}, stop, line);
    --loop_depth_;
    expect_block_end();
    if (stop == "else") {
      s->else_body = parse_body({"endfor"}, stop, line);
      expect_block_end();
    }
    return s;
  }

  StmtPtr parse_if(int line) {
    auto s = stmt(StmtKind::kIf, line);
    ExprPtr cond = parse_tuple(true);
    while (true) {
      expect_block_end();
      std::string stop;
      Body body = parse_body({"elif", "else", "endif"}, stop, line);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") {
        cond = parse_tuple(true);
        continue;
      }
      if (stop == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, stop, line);
      }
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_set(int line) {
    std::vector<std::string> targets{expect_name()};
    std::string attr;
    if (skip_op(".")) {
      attr = expect_name();
    } else {
      while (skip_op(",")) targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      auto s = stmt(StmtKind::kSet, line);
      s->targets = std::move(targets);
      s->text = attr;
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (targets.size() != 1 || !attr.empty()) error(line, "a block {% set %} assigns one plain name");
    auto s = stmt(StmtKind::kSetBlock, line);
    s->targets = std::move(targets);
    if (skip_op("|")) s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endset"}, stop, line);
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(int line) {
    auto s = stmt(StmtKind::kMacro, line);
    s->text = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      std::string param = expect_name();
      ExprPtr def = skip_op("=") ? parse_expression(true) : nullptr;
      s->params.emplace_back(std::move(param), std::move(def));
      if (!at_op(")")) expect_op(",");
    }
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    std::string stop;
    s->body = parse_body({"endmacro"}, stop, line);
    loop_depth_ = saved;
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(int line) {
    auto s = stmt(StmtKind::kFilterBlock, line);
    s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    std::string stop;
    s->body = parse_body({"endfilter"}, stop, line);
    expect_block_end();
    return s;
  }

  int loop_depth_ = 0;
};

}  // namespace

std::unique_ptr<Template> parse_template(const std::string& source, const std::string& name) {
  auto tpl = std::make_unique<Template>();
  tpl->name = name;
  tpl->body = Parser(tokenize(source, name), name).parse_all();
  return tpl;
}

}  // namespace loom::data::jinja
