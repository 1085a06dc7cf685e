// Loading a YAML text the one way every YAML reader in loom does (train configs, plan
// clusters): aliases (*name) refused first, since nested ones expand exponentially when the
// tree is walked (an alias bomb), then the text parsed. Typed reading is the callers'.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>

namespace loom::io {

// The document of `text`. Throws "[TAG] SOURCE:LINE: YAML aliases (*name) are not accepted in
// WHAT; ..." at the first alias, and "[TAG] SOURCE: not valid YAML: ..." for malformed text.
YAML::Node load_yaml(const std::string& text, const std::string& source, const char* tag, const char* what);

}  // namespace loom::io
