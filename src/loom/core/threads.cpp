#include "loom/core/threads.h"

#include <omp.h>

extern "C" void openblas_set_num_threads(int);

namespace loom {

void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace loom
