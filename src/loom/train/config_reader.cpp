#include "loom/train/config_reader.h"

#include <algorithm>

#include <cmath>
#include <map>
#include <sstream>

#include "loom/core/error.h"

namespace loom::train {

namespace {
std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> out;
  std::stringstream ss(p);
  std::string part;
  while (std::getline(ss, part, '.')) out.push_back(part);
  return out;
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsMap()) return "a mapping";
  if (n.IsSequence()) return "a list";
  return "null";
}
}  // namespace

ConfigReader::ConfigReader(YAML::Node root) : root_(std::move(root)) {
  if (!root_ || root_.IsNull()) root_ = YAML::Node(YAML::NodeType::Map);
  LOOM_CHECK(root_.IsMap(), "config", "the top level must be a mapping of sections, got ", scalar_text(root_));
}

void ConfigReader::apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  LOOM_CHECK(eq != std::string::npos && eq > 0, "config", "--set expects key=value (e.g. optim.lr=3e-4), got \"",
             assignment, "\"");
  const auto parts = split_path(assignment.substr(0, eq));
  for (const auto& p : parts) LOOM_CHECK(!p.empty(), "config", "--set ", assignment, ": empty key component");
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    fail("config", "--set ", assignment, ": cannot parse value: ", e.what());
  }
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  // Walk by node identity (operator[] on a copy would rebind, not assign).
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next.IsMap()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    }
    chain.push_back(next);
  }
  chain.back()[parts.back()] = value;
}

void ConfigReader::reject_duplicate_keys(const YAML::Node& root, const std::string& source) {
  std::vector<std::pair<std::string, YAML::Node>> stack{{"", root}};
  while (!stack.empty()) {
    auto [prefix, node] = stack.back();
    stack.pop_back();
    if (node.IsSequence())
      for (size_t i = 0; i < node.size(); ++i) stack.push_back({str_cat(prefix, "[", i, "]"), node[i]});
    if (!node.IsMap()) continue;
    std::map<std::string, int> line_of;  // key -> 1-based line of its first occurrence
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      const int line = it->first.Mark().line + 1;
      auto [first, fresh] = line_of.emplace(key, line);
      LOOM_CHECK(fresh, "config", source, ": ", path, " is given twice (lines ", first->second, " and ", line,
                 "); keep one");
      stack.push_back({path, it->second});
    }
  }
}

void ConfigReader::reject_duplicate_overrides(const std::vector<std::string>& assignments) {
  std::map<std::string, std::string> seen;  // key -> its first assignment
  for (const auto& a : assignments) {
    const std::string key = a.substr(0, a.find('='));
    auto [first, fresh] = seen.emplace(key, a);
    LOOM_CHECK(fresh, "config", "--set ", key, " is given twice (", first->second, " and ", a, "); give it once");
  }
}

YAML::Node ConfigReader::find(const std::string& path) const {
  YAML::Node cur = YAML::Clone(root_);
  for (const auto& p : split_path(path)) {
    if (!cur.IsMap()) return YAML::Node();
    YAML::Node next = cur[p];
    if (!next) return YAML::Node();
    cur = next;
  }
  return cur;
}

void ConfigReader::mark(const std::string& path) {
  std::string acc;
  for (const auto& p : split_path(path)) {
    acc = acc.empty() ? p : acc + "." + p;
    known_.insert(acc);
  }
}

void ConfigReader::known(const std::string& path) { mark(path); }

std::vector<std::string> ConfigReader::keys(const std::string& path) const {
  std::vector<std::string> out;
  const YAML::Node n = find(path);
  if (n && n.IsMap())
    for (const auto& kv : n) out.push_back(path + "." + kv.first.as<std::string>());
  return out;
}

bool ConfigReader::has(const std::string& path) const {
  YAML::Node n = find(path);
  return n && !n.IsNull();
}

namespace {
// The scalar at `path` as T (parsed whole by `parse`, e.g. std::stod), within [lo, hi]; `what`
// names the expected kind in the error.
template <class T, class Parse>
T read_scalar(const std::string& path, const YAML::Node& n, T lo, T hi, const char* what, Parse parse) {
  T v = 0;
  bool ok = n.IsScalar();
  if (ok) {
    try {
      size_t pos = 0;
      v = parse(n.Scalar(), &pos);
      ok = pos == n.Scalar().size() && std::isfinite(double(v));
    } catch (...) {
      ok = false;
    }
  }
  LOOM_CHECK(ok, "config", path, ": expected ", what, ", got \"", scalar_text(n), "\"");
  LOOM_CHECK(v >= lo && v <= hi, "config", path, ": ", v, " is out of range [", lo, ", ", hi, "]");
  return v;
}
}  // namespace

