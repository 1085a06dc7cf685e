// Expression evaluation for the chat-template renderer: literals, names, attribute and item
// access, slicing, calls, and Python's operator semantics (int/float arithmetic with floor
// division and modulo, str and list concatenation and repetition, chained comparisons, `in`).
#include <cmath>

#include "loom/core/error.h"
#include "loom/data/jinja_render.h"
#include "loom/data/jinja_text.h"

namespace loom::data::jinja {
namespace {

constexpr size_t kMaxRepeatBytes = size_t(16) << 20;  // 'x' * n
constexpr size_t kMaxRepeatItems = size_t(1) << 20;   // [..] * n

int64_t as_int(const Value& v) { return v.kind == Value::Kind::kBool ? int64_t(v.b) : v.i; }
bool int_like(const Value& v) { return v.kind == Value::Kind::kInt || v.kind == Value::Kind::kBool; }

// Python slice bounds for a sequence of length n.
void slice_indices(int64_t n, const Value* start, const Value* stop, int64_t step, int64_t& b, int64_t& e) {
  auto clamp = [&](const Value* v, int64_t def) {
    if (!v || v->is_none()) return def;
    int64_t x = as_int(*v);
    if (x < 0) x += n;
    if (step > 0) return x < 0 ? 0 : x > n ? n : x;
    return x < 0 ? -1 : x >= n ? n - 1 : x;
  };
  b = clamp(start, step > 0 ? 0 : n - 1);
  e = clamp(stop, step > 0 ? n : -1);
}

}  // namespace

Value Renderer::eval(const Expr& e) {
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::kConst: return e.literal;
    case ExprKind::kName: return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      List items;
      for (const auto& a : e.args) items.push_back(eval(*a));
      return e.kind == ExprKind::kList ? Value::make_list(std::move(items)) : Value::tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
        Value key = eval(*e.args[k]);
        d.set(key, eval(*e.args[k + 1]));
      }
      return d;
    }
    case ExprKind::kGetattr: {
      Value obj = eval(*e.args[0]);
      line_ = e.line;
      return get_attr(obj, e.name);
    }
    case ExprKind::kGetitem: {
      Value obj = eval(*e.args[0]);
      Value key = eval(*e.args[1]);
      line_ = e.line;
      return get_item(obj, key);
    }
    case ExprKind::kSlice: return eval_slice(e);
    case ExprKind::kCall:
    case ExprKind::kFilter:
    case ExprKind::kTest: {
      Value target = e.args[0] ? eval(*e.args[0]) : Value::undefined();
      CallArgs args;
      for (size_t k = 1; k < e.args.size(); ++k) args.pos.push_back(eval(*e.args[k]));
      for (const auto& kw : e.kwargs) args.kw.emplace_back(kw.first, eval(*kw.second));
      line_ = e.line;
      if (e.kind == ExprKind::kCall) return call(target, args);
      if (e.kind == ExprKind::kFilter) return filter(e.name, std::move(target), args);
      return Value::boolean(test(e.name, target, args) != e.negated);
    }
    case ExprKind::kUnary: {
      Value v = eval(*e.args[0]);
      line_ = e.line;
      if (e.name == "not") return Value::boolean(!v.truthy());
      require_defined(v);
      if (!v.is_number()) error(std::string("bad operand type for unary ") + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.kind == Value::Kind::kBool ? Value::integer(v.b) : v;
      if (v.kind == Value::Kind::kFloat) return Value::real(-v.f);
      if (as_int(v) == INT64_MIN) error("integer overflow");
      return Value::integer(-as_int(v));
    }
    case ExprKind::kBinary: return eval_binary(e);
    case ExprKind::kCompare: return eval_compare(e);
    case ExprKind::kCondition:
      if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the condition was false and there is no else");
  }
  return Value::undefined();
}

Value Renderer::eval_binary(const Expr& e) {
  if (e.name == "and" || e.name == "or") {
    Value a = eval(*e.args[0]);
    if (a.truthy() == (e.name == "or")) return a;
    return eval(*e.args[1]);
  }
  Value a = eval(*e.args[0]);
  Value b = eval(*e.args[1]);
  line_ = e.line;
  if (e.name == "~") return checked_string(py_str(a) + py_str(b));
  return arith(e.name, a, b);
}

