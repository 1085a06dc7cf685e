// A small MPI program for the process-level comm tests (tests/comm/*.sh): ranks that stall,
// die or fail on purpose so the watchdog and `loom launch` can be checked from outside.
//   comm_test_child hello      each rank prints "hello from rank R of N"
//   comm_test_child stall      the last rank sleeps instead of joining all_reduce #2
//   comm_test_child kill       the last rank SIGKILLs itself before all_reduce #2
//   comm_test_child fail       rank 1 throws; the others wait in a barrier
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "loom/comm/world.h"

using namespace loom;

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "hello";
  try {
    comm::World world(&argc, &argv);
    const comm::Group& g = world.group();
    const int last = g.size() - 1;
    if (mode == "hello") {
      g.barrier();
      std::printf("hello from rank %d of %d\n", g.rank(), g.size());
      return 0;
    }
    Tensor t = Tensor::zeros({1 << 20}, DType::f32);  // 4 MiB
    g.all_reduce(t);                                  // #1 completes everywhere
    if (mode == "stall" && g.rank() == last) {
      std::this_thread::sleep_for(std::chrono::seconds(120));
    } else if (mode == "kill" && g.rank() == last) {
      std::raise(SIGKILL);
    } else if (mode == "fail" && g.rank() == 1) {
      fail("child", "rank 1 fails on purpose");
    } else if (mode == "fail") {
      g.barrier();
    }
    g.all_reduce(t);  // #2: hangs on the healthy ranks in stall/kill
    std::printf("rank %d finished\n", g.rank());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