double ConfigReader::number(const std::string& path, double def, double lo, double hi) {
  mark(path);
  YAML::Node n = find(path);
  if (!n || n.IsNull()) return def;
  return read_scalar<double>(path, n, lo, hi, "a number",
                             [](const std::string& s, size_t* pos) { return std::stod(s, pos); });
}

int64_t ConfigReader::integer(const std::string& path, int64_t def, int64_t lo, int64_t hi) {
  mark(path);
  YAML::Node n = find(path);
  if (!n || n.IsNull()) return def;
  return read_scalar<int64_t>(path, n, lo, hi, "an integer",
                              [](const std::string& s, size_t* pos) { return int64_t(std::stoll(s, pos)); });
}

bool ConfigReader::boolean(const std::string& path, bool def) {
  mark(path);
  YAML::Node n = find(path);
  if (!n || n.IsNull()) return def;
  const std::string s = n.IsScalar() ? n.Scalar() : "";
  if (s == "true" || s == "True" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "False" || s == "no" || s == "off") return false;
  fail("config", path, ": expected true or false, got \"", scalar_text(n), "\"");
}

std::string ConfigReader::string(const std::string& path, const std::string& def,
                                 const std::vector<std::string>& choices) {
  mark(path);
  YAML::Node n = find(path);
  if (!n || n.IsNull()) return def;
  LOOM_CHECK(n.IsScalar(), "config", path, ": expected a string, got ", scalar_text(n));
  const std::string v = n.Scalar();
  if (!choices.empty()) {
    bool found = false;
    std::string list;
    for (const auto& c : choices) {
      found = found || c == v;
      list += (list.empty() ? "" : ", ") + c;
    }
    LOOM_CHECK(found, "config", path, ": \"", v, "\" is not one of: ", list);
  }
  return v;
}

std::vector<std::string> ConfigReader::strings(const std::string& path, const std::vector<std::string>& def,
                                               const std::vector<std::string>& choices) {
  mark(path);
  YAML::Node n = find(path);
  if (!n || n.IsNull()) return def;
  std::vector<std::string> out;
  if (n.IsScalar()) {  // "q,v" as well as [q, v]
    std::string item;
    for (char c : n.Scalar() + ",") {
      if (c != ',') {
        if (c != ' ') item += c;
        continue;
      }
      if (!item.empty()) out.push_back(item);
      item.clear();
    }
  } else {
    LOOM_CHECK(n.IsSequence(), "config", path, ": expected a list such as [q, v], got ", scalar_text(n));
    for (const YAML::Node& e : n) {
      LOOM_CHECK(e.IsScalar(), "config", path, ": expected a list of names, got an item ", scalar_text(e));
      out.push_back(e.Scalar());
    }
  }
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  for (const std::string& v : out)
    LOOM_CHECK(choices.empty() || std::find(choices.begin(), choices.end(), v) != choices.end(), "config", path, ": \"",
               v, "\" is not one of: ", list);
  return out;
}

void ConfigReader::reject_unknown() const {
  // Depth-first over the tree: every key path must have been read (or declared known).
  std::vector<std::pair<std::string, YAML::Node>> stack{{"", root_}};
  while (!stack.empty()) {
    auto [prefix, node] = stack.back();
    stack.pop_back();
    if (!node.IsMap()) continue;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string key = it->first.as<std::string>();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (!known_.count(path)) {
        std::string siblings;
        for (const auto& k : known_) {
          const bool child = prefix.empty()
                                 ? k.find('.') == std::string::npos
                                 : k.rfind(prefix + ".", 0) == 0 && k.find('.', prefix.size() + 1) == std::string::npos;
          if (child) siblings += (siblings.empty() ? "" : ", ") + k.substr(prefix.empty() ? 0 : prefix.size() + 1);
        }
        fail("config", path, ": unknown key", siblings.empty() ? "" : " (known keys here: " + siblings + ")");
      }
      stack.push_back({path, it->second});
    }
  }
}

}  // namespace loom::train
