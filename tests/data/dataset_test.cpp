// The loader: shard validation messages, training windows as a pure function of
// (seed, step, sequence), rank/micro-batch slices that reassemble the global batch, resume,
// and the sequential validation walk.
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "data/data_testing.h"
#include "loom/data/dataset.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

// A shard whose token at position i is i % vocab, so a window shows where it starts.
std::string make_shard(const ScratchDir& dir, const std::string& name, int64_t n, uint32_t vocab,
                       const std::string& tokenizer = "test") {
  ShardHeader h;
  h.token_bytes = token_bytes_for_vocab(vocab);
  h.vocab_size = vocab;
  h.tokenizer = tokenizer;
  h.split = "train";
  const std::string path = (dir / name).string();
  ShardWriter w(path, h);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(i % vocab);
  w.append(ids);
  w.finish();
  return path;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
  bool operator==(const Batch&) const = default;
};

Batch batch(const TokenDataset& d, int64_t step, int64_t first, int64_t n, int64_t global, int64_t T) {
  Batch b{std::vector<int32_t>(size_t(n * T)), std::vector<int32_t>(size_t(n * T))};
  d.fill_batch(step, first, n, global, T, b.tokens.data(), b.targets.data());
  return b;
}

TEST(Dataset, WindowsAreContiguousAndTargetsShifted) {
  ScratchDir dir;
  const TokenDataset d(make_shard(dir, "s.bin", 3000, 4000), {.seed = 7});
  const int64_t T = 16;
  const Batch b = batch(d, 3, 0, 4, 4, T);
  for (int64_t r = 0; r < 4; ++r) {
    const int32_t start = b.tokens[size_t(r * T)];
    EXPECT_EQ(start, d.window_start(3, r, 4, T));
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(b.tokens[size_t(r * T + t)], start + t);
      EXPECT_EQ(b.targets[size_t(r * T + t)], start + t + 1);
    }
  }
}

TEST(Dataset, BatchesArePureFunctionsOfSeedAndStep) {
  ScratchDir dir;
  const std::string path = make_shard(dir, "s.bin", 5000, 5000);
  const TokenDataset a(path, {.seed = 42}), b(path, {.seed = 42}), other(path, {.seed = 43});
  EXPECT_EQ(batch(a, 5, 0, 8, 8, 32), batch(b, 5, 0, 8, 8, 32));
  EXPECT_NE(batch(a, 5, 0, 8, 8, 32), batch(a, 6, 0, 8, 8, 32));
  EXPECT_NE(batch(a, 5, 0, 8, 8, 32), batch(other, 5, 0, 8, 8, 32));
  // Resume: a loader opened fresh at step 10 sees what the first one saw at step 10,
  // whatever it did before.
  for (int64_t s = 0; s < 10; ++s) batch(a, s, 0, 8, 8, 32);
  const TokenDataset restarted(path, {.seed = 42});
  EXPECT_EQ(batch(restarted, 10, 0, 8, 8, 32), batch(a, 10, 0, 8, 8, 32));
}

TEST(Dataset, RankAndMicroBatchSlicesRebuildTheGlobalBatch) {
  ScratchDir dir;
  const TokenDataset d(make_shard(dir, "s.bin", 10000, 10000), {.seed = 1});
  const int64_t global = 12, T = 8;
  for (int64_t world : {1, 2, 3, 4}) {
    for (int64_t micro : {1, 3}) {
      if ((global / world) % micro) continue;
      Batch joined;
      for (int64_t r = 0; r < world; ++r) {
        const int64_t first = r * global / world, per_rank = global / world;
        for (int64_t m = 0; m < per_rank; m += micro) {
          const Batch part = batch(d, 9, first + m, micro, global, T);
          joined.tokens.insert(joined.tokens.end(), part.tokens.begin(), part.tokens.end());
          joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
        }
      }
      EXPECT_EQ(joined, batch(d, 9, 0, global, global, T)) << "world " << world << " micro " << micro;
    }
  }
}

TEST(Dataset, StartsCoverEveryValidOffset) {
  ScratchDir dir;
  const int64_t n = 24, T = 20;  // n - T = 4 valid starts: 0..3
  const TokenDataset d(make_shard(dir, "s.bin", n, 100), {.seed = 3});
  std::vector<int> hits(4, 0);
  for (int64_t step = 0; step < 400; ++step) {
    const int64_t s = d.window_start(step, 0, 1, T);
    ASSERT_GE(s, 0);
    ASSERT_LT(s, 4);
    ++hits[size_t(s)];
  }
  for (int h : hits) EXPECT_GT(h, 60);  // roughly uniform: 100 expected each
}

