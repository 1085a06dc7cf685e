// Thread-count control shared by our OpenMP kernels and OpenBLAS (one pool, one setting).
#pragma once

namespace loom {

// Sets the threads used by loom kernels and BLAS; n <= 0 keeps the current setting.
void set_num_threads(int n);
int num_threads();

}  // namespace loom
