// gtest main for the comm tests that run under mpiexec: creates the World, shares its group
// with the tests, and keeps ranks other than 0 quiet except for their failures.
#include <gtest/gtest.h>

#include "comm/mpi/mpi_world.h"
#include "testing/rank_output.h"

namespace {

const loom::comm::Group* g_world = nullptr;

}  // namespace

const loom::comm::Group& test_world() { return *g_world; }

int main(int argc, char** argv) {
  loom::comm::WorldOptions opts;
  opts.backend = loom::comm::WorldBackend::mpi;
  opts.watchdog_timeout_s = 60;  // a desynchronised failing test ends instead of hanging
  loom::comm::World world(&argc, &argv, opts);
  g_world = &world.group();
  testing::InitGoogleTest(&argc, argv);
  loom::testing::quiet_unless_rank0(world.rank());
  int rc = RUN_ALL_TESTS();
  g_world = nullptr;
  return rc;
}
