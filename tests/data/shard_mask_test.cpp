// Shards with a loss mask (format version 2): the mask round-trips beside the tokens under the
// payload checksum, version-1 shards still load (every token trained), and batches turn the
// mask into ignored targets in both layouts: whole conversations packed into rows (bins), with
// positions restarting at each, and one padded conversation per row.
#include <gtest/gtest.h>

#include <vector>

#include "data/data_testing.h"
#include "loom/data/dataset.h"

namespace loom::data {
namespace {

using testing::read_bytes;
using testing::ScratchDir;
using testing::write_bytes;

// Conversations of the given lengths; token i of the stream is i % vocab, and in each
// conversation the first third (rounded down) is the "user" part, the rest "assistant" (trained)
// but for the last token, which stands for the template's text after the end-of-turn token.
struct Conversations {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
};

Conversations conversations(const std::vector<int64_t>& lengths, int32_t vocab = 1000) {
  Conversations c;
  for (int64_t len : lengths) {
    for (int64_t t = 0; t < len; ++t) {
      uint8_t m = (t >= len / 3 && t + 1 < len) ? kMaskTrained : 0;
      if (t == 0) m |= kMaskConversationStart;
      c.ids.push_back(int32_t(c.ids.size()) % vocab);
      c.mask.push_back(m);
    }
  }
  return c;
}

std::string write_masked_shard(const ScratchDir& dir, const std::string& name, const Conversations& c,
                               uint32_t vocab = 1000, uint32_t eot = kNoEot) {
  ShardHeader h;
  h.token_bytes = 2;
  h.vocab_size = vocab;
  h.eot_id = eot;
  h.flags = kShardHasMask;
  h.tokenizer = "test";
  h.split = "train";
  const std::string path = (dir / name).string();
  ShardWriter w(path, h);
  // In two appends, so that the side file of mask bytes is appended to more than once.
  const size_t half = c.ids.size() / 2;
  w.append(std::span(c.ids).first(half), std::span(c.mask).first(half));
  w.append(std::span(c.ids).subspan(half), std::span(c.mask).subspan(half));
  w.finish();
  return path;
}

// What a packed row must hold: the conversations [first, last) one after another (each cut at
// the row's end), their targets (ignored where the mask does not train and at each one's last
// token), positions restarting at 0 at each, then padding counting on.
struct Row {
  std::vector<int32_t> tokens, targets, positions;
};
Row expected_bin(const Conversations& c, const std::vector<int64_t>& lengths, size_t first, size_t last, int64_t T,
                 int32_t pad) {
  Row r;
  int64_t start = 0;
  for (size_t k = 0; k < first; ++k) start += lengths[k];
  for (size_t k = first; k < last; ++k) {
    for (int64_t t = 0; t < lengths[k] && int64_t(r.tokens.size()) < T; ++t) {
      r.tokens.push_back(c.ids[size_t(start + t)]);
      const bool inside = t + 1 < lengths[k];
      r.targets.push_back(inside && (c.mask[size_t(start + t + 1)] & kMaskTrained) ? c.ids[size_t(start + t + 1)] : -1);
      r.positions.push_back(int32_t(t));
    }
    start += lengths[k];
  }
  while (int64_t(r.tokens.size()) < T) {
    r.tokens.push_back(pad);
    r.targets.push_back(-1);
    r.positions.push_back(r.positions.empty() ? 0 : r.positions.back() + 1);
  }
  return r;
}

TEST(ShardMask, RoundTripsBesideTheTokens) {
  ScratchDir dir;
  const Conversations c = conversations({7, 12, 1, 30});
  const std::string path = write_masked_shard(dir, "s.bin", c);
  EXPECT_EQ(read_bytes(path).size(), kShardHeaderBytes + c.ids.size() * 3);  // u16 tokens, then a byte each
  const TokenDataset d(path);
  EXPECT_EQ(d.header().version, 2u);
  EXPECT_TRUE(d.has_mask());
  ASSERT_EQ(d.size(), int64_t(c.ids.size()));
  std::vector<int32_t> ids(c.ids.size());
  std::vector<uint8_t> mask(c.mask.size());
  d.read(0, d.size(), ids.data());
  d.read_mask(0, d.size(), mask.data());
  EXPECT_EQ(ids, c.ids);
  EXPECT_EQ(mask, c.mask);
  EXPECT_EQ(d.conversation_starts(), (std::vector<int64_t>{0, 7, 19, 20}));
  EXPECT_EQ(d.conversation_length(2), 1);
  EXPECT_EQ(d.conversation_length(3), 30);
  EXPECT_EQ(d.conversations_longer_than(7), 2);
}

TEST(ShardMask, VersionOneShardLoadsWithEveryTokenTrained) {
  ScratchDir dir;
  ShardHeader h;
  h.version = 1;
  h.vocab_size = 500;
  h.tokenizer = "old";
  h.split = "train";
  const std::string path = (dir / "v1.bin").string();
  ShardWriter w(path, h);
  std::vector<int32_t> ids(300);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  w.append(ids);
  w.finish();
  const std::string bytes = read_bytes(path);
  ASSERT_EQ(bytes[8], 1);  // the version field as version 1 wrote it
  ASSERT_EQ(bytes.size(), kShardHeaderBytes + 600);

  const TokenDataset d(path, {.seed = 3});
  EXPECT_FALSE(d.has_mask());
  EXPECT_TRUE(d.conversation_starts().empty());
  std::vector<uint8_t> mask(300);
  d.read_mask(0, 300, mask.data());
  EXPECT_EQ(mask, std::vector<uint8_t>(300, kMaskTrained));
  const int64_t T = 16;
  std::vector<int32_t> tok(size_t(4 * T)), tgt(size_t(4 * T));
  d.fill_batch(2, 0, 4, 4, T, tok.data(), tgt.data());
  for (size_t i = 0; i < tok.size(); ++i) EXPECT_EQ(tgt[i], tok[i] + 1) << i;  // token i is i: nothing ignored
  const std::string e = testing::error_of([&] { TokenDataset d(path, {.layout = ChatLayout::pad}); });
  EXPECT_EQ(e, "[data] " + path +
                   " holds plain text (no loss mask), but the pad layout (data.chat_layout=pad) puts one conversation "
                   "in each row; prepare conversations with loom prepare --chat, or use data.chat_layout=pack");
}

TEST(ShardMask, ChecksumAndChecksCoverTheMask) {
  ScratchDir dir;
  const Conversations c = conversations({40, 60});
  const std::string path = write_masked_shard(dir, "s.bin", c);
  const std::string good = read_bytes(path);
  const size_t mask_at = kShardHeaderBytes + 2 * c.ids.size();
  auto open_error = [&](const std::string& bytes) {
    write_bytes(dir / "bad.bin", bytes);
    return testing::error_of([&] { TokenDataset d((dir / "bad.bin").string()); });
  };
  EXPECT_EQ(open_error(good), "");

  std::string flipped = good;
  flipped[mask_at + 50] ^= kMaskTrained;  // a trained token made untrained: only the checksum can tell
  std::string e = open_error(flipped);
  EXPECT_NE(e.find("bad.bin: payload checksum 0x"), std::string::npos) << e;
  EXPECT_NE(e.find("(FNV-1a 64 of the 300 bytes from offset 128)"), std::string::npos) << e;

  // A bit that means nothing, under a checksum that matches.
  std::string odd = good;
  odd[mask_at + 70] = char(odd[mask_at + 70] | 4);
  ShardHeader h = parse_shard_header(reinterpret_cast<const unsigned char*>(odd.data()), odd.size(), "x");
  h.checksum = fnv1a64(odd.data() + kShardHeaderBytes, odd.size() - kShardHeaderBytes);
  write_shard_header(h, reinterpret_cast<unsigned char*>(odd.data()));
  e = open_error(odd);
  EXPECT_NE(e.find("bad.bin: mask byte 5 of token 70 (byte offset 398) has bits other than trained (1) and "
                   "conversation start (2)"),
            std::string::npos)
      << e;

  e = open_error(good.substr(0, good.size() - 1));
  EXPECT_NE(e.find("bad.bin is truncated: its header promises 100 tokens and their mask (300 bytes) but only 299"),
            std::string::npos)
      << e;

  // The first token must start a conversation, or the pad layout would lose what comes before.
  std::string headless = good;
  headless[mask_at] = char(kMaskTrained);
  h = parse_shard_header(reinterpret_cast<const unsigned char*>(headless.data()), headless.size(), "x");
  h.checksum = fnv1a64(headless.data() + kShardHeaderBytes, headless.size() - kShardHeaderBytes);
  write_shard_header(h, reinterpret_cast<unsigned char*>(headless.data()));
  e = open_error(headless);
  EXPECT_NE(e.find("bad.bin: its first token does not start a conversation"), std::string::npos) << e;
}

TEST(ShardMask, PackedRowsHoldWholeConversations) {
  ScratchDir dir;
  const std::vector<int64_t> lengths = {9, 14, 5, 20, 11, 30, 8};
  const Conversations c = conversations(lengths);
  const uint32_t eot = 999;
  const TokenDataset d(write_masked_shard(dir, "s.bin", c, 1000, eot), {.seed = 5});
  EXPECT_TRUE(d.packs_documents());
  const int64_t T = 32, G = 8;
  // Consecutive conversations while they fit: 9+14+5, 20+11, 30, 8.
  const std::vector<int64_t> bins = d.bins(T);
  ASSERT_EQ(bins, (std::vector<int64_t>{0, 3, 5, 6, 7}));
  const std::vector<int64_t>& starts = d.conversation_starts();
  std::vector<int> seen(4, 0);
  for (int64_t step = 0; step < 10; ++step) {
    std::vector<int32_t> tok(size_t(G * T)), tgt(size_t(G * T)), pos(size_t(G * T));
    d.fill_batch(step, 0, G, G, T, tok.data(), tgt.data(), pos.data());
    for (int64_t r = 0; r < G; ++r) {
      const int64_t start = d.window_start(step, r, G, T);
      const size_t conv = size_t(std::find(starts.begin(), starts.end(), start) - starts.begin());
      const size_t b = size_t(std::find(bins.begin(), bins.end(), int64_t(conv)) - bins.begin());
      ASSERT_LT(b, 4u) << "row " << r << " does not start a bin";
      ++seen[b];
      const Row want = expected_bin(c, lengths, size_t(bins[b]), size_t(bins[b + 1]), T, int32_t(eot));
      auto row = [&](const std::vector<int32_t>& v) {
        return std::vector<int32_t>(v.begin() + r * T, v.begin() + (r + 1) * T);
      };
      EXPECT_EQ(row(tok), want.tokens) << "step " << step << " row " << r;
      EXPECT_EQ(row(tgt), want.targets) << "step " << step << " row " << r;
      EXPECT_EQ(row(pos), want.positions) << "step " << step << " row " << r;
    }
    // Any rank and micro-batch split of the global batch gives the same rows.
    std::vector<int32_t> tok2(size_t(2 * T)), tgt2(size_t(2 * T)), pos2(size_t(2 * T));
    d.fill_batch(step, 3, 2, G, T, tok2.data(), tgt2.data(), pos2.data());
    EXPECT_TRUE(std::equal(tok2.begin(), tok2.end(), tok.begin() + 3 * T));
    EXPECT_TRUE(std::equal(pos2.begin(), pos2.end(), pos.begin() + 3 * T));
  }
  for (size_t b = 0; b < seen.size(); ++b) EXPECT_GT(seen[b], 0) << "bin " << b << " never drawn";
  // Validation: bin by bin, in order; a conversation longer than T fills a bin alone, cut.
  EXPECT_EQ(d.eval_windows(T), 4);
  EXPECT_EQ(d.bins(24), (std::vector<int64_t>{0, 2, 3, 4, 5, 6, 7}));
  std::vector<int32_t> tok(size_t(24)), tgt(size_t(24)), pos(size_t(24));
  d.fill_eval_batch(4, 1, 24, tok.data(), tgt.data(), pos.data());  // bin 4: the 30-token conversation
  const Row cut = expected_bin(c, lengths, 5, 6, 24, int32_t(eot));
  EXPECT_EQ(tok, cut.tokens);
  EXPECT_EQ(tgt, cut.targets);
  EXPECT_EQ(tgt[23], c.ids[size_t(9 + 14 + 5 + 20 + 11 + 24)]);  // the cut row still trains its last target

  // A trained token that starts a conversation (not what prepare writes) is no target of the
  // conversation before it in a packed row.
  Conversations odd = conversations({10, 10});
  odd.mask[10] |= kMaskTrained;
  const TokenDataset o(write_masked_shard(dir, "odd.bin", odd));
  std::vector<int32_t> otok(20), otgt(20);
  o.fill_eval_batch(0, 1, 20, otok.data(), otgt.data());
  EXPECT_EQ(otgt[9], -1);  // target token 10
  EXPECT_EQ(otgt[8], -1);  // token 9: the first conversation's last, untrained
  EXPECT_EQ(otgt[7], 8);
  EXPECT_EQ(otok[10], 10);  // the second conversation follows in the same row
}

TEST(ShardMask, PaddedRowsHoldOneConversationEach) {
  ScratchDir dir;
  const std::vector<int64_t> lengths = {9, 14, 5, 40, 11};
  const Conversations c = conversations(lengths);
  const uint32_t eot = 999;
  const TokenDataset d(write_masked_shard(dir, "s.bin", c, 1000, eot), {.seed = 9, .layout = ChatLayout::pad});
  const int64_t T = 16, G = 6;
  const std::vector<int64_t>& starts = d.conversation_starts();
  std::vector<int> seen(lengths.size(), 0);
  for (int64_t step = 0; step < 10; ++step) {
    std::vector<int32_t> tok(size_t(G * T)), tgt(size_t(G * T));
    d.fill_batch(step, 0, G, G, T, tok.data(), tgt.data());
    for (int64_t r = 0; r < G; ++r) {
      const int64_t start = d.window_start(step, r, G, T);
      const size_t conv = size_t(std::find(starts.begin(), starts.end(), start) - starts.begin());
      ASSERT_LT(conv, starts.size()) << "row " << r << " does not start at a conversation";
      ++seen[conv];
      const int64_t len = lengths[conv];
      for (int64_t t = 0; t < T; ++t) {
        const size_t i = size_t(r * T + t);
        EXPECT_EQ(tok[i], t < len ? c.ids[size_t(start + t)] : int32_t(eot)) << conv << " " << t;
        const bool inside = t + 1 < len;
        const int32_t want =
            inside && (c.mask[size_t(start + t + 1)] & kMaskTrained) ? c.ids[size_t(start + t + 1)] : -1;
        EXPECT_EQ(tgt[i], want) << "conversation " << conv << " position " << t;
      }
    }
    // Any rank and micro-batch split of the global batch gives the same rows.
    std::vector<int32_t> tok2(size_t(2 * T)), tgt2(size_t(2 * T));
    d.fill_batch(step, 3, 2, G, T, tok2.data(), tgt2.data());
    EXPECT_TRUE(std::equal(tok2.begin(), tok2.end(), tok.begin() + 3 * T));
    EXPECT_TRUE(std::equal(tgt2.begin(), tgt2.end(), tgt.begin() + 3 * T));
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_GT(seen[i], 0) << "conversation " << i << " never drawn";
  EXPECT_EQ(d.conversations_longer_than(T + 1), 1);  // the 40-token one is cut

  // Validation: conversation by conversation, in order, wrapping.
  EXPECT_EQ(d.eval_windows(T), 5);
  std::vector<int32_t> tok(size_t(3 * T)), tgt(size_t(3 * T));
  d.fill_eval_batch(1, 3, T, tok.data(), tgt.data());  // conversations 3, 4, 0
  EXPECT_EQ(tok[0], c.ids[size_t(starts[3])]);
  EXPECT_EQ(tok[size_t(T)], c.ids[size_t(starts[4])]);
  EXPECT_EQ(tok[size_t(2 * T)], 0);
  EXPECT_EQ(tok[size_t(2 * T + 9)], int32_t(eot));  // conversation 0 has 9 tokens
}

}  // namespace
}  // namespace loom::data
