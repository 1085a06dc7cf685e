// Stand-in for the NCCL backend in a build without CUDA: asking for a NCCL group throws.
#include "loom/comm/nccl.h"

namespace loom::comm {

static constexpr const char* kWhy =
    "this loom was built without NCCL; install the CUDA toolkit and NCCL and rebuild "
    "(cmake -DLOOM_WITH_CUDA=ON), or use the MPI group for CPU tensors";

bool nccl_available() { return false; }
std::string nccl_describe() { return std::string("nccl: unavailable (") + kWhy + ")"; }
Group nccl_group(const Group&, int, const std::string&) { fail("comm", kWhy); }

}  // namespace loom::comm
