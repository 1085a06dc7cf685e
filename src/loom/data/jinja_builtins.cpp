// The global functions transformers gives chat templates (range, namespace, dict, raise_exception,
// strftime_now) and the Python methods templates call on values (str.strip, dict.items, ...).
// Methods that would mutate a list or dict fail, as in jinja2's ImmutableSandboxedEnvironment.
#include <algorithm>
#include <ctime>

#include "loom/core/error.h"
#include "loom/data/jinja_render.h"
#include "loom/data/jinja_text.h"

namespace loom::data::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2's sandbox refuses larger ranges (MAX_RANGE)

const char* const kStrMethods[] = {"strip", "lstrip", "rstrip",     "startswith", "endswith", "split",
                                   "upper", "lower",  "title",      "capitalize", "replace",  "join",
                                   "find",  "count",  "splitlines", "isdigit",    "isspace"};
const char* const kDictMethods[] = {"items", "keys", "values", "get"};
const char* const kMutators[] = {"append", "extend",  "insert", "pop",        "remove", "clear",
                                 "sort",   "reverse", "update", "setdefault", "popitem"};

bool in_list(const std::string& name, const char* const* b, const char* const* e) {
  return std::any_of(b, e, [&](const char* m) { return name == m; });
}

int64_t int_arg(Renderer& r, const Value& v, const char* what) {
  if (v.kind == Value::Kind::kBool) return v.b;
  if (!v.is_integer()) r.error(std::string(what) + " expects an integer, got '" + type_name(v) + "'");
  return v.i;
}

std::string str_arg(Renderer& r, const CallArgs& a, size_t i, const std::string& method) {
  if (i >= a.pos.size() || !a.pos[i].is_string()) r.error("str." + method + "() expects a string argument");
  return a.pos[i].s;
}

Value range_fn(Renderer& r, CallArgs& a) {
  if (a.pos.empty() || a.pos.size() > 3) r.error("range expects 1 to 3 integer arguments");
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = int_arg(r, a.pos[0], "range");
  } else {
    start = int_arg(r, a.pos[0], "range");
    stop = int_arg(r, a.pos[1], "range");
    if (a.pos.size() == 3) step = int_arg(r, a.pos[2], "range");
  }
  if (step == 0) r.error("range() arg 3 must not be zero");
  const double n = std::max(0.0, std::ceil((double(stop) - double(start)) / double(step)));
  if (n > double(kMaxRange)) r.error("range of more than 100000 items (the sandbox limit)");
  List out;
  for (int64_t k = 0; k < int64_t(n); ++k) out.push_back(Value::integer(start + k * step));
  return Value::make_list(std::move(out));
}

Value dict_from_args(Renderer& r, CallArgs& a, Value d) {
  if (a.pos.size() > 1) r.error("namespace()/dict() take at most one positional argument");
  if (a.pos.size() == 1) {
    if (!a.pos[0].is_mapping()) r.error("namespace()/dict() expect a mapping as positional argument");
    for (const auto& kv : *a.pos[0].dict) d.set(kv.first, kv.second);
  }
  for (const auto& kw : a.kw) d.set(Value::string(kw.first), kw.second);
  return d;
}

Value strftime_fn(Renderer& r, CallArgs& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string()) r.error("strftime_now expects one format string");
  std::tm tm{};
  if (r.options().now) {
    tm = *r.options().now;
  } else {
    const std::time_t t = std::time(nullptr);
    localtime_r(&t, &tm);
  }
  char buf[512];
  const size_t n = a.pos[0].s.empty() ? 0 : std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
  if (n == 0 && !a.pos[0].s.empty())
    r.error("strftime_now format '" + a.pos[0].s + "' gives an empty or too long result");
  return Value::string(std::string(buf, n));
}

bool starts_or_ends(Renderer& r, const std::string& s, const Value& affix, bool ends, const std::string& method) {
  if (affix.is_sequence()) {
    for (const auto& v : *affix.list)
      if (starts_or_ends(r, s, v, ends, method)) return true;
    return false;
  }
  if (!affix.is_string()) r.error("str." + method + "() expects a string or a tuple of strings");
  const std::string& x = affix.s;
  if (x.size() > s.size()) return false;
  return ends ? s.compare(s.size() - x.size(), x.size(), x) == 0 : s.compare(0, x.size(), x) == 0;
}

