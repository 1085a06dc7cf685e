#include <cstdio>

#include "tools/loom/commands.h"

namespace loom::cli {
int cmd_bench(const std::vector<std::string>&) {
  std::printf("bench: not yet\n");
  return 1;
}
}  // namespace loom::cli
