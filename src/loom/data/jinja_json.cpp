// Chat-template values to and from JSON: nlohmann's ordered JSON in (keys keep their order), and
// json.dumps(ensure_ascii=False) out, with Python's float repr, indent and separators.
#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "loom/data/jinja_text.h"
#include "loom/data/jinja_value.h"

namespace loom::data::jinja {

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? Value::real(double(u)) : Value::integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(Value::string(it.key()), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: return Value::none();  // binary and discarded values do not occur in parsed JSON
  }
}

namespace {
void newline_indent(const JsonStyle& st, int level, std::string& out) {
  out += '\n';
  out.append(size_t(st.indent) * size_t(level), ' ');
}

std::string json_key(const Value& k) {
  switch (k.kind) {
    case Value::Kind::kString: return k.s;
    case Value::Kind::kInt: return std::to_string(k.i);
    case Value::Kind::kFloat: return py_float_repr(k.f);
    case Value::Kind::kBool: return k.b ? "true" : "false";
    case Value::Kind::kNone: return "null";
    default:
      throw std::invalid_argument(std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
  }
}

void dump_at(const Value& v, const JsonStyle& st, int level, std::string& out) {
  if (level > 512) throw std::invalid_argument("nesting deeper than 512 levels");
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.b ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.i); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f < 0 ? "-Infinity" : "Infinity") : py_float_repr(v.f);
      return;
    case Value::Kind::kString: append_json_string(out, v.s); return;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indent >= 0) newline_indent(st, level + 1, out);
        dump_at((*v.list)[k], st, level + 1, out);
      }
      if (st.indent >= 0) newline_indent(st, level, out);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> items;
      for (const auto& kv : *v.dict) items.emplace_back(json_key(kv.first), &kv.second);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indent >= 0) newline_indent(st, level + 1, out);
        append_json_string(out, items[k].first);
        out += st.key_sep;
        dump_at(*items[k].second, st, level + 1, out);
      }
      if (st.indent >= 0) newline_indent(st, level, out);
      out += '}';
      return;
    }
    default: throw std::invalid_argument(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
}
}  // namespace

void dump_json(const Value& v, const JsonStyle& style, std::string& out) { dump_at(v, style, 0, out); }

}  // namespace loom::data::jinja
