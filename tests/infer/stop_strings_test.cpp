// StopStringMatcher: the one place stop strings are matched, by the engine (to stop) and the
// server (to cut the text it sends). Checked against a whole-text reference over every way
// of splitting the text into pieces.
#include "loom/infer/stop_strings.h"

#include <gtest/gtest.h>

#include "loom/core/rng.h"

namespace loom::infer {
namespace {

// The reference, on the whole text: cut where the first stop string to be complete begins
// (the earliest end; then the earliest start; then list order), or keep all of it.
std::string reference_cut(const std::string& text, const std::vector<std::string>& stops, std::string* which) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t best = std::string::npos;
    for (const auto& s : stops)
      if (!s.empty() && s.size() <= end && text.compare(end - s.size(), s.size(), s) == 0 &&
          (best == std::string::npos || end - s.size() < best)) {
        best = end - s.size();
        *which = s;
      }
    if (best != std::string::npos) return text.substr(0, best);
  }
  return text;
}

struct Streamed {
  std::string out, which;
  bool stopped = false;
};

Streamed feed(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopStringMatcher m(stops);
  Streamed r;
  for (const auto& p : pieces) {
    const std::string got = m.push(p);
    // What push() releases is final: it never ends in the beginning of a stop string.
    r.out += got;
    if (m.stopped()) break;
  }
  if (!m.stopped()) r.out += m.flush();
  r.stopped = m.stopped();
  r.which = m.stop();
  return r;
}

TEST(StopStringMatcher, CutsAtAStopSplitAcrossPieces) {
  const Streamed r = feed({"\n\n"}, {"Hello", "\n", "\nworld"});
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.out, "Hello");
  EXPECT_EQ(r.which, "\n\n");
}

TEST(StopStringMatcher, HoldsBackOnlyWhatCouldStillBecomeAStop) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("abcE"), "abc");  // "E" may begin "END"
  EXPECT_EQ(m.push("N"), "");        // "EN" still may
  EXPECT_EQ(m.push("x"), "ENx");     // not any more
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("EN"), "");
  EXPECT_EQ(m.flush(), "EN");  // the end of the text: nothing can follow
}

TEST(StopStringMatcher, TheStopCompletedFirstWinsWhateverThePieces) {
  for (const auto& pieces : std::vector<std::vector<std::string>>{{"abcd"}, {"ab", "cd"}, {"a", "b", "c", "d"}}) {
    EXPECT_EQ(feed({"abc", "b"}, pieces).which, "b");  // "b" ends first
    EXPECT_EQ(feed({"abc", "b"}, pieces).out, "a");
    EXPECT_EQ(feed({"b", "ab"}, pieces).which, "ab");  // same end: the earlier start
    EXPECT_EQ(feed({"b", "ab"}, pieces).out, "");
    EXPECT_EQ(feed({"cd", "d", "cd"}, pieces).which, "cd");
  }
}

TEST(StopStringMatcher, NoStopsPassesEverythingAndEmptyStopsAreIgnored) {
  StopStringMatcher none;
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.push("abc"), "abc");
  StopStringMatcher empty({""});
  EXPECT_FALSE(empty.active());
  EXPECT_EQ(empty.push("abc"), "abc");
  EXPECT_FALSE(empty.stopped());
}

TEST(StopStringMatcher, NothingAfterAStop) {
  StopStringMatcher m({"x"});
  EXPECT_EQ(m.push("axb"), "a");
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

// Random texts over a small alphabet (so stops occur, overlap and share prefixes), random
// stops and random splits: the streamed result equals the whole-text reference.
TEST(StopStringMatcher, AnySplitMatchesTheWholeTextReference) {
  CounterRng rng(7, 0);
  const std::string alphabet = "ab\n";
  auto random_string = [&](int64_t lo, int64_t hi) {
    std::string s(size_t(lo + int64_t(rng.next_u64() % uint64_t(hi - lo + 1))), 'a');
    for (auto& c : s) c = alphabet[rng.next_u64() % alphabet.size()];
    return s;
  };
  int stopped = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string text = random_string(0, 24);
    std::vector<std::string> stops;
    for (int k = int(rng.next_u64() % 3); k >= 0; --k) stops.push_back(random_string(1, 4));
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min(text.size() - at, size_t(rng.next_u64() % 4));
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    std::string which;
    const std::string want = reference_cut(text, stops, &which);
    const Streamed got = feed(stops, pieces);
    ASSERT_EQ(got.out, want) << "trial " << trial;
    ASSERT_EQ(got.stopped, !which.empty()) << "trial " << trial;
    ASSERT_EQ(got.which, which) << "trial " << trial;
    stopped += got.stopped;
  }
  EXPECT_GT(stopped, 500);  // the cases exercise both outcomes
  EXPECT_LT(stopped, 1950);
}

}  // namespace
}  // namespace loom::infer