Value Renderer::arith(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  auto unsupported = [&]() {
    error("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = int_like(a) && int_like(b);
    const int64_t x = ints ? as_int(a) : 0, y = ints ? as_int(b) : 0;
    const double fx = a.as_double(), fy = b.as_double();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Value::real(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) error("integer overflow");
      return Value::integer(r);
    }
    if (op == "-") {
      if (!ints) return Value::real(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) error("integer overflow");
      return Value::integer(r);
    }
    if (op == "*") {
      if (!ints) return Value::real(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) error("integer overflow");
      return Value::integer(r);
    }
    if (op == "/") {
      if (fy == 0) error("division by zero");
      return Value::real(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (fy == 0) error(op == "//" ? "integer division or modulo by zero" : "modulo by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) error("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;
        return Value::integer(op == "//" ? q : m);
      }
      const double q = std::floor(fx / fy);
      if (op == "//") return Value::real(q);
      double m = std::fmod(fx, fy);
      if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
      return Value::real(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t acc = 1, base = x;
        for (int64_t k = y; k > 0; k >>= 1) {
          if ((k & 1) && __builtin_mul_overflow(acc, base, &acc)) error("integer overflow");
          if (k > 1 && __builtin_mul_overflow(base, base, &base)) error("integer overflow");
        }
        return Value::integer(acc);
      }
      if (fx == 0 && fy < 0) error("0.0 cannot be raised to a negative power");
      return Value::real(std::pow(fx, fy));
    }
    unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return checked_string(a.s + b.s);
    if (a.is_sequence() && a.kind == b.kind) {
      if (a.list->size() + b.list->size() > kMaxRepeatItems) error("list concatenation too large");
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return a.kind == Value::Kind::kList ? Value::make_list(std::move(items)) : Value::tuple(std::move(items));
    }
    if (a.is_string() || b.is_string())
      error(std::string("can only concatenate str (not \"") + type_name(a.is_string() ? b : a) + "\") to str");
  }
  if (op == "*" && (int_like(a) || int_like(b))) {
    const Value& seq = int_like(a) ? b : a;
    const int64_t n = std::max<int64_t>(0, as_int(int_like(a) ? a : b));
    if (seq.is_string()) {
      if (double(seq.s.size()) * double(n) > double(kMaxRepeatBytes)) error("string repetition too large");
      std::string out;
      for (int64_t k = 0; k < n; ++k) out += seq.s;
      return Value::string(std::move(out));
    }
    if (seq.is_sequence()) {
      if (double(seq.list->size()) * double(n) > double(kMaxRepeatItems)) error("list repetition too large");
      List items;
      for (int64_t k = 0; k < n; ++k) items.insert(items.end(), seq.list->begin(), seq.list->end());
      return seq.kind == Value::Kind::kList ? Value::make_list(std::move(items)) : Value::tuple(std::move(items));
    }
  }
  unsupported();
  return Value::undefined();
}

bool Renderer::contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        require_defined(item);
        error(std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      }
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const auto& v : *container.list)
        if (py_equal(v, item)) return true;
      return false;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: return container.find(item) != nullptr;
    default: error(std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

Value Renderer::eval_compare(const Expr& e) {
  Value left = eval(*e.args[0]);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.args[k + 1]);
    line_ = e.line;
    const std::string& op = e.ops[k];
    bool ok;
    if (op == "==")
      ok = py_equal(left, right);
    else if (op == "!=")
      ok = !py_equal(left, right);
    else if (op == "in")
      ok = contains(right, left);
    else if (op == "notin")
      ok = !contains(right, left);
    else {
      require_defined(left);
      require_defined(right);
      const std::string where = tpl_.name + ":" + std::to_string(line_);
      if (op == "<")
        ok = py_less(left, right, where);
      else if (op == ">")
        ok = py_less(right, left, where);
      else if (op == "<=")
        ok = !py_less(right, left, where);
      else
        ok = !py_less(left, right, where);
    }
    if (!ok) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Renderer::eval_slice(const Expr& e) {
  Value obj = eval(*e.args[0]);
  Value parts[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.args[size_t(k) + 1]) continue;
    parts[k] = eval(*e.args[size_t(k) + 1]);
    if (!int_like(parts[k]) && !parts[k].is_none()) {
      line_ = e.line;
      error("slice indices must be integers or None, not " + std::string(type_name(parts[k])));
    }
  }
  line_ = e.line;
  require_defined(obj);
  const int64_t step = parts[2].is_undefined() || parts[2].is_none() ? 1 : as_int(parts[2]);
  if (step == 0) error("slice step cannot be zero");
  const Value* start = parts[0].is_undefined() ? nullptr : &parts[0];
  const Value* stop = parts[1].is_undefined() ? nullptr : &parts[1];
  if (obj.is_string()) {
    const auto offs = code_point_offsets(obj.s);
    int64_t b, end;
    slice_indices(int64_t(offs.size() - 1), start, stop, step, b, end);
    std::string out;
    for (int64_t k = b; step > 0 ? k < end : k > end; k += step)
      out.append(obj.s, offs[size_t(k)], offs[size_t(k) + 1] - offs[size_t(k)]);
    return Value::string(std::move(out));
  }
  if (obj.is_sequence()) {
    int64_t b, end;
    slice_indices(int64_t(obj.list->size()), start, stop, step, b, end);
    List out;
    for (int64_t k = b; step > 0 ? k < end : k > end; k += step) out.push_back((*obj.list)[size_t(k)]);
    return obj.kind == Value::Kind::kList ? Value::make_list(std::move(out)) : Value::tuple(std::move(out));
  }
  error(std::string("'") + type_name(obj) + "' object is not subscriptable");
}

}  // namespace loom::data::jinja