TEST(Dataset, EvalWalksInOrderAndWraps) {
  ScratchDir dir;
  const TokenDataset d(make_shard(dir, "v.bin", 101, 200));
  const int64_t T = 10, B = 4;
  EXPECT_EQ(d.eval_windows(T), 10);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  d.fill_eval_batch(0, B, T, tok.data(), tgt.data());
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(tok[size_t(b * T)], b * T);
  EXPECT_EQ(tgt[size_t(B * T - 1)], 40);
  d.fill_eval_batch(2, B, T, tok.data(), tgt.data());  // windows 8, 9, then 0, 1
  EXPECT_EQ(tok[0], 80);
  EXPECT_EQ(tgt[size_t(2 * T - 1)], 100);  // the last token of the split is a target
  EXPECT_EQ(tok[size_t(2 * T)], 0);
  EXPECT_EQ(tok[size_t(3 * T)], 10);
}

TEST(Dataset, WideVocabularyUsesU32) {
  ScratchDir dir;
  const TokenDataset d(make_shard(dir, "w.bin", 70000, 70000), {.verify = true});
  EXPECT_EQ(d.header().token_bytes, 4u);
  EXPECT_EQ(d.token(69999), 69999);
}

TEST(Dataset, HeaderErrorsNameFileAndFix) {
  ScratchDir dir;
  const std::string good = make_shard(dir, "train.bin", 1000, 256, "byte");
  const std::string bytes = read_bytes(good);
  auto open_error = [&](const std::string& content, const DatasetOptions& opt = {}) {
    write_bytes(dir / "bad.bin", content);
    return error_of([&] { TokenDataset d((dir / "bad.bin").string(), opt); });
  };

  std::string e = open_error("NOTLOOM!" + bytes.substr(8));
  EXPECT_NE(e.find("[data] bad.bin is not a loom token shard (magic 'NOTLOOM!'"), std::string::npos) << e;

  ShardHeader h = parse_shard_header(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), "x");
  h.version = 2;
  unsigned char head[kShardHeaderBytes];
  write_shard_header(h, head);
  e = open_error(std::string(reinterpret_cast<char*>(head), kShardHeaderBytes) + bytes.substr(kShardHeaderBytes));
  EXPECT_NE(e.find("bad.bin has shard format version 2 but this loom reads version 1"), std::string::npos) << e;

  std::string flipped = bytes;
  flipped[50] ^= 1;  // inside the tokenizer name
  e = open_error(flipped);
  EXPECT_NE(e.find("corrupt header"), std::string::npos) << e;

  e = open_error(bytes.substr(0, bytes.size() - 7));
  EXPECT_NE(e.find("bad.bin is truncated: its header promises 1000 tokens (2000 bytes) but only 1993"),
            std::string::npos) << e;
  e = open_error(bytes.substr(0, 20));
  EXPECT_NE(e.find("too short"), std::string::npos) << e;

  std::string payload_flip = bytes;
  payload_flip[kShardHeaderBytes + 10] ^= 1;
  EXPECT_EQ(open_error(payload_flip), "");  // not checked unless asked
  e = open_error(payload_flip, {.verify = true});
  EXPECT_NE(e.find("bad.bin is corrupt: payload checksum"), std::string::npos) << e;

  e = error_of([&] { TokenDataset d(good, {.model_vocab = 50257}); });
  EXPECT_EQ(e, "[data] train.bin has vocab_size 256 (tokenizer byte) but the model has 50257; "
               "re-run loom prepare with --tokenizer gpt2");
  EXPECT_EQ(error_of([&] { TokenDataset d(good, {.model_vocab = 256}); }), "");
  e = error_of([&] { TokenDataset d((dir / "nowhere.bin").string()); });
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
  EXPECT_NE(e.find("loom prepare"), std::string::npos) << e;
}

TEST(Dataset, ShortShardsAndBadSlicesAreRefused) {
  ScratchDir dir;
  const TokenDataset d(make_shard(dir, "tiny.bin", 10, 100));
  std::vector<int32_t> buf(64);
  std::string e = error_of([&] { d.fill_batch(0, 0, 1, 1, 16, buf.data(), buf.data()); });
  EXPECT_NE(e.find("tiny.bin has 10 tokens, fewer than one training window of T+1 = 17"), std::string::npos) << e;
  e = error_of([&] { d.fill_batch(0, 3, 2, 4, 4, buf.data(), buf.data()); });
  EXPECT_NE(e.find("outside the global batch of 4"), std::string::npos) << e;
}

TEST(Dataset, PadsAllowedForModelVocab) {
  ScratchDir dir;
  const std::string p = make_shard(dir, "g.bin", 100, 50257, "gpt2");
  EXPECT_EQ(error_of([&] { TokenDataset d(p, {.model_vocab = 50304}); }), "");
  const std::string e = error_of([&] { TokenDataset d(p, {.model_vocab = 256}); });
  EXPECT_NE(e.find("--tokenizer byte"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::data
