// jinja2's filters as chat templates use them, plus transformers' `tojson` (json.dumps with
// ensure_ascii=False, indent, separators and sort_keys). The name list here is what the parser
// accepts after `|`; any other filter fails when the template is loaded.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <stdexcept>
#include <utility>

#include "loom/data/jinja_render.h"
#include "loom/data/jinja_text.h"
#include "loom/data/unicode.h"

namespace loom::data::jinja {
namespace {

bool arg_bool(const CallArgs& a, size_t i, const char* name, bool def) {
  const Value* v = find_arg(a, i, name);
  return v ? v->truthy() : def;
}

std::string require_string(Renderer& r, const Value& v, const char* what) {
  if (!v.is_string()) r.error(std::string(what) + " expects a string, got '" + type_name(v) + "'");
  return v.s;
}

// Attribute paths like "function.name", as selectattr/map/sort/join take them.
Value attr_path(Renderer& r, Value v, const std::string& path) {
  size_t p = 0;
  while (true) {
    const size_t dot = path.find('.', p);
    const std::string part = path.substr(p, dot == std::string::npos ? std::string::npos : dot - p);
    if (v.is_undefined()) return v;
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = digits ? r.get_item(v, Value::integer(std::atoll(part.c_str()))) : r.get_item(v, Value::string(part));
    if (dot == std::string::npos) return v;
    p = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(ascii_lower(v.s)) : v;
}

Value tojson(Renderer& r, const Value& v, CallArgs& a) {
  JsonStyle st;
  const bool ensure_ascii = arg_bool(a, 0, "ensure_ascii", false);
  if (const Value* ind = find_arg(a, 1, "indent"); ind && !ind->is_none()) {
    if (!ind->is_integer()) r.error("tojson(indent=...) expects an integer");
    st.indent = int(std::clamp<int64_t>(ind->i, 0, 64));
    st.item_sep = std::string(1, ',');  // a plain "," trips GCC 12 -Wrestrict (PR105329)
  }
  if (const Value* sep = find_arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_sequence() || sep->list->size() != 2 || !(*sep->list)[0].is_string() || !(*sep->list)[1].is_string())
      r.error("tojson(separators=...) expects a pair of strings");
    st.item_sep = (*sep->list)[0].s;
    st.key_sep = (*sep->list)[1].s;
  }
  st.sort_keys = arg_bool(a, 3, "sort_keys", false);
  std::string out;
  try {
    dump_json(v, st, out);
  } catch (const std::invalid_argument& e) {
    r.error(std::string("tojson: ") + e.what());
  }
  if (!ensure_ascii) return Value::string(std::move(out));
  std::string esc;
  for (size_t p = 0; p < out.size();) {
    int len = 1;
    uint32_t cp = decode_at(out, p, len);
    p += size_t(len);
    if (cp < 0x80) {
      esc += char(cp);
      continue;
    }
    char buf[16];
    if (cp >= 0x10000) {
      cp -= 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    }
    esc += buf;
  }
  return Value::string(std::move(esc));
}

Value to_int(const Value& v, const Value& def) {
  switch (v.kind) {
    case Value::Kind::kInt: return v;
    case Value::Kind::kBool: return Value::integer(v.b);
    case Value::Kind::kFloat: return std::isfinite(v.f) && std::fabs(v.f) < 9.2e18 ? Value::integer(int64_t(v.f)) : def;
    case Value::Kind::kString: {
      const std::string s = py_strip(v.s, true, true);
      if (s.empty()) return def;
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (*end == '\0' && errno == 0) return Value::integer(i);
      const double d = std::strtod(s.c_str(), &end);
      if (*end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(int64_t(d));
      return def;
    }
    default: return def;
  }
}

Value to_float(const Value& v, const Value& def) {
  if (v.is_number()) return Value::real(v.as_double());
  if (v.is_string()) {
    const std::string s = py_strip(v.s, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::real(d);
  }
  return def;
}

Value round_value(Renderer& r, const Value& v, CallArgs& a) {
  if (!v.is_number()) r.error(std::string("round expects a number, got '") + type_name(v) + "'");
  const Value* pv = find_arg(a, 0, "precision");
  const int64_t prec = pv && pv->is_integer() ? std::clamp<int64_t>(pv->i, -20, 20) : 0;
  const Value* mv = find_arg(a, 1, "method");
  const std::string method = mv && mv->is_string() ? mv->s : "common";
  const double x = v.as_double(), scale = std::pow(10.0, double(prec));
  if (method == "ceil") return Value::real(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::real(std::floor(x * scale) / scale);
  if (method != "common") r.error("round(method=...) must be 'common', 'ceil' or 'floor'");
  if (v.kind != Value::Kind::kFloat) return Value::integer(v.kind == Value::Kind::kBool ? v.b : v.i);
  if (prec <= 0) return Value::real(std::nearbyint(x * scale) / scale);  // half to even, as Python's round
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.*f", int(prec), x);  // correctly rounded, as Python's round
  return Value::real(std::strtod(buf, nullptr));
}

// jinja2's escape (markupsafe): & < > " ' as entities.
std::string html_escape(const std::string& s) {
  static constexpr std::pair<char, const char*> kEntities[] = {
      {'&', "&amp;"}, {'<', "&lt;"}, {'>', "&gt;"}, {'"', "&#34;"}, {'\'', "&#39;"}};
  std::string out;
  for (char c : s) {
    const auto* e =
        std::find_if(std::begin(kEntities), std::end(kEntities), [c](const auto& x) { return x.first == c; });
    if (e != std::end(kEntities))
      out += e->second;
    else
      out += c;
  }
  return out;
}

std::string indent_text(const std::string& s, const CallArgs& a) {
  const Value* w = find_arg(a, 0, "width");
  const std::string pad = w && w->is_string()
                              ? w->s
                              : std::string(size_t(w && w->is_integer() ? std::clamp<int64_t>(w->i, 0, 256) : 4), ' ');
  const bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
  std::vector<std::string> lines = py_split(s, "\n", -1);  // s + "\n" split by lines, as jinja2 does
  std::string out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) out += "\n";
    if (k && (blank || !lines[k].empty())) out += pad;
    out += lines[k];
  }
  return first ? pad + out : out;
}

// select/reject/selectattr/rejectattr: keep items whose (attribute's) test result is `want`.
Value select_items(Renderer& r, const Value& v, const CallArgs& a, bool by_attr, bool want) {
  size_t next = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string()) r.error("selectattr/rejectattr need an attribute name");
    attr = a.pos[0].s;
    next = 1;
  }
  std::string test_name;
  CallArgs test_args;
  if (next < a.pos.size()) {
    test_name = require_string(r, a.pos[next], "the test name");
    if (!is_known_test(test_name)) r.error("unsupported test '" + test_name + "'");
    test_args.pos.assign(a.pos.begin() + long(next) + 1, a.pos.end());
  }
  List out;
  for (const auto& item : r.iterate(v)) {
    const Value subject = by_attr ? attr_path(r, item, attr) : item;
    const bool ok = test_name.empty() ? subject.truthy() : r.test(test_name, subject, test_args);
    if (ok == want) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value sorted_items(Renderer& r, List items, const CallArgs& a) {
  const bool reverse = arg_bool(a, 0, "reverse", false), cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attr = find_arg(a, 2, "attribute");
  const std::string where = r.template_name();
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& it : items) keyed.emplace_back(sort_key(attr ? attr_path(r, it, py_str(*attr)) : it, cs), it);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? py_less(y.first, x.first, where) : py_less(x.first, y.first, where);
  });
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::make_list(std::move(out));
}

