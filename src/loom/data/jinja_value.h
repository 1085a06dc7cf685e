// The values a chat template computes with, modelled on the Python objects jinja2 sees: undefined,
// None, bool, int, float, str, list/tuple, dict (insertion-ordered), namespace and callables.
// Also how they print (Python's str/repr), compare and convert to and from JSON.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom::data::jinja {

class Renderer;

// Containers nest at most this deep; building a deeper one throws std::length_error, so printing,
// comparing and destroying values never recurse without bound.
inline constexpr uint32_t kMaxValueDepth = 500;
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<Value, Value>>;  // insertion order, as Python's dict

// Arguments of a call, filter or test: positional then keyword, as written.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Callable {
  std::string name;
  std::function<Value(Renderer&, CallArgs&)> fn;
};

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kCallable };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;                 // kString; for kUndefined the name that was missing
  std::shared_ptr<List> list;    // kList, kTuple
  std::shared_ptr<Dict> dict;    // kDict, kNamespace (namespaces are mutable, so shared)
  std::shared_ptr<Callable> fn;  // kCallable
  uint32_t depth = 0;            // containers nested inside this one (bounded by kMaxValueDepth)

  static Value undefined(std::string what = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v);
  static Value make_list(List v = {});
  static Value tuple(List v);
  static Value make_dict(Dict v = {});
  static Value make_namespace();
  static Value callable(std::string name, std::function<Value(Renderer&, CallArgs&)> fn);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_sequence() const { return kind == Kind::kList || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kDict || kind == Kind::kNamespace; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool is_integer() const { return kind == Kind::kInt; }

  // Python's bool(x).
  bool truthy() const;
  // The value for `key` in a dict/namespace, or nullptr.
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  // Sets `key` (replacing in place, so order is kept).
  void set(const Value& key, Value v);
  // Python numeric value of a bool/int/float.
  double as_double() const;
};

// Python's type name, for error messages: 'str', 'int', 'NoneType', 'list', ...
const char* type_name(const Value& v);
// Python's str(x) and repr(x).
std::string py_str(const Value& v);
std::string py_repr(const Value& v);
// Python's repr of a float (shortest round-trip digits: 1.0, 0.1, 1e-05, 1e+20, inf, nan).
std::string py_float_repr(double d);
// Python's `==` (1 == 1.0 == True; lists and dicts compared deeply).
bool py_equal(const Value& a, const Value& b);
// Python's `<` for numbers, strings and sequences; throws on other types.
bool py_less(const Value& a, const Value& b, const std::string& where);

// JSON in (object keys keep their order) and out, json.dumps(ensure_ascii=False) style.
Value from_json(const nlohmann::ordered_json& j);
struct JsonStyle {
  int indent = -1;  // < 0: one line
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
// Appends the JSON for `v`; throws std::invalid_argument naming the unserialisable type.
void dump_json(const Value& v, const JsonStyle& style, std::string& out);

}  // namespace loom::data::jinja
