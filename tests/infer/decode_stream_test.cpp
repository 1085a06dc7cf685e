// DecodeStream against decoding everything at once, with a decoder that is not a per-token
// concatenation (the first token loses its leading space, as SentencePiece's does), control
// tokens that print nothing, a prompt the stream continues, and the work per token.
#include "loom/infer/decode_stream.h"

#include <gtest/gtest.h>

#include "loom/core/rng.h"

namespace loom::infer {
namespace {

constexpr int32_t kControl = 0;  // prints nothing, like </s>

// Token t > 0 is " " + a letter, or a bare letter when t is odd; the first token decoded loses
// its leading space. `decoded` counts the ids decoded.
Detokenizer spm_like(int64_t* decoded) {
  return [decoded](const std::vector<int32_t>& ids) {
    std::string s;
    bool first = true;
    for (int32_t t : ids) {
      if (t == kControl) continue;
      if (t % 2 == 0 && !first) s += ' ';
      s += char('a' + t % 26);
      first = false;
    }
    *decoded += int64_t(ids.size());
    return s;
  };
}

std::vector<int32_t> random_ids(size_t n, uint64_t seed) {
  CounterRng rng(seed, 0);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = int32_t(rng.next_u64() % 40);  // kControl now and then
  return ids;
}

TEST(DecodeStream, PiecesJoinIntoTheWholeDecoding) {
  int64_t decoded = 0;
  const Detokenizer decode = spm_like(&decoded);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<int32_t> ids = random_ids(50, seed);
    DecodeStream ds(decode);
    std::string out;
    for (int32_t t : ids) out += ds.push(t);
    out += ds.flush();
    EXPECT_EQ(out, decode(ids)) << "seed " << seed;
  }
  // Token by token the spaces are gone: what the stream is for.
  EXPECT_EQ(decode({2}) + decode({4}), "ce");
  EXPECT_EQ(decode({2, 4}), "c e");
}

TEST(DecodeStream, AControlTokenAddsNothingAndKeepsTheNextSpace) {
  int64_t decoded = 0;
  DecodeStream ds(spm_like(&decoded));
  EXPECT_EQ(ds.push(2), "c");
  EXPECT_EQ(ds.push(kControl), "");
  EXPECT_EQ(ds.push(4), " e");
  EXPECT_EQ(ds.push(kControl), "");
  EXPECT_EQ(ds.flush(), "");
}

TEST(DecodeStream, APromptMakesTheFirstTokenAContinuation) {
  int64_t decoded = 0;
  const Detokenizer decode = spm_like(&decoded);
  const std::vector<int32_t> prompt = random_ids(30, 7), reply = {2, 3, 4};
  DecodeStream alone(decode), after(decode, prompt);
  std::string a, b;
  for (int32_t t : reply) a += alone.push(t), b += after.push(t);
  EXPECT_EQ(a, "cd e");
  EXPECT_EQ(b, " cd e");
}

TEST(DecodeStream, WorkPerTokenDoesNotGrowWithTheOutput) {
  int64_t decoded = 0;
  const std::vector<int32_t> ids = random_ids(5000, 3);
  DecodeStream ds(spm_like(&decoded), random_ids(100, 4));
  for (int32_t t : ids) ds.push(t);
  // Two windows per token, each the last piece's tokens (and any control tokens) plus the new one.
  EXPECT_LT(decoded, int64_t(ids.size()) * 8);
}

}  // namespace
}  // namespace loom::infer
