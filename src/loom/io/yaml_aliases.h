// The one refusal of YAML aliases (*name) that every YAML reader in loom applies before it
// loads a text: nested aliases expand exponentially when the tree is walked (an alias bomb).
// No YAML loading or typed reading here; train/config_reader.h and plan/cluster.h do that.
#pragma once
#include <string>

namespace loom::io {

// Throws "[TAG] SOURCE:LINE: YAML aliases (*name) are not accepted in WHAT; ..." at the first
// alias of `text`; malformed YAML passes, for the loader to report with its own message.
void reject_yaml_aliases(const std::string& text, const std::string& source, const char* tag, const char* what);

}  // namespace loom::io