Value string_method(Renderer& r, const std::string& s, const std::string& m, CallArgs& a) {
  auto strip = [&](bool l, bool rt) {
    if (a.pos.empty() || a.pos[0].is_none()) return Value::string(py_strip(s, l, rt));
    return Value::string(py_strip_chars(s, str_arg(r, a, 0, m), l, rt));
  };
  if (m == "strip") return strip(true, true);
  if (m == "lstrip") return strip(true, false);
  if (m == "rstrip") return strip(false, true);
  if (m == "startswith" || m == "endswith") {
    if (a.pos.empty()) r.error("str." + m + "() expects an argument");
    return Value::boolean(starts_or_ends(r, s, a.pos[0], m == "endswith", m));
  }
  if (m == "split") {
    const Value* sep = !a.pos.empty() ? &a.pos[0] : nullptr;
    for (const auto& kw : a.kw)
      if (kw.first == "sep") sep = &kw.second;
    int64_t maxsplit = a.pos.size() > 1 ? int_arg(r, a.pos[1], "split") : -1;
    for (const auto& kw : a.kw)
      if (kw.first == "maxsplit") maxsplit = int_arg(r, kw.second, "split");
    std::vector<std::string> parts;
    if (!sep || sep->is_none()) {
      parts = py_split_ws(s, maxsplit);
    } else {
      if (!sep->is_string() || sep->s.empty()) r.error("str.split() separator must be a non-empty string");
      parts = py_split(s, sep->s, maxsplit);
    }
    List out;
    for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    return Value::make_list(std::move(out));
  }
  if (m == "splitlines") {
    List out;
    std::vector<std::string> parts = py_split(s, "\n", -1);
    if (!parts.empty() && parts.back().empty()) parts.pop_back();
    for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    return Value::make_list(std::move(out));
  }
  if (m == "upper") return Value::string(ascii_upper(s));
  if (m == "lower") return Value::string(ascii_lower(s));
  if (m == "title") return Value::string(py_title(s));
  if (m == "capitalize") return Value::string(py_capitalize(s));
  if (m == "replace") {
    const int64_t count = a.pos.size() > 2 ? int_arg(r, a.pos[2], "replace") : -1;
    return r.checked_string(py_replace(s, str_arg(r, a, 0, m), str_arg(r, a, 1, m), count));
  }
  if (m == "join") {
    if (a.pos.size() != 1) r.error("str.join() expects one iterable");
    std::string out;
    bool first = true;
    for (const auto& v : r.iterate(a.pos[0])) {
      if (!v.is_string()) r.error(std::string("str.join() expects strings, found '") + type_name(v) + "'");
      if (!first) out += s;
      out += v.s;
      first = false;
      if (out.size() > r.options().max_output_bytes) break;
    }
    return r.checked_string(std::move(out));
  }
  if (m == "find" || m == "count") {
    const std::string sub = str_arg(r, a, 0, m);
    if (m == "find") {
      const size_t p = s.find(sub);
      return Value::integer(p == std::string::npos ? -1 : int64_t(code_point_count(std::string_view(s).substr(0, p))));
    }
    if (sub.empty()) return Value::integer(int64_t(code_point_count(s)) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (m == "isdigit")
    return Value::boolean(!s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
  if (m == "isspace") return Value::boolean(!s.empty() && py_strip(s, true, true).empty());
  r.error("unsupported method str." + m + "()");
}

}  // namespace

void add_global_functions(std::vector<std::pair<std::string, Value>>& g) {
  g.emplace_back("range", Value::callable("range", range_fn));
  g.emplace_back("namespace", Value::callable("namespace", [](Renderer& r, CallArgs& a) {
                   return dict_from_args(r, a, r.new_namespace());
                 }));
  g.emplace_back("dict", Value::callable("dict", [](Renderer& r, CallArgs& a) {
                   return dict_from_args(r, a, Value::make_dict());
                 }));
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](Renderer& r, CallArgs& a) -> Value {
                   fail("chat-template", r.template_name(),
                        ": the template raised: ", a.pos.empty() ? std::string() : py_str(a.pos[0]));
                 }));
  g.emplace_back("strftime_now", Value::callable("strftime_now", strftime_fn));
}

bool has_method(const Value& self, const std::string& name) {
  if (self.is_string()) return in_list(name, std::begin(kStrMethods), std::end(kStrMethods));
  if (self.kind == Value::Kind::kDict)
    return in_list(name, std::begin(kDictMethods), std::end(kDictMethods)) ||
           in_list(name, std::begin(kMutators), std::end(kMutators));
  if (self.is_sequence()) return in_list(name, std::begin(kMutators), std::end(kMutators));
  return false;
}

Value call_method(Renderer& r, const Value& self, const std::string& m, CallArgs& a) {
  if (in_list(m, std::begin(kMutators), std::end(kMutators)))
    r.error("access to attribute '" + m + "' of '" + type_name(self) +
            "' object is unsafe: chat templates render in an immutable sandbox (use namespace() to accumulate)");
  if (self.is_string()) return string_method(r, self.s, m, a);
  if (m == "get") {
    if (a.pos.empty() || a.pos.size() > 2) r.error("dict.get() expects (key[, default])");
    const Value* v = self.find(a.pos[0]);
    return v ? *v : a.pos.size() > 1 ? a.pos[1] : Value::none();
  }
  List out;
  for (const auto& kv : *self.dict) {
    if (m == "items")
      out.push_back(Value::tuple({kv.first, kv.second}));
    else
      out.push_back(m == "keys" ? kv.first : kv.second);
  }
  return Value::make_list(std::move(out));
}

}  // namespace loom::data::jinja
