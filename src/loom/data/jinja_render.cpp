// Statement execution, scoping, variable lookup and attribute access of the chat-template
// renderer (see jinja_render.h); operators are in jinja_ops.cpp.
#include "loom/data/jinja_render.h"

#include "loom/core/error.h"
#include "loom/data/jinja_text.h"

namespace loom::data::jinja {
namespace {
constexpr int kMaxCallDepth = 64;  // macro recursion; jinja2 would hit Python's recursion limit
}

Renderer::Renderer(const Template& tpl, const ChatTemplateOptions& opt) : tpl_(tpl), opt_(opt) {
  add_global_functions(globals_.vars);
}

Renderer::~Renderer() {
  for (const auto& d : namespaces_) d->clear();
}

Value Renderer::new_namespace() {
  Value v = Value::make_namespace();
  namespaces_.push_back(v.dict);
  return v;
}

void Renderer::error(const std::string& what) const { fail("chat-template", tpl_.name, ":", line_, ": ", what); }

std::string Renderer::run(const Value& vars) {
  if (vars.is_mapping())
    for (const auto& kv : *vars.dict)
      if (kv.first.is_string()) root_.vars.emplace_back(kv.first.s, kv.second);
  std::string out;
  exec(tpl_.body, out);
  return out;
}

void Renderer::emit(std::string& out, const std::string& text) {
  emitted_ += text.size();
  if (emitted_ > opt_.max_output_bytes)
    error("output exceeds " + std::to_string(opt_.max_output_bytes) + " bytes (ChatTemplateOptions::max_output_bytes)");
  out += text;
}

Value Renderer::lookup(const std::string& name) const {
  for (const Frame* f = frame_; f; f = f->parent)
    for (auto it = f->vars.rbegin(); it != f->vars.rend(); ++it)
      if (it->first == name) return it->second;
  return Value::undefined("'" + name + "' is undefined");
}

void Renderer::assign(const std::string& name, Value v) {
  for (auto& kv : frame_->vars)
    if (kv.first == name) {
      kv.second = std::move(v);
      return;
    }
  frame_->vars.emplace_back(name, std::move(v));
}

Value Renderer::checked_string(std::string s) {
  if (s.size() > opt_.max_output_bytes)
    error("a string of " + std::to_string(s.size()) + " bytes exceeds ChatTemplateOptions::max_output_bytes");
  return Value::string(std::move(s));
}

void Renderer::require_defined(const Value& v) {
  if (v.is_undefined()) error(v.s.empty() ? "value is undefined" : v.s);
}

Renderer::Flow Renderer::exec(const Body& body, std::string& out) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Value Renderer::apply_filter_chain(const Expr* outermost, Value v) {
  std::vector<const Expr*> chain;
  for (const Expr* e = outermost; e; e = e->args[0].get()) chain.push_back(e);
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    CallArgs args;
    for (size_t k = 1; k < (*it)->args.size(); ++k) args.pos.push_back(eval(*(*it)->args[k]));
    for (const auto& kw : (*it)->kwargs) args.kw.emplace_back(kw.first, eval(*kw.second));
    line_ = (*it)->line;
    v = filter((*it)->name, std::move(v), args);
  }
  return v;
}

