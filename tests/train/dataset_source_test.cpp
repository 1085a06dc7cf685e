// The trainer's data directory: train.bin and val.bin are verified when DatasetSource opens
// them, so a corrupted shard or an id outside the vocabulary stops the run before step 0
// (val.bin's used to surface only at the final evaluation).
#include <gtest/gtest.h>

#include "data/data_testing.h"
#include "loom/train/dataset_source.h"
#include "train/train_testing.h"

using namespace loom;
using namespace loom::train;

namespace {

TrainConfig byte_config(const std::string& data_dir) {
  return parse_train_config(loom::testing::tiny_config_yaml(data_dir, ""), {});
}

}  // namespace

TEST(DatasetSource, OutOfRangeValIdIsRefusedAtOpen) {
  const std::string dir = loom::testing::temp_dir("source_val_id");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  const std::string val = data + "/val.bin";
  data::testing::write_token_and_reseal(val, 100, 300);  // byte vocabulary: 256 ids
  const std::string e = data::testing::error_of([&] { DatasetSource src(byte_config(data), nullptr); });
  EXPECT_EQ(e.rfind("[data] " + val +
                        ": token id 300 at token 100 (byte offset 328) is outside the vocabulary "
                        "of 256 (header vocab_size)",
                    0),
            0u)
      << e;
}

TEST(DatasetSource, CorruptTrainShardIsRefusedAtOpen) {
  const std::string dir = loom::testing::temp_dir("source_flip");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  ASSERT_TRUE(loom::testing::flip_byte(data + "/train.bin", 5000, 0x01));  // stays a byte value
  const std::string e = data::testing::error_of([&] { DatasetSource src(byte_config(data), nullptr); });
  EXPECT_EQ(e.rfind("[data] " + data + "/train.bin: payload checksum 0x", 0), 0u) << e;
  EXPECT_NE(e.find("the file is corrupted; re-run loom prepare to rebuild it"), std::string::npos) << e;
}

TEST(DatasetSource, ValMustComeFromTheSamePrepareAsTrain) {
  const std::string dir = loom::testing::temp_dir("source_mismatch");
  const std::string data = loom::testing::prepare_shakespeare(dir, 20000);
  data::ShardHeader h;
  h.token_bytes = 2;
  h.vocab_size = 200;
  h.tokenizer = "other";
  h.split = "val";
  data::ShardWriter w(data + "/val.bin", h);
  const std::vector<int32_t> ids(100, 7);
  w.append(ids);
  w.finish();
  const std::string e = data::testing::error_of([&] { DatasetSource src(byte_config(data), nullptr); });
  EXPECT_EQ(e, "[data] " + data + "/val.bin has vocab_size 200 (tokenizer other) but " + data +
                   "/train.bin has 256 (tokenizer byte); both must come from one loom prepare run; re-run loom prepare")
      << e;
}
