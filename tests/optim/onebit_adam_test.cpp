// optim::OneBitAdam on one process: the warm-up ends at freeze_step, one exchange per unit of
// the unit's size, and optimizer_name/optimizer_from_name round-trip the optim.name values.
// Its compressed steps across ranks are tested under mpiexec (tests/parallel/mpi).
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/optim/onebit_adam.h"

using namespace loom;

TEST(OneBitAdam, CompressesFromTheFreezeStepWithOneExchangePerUnit) {
  optim::AdamWConfig cfg;
  cfg.kind = optim::OptimizerKind::onebit_adam;
  cfg.freeze_step = 3;
  optim::OneBitAdam adam(comm::Group::single(), cfg, {64, 0, 1024});
  EXPECT_FALSE(adam.compressing(2));
  EXPECT_TRUE(adam.compressing(3));
  ASSERT_EQ(adam.exchanges().size(), 3u);
  EXPECT_EQ(adam.exchanges()[2]->size(), 1024);
  const auto totals = adam.take_totals();
  EXPECT_EQ(totals.wire_bytes, 0);
}

TEST(OptimizerKind, NamesRoundTripAndUnknownNamesAreRefused) {
  for (auto k : {optim::OptimizerKind::adamw, optim::OptimizerKind::onebit_adam})
    EXPECT_EQ(optim::optimizer_from_name(optim::optimizer_name(k)), k);
  try {
    optim::optimizer_from_name("sgd");
    FAIL() << "sgd was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("optim.name 'sgd' is not adamw or onebit_adam"), std::string::npos)
        << e.what();
  }
}
