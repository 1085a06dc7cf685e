// The message of the loom::Error a call throws, or "" when it throws none: for tests that
// check what an error says.
#pragma once
#include <functional>
#include <string>

#include "loom/core/error.h"

namespace loom::testing {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace loom::testing
