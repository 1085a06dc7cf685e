// For gtest binaries under mpiexec: ranks other than 0 print only their failed assertions,
// prefixed with the rank, so one rank's report is read instead of N interleaved ones.
#pragma once
#include <gtest/gtest.h>

#include <cstdio>

namespace loom::testing {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

// Call after InitGoogleTest.
inline void quiet_unless_rank0(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace loom::testing
