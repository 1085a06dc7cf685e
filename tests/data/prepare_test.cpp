// `loom prepare` as a library: tokens in == tokens out through the shards, the split is the
// tail of the stream, meta.json agrees, the unigram baseline, and every refusal's message.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "data/data_testing.h"
#include "loom/data/dataset.h"
#include "loom/data/prepare.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

std::vector<int32_t> all_tokens(const TokenDataset& d) {
  std::vector<int32_t> out(size_t(d.size()));
  d.read(0, d.size(), out.data());
  return out;
}

PrepareOptions options(const ScratchDir& dir, std::vector<std::string> inputs, std::string tokenizer) {
  PrepareOptions opt;
  opt.inputs = std::move(inputs);
  opt.tokenizer = std::move(tokenizer);
  opt.out_dir = (dir / "out").string();
  opt.data_dir = testing::repo_data_dir();
  return opt;
}

TEST(Prepare, TokensRoundTripThroughShards) {
  ScratchDir dir;
  const std::string a = "First document. It's short!\n", b = "Second one, with caf\xc3\xa9 and \xe4\xb8\xad.\n";
  write_bytes(dir / "a.txt", a);
  write_bytes(dir / "b.txt", b);
  PrepareOptions opt = options(dir, {(dir / "a.txt").string(), (dir / "b.txt").string()}, "gpt2");
  opt.val_fraction = 0.25;
  size_t last_progress = 0;
  opt.progress = [&](size_t done, size_t total) {
    EXPECT_EQ(total, a.size() + b.size());
    last_progress = done;
  };
  const PrepareResult r = prepare(opt);
  EXPECT_EQ(last_progress, a.size() + b.size());

  // Expected stream: <|endoftext|> before each document.
  std::vector<int32_t> expected = {50256};
  for (int32_t id : testing::gpt2().encode(a)) expected.push_back(id);
  expected.push_back(50256);
  for (int32_t id : testing::gpt2().encode(b)) expected.push_back(id);

  TokenDataset train = TokenDataset::open_split(opt.out_dir, "train", {.model_vocab = 50257, .verify = true});
  TokenDataset val = TokenDataset::open_split(opt.out_dir, "val", {.verify = true});
  std::vector<int32_t> got = all_tokens(train);
  const std::vector<int32_t> tail = all_tokens(val);
  got.insert(got.end(), tail.begin(), tail.end());
  EXPECT_EQ(got, expected);
  EXPECT_EQ(val.size(), int64_t(double(expected.size()) * 0.25));  // the last quarter
  EXPECT_EQ(r.train_tokens, train.size());
  EXPECT_EQ(r.val_tokens, val.size());
  EXPECT_EQ(train.header().tokenizer, "gpt2");
  EXPECT_EQ(train.header().token_bytes, 2u);
  EXPECT_EQ(train.header().eot_id, 50256u);
  EXPECT_EQ(val.header().split, "val");

  const auto meta = nlohmann::json::parse(read_bytes(dir / "out/meta.json"));
  EXPECT_EQ(meta["tokenizer"], "gpt2");
  EXPECT_EQ(meta["vocab_size"], 50257);
  EXPECT_EQ(meta["train"]["tokens"], train.size());
  EXPECT_EQ(meta["val"]["tokens"], val.size());
  ASSERT_EQ(meta["sources"].size(), 2u);
  EXPECT_EQ(meta["sources"][1]["bytes"], b.size());
  EXPECT_FALSE(std::filesystem::exists(dir / "out/.all.tokens"));
}

TEST(Prepare, ByteTokenizerKeepsBytesAndNoEot) {
  ScratchDir dir;
  std::string text;
  for (int i = 0; i < 500; ++i) text += "line " + std::to_string(i) + "\n";
  write_bytes(dir / "t.txt", text);
  const PrepareResult r = prepare(options(dir, {(dir / "t.txt").string()}, "byte"));
  TokenDataset train = TokenDataset::open_split((dir / "out").string(), "train");
  TokenDataset val = TokenDataset::open_split((dir / "out").string(), "val");
  EXPECT_EQ(train.header().vocab_size, 256u);
  EXPECT_EQ(train.header().eot_id, kNoEot);
  EXPECT_EQ(train.size() + val.size(), int64_t(text.size()));
  EXPECT_EQ(val.token(0), uint8_t(text[size_t(train.size())]));
  EXPECT_GT(r.unigram_val_nats, 1.0);
  EXPECT_LT(r.unigram_val_nats, std::log(256.0));
}

TEST(Prepare, UnigramCrossEntropyIsSmoothedFrequencies) {
  // Fit counts {3, 1, 0} (n=4, V=3): p = (c + 1/2) / (4 + 3/2). Eval: one id 0 and one id 2.
  const std::vector<int64_t> fit = {3, 1, 0}, eval = {1, 0, 1};
  const double expected = -(std::log(3.5 / 5.5) + std::log(0.5 / 5.5)) / 2;
  EXPECT_NEAR(unigram_cross_entropy(fit, 4, eval), expected, 1e-12);
  EXPECT_TRUE(std::isnan(unigram_cross_entropy(fit, 4, std::vector<int64_t>{0, 0, 0})));
}

TEST(Prepare, RefusesBadInputsBeforeWriting) {
  ScratchDir dir;
  write_bytes(dir / "empty.txt", "");
  std::string garbage(1000, '\0');
  for (size_t i = 0; i < garbage.size(); i += 3) garbage[i] = 'a';
  write_bytes(dir / "blob.bin", garbage);
  write_bytes(dir / "ok.txt", "fine text\n");

  std::string e = error_of([&] { prepare(options(dir, {(dir / "missing.txt").string()}, "gpt2")); });
  EXPECT_NE(e.find("[prepare] cannot open"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.txt"), std::string::npos) << e;

  e = error_of([&] { prepare(options(dir, {(dir / "ok.txt").string(), (dir / "empty.txt").string()}, "gpt2")); });
  EXPECT_NE(e.find("empty.txt is empty"), std::string::npos) << e;

  e = error_of([&] { prepare(options(dir, {(dir / "blob.bin").string()}, "byte")); });
  EXPECT_NE(e.find("blob.bin looks binary"), std::string::npos) << e;
  EXPECT_NE(e.find("66.6%"), std::string::npos) << e;  // 666 of 1000 bytes are NUL

  e = error_of([&] { prepare(options(dir, {(dir / "ok.txt").string()}, "nope")); });
  EXPECT_NE(e.find("unknown tokenizer 'nope'"), std::string::npos) << e;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));  // nothing written by any refusal
}

TEST(Prepare, ExistingOutputNeedsForce) {
  ScratchDir dir;
  write_bytes(dir / "ok.txt", "some words, then more words\n");
  PrepareOptions opt = options(dir, {(dir / "ok.txt").string()}, "byte");
  prepare(opt);
  const std::string e = error_of([&] { prepare(opt); });
  EXPECT_NE(e.find("already exists"), std::string::npos) << e;
  EXPECT_NE(e.find("--force"), std::string::npos) << e;
  const std::string longer = "different and longer text this time around\n";
  write_bytes(dir / "ok.txt", longer);
  opt.force = true;
  const PrepareResult r = prepare(opt);
  EXPECT_EQ(r.train_tokens + r.val_tokens, int64_t(longer.size()));
  EXPECT_EQ(TokenDataset::open_split(opt.out_dir, "train").size(), r.train_tokens);
}

}  // namespace
}  // namespace loom::data
