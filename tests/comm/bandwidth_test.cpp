// Bus-bandwidth factors (the nccl-tests conventions) and byte sizes of `loom bench comm`.
#include <gtest/gtest.h>

#include "loom/comm/bandwidth.h"
#include "loom/core/error.h"

using namespace loom;
using namespace loom::comm;

TEST(BusBandwidth, FactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 2), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("reduce_scatter", 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_gather", 8), 0.875);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_to_all", 2), 0.5);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("broadcast", 16), 1.0);
  EXPECT_DOUBLE_EQ(bus_bandwidth_factor("all_reduce", 1), 0.0);
  try {
    bus_bandwidth_factor("gossip", 4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'gossip'"), std::string::npos);
  }
}

TEST(BusBandwidth, ByteSizes) {
  EXPECT_EQ(parse_byte_size("4096"), 4096);
  EXPECT_EQ(parse_byte_size("1K"), 1024);
  EXPECT_EQ(parse_byte_size("256M"), int64_t(256) << 20);
  EXPECT_EQ(parse_byte_size("2G"), int64_t(2) << 30);
  EXPECT_THROW(parse_byte_size("lots"), Error);
  EXPECT_THROW(parse_byte_size("3X"), Error);
  EXPECT_THROW(parse_byte_size("0"), Error);
  EXPECT_EQ(short_byte_size(1024), "1K");
  EXPECT_EQ(short_byte_size(int64_t(64) << 20), "64M");
  EXPECT_EQ(short_byte_size(1000), "1000");
  EXPECT_EQ(short_byte_size(3072), "3K");
}