Value default_value(Renderer&, const Value& v, CallArgs& a) {
  const bool boolean = arg_bool(a, 1, "boolean", false);
  const Value* def = find_arg(a, 0, "default_value");
  if (v.is_undefined() || (boolean && !v.truthy())) return def ? *def : Value::string("");
  return v;
}

Value items(Renderer& r, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_mapping()) r.error(std::string("items expects a mapping, got '") + type_name(v) + "'");
  List out;
  for (const auto& kv : *v.dict) out.push_back(Value::tuple({kv.first, kv.second}));
  return Value::make_list(std::move(out));
}

Value length(Renderer& r, const Value& v, CallArgs&) {
  if (v.is_string()) return Value::integer(int64_t(code_point_count(v.s)));
  if (v.is_sequence()) return Value::integer(int64_t(v.list->size()));
  if (v.is_mapping()) return Value::integer(int64_t(v.dict->size()));
  if (v.is_undefined()) return Value::integer(0);
  r.error(std::string("object of type '") + type_name(v) + "' has no len()");
}

Value first_or_last(Renderer& r, const Value& v, bool first) {
  List items = r.iterate(v);
  if (items.empty()) return Value::undefined(first ? "no first item" : "no last item");
  return first ? items.front() : items.back();
}

Value reversed(Renderer& r, const Value& v, CallArgs&) {
  if (v.is_string()) {
    List chars = r.iterate(v);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->s;
    return Value::string(std::move(out));
  }
  List items = r.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}

