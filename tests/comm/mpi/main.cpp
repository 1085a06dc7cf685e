// gtest main for the comm tests that run under mpiexec: creates the World, shares its group
// with the tests, and keeps ranks other than 0 quiet except for their failures.
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/mpi/mpi_world.h"

namespace {

const loom::comm::Group* g_world = nullptr;

// On ranks > 0: print only failed assertions, prefixed with the rank.
class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

const loom::comm::Group& test_world() { return *g_world; }

int main(int argc, char** argv) {
  loom::comm::WorldOptions opts;
  opts.backend = loom::comm::WorldBackend::mpi;
  opts.watchdog_timeout_s = 60;  // a desynchronised failing test ends instead of hanging
  loom::comm::World world(&argc, &argv, opts);
  g_world = &world.group();
  testing::InitGoogleTest(&argc, argv);
  if (world.rank() != 0) {
    auto& listeners = testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(world.rank()));
  }
  int rc = RUN_ALL_TESTS();
  g_world = nullptr;
  return rc;
}
