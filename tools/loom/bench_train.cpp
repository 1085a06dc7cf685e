#include <cstdio>

#include "tools/loom/commands.h"

namespace loom::cli {
int bench_train(const std::vector<std::string>&) {
  std::printf("bench train: in progress\n");
  return 1;
}
}  // namespace loom::cli
