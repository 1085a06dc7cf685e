// The NCCL group the NCCL tests share (set up by tests/cuda/nccl/main.cpp), and their fixture:
// skip without a GPU (fail under LOOM_TEST_REQUIRE_GPU=1, see cuda/gpu_test.h), fail when the
// group could not be set up.
#pragma once
#include <string>

#include "cuda/gpu_test.h"
#include "loom/comm/group.h"

// Null without a GPU or when setup failed (nccl_setup_error() says why).
const loom::comm::Group* nccl_world();
const std::string& nccl_setup_error();

class NcclTest : public loom::testing::GpuTest {
 protected:
  void SetUp() override {
    loom::testing::GpuTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    if (!nccl_setup_error().empty()) FAIL() << nccl_setup_error();
    ASSERT_NE(nccl_world(), nullptr) << "[nccl test] no NCCL group was set up";
  }
  const loom::comm::Group& g() const { return *nccl_world(); }
};
