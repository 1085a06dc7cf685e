// An empty directory of this process's own under the system's temporary directory, for tests that
// write files (removed and made again on every call with the same name).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

namespace loom::testing {

inline std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("loom_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace loom::testing