Value join(Renderer& r, const Value& v, CallArgs& a) {
  const Value* sep = find_arg(a, 0, "d");
  const Value* attr = find_arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const auto& it : r.iterate(v)) {
    if (!first) out += sep ? py_str(*sep) : "";
    out += py_str(attr ? attr_path(r, it, py_str(*attr)) : it);
    first = false;
    if (out.size() > r.options().max_output_bytes) break;
  }
  return r.checked_string(std::move(out));
}

Value map_items(Renderer& r, const Value& v, CallArgs& a) {
  List out;
  if (const Value* attr = find_arg(a, 99, "attribute")) {
    const Value* def = find_arg(a, 99, "default");
    for (const auto& it : r.iterate(v)) {
      Value x = attr_path(r, it, py_str(*attr));
      out.push_back(x.is_undefined() && def ? *def : x);
    }
  } else {
    if (a.pos.empty() || !a.pos[0].is_string()) r.error("map expects a filter name or attribute=");
    const std::string name = a.pos[0].s;
    if (!is_known_filter(name)) r.error("unsupported filter '" + name + "' in map");
    for (const auto& it : r.iterate(v)) {
      CallArgs rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      out.push_back(apply_filter(r, name, it, rest));
    }
  }
  return Value::make_list(std::move(out));
}

Value dictsort(Renderer& r, const Value& v, CallArgs& a) {
  if (!v.is_mapping()) r.error("dictsort expects a mapping");
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = find_arg(a, 1, "by");
  const size_t pos = by && by->is_string() && by->s == "value" ? 1 : 0;
  const bool reverse = arg_bool(a, 2, "reverse", false);
  List items;
  for (const auto& kv : *v.dict) items.push_back(Value::tuple({kv.first, kv.second}));
  const std::string where = r.template_name();
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key((*x.list)[pos], cs), ky = sort_key((*y.list)[pos], cs);
    return reverse ? py_less(ky, kx, where) : py_less(kx, ky, where);
  });
  return Value::make_list(std::move(items));
}

Value unique(Renderer& r, const Value& v, CallArgs& a) {
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attr = find_arg(a, 1, "attribute");
  List out, seen;
  for (const auto& it : r.iterate(v)) {
    const Value key = sort_key(attr ? attr_path(r, it, py_str(*attr)) : it, cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, key); }))
      seen.push_back(key), out.push_back(it);
  }
  return Value::make_list(std::move(out));
}

Value sum(Renderer& r, const Value& v, CallArgs& a) {
  const Value* attr = find_arg(a, 0, "attribute");
  const Value* start = find_arg(a, 1, "start");
  Value acc = start ? *start : Value::integer(0);
  for (const auto& it : r.iterate(v)) {
    acc = r.arith("+", acc, attr ? attr_path(r, it, py_str(*attr)) : it);
  }
  return acc;
}

Value absolute(Renderer& r, const Value& v, CallArgs&) {
  if (v.kind == Value::Kind::kFloat) return Value::real(std::fabs(v.f));
  if (v.is_number()) return Value::integer(std::llabs(v.kind == Value::Kind::kBool ? v.b : v.i));
  r.error(std::string("bad operand type for abs(): '") + type_name(v) + "'");
}

// Matches of Python's \w+: letters, digits and '_'.
Value wordcount(Renderer&, const Value& v, CallArgs&) {
  const std::string text = py_str(v);
  int64_t n = 0;
  bool in_word = false;
  for (size_t p = 0; p < text.size();) {
    int len = 1;
    const uint32_t cp = decode_at(text, p, len);
    p += size_t(len);
    const CharClass cls = classify(cp);
    const bool w = cp == '_' || cls == CharClass::kLetter || cls == CharClass::kNumber;
    n += w && !in_word;
    in_word = w;
  }
  return Value::integer(n);
}

Value trim(Renderer&, const Value& v, CallArgs& a) {
  const std::string s = py_str(v);
  const Value* chars = find_arg(a, 0, "chars");
  return Value::string(chars && chars->is_string() ? py_strip_chars(s, chars->s, true, true) : py_strip(s, true, true));
}

