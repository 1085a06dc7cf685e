// The loader: shard validation messages (header, payload checksum, token ids, each naming
// the file and offset), training windows as a pure function of
// (seed, step, sequence), rank/micro-batch slices that reassemble the global batch, resume,
// and the sequential validation walk.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <set>
#include <vector>

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
  EXPECT_NE(e.find("[data] " + (dir / "bad.bin").string() + " is not a loom token shard (magic 'NOTLOOM!'"),
            std::string::npos)
      << e;

  ShardHeader h = parse_shard_header(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), "x");
  h.version = 3;
  unsigned char head[kShardHeaderBytes];
  write_shard_header(h, head);
  e = open_error(std::string(reinterpret_cast<char*>(head), kShardHeaderBytes) + bytes.substr(kShardHeaderBytes));
  EXPECT_NE(e.find("bad.bin has shard format version 3 but this loom reads versions 1 to 2"), std::string::npos) << e;

  std::string flipped = bytes;
  flipped[50] ^= 1;  // inside the tokenizer name
  e = open_error(flipped);
  EXPECT_NE(e.find("corrupt header"), std::string::npos) << e;

  e = open_error(bytes.substr(0, bytes.size() - 7));
  EXPECT_NE(e.find("bad.bin is truncated: its header promises 1000 tokens (2000 bytes) but only 1993"),
            std::string::npos)
      << e;
  e = open_error(bytes.substr(0, 20));
  EXPECT_NE(e.find("too short"), std::string::npos) << e;

  e = error_of([&] { TokenDataset d(good, {.model_vocab = 50257}); });
  EXPECT_EQ(e, "[data] " + good +
                   " has vocab_size 256 (tokenizer byte) but the model has 50257; "
                   "re-run loom prepare with --tokenizer gpt2");
  EXPECT_EQ(error_of([&] { TokenDataset d(good, {.model_vocab = 256}); }), "");
  e = error_of([&] { TokenDataset d((dir / "nowhere.bin").string()); });
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
  EXPECT_NE(e.find("loom prepare"), std::string::npos) << e;
}

TEST(Dataset, FlippedPayloadByteIsRefusedAtOpen) {
  ScratchDir dir;
  const std::string path = make_shard(dir, "train.bin", 1000, 256, "byte");
  std::string bytes = read_bytes(path);
  bytes[kShardHeaderBytes + 10] ^= 0x01;  // token 5: 5 -> 4, still inside the vocabulary
  write_bytes(path, bytes);
  const std::string e = error_of([&] { TokenDataset d(path); });
  EXPECT_EQ(e.rfind("[data] " + path + ": payload checksum 0x", 0), 0u) << e;
  EXPECT_NE(e.find("(FNV-1a 64 of the 2000 bytes from offset 128) differs from the header's 0x"), std::string::npos)
      << e;
  EXPECT_NE(e.find("the file is corrupted; re-run loom prepare to rebuild it"), std::string::npos) << e;
  EXPECT_EQ(e.find("outside the vocabulary"), std::string::npos) << e;  // every id is in range
  // With verification off (a tool that only reads the header), the same file opens.
  EXPECT_EQ(error_of([&] { TokenDataset d(path, {.verify = false}); }), "");
}

TEST(Dataset, OutOfRangeIdWithMatchingChecksumIsRefusedAtOpen) {
  ScratchDir dir;
  const std::string path = make_shard(dir, "val.bin", 2000, 50257, "gpt2");
  testing::write_token_and_reseal(path, 1234, 60000);  // u16 holds it; the vocabulary does not
  std::string e = error_of([&] { TokenDataset d(path); });
  EXPECT_EQ(e, "[data] " + path +
                   ": token id 60000 at token 1234 (byte offset 2596) is outside the vocabulary "
                   "of 50257 (header vocab_size); its checksum matches, so it was written that way (not by loom "
                   "prepare, or by one with another vocabulary); re-run loom prepare to rebuild it");

  // u32 shards too, and the first bad id is the one named.
  const std::string wide = make_shard(dir, "wide.bin", 3000, 70000);
  testing::write_token_and_reseal(wide, 2999, 70000);
  testing::write_token_and_reseal(wide, 17, 0xFFFFFFFFu);
  e = error_of([&] { TokenDataset d(wide); });
  EXPECT_NE(e.find(wide + ": token id 4294967295 at token 17 (byte offset 196) is outside the vocabulary of 70000"),
            std::string::npos)
      << e;

  // When the checksum fails as well, that is the error, and the bad id is named in it.
  std::string bytes = read_bytes(path);
  bytes[kShardHeaderBytes + 2 * 1500] ^= 0x01;
  write_bytes(path, bytes);
  e = error_of([&] { TokenDataset d(path); });
  EXPECT_NE(e.find(path + ": payload checksum"), std::string::npos) << e;
  EXPECT_NE(e.find("among the damage, token id 60000 at token 1234 (byte offset 2596)"), std::string::npos) << e;
}

