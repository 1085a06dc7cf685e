// UTF-8 assembly of token bytes and stop-string handling of streamed text.
#include <gtest/gtest.h>

#include "loom/serve/text_stream.h"

using namespace loom::serve;

namespace {
std::vector<int32_t> bytes(const std::string& s) { return ByteTextTokenizer().encode(s); }
}  // namespace

TEST(ServeUtf8Assembler, HoldsSplitCharactersAndReplacesInvalidOnes) {
  Utf8Assembler a;
  EXPECT_EQ(a.push("h\xC3"), "h");  // first half of 'é' waits
  EXPECT_EQ(a.push("\xA9!"), "\xC3\xA9!");
  EXPECT_EQ(a.push("\xFF"), "\xEF\xBF\xBD");  // never valid
  EXPECT_EQ(a.push("\xE2\x82"), "");          // two of three bytes of '€'
  EXPECT_EQ(a.push("x"), "\xEF\xBF\xBDx");    // broken by 'x': one U+FFFD, 'x' kept
  EXPECT_EQ(a.push("\xF0\x9F"), "");
  EXPECT_EQ(a.flush(), "\xEF\xBF\xBD");                                       // unfinished at the end
  EXPECT_EQ(a.push("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: invalid
}

TEST(ServeTextStream, NoStopsPassesEverythingThrough) {
  ByteTextTokenizer tok;
  TextStream ts(tok, {});
  std::string out;
  for (int32_t t : bytes("hello")) out += ts.push_token(t);
  EXPECT_EQ(out, "hello");
  EXPECT_EQ(ts.finish(), "");
  EXPECT_FALSE(ts.stopped());
}

TEST(ServeTextStream, CutsAtTheFirstStopAndHoldsPossiblePrefixes) {
  ByteTextTokenizer tok;
  TextStream ts(tok, {"wor", "xyz"});
  std::vector<std::string> deltas;
  for (int32_t t : bytes("hello world")) {
    deltas.push_back(ts.push_token(t));
    if (ts.stopped()) break;
  }
  // "w" and "wo" are held back because they may start "wor"; then the stop completes.
  EXPECT_EQ(deltas[6], "");
  EXPECT_EQ(deltas[7], "");
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.text(), "hello ");
  EXPECT_EQ(ts.push_token('z'), "");
  EXPECT_EQ(ts.finish(), "");
}

TEST(ServeTextStream, ReleasesAHeldPrefixThatDidNotBecomeAStop) {
  ByteTextTokenizer tok;
  TextStream ts(tok, {"abc"});
  EXPECT_EQ(ts.push_token('a'), "");
  EXPECT_EQ(ts.push_token('b'), "");
  EXPECT_EQ(ts.push_token('x'), "abx");
  EXPECT_EQ(ts.push_token('a'), "");
  EXPECT_EQ(ts.finish(), "a");
  EXPECT_EQ(ts.text(), "abxa");
}

TEST(ServeTextStream, RenderCompletionMatchesStreaming) {
  ByteTextTokenizer tok;
  bool stopped = false;
  EXPECT_EQ(render_completion(tok, bytes("one two three"), {"thr"}, &stopped), "one two ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(render_completion(tok, bytes("one"), {"zz"}, &stopped), "one");
  EXPECT_FALSE(stopped);
}
