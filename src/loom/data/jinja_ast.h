// The parsed form of a chat template: expressions and statements as plain trees. The parser
// (jinja_parser.cpp) builds them and checks every filter and test name; the renderer
// (jinja_render.cpp) walks them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/data/jinja_value.h"

namespace loom::data::jinja {

enum class ExprKind {
  kConst,      // literal
  kName,       // name
  kList,       // args: items
  kTuple,      // args: items
  kDict,       // args: key, value, key, value, ...
  kGetattr,    // args[0].name
  kGetitem,    // args[0][args[1]]
  kSlice,      // args[0][args[1]:args[2]:args[3]] (missing parts are null)
  kCall,       // args[0](args[1..], kwargs)
  kFilter,     // args[0] | name(args[1..], kwargs); args[0] null inside a filter block
  kTest,       // args[0] is name(args[1..], kwargs); `negated` for `is not`
  kUnary,      // name in {not, -, +}
  kBinary,     // name in {+, -, *, /, //, %, **, ~, and, or}
  kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ...
  kCondition,  // args[1] if args[0] else args[2] (args[2] may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // kCompare
  bool negated = false;          // kTest
};

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches (cond, body)..., else_body
  kFor,       // for targets in expr [if cond]: body else else_body
  kSet,       // set targets = expr, or set targets[0].attr = expr
  kSetBlock,  // set targets[0] [| filter] %}body{% endset
  kMacro,     // macro name(params) body
  kBreak,
  kContinue,
  kFilterBlock,  // filter expr (a kFilter chain on a null operand) applied to body
  kScope,        // a body rendered as is ({% generation %} of transformers)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line;
  std::string text;                  // kText; kMacro name; kSet attribute (for ns.attr)
  std::vector<std::string> targets;  // kFor / kSet / kSetBlock names
  ExprPtr expr;                      // value / iterable / filter chain
  ExprPtr cond;                      // kFor filter
  Body body, else_body;
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro (default may be null)
};

struct Template {
  std::string name;
  Body body;
};

// Parses the template or throws "[chat-template] NAME:LINE: ...".
std::unique_ptr<Template> parse_template(const std::string& source, const std::string& name);

// Names the parser accepts after `|` and after `is` (implemented in jinja_filters.cpp).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace loom::data::jinja