TEST(Dataset, FillNamesFileAndOffsetOfABadId) {
  // A shard opened without verification must still never hand a bad id to the model.
  ScratchDir dir;
  const std::string path = make_shard(dir, "train.bin", 40, 256, "byte");
  testing::write_token_and_reseal(path, 30, 300);
  const TokenDataset d(path, {.verify = false});
  std::vector<int32_t> tok(32), tgt(32);
  std::string e = error_of([&] { d.fill_eval_batch(0, 1, 32, tok.data(), tgt.data()); });
  EXPECT_NE(e.find("[data] " + path + ": token id 300 at token 30 (byte offset 188) is outside the vocabulary of 256"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("opened without verification or changed on disk since"), std::string::npos) << e;
  e = error_of([&] { d.read(30, 20, tok.data()); });
  EXPECT_NE(e.find(path + ": read of tokens [30, 50) (bytes 188..228) is outside its 40 tokens"), std::string::npos)
      << e;
}

TEST(Dataset, SlowVerificationIsLogged) {
  ScratchDir dir;
  const std::string path = make_shard(dir, "train.bin", 3000, 256, "byte");
  std::FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  TokenDataset d(path, {.log = log, .log_after_s = 0.0});  // every verification counts as slow
  std::rewind(log);
  char buf[512] = {};
  const std::string text(buf, std::fread(buf, 1, sizeof buf - 1, log));
  std::fclose(log);
  EXPECT_NE(text.find("[data] verifying " + path +
                      ": payload checksum and token ids of 3000 tokens (0.0 MB)...\n"
                      "[data] verified " +
                      path + " in "),
            std::string::npos)
      << text;
  // Quick ones say nothing.
  log = std::tmpfile();
  TokenDataset quiet(path, {.log = log});
  EXPECT_EQ(std::ftell(log), 0);
  std::fclose(log);
}

TEST(Dataset, ShortShardsAndBadSlicesAreRefused) {
  ScratchDir dir;
  const TokenDataset d(make_shard(dir, "tiny.bin", 10, 100));
  std::vector<int32_t> buf(64);
  std::string e = error_of([&] { d.fill_batch(0, 0, 1, 1, 16, buf.data(), buf.data()); });
  EXPECT_NE(e.find("tiny.bin has 10 tokens, fewer than one training window of T+1 = 17"), std::string::npos) << e;
  e = error_of([&] { d.fill_batch(0, 3, 2, 4, 4, buf.data(), buf.data()); });
  EXPECT_NE(e.find("tiny.bin: training sequences [3, 5) at step 0 are outside the global batch of 4"),
            std::string::npos)
      << e;
}

TEST(Dataset, PadsAllowedForModelVocab) {
  ScratchDir dir;
  const std::string p = make_shard(dir, "g.bin", 100, 50257, "gpt2");
  EXPECT_EQ(error_of([&] { TokenDataset d(p, {.model_vocab = 50304}); }), "");
  const std::string e = error_of([&] { TokenDataset d(p, {.model_vocab = 256}); });
  EXPECT_NE(e.find("--tokenizer byte"), std::string::npos) << e;
}

// The cost of verifying at open (docs/DATA.md quotes it). Disabled: it writes a 200 MB shard.
//   test_data --gtest_also_run_disabled_tests --gtest_filter='DatasetBench.*'
TEST(DatasetBench, DISABLED_VerifyAtOpen) {
  ScratchDir dir;
  // Tiny Shakespeare's byte-level train.bin, and a 100M-token GPT-2 shard.
  for (auto [n, vocab] : {std::pair<int64_t, uint32_t>{1003855, 256}, {100'000'000, 50257}}) {
    const std::string path = make_shard(dir, "bench.bin", n, vocab);
    const double bytes = double(n) * token_bytes_for_vocab(vocab);
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {  // warm page cache: the hash, not the disk
      const auto t0 = std::chrono::steady_clock::now();
      const TokenDataset d(path);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("verify at open: %lld tokens (%.1f MB): %.2f ms, %.0f MB/s\n", (long long)n, bytes / 1e6, best * 1e3,
                bytes / 1e6 / best);
  }
}

}  // namespace
}  // namespace loom::data
