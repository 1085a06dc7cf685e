// gtest main of the NCCL tests: one rank per GPU (mpiexec -n <GPUs>, or alone as a world of
// one). Each rank drives the GPU of its rank on the host and joins one NCCL group over the
// world, which the tests share; ranks other than 0 print only their failures.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

#include "cuda/nccl/nccl_world.h"
#include "loom/comm/nccl.h"
#include "loom/comm/world.h"
#include "loom/kernels/cuda/cuda_ops.h"
#include "testing/rank_output.h"

namespace {

const loom::comm::Group* g_nccl = nullptr;
std::string g_setup_error;

}  // namespace

const loom::comm::Group* nccl_world() { return g_nccl; }
const std::string& nccl_setup_error() { return g_setup_error; }

int main(int argc, char** argv) {
  using namespace loom;
  comm::WorldOptions opts;
  opts.watchdog_timeout_s = 120;  // a desynchronised failing test ends instead of hanging
  comm::World world(&argc, &argv, opts);
  ::testing::InitGoogleTest(&argc, argv);
  loom::testing::quiet_unless_rank0(world.rank());
  bool ready = false;  // this rank has its GPU
  int devices = 0;
  if (cuda::available() && cudaGetDeviceCount(&devices) == cudaSuccess) {
    const int local = world.host().rank();
    if (world.host().size() > devices)
      g_setup_error = str_cat("[nccl test] ", world.host().size(), " ranks on this host but ", devices,
                              " GPU(s): NCCL needs one GPU per rank; run mpiexec -n ", devices);
    else if (cudaSetDevice(local) != cudaSuccess)  // for the allocator and cuda::copy too
      g_setup_error = str_cat("[nccl test] cudaSetDevice(", local, ") failed");
    else
      ready = true;
  }
  // Every rank joins the NCCL group or none does: its initialisation waits for every rank.
  Tensor all_ready = Tensor::from_vector<int32_t>({ready ? 1 : 0}, {1});
  world.group().all_reduce(all_ready, comm::ReduceOp::min);
  if (ready && all_ready.data<int32_t>()[0] == 0)
    g_setup_error = "[nccl test] another rank has no usable GPU (see its messages); every rank needs one";
  comm::Group nccl;  // invalid until set up
  if (all_ready.data<int32_t>()[0] == 1) {
    try {
      nccl = comm::nccl_group(world.group(), world.host().rank(), "nccl");
      g_nccl = &nccl;
      if (world.rank() == 0) {
        std::printf("[nccl test] %s, %d rank(s), %s\n", comm::nccl_describe().c_str(), world.size(),
                    cuda::describe().c_str());
        if (world.size() == 1)
          std::printf(
              "[nccl test] one rank: sum, max, min and avg of one input are that input, so this run "
              "checks the NCCL calls, dtypes and sizes but verifies no reduction (that needs 2 GPUs or "
              "more: mpiexec -n <GPUs>, as scripts/gpu-check.sh runs it)\n");
      }
    } catch (const Error& e) {
      // A peer may wait in NCCL's initialisation for this rank: end the whole job.
      std::fprintf(stderr, "[rank %d] %s\n", world.rank(), e.what());
      comm::abort_job(1);
    }
  }
  const int rc = RUN_ALL_TESTS();
  g_nccl = nullptr;
  nccl = comm::Group();  // destroyed before the World
  return rc;
}
