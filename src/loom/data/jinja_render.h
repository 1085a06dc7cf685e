// The tree-walking renderer of chat templates: jinja2's scoping (a for-loop iteration and a macro
// call each get a fresh scope; `if` does not), undefined values, and Python operator semantics.
// Filters, tests, methods and global functions live in jinja_filters.cpp and jinja_builtins.cpp.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/data/chat_template.h"
#include "loom/data/jinja_ast.h"
#include "loom/data/jinja_value.h"

namespace loom::data::jinja {

class Renderer {
 public:
  Renderer(const Template& tpl, const ChatTemplateOptions& opt);
  // Empties the namespaces the render made: `{% set ns.me = ns %}` makes a cycle of shared
  // pointers that would otherwise outlive every render.
  ~Renderer();
  Renderer(const Renderer&) = delete;
  Renderer& operator=(const Renderer&) = delete;

  // Renders with `vars` (a dict) as the top-level variables.
  std::string run(const Value& vars);

  const ChatTemplateOptions& options() const { return opt_; }
  const std::string& template_name() const { return tpl_.name; }
  // Throws "[chat-template] NAME:LINE: what" at the expression being evaluated.
  [[noreturn]] void error(const std::string& what) const;

  Value call(const Value& callee, CallArgs& args);
  Value filter(const std::string& name, Value operand, CallArgs& args);
  bool test(const std::string& name, const Value& operand, CallArgs& args);
  // x.name and x[key] with jinja2's fallbacks (attribute then item, or item then attribute).
  Value get_attr(const Value& obj, const std::string& name);
  Value get_item(const Value& obj, const Value& key);
  // Python's binary operators on two values: + - * / // % **.
  Value arith(const std::string& op, const Value& a, const Value& b);
  // The items a for loop over `v` visits (dict keys, string characters, nothing for undefined).
  List iterate(const Value& v);
  // Returns `s` after checking it against max_output_bytes (strings built by +, ~, join, replace).
  Value checked_string(std::string s);
  // Fails with jinja2's UndefinedError message when `v` is undefined.
  void require_defined(const Value& v);
  // namespace(): a new one, emptied when the renderer ends.
  Value new_namespace();

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct Frame {
    std::vector<std::pair<std::string, Value>> vars;
    Frame* parent;
  };

  Flow exec(const Body& body, std::string& out);
  Flow exec_stmt(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  // A `{% set x | f | g %}` or `{% filter f | g %}` chain (parsed on a null operand, outermost
  // first) applied to v, innermost first.
  Value apply_filter_chain(const Expr* outermost, Value v);
  void exec_set(const Stmt& s);
  Value make_macro(const Stmt& s);
  Value eval(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_slice(const Expr& e);
  bool contains(const Value& container, const Value& item);
  void emit(std::string& out, const std::string& text);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);

  const Template& tpl_;
  const ChatTemplateOptions& opt_;
  Frame globals_{{}, nullptr};
  Frame root_{{}, &globals_};
  Frame* frame_ = &root_;
  int line_ = 1;
  int call_depth_ = 0;
  size_t emitted_ = 0;
  size_t steps_ = 0;
  std::vector<std::shared_ptr<Dict>> namespaces_;
};

// The call argument at position `i` or keyword `name`; nullptr when absent.
inline const Value* find_arg(const CallArgs& a, size_t i, const char* name) {
  for (const auto& kw : a.kw)
    if (kw.first == name) return &kw.second;
  return i < a.pos.size() ? &a.pos[i] : nullptr;
}

// Adds range, namespace, dict, raise_exception and strftime_now (jinja_builtins.cpp).
void add_global_functions(std::vector<std::pair<std::string, Value>>& globals);
// Methods of str, dict and list values that templates call (`content.strip()`, `d.items()`).
bool has_method(const Value& self, const std::string& name);
Value call_method(Renderer& r, const Value& self, const std::string& name, CallArgs& args);
// Implementations behind Renderer::filter and Renderer::test (jinja_filters.cpp).
Value apply_filter(Renderer& r, const std::string& name, Value operand, CallArgs& args);
bool apply_test(Renderer& r, const std::string& name, const Value& operand, CallArgs& args);

}  // namespace loom::data::jinja
