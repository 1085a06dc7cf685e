// Typed reading of a YAML tree with errors that name the key path: every key must be known,
// every value must have the right type and range, before any work starts. `--set a.b=v`
// overrides are applied to the tree first, so they are checked the same way.
#pragma once
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

class ConfigReader {
 public:
  explicit ConfigReader(YAML::Node root);

  // Applies "a.b.c=value" (value parsed as a YAML scalar); throws on malformed input.
  static void apply_override(YAML::Node& root, const std::string& assignment);
  // Throws naming the key path and both lines when a mapping repeats a key (yaml-cpp would
  // silently use the first), and when two --set assignments name the same key.
  static void reject_duplicate_keys(const YAML::Node& root, const std::string& source);
  static void reject_duplicate_overrides(const std::vector<std::string>& assignments);

  bool has(const std::string& path) const;
  // The keys a mapping holds ("model" -> {"model.preset", "model.moe", ...}); none when the path
  // is absent or not a mapping.
  std::vector<std::string> keys(const std::string& path) const;
  double number(const std::string& path, double def, double lo, double hi);
  int64_t integer(const std::string& path, int64_t def, int64_t lo, int64_t hi);
  bool boolean(const std::string& path, bool def);
  std::string string(const std::string& path, const std::string& def, const std::vector<std::string>& choices = {});
  // A list of names, written [a, b] or "a,b"; each must be one of `choices` (when given).
  std::vector<std::string> strings(const std::string& path, const std::vector<std::string>& def,
                                   const std::vector<std::string>& choices = {});
  // A value from a closed set, returned as its enum: `names` pairs each accepted spelling with
  // its value; any other spelling is refused with the list.
  template <class E>
  E choice(const std::string& path, E def, const std::vector<std::pair<std::string, E>>& names) {
    std::string def_name;
    std::vector<std::string> spellings;
    for (const auto& [name, value] : names) {
      spellings.push_back(name);
      if (value == def) def_name = name;
    }
    const std::string v = string(path, def_name, spellings);
    for (const auto& [name, value] : names)
      if (name == v) return value;
    return def;
  }
  // Marks a section as known (for sections read by another component).
  void known(const std::string& path);
  // Throws "[config] a.b: unknown key (known keys: ...)" for any key nobody read.
  void reject_unknown() const;

 private:
  YAML::Node find(const std::string& path) const;  // null node when absent
  void mark(const std::string& path);
  YAML::Node root_;
  std::set<std::string> known_;
};

}  // namespace loom::train
