// Stand-ins for the CUDA kernels in a build without a CUDA toolkit: each throws a clear error.
#include "loom/kernels/cuda/cuda_ops.h"

namespace loom::cuda {

static constexpr const char* kWhy =
    "this loom was built without CUDA; install the CUDA toolkit and rebuild "
    "(cmake -DLOOM_WITH_CUDA=ON) to use GPU tensors";

bool available() { return false; }
std::string describe() { return std::string("cuda: unavailable (") + kWhy + ")"; }
Allocator& allocator() { fail("cuda", kWhy); }
void copy(const Tensor&, const Tensor&) { fail("cuda", kWhy); }
void linear_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { fail("cuda", kWhy); }
void gelu_forward(const Tensor&, const Tensor&) { fail("cuda", kWhy); }

}  // namespace loom::cuda