Renderer::Flow Renderer::exec_stmt(const Stmt& s, std::string& out) {
  line_ = s.line;
  if (++steps_ > opt_.max_steps)
    error("more than " + std::to_string(opt_.max_steps) + " statements executed (ChatTemplateOptions::max_steps)");
  switch (s.kind) {
    case StmtKind::kText: emit(out, s.text); return Flow::kNormal;
    case StmtKind::kOutput: emit(out, py_str(eval(*s.expr))); return Flow::kNormal;
    case StmtKind::kIf:
      for (const auto& br : s.branches)
        if (eval(*br.first).truthy()) return exec(br.second, out);
      return exec(s.else_body, out);
    case StmtKind::kFor: return exec_for(s, out);
    case StmtKind::kSet: exec_set(s); return Flow::kNormal;
    case StmtKind::kSetBlock: {
      std::string body;
      exec(s.body, body);
      Value v = Value::string(std::move(body));
      if (s.expr) v = apply_filter_chain(s.expr.get(), std::move(v));
      assign(s.targets[0], std::move(v));
      return Flow::kNormal;
    }
    case StmtKind::kMacro: assign(s.text, make_macro(s)); return Flow::kNormal;
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
    case StmtKind::kFilterBlock: {
      std::string body;
      const Flow f = exec(s.body, body);
      emit(out, py_str(apply_filter_chain(s.expr.get(), Value::string(std::move(body)))));
      return f;
    }
    case StmtKind::kScope: return exec(s.body, out);
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::exec_for(const Stmt& s, std::string& out) {
  List items = iterate(eval(*s.expr));
  Frame* const outer = frame_;
  if (s.cond) {  // `for x in xs if c`: filtered before the loop, so loop.length counts survivors
    List kept;
    for (auto& item : items) {
      Frame f{{}, outer};
      frame_ = &f;
      if (s.targets.size() == 1)
        assign(s.targets[0], item);
      else if (item.is_sequence() && item.list->size() == s.targets.size())
        for (size_t k = 0; k < s.targets.size(); ++k) assign(s.targets[k], (*item.list)[k]);
      const bool keep = eval(*s.cond).truthy();
      frame_ = outer;
      if (keep) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const size_t n = items.size();
  Flow result = Flow::kNormal;
  for (size_t k = 0; k < n; ++k) {
    Frame f{{}, outer};
    frame_ = &f;
    const Value& item = items[k];
    if (s.targets.size() == 1) {
      assign(s.targets[0], item);
    } else {
      if (!item.is_sequence() || item.list->size() != s.targets.size()) {
        frame_ = outer;
        error("cannot unpack " + std::string(type_name(item)) + " into " + std::to_string(s.targets.size()) +
              " loop variables");
      }
      for (size_t t = 0; t < s.targets.size(); ++t) assign(s.targets[t], (*item.list)[t]);
    }
    Dict loop{{Value::string("index"), Value::integer(int64_t(k + 1))},
              {Value::string("index0"), Value::integer(int64_t(k))},
              {Value::string("revindex"), Value::integer(int64_t(n - k))},
              {Value::string("revindex0"), Value::integer(int64_t(n - k - 1))},
              {Value::string("first"), Value::boolean(k == 0)},
              {Value::string("last"), Value::boolean(k + 1 == n)},
              {Value::string("length"), Value::integer(int64_t(n))},
              {Value::string("depth"), Value::integer(1)},
              {Value::string("depth0"), Value::integer(0)}};
    if (k > 0) loop.emplace_back(Value::string("previtem"), items[k - 1]);
    if (k + 1 < n) loop.emplace_back(Value::string("nextitem"), items[k + 1]);
    loop.emplace_back(Value::string("cycle"), Value::callable("cycle", [k](Renderer& r, CallArgs& a) {
                        if (a.pos.empty()) r.error("loop.cycle() needs at least one value");
                        return a.pos[k % a.pos.size()];
                      }));
    assign("loop", Value::make_dict(std::move(loop)));
    Flow f_result;
    try {
      f_result = exec(s.body, out);
    } catch (...) {
      frame_ = outer;
      throw;
    }
    frame_ = outer;
    if (f_result == Flow::kBreak) break;
  }
  if (n == 0) result = exec(s.else_body, out);
  return result;
}

void Renderer::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.text.empty()) {  // {% set ns.attr = v %}
    Value target = lookup(s.targets[0]);
    if (target.kind != Value::Kind::kNamespace)
      error("cannot assign attribute '" + s.text + "' on '" + s.targets[0] + "', which is not a namespace()");
    target.set(Value::string(s.text), std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    assign(s.targets[0], std::move(v));
    return;
  }
  List items = iterate(v);
  if (items.size() != s.targets.size())
    error("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(s.targets.size()) +
          " names");
  for (size_t k = 0; k < items.size(); ++k) assign(s.targets[k], std::move(items[k]));
}

Value Renderer::make_macro(const Stmt& s) {
  const Stmt* def = &s;
  return Value::callable(s.text, [def](Renderer& r, CallArgs& args) {
    if (args.pos.size() > def->params.size())
      r.error("macro '" + def->text + "' takes " + std::to_string(def->params.size()) + " arguments, got " +
              std::to_string(args.pos.size()));
    if (r.call_depth_ >= kMaxCallDepth) r.error("macro calls nested deeper than " + std::to_string(kMaxCallDepth));
    Frame f{{}, &r.root_};
    Frame* const saved = r.frame_;
    const int saved_line = r.line_;
    r.frame_ = &f;
    ++r.call_depth_;
    std::string out;
    try {
      for (size_t k = 0; k < def->params.size(); ++k) {
        const auto& [pname, pdefault] = def->params[k];
        Value v = k < args.pos.size() ? args.pos[k] : Value::undefined("'" + pname + "' is undefined");
        for (const auto& kw : args.kw)
          if (kw.first == pname) v = kw.second;
        if (k >= args.pos.size() && v.is_undefined() && pdefault) v = r.eval(*pdefault);
        r.assign(pname, std::move(v));
      }
      for (const auto& kw : args.kw) {
        bool known = false;
        for (const auto& p : def->params) known = known || p.first == kw.first;
        if (!known) r.error("macro '" + def->text + "' has no parameter named '" + kw.first + "'");
      }
      r.exec(def->body, out);
    } catch (...) {
      r.frame_ = saved, --r.call_depth_;
      throw;
    }
    r.frame_ = saved, --r.call_depth_, r.line_ = saved_line;
    return Value::string(std::move(out));
  });
}

Value Renderer::call(const Value& callee, CallArgs& args) {
  if (callee.kind == Value::Kind::kCallable) return callee.fn->fn(*this, args);
  require_defined(callee);
  error(std::string("'") + type_name(callee) + "' object is not callable");
}

Value Renderer::filter(const std::string& name, Value operand, CallArgs& args) {
  return apply_filter(*this, name, std::move(operand), args);
}

bool Renderer::test(const std::string& name, const Value& operand, CallArgs& args) {
  return apply_test(*this, name, operand, args);
}

Value Renderer::get_attr(const Value& obj, const std::string& name) {
  require_defined(obj);
  if (has_method(obj, name)) {
    Value self = obj;
    return Value::callable(name, [self, name](Renderer& r, CallArgs& a) { return call_method(r, self, name, a); });
  }
  if (obj.is_mapping())
    if (const Value* v = obj.find(name)) return *v;
  return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + name + "'");
}

Value Renderer::get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  if (obj.is_mapping()) {
    if (const Value* v = obj.find(key)) return *v;
  } else if ((obj.is_sequence() || obj.is_string()) && (key.is_integer() || key.kind == Value::Kind::kBool)) {
    int64_t idx = key.is_integer() ? key.i : int64_t(key.b);
    if (obj.is_string()) {
      const auto offs = code_point_offsets(obj.s);
      const auto n = int64_t(offs.size() - 1);
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n)
        return Value::string(obj.s.substr(offs[size_t(idx)], offs[size_t(idx) + 1] - offs[size_t(idx)]));
    } else {
      const auto n = int64_t(obj.list->size());
      if (idx < 0) idx += n;
      if (idx >= 0 && idx < n) return (*obj.list)[size_t(idx)];
    }
    return Value::undefined(std::string(type_name(obj)) + " object has no element " + std::to_string(key.i));
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined("'" + std::string(type_name(obj)) + " object' has no element " + py_repr(key));
}

List Renderer::iterate(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList:
    case Value::Kind::kTuple: return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& kv : *v.dict) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      const auto offs = code_point_offsets(v.s);
      for (size_t k = 0; k + 1 < offs.size(); ++k)
        chars.push_back(Value::string(v.s.substr(offs[k], offs[k + 1] - offs[k])));
      return chars;
    }
    default: error(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

}  // namespace loom::data::jinja