// jinja2 capitalises after whitespace and -([{<, and lowercases the rest.
Value title(Renderer&, const Value& v, CallArgs&) {
  std::string out;
  bool start = true;
  for (char c : py_str(v)) {
    out += start ? ascii_upper({&c, 1}) : ascii_lower({&c, 1});
    start = std::isspace(static_cast<unsigned char>(c)) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  }
  return Value::string(std::move(out));
}

Value replace(Renderer& r, const Value& v, CallArgs& a) {
  if (a.pos.size() < 2) r.error("replace expects (old, new[, count])");
  const Value* count = find_arg(a, 2, "count");
  return r.checked_string(
      py_replace(py_str(v), py_str(a.pos[0]), py_str(a.pos[1]), count && count->is_integer() ? count->i : -1));
}

using FilterFn = Value (*)(Renderer&, const Value&, CallArgs&);
struct Filter {
  const char* name;
  FilterFn apply;
};

// Every filter the parser accepts after `|`, by name.
const Filter kFilters[] = {
    {"abs", absolute},
    {"attr",
     [](Renderer& r, const Value& v, CallArgs& a) { return r.get_attr(v, a.pos.empty() ? "" : py_str(a.pos[0])); }},
    {"capitalize", [](Renderer&, const Value& v, CallArgs&) { return Value::string(py_capitalize(py_str(v))); }},
    {"count", length},
    {"d", default_value},
    {"default", default_value},
    {"dictsort", dictsort},
    {"e", [](Renderer&, const Value& v, CallArgs&) { return Value::string(html_escape(py_str(v))); }},
    {"escape", [](Renderer&, const Value& v, CallArgs&) { return Value::string(html_escape(py_str(v))); }},
    {"first", [](Renderer& r, const Value& v, CallArgs&) { return first_or_last(r, v, true); }},
    {"float",
     [](Renderer&, const Value& v, CallArgs& a) {
       return to_float(v, find_arg(a, 0, "default") ? *find_arg(a, 0, "default") : Value::real(0));
     }},
    {"indent", [](Renderer& r, const Value& v, CallArgs& a) { return r.checked_string(indent_text(py_str(v), a)); }},
    {"int",
     [](Renderer&, const Value& v, CallArgs& a) {
       return to_int(v, find_arg(a, 0, "default") ? *find_arg(a, 0, "default") : Value::integer(0));
     }},
    {"items", items},
    {"join", join},
    {"last", [](Renderer& r, const Value& v, CallArgs&) { return first_or_last(r, v, false); }},
    {"length", length},
    {"list", [](Renderer& r, const Value& v, CallArgs&) { return Value::make_list(r.iterate(v)); }},
    {"lower", [](Renderer&, const Value& v, CallArgs&) { return Value::string(ascii_lower(py_str(v))); }},
    {"map", map_items},
    {"reject", [](Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, false, false); }},
    {"rejectattr", [](Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, true, false); }},
    {"replace", replace},
    {"reverse", reversed},
    {"round", round_value},
    {"safe", [](Renderer&, const Value& v, CallArgs&) { return v; }},
    {"select", [](Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, false, true); }},
    {"selectattr", [](Renderer& r, const Value& v, CallArgs& a) { return select_items(r, v, a, true, true); }},
    {"sort", [](Renderer& r, const Value& v, CallArgs& a) { return sorted_items(r, r.iterate(v), a); }},
    {"string", [](Renderer&, const Value& v, CallArgs&) { return Value::string(py_str(v)); }},
    {"sum", sum},
    {"title", title},
    {"tojson", tojson},
    {"trim", trim},
    {"unique", unique},
    {"upper", [](Renderer&, const Value& v, CallArgs&) { return Value::string(ascii_upper(py_str(v))); }},
    {"wordcount", wordcount},
};

}  // namespace

bool is_known_filter(const std::string& name) {
  return std::any_of(std::begin(kFilters), std::end(kFilters), [&](const Filter& f) { return name == f.name; });
}

Value apply_filter(Renderer& r, const std::string& name, Value v, CallArgs& a) {
  for (const Filter& f : kFilters)
    if (name == f.name) return f.apply(r, v, a);
  r.error("unsupported filter '" + name + "'");
}

}  // namespace loom::data::jinja
