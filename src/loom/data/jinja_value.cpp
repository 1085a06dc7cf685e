// Chat-template values: construction, Python truthiness, str/repr, equality and ordering.
#include "loom/data/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "loom/core/error.h"
#include "loom/data/jinja_text.h"

namespace loom::data::jinja {

Value Value::undefined(std::string what) {
  Value v;
  v.s = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  return v;
}
namespace {
uint32_t child_depth(const Value& c) {
  return c.kind == Value::Kind::kList || c.kind == Value::Kind::kTuple || c.kind == Value::Kind::kDict ||
                 c.kind == Value::Kind::kNamespace
             ? c.depth + 1
             : 0;
}
void check_depth(uint32_t d) {
  if (d > kMaxValueDepth)
    throw std::length_error("a list or dict nested deeper than " + std::to_string(kMaxValueDepth) + " levels");
}
}  // namespace

Value Value::make_list(List x) {
  Value v;
  for (const auto& c : x) v.depth = std::max(v.depth, child_depth(c));
  check_depth(v.depth);
  v.kind = Kind::kList;
  v.list = std::make_shared<List>(std::move(x));
  return v;
}
Value Value::tuple(List x) {
  Value v = make_list(std::move(x));
  v.kind = Kind::kTuple;
  return v;
}
Value Value::make_dict(Dict x) {
  Value v;
  for (const auto& kv : x) v.depth = std::max({v.depth, child_depth(kv.first), child_depth(kv.second)});
  check_depth(v.depth);
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}
Value Value::make_namespace() {
  Value v = make_dict();
  v.kind = Kind::kNamespace;
  return v;
}
Value Value::callable(std::string name, std::function<Value(Renderer&, CallArgs&)> f) {
  Value v;
  v.kind = Kind::kCallable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(f)});
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return b;
    case Kind::kInt: return i != 0;
    case Kind::kFloat: return f != 0;
    case Kind::kString: return !s.empty();
    case Kind::kList:
    case Kind::kTuple: return !list->empty();
    case Kind::kDict: return !dict->empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

const Value* Value::find(const Value& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& kv : *dict)
    if (py_equal(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Value::find(const std::string& key) const {
  if (!is_mapping()) return nullptr;
  for (const auto& kv : *dict)
    if (kv.first.kind == Kind::kString && kv.first.s == key) return &kv.second;
  return nullptr;
}

void Value::set(const Value& key, Value v) {
  depth = std::max(depth, child_depth(v));
  check_depth(depth);
  for (auto& kv : *dict)
    if (py_equal(kv.first, key)) {
      kv.second = std::move(v);
      return;
    }
  dict->emplace_back(key, std::move(v));
}

double Value::as_double() const { return kind == Kind::kFloat ? f : kind == Kind::kBool ? double(b) : double(i); }

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "NoneType";
    case Value::Kind::kBool: return "bool";
    case Value::Kind::kInt: return "int";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "str";
    case Value::Kind::kList: return "list";
    case Value::Kind::kTuple: return "tuple";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kCallable: return "function";
  }
  return "?";
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[40];
  int prec = 1;
  for (; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf is "-d.ddde[+-]XX": split into sign, digits and decimal exponent.
  std::string s(buf);
  std::string sign;
  if (s[0] == '-') sign = "-", s.erase(0, 1);
  const size_t e_pos = s.find('e');
  const int exp = std::atoi(s.c_str() + e_pos + 1);
  std::string digits = s.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return sign + "0." + std::string(size_t(-exp - 1), '0') + digits;
  if (digits.size() <= size_t(exp) + 1) return sign + digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
  return sign + digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
}

namespace {
std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (size_t p = 0; p < s.size();) {
    int len = 1;
    const uint32_t cp = decode_at(s, p, len);
    if (cp == uint32_t(quote) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      out += buf;
    } else {
      out.append(s, p, size_t(len));
    }
    p += size_t(len);
  }
  return out + quote;
}

std::string repr_at(const Value& v, uint32_t level);

std::string join_repr(const List& items, uint32_t level) {
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) out += (k ? ", " : "") + repr_at(items[k], level + 1);
  return out;
}

std::string dict_repr(const Dict& d, uint32_t level) {
  std::string out = "{";
  for (size_t k = 0; k < d.size(); ++k)
    out += (k ? ", " : "") + repr_at(d[k].first, level + 1) + ": " + repr_at(d[k].second, level + 1);
  return out + "}";
}

// Namespaces can contain themselves; this bounds the recursion of printing and comparing.
void check_level(uint32_t level) {
  if (level > kMaxValueDepth)
    throw std::length_error("a value nested deeper than " + std::to_string(kMaxValueDepth) +
                            " levels (or containing itself)");
}

std::string repr_at(const Value& v, uint32_t level) {
  check_level(level);
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.b ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.i);
    case Value::Kind::kFloat: return py_float_repr(v.f);
    case Value::Kind::kString: return repr_string(v.s);
    case Value::Kind::kList: return "[" + join_repr(*v.list, level) + "]";
    case Value::Kind::kTuple: return "(" + join_repr(*v.list, level) + (v.list->size() == 1 ? ",)" : ")");
    case Value::Kind::kDict: return dict_repr(*v.dict, level);
    case Value::Kind::kNamespace: return "<Namespace " + dict_repr(*v.dict, level) + ">";
    case Value::Kind::kCallable: return "<function " + v.fn->name + ">";
  }
  return "";
}

bool equal_at(const Value& a, const Value& b, uint32_t level) {
  check_level(level);
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat)
      return (a.kind == Value::Kind::kBool ? int64_t(a.b) : a.i) == (b.kind == Value::Kind::kBool ? int64_t(b.b) : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.s == b.s;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal_at((*a.list)[k], (*b.list)[k], level + 1)) return false;
      return true;
    case Value::Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& kv : *a.dict) {
        const Value* other = b.find(kv.first);
        if (!other || !equal_at(kv.second, *other, level + 1)) return false;
      }
      return true;
    case Value::Kind::kNamespace: return a.dict == b.dict;
    case Value::Kind::kCallable: return a.fn == b.fn;
    default: return false;
  }
}

bool less_at(const Value& a, const Value& b, const std::string& where, uint32_t level) {
  check_level(level);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Value::Kind::kInt && b.kind == Value::Kind::kInt) return a.i < b.i;
    return a.as_double() < b.as_double();
  }
  if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
  if (a.kind == b.kind && a.is_sequence()) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (less_at((*a.list)[k], (*b.list)[k], where, level + 1)) return true;
      if (less_at((*b.list)[k], (*a.list)[k], where, level + 1)) return false;
    }
    return a.list->size() < b.list->size();
  }
  fail("chat-template", where, ": '<' not supported between instances of '", type_name(a), "' and '", type_name(b),
       "'");
}
}  // namespace

std::string py_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.s;
    default: return py_repr(v);
  }
}

std::string py_repr(const Value& v) { return repr_at(v, 0); }
bool py_equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }
bool py_less(const Value& a, const Value& b, const std::string& where) { return less_at(a, b, where, 0); }

}  // namespace loom::data::jinja
