// jinja2's tests (`x is defined`, `n is divisibleby 3`, `v is mapping`) with jinja2's answers for
// undefined values (an undefined value is iterable and a sequence). The name list here is what
// the parser accepts after `is`; any other test fails when the template is loaded.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "loom/data/jinja_render.h"
#include "loom/data/jinja_text.h"

namespace loom::data::jinja {
namespace {

const char* const kTests[] = {
    "defined", "undefined", "none", "string",   "mapping", "iterable", "sequence",    "number",  "integer",
    "float",   "boolean",   "true", "false",    "odd",     "even",     "divisibleby", "equalto", "eq",
    "==",      "ne",        "!=",   "lt",       "<",       "le",       "<=",          "gt",      ">",
    "ge",      ">=",        "in",   "callable", "lower",   "upper",    "sameas"};

}  // namespace

bool is_known_test(const std::string& name) {
  return std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return name == t; });
}

bool apply_test(Renderer& r, const std::string& t, const Value& v, CallArgs& a) {
  using K = Value::Kind;
  const Value* other = find_arg(a, 0, "value");
  if (t == "defined") return !v.is_undefined();
  if (t == "undefined") return v.is_undefined();
  if (t == "none") return v.is_none();
  if (t == "string") return v.is_string();
  if (t == "mapping") return v.kind == K::kDict;
  if (t == "iterable") return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind == K::kDict;
  if (t == "sequence") return v.is_undefined() || v.is_string() || v.is_sequence() || v.kind == K::kDict;
  if (t == "number") return v.is_number();
  if (t == "integer") return v.kind == K::kInt;
  if (t == "float") return v.kind == K::kFloat;
  if (t == "boolean") return v.kind == K::kBool;
  if (t == "true") return v.kind == K::kBool && v.b;
  if (t == "false") return v.kind == K::kBool && !v.b;
  if (t == "callable") return v.kind == K::kCallable;
  if (t == "lower") return v.is_string() && v.s == ascii_lower(v.s) && v.s != ascii_upper(v.s);
  if (t == "upper") return v.is_string() && v.s == ascii_upper(v.s) && v.s != ascii_lower(v.s);
  if (t == "odd" || t == "even" || t == "divisibleby") {
    if (!v.is_number()) r.require_defined(v), r.error(std::string("test '") + t + "' expects a number");
    const Value by =
        t == "divisibleby" ? (other ? *other : Value::undefined("divisibleby needs a divisor")) : Value::integer(2);
    r.require_defined(by);
    if (by.is_number() && by.as_double() == 0) r.error("divisibleby(0)");
    const double m = std::fmod(v.as_double(), by.as_double());
    return t == "odd" ? m != 0 : m == 0;
  }
  if (!other) r.error("test '" + t + "' needs a value to compare with");
  if (t == "equalto" || t == "eq" || t == "==") return py_equal(v, *other);
  if (t == "ne" || t == "!=") return !py_equal(v, *other);
  if (t == "sameas") {
    if (v.kind != other->kind) return false;
    if (v.is_sequence()) return v.list == other->list;
    if (v.is_mapping()) return v.dict == other->dict;
    return py_equal(v, *other);
  }
  if (t == "in") {
    if (other->is_string()) return v.is_string() && other->s.find(v.s) != std::string::npos;
    for (const auto& it : r.iterate(*other))
      if (py_equal(it, v)) return true;
    return false;
  }
  r.require_defined(v);
  r.require_defined(*other);
  const std::string where = r.template_name();
  if (t == "lt" || t == "<") return py_less(v, *other, where);
  if (t == "gt" || t == ">") return py_less(*other, v, where);
  if (t == "le" || t == "<=") return !py_less(*other, v, where);
  return !py_less(v, *other, where);  // ge, >=
}

}  // namespace loom::data::jinja
