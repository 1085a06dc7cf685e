// Tokenizer properties beyond the golden ids: the pre-tokeniser's regex rules one by one,
// character classes, round trip over random bytes, ill-formed UTF-8, streaming, errors.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "data/data_testing.h"
#include "loom/data/pretokenize.h"
#include "loom/data/unicode.h"

namespace loom::data {
namespace {

using testing::error_of;
using testing::gpt2;
using Pieces = std::vector<std::string_view>;

TEST(PreTokenizer, FollowsGpt2Pattern) {
  EXPECT_EQ(gpt2_pretokenize("Hello world"), (Pieces{"Hello", " world"}));
  // Runs of spaces give all but the last space to a whitespace piece.
  EXPECT_EQ(gpt2_pretokenize("a   b"), (Pieces{"a", "  ", " b"}));
  // A lone newline before a word stands alone; trailing whitespace is one piece.
  EXPECT_EQ(gpt2_pretokenize("a\n\nb  "), (Pieces{"a", "\n", "\n", "b", "  "}));
  EXPECT_EQ(gpt2_pretokenize("x\t y"), (Pieces{"x", "\t", " y"}));
  // Lower-case contractions only; upper-case ones split as punctuation + letters.
  EXPECT_EQ(gpt2_pretokenize("they'll I'M"), (Pieces{"they", "'ll", " I", "'", "M"}));
  EXPECT_EQ(gpt2_pretokenize("we've'd"), (Pieces{"we", "'ve", "'d"}));
  EXPECT_EQ(gpt2_pretokenize("3.14 x2"), (Pieces{"3", ".", "14", " x", "2"}));
  EXPECT_EQ(gpt2_pretokenize(" !?abc"), (Pieces{" !?", "abc"}));
  EXPECT_EQ(gpt2_pretokenize(""), Pieces{});
  EXPECT_EQ(gpt2_pretokenize(" "), Pieces{" "});
}

TEST(PreTokenizer, UnicodeClassesAndIllFormedBytes) {
  EXPECT_EQ(gpt2_pretokenize("caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87"),
            (Pieces{"caf\xc3\xa9", " \xe4\xb8\xad\xe6\x96\x87"}));
  // U+3000 (ideographic space) is \s, U+00A0 too; neither is glued to the word like ' ' is.
  EXPECT_EQ(gpt2_pretokenize("a\xe3\x80\x80"
                             "b"),
            (Pieces{"a", "\xe3\x80\x80", "b"}));
  // Ill-formed bytes are "other" characters and join neighbouring punctuation.
  EXPECT_EQ(gpt2_pretokenize("ab\xff\xfe!cd"), (Pieces{"ab", "\xff\xfe!", "cd"}));
  EXPECT_EQ(gpt2_pretokenize(" \xc3"
                             "x"),
            (Pieces{" \xc3", "x"}));
}

TEST(Unicode, ClassesMatchRegexModule) {
  EXPECT_EQ(classify('a'), CharClass::kLetter);
  EXPECT_EQ(classify('7'), CharClass::kNumber);
  EXPECT_EQ(classify(' '), CharClass::kSpace);
  EXPECT_EQ(classify('\x0b'), CharClass::kSpace);
  EXPECT_EQ(classify(0x1C), CharClass::kOther);  // str.isspace() says yes, regex's \s says no
  EXPECT_EQ(classify('\''), CharClass::kOther);
  EXPECT_EQ(classify(0xE9), CharClass::kLetter);    // e acute
  EXPECT_EQ(classify(0x4E2D), CharClass::kLetter);  // CJK
  EXPECT_EQ(classify(0x0663), CharClass::kNumber);  // Arabic-Indic three
  EXPECT_EQ(classify(0x00BD), CharClass::kNumber);  // one half (No)
  EXPECT_EQ(classify(0x3000), CharClass::kSpace);
  EXPECT_EQ(classify(0x1F600), CharClass::kOther);  // emoji
  EXPECT_EQ(classify(0x0301), CharClass::kOther);   // combining acute (Mn)
}

TEST(Unicode, WellFormedUtf8Only) {
  auto len = [](const std::string& s) {
    uint32_t cp = 0;
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    return utf8_sequence_length(p, p + s.size(), &cp);
  };
  EXPECT_EQ(len("\xc3\xa9"), 2);
  EXPECT_EQ(len("\xf0\x9f\x98\x80"), 4);
  EXPECT_EQ(len("\xc0\xaf"), 0);          // overlong
  EXPECT_EQ(len("\xed\xa0\x80"), 0);      // encoded surrogate
  EXPECT_EQ(len("\xf4\x90\x80\x80"), 0);  // above U+10FFFF
  EXPECT_EQ(len("\xe2\x82"), 0);          // truncated
  EXPECT_EQ(len("\x80"), 0);              // lone continuation
}

// Random strings drawn from bytes that exercise every branch: ASCII classes, multi-byte
// letters/spaces/emoji, and bytes that are never valid UTF-8.
std::string random_text(std::mt19937& g) {
  static const std::vector<std::string> atoms = {
      "a",  "Z",    " ",    "  ",       "\n",           "\t",           "'",
      "'s", "'LL",  "7",    "\xc3\xa9", "\xe4\xb8\xad", "\xe3\x80\x80", "\xf0\x9f\x98\x80",
      "!",  "\xff", "\x80", "\xc3",     "\xed\xa0\x80", "\x00",         "\xc2\xa0"};
  std::uniform_int_distribution<int> len(0, 40), pick(0, int(atoms.size()) - 1), byte(0, 255), coin(0, 3);
  std::string s;
  for (int i = len(g); i > 0; --i) {
    if (coin(g) == 0) {
      s += char(byte(g));
    } else {
      s += atoms[size_t(pick(g))];
    }
  }
  return s;
}

TEST(TokenizerFuzz, RoundTripsRandomBytes) {
  std::mt19937 g(20240611);
  const ByteTokenizer bytes;
  for (int i = 0; i < 3000; ++i) {
    const std::string s = random_text(g);
    const std::vector<int32_t> ids = gpt2().encode(s);
    ASSERT_EQ(gpt2().decode(ids), s) << "case " << i;
    ASSERT_EQ(bytes.decode(bytes.encode(s)), s);
    // Pieces cover the input exactly, in order.
    std::string joined;
    for (auto p : gpt2_pretokenize(s)) joined += p;
    ASSERT_EQ(joined, s);
  }
}

TEST(Tokenizer, IllFormedUtf8RoundTrips) {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += char(b);
  for (const std::string& s : {all_bytes, std::string("\xff\xff\xff"), std::string("\xe2\x82\xac\xe2\x82"),
                               std::string("x\xc3"), std::string(1000, '\x80')}) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(s)), s);
  }
  // Each stray byte becomes its own byte-level token when nothing merges with it: in
  // data/gpt2/encoder.json byte 0xff is "\u00ff" (id 187) and 0xfe is "\u00fe" (id 186), and no
  // pair of them is a token.
  EXPECT_EQ(gpt2().encode("\xff"), (std::vector<int32_t>{187}));
  EXPECT_EQ(gpt2().encode("\xff\xfe"), (std::vector<int32_t>{187, 186}));
  EXPECT_EQ(gpt2().encode("\xff\xff\xff"), (std::vector<int32_t>{187, 187, 187}));
  EXPECT_EQ(gpt2().decode(std::vector<int32_t>{187, 186}), "\xff\xfe");
}

TEST(Tokenizer, StreamEqualsWholeEncode) {
  const std::string text =
      testing::read_bytes(testing::repo_data_dir() + "/tinyshakespeare/input.txt").substr(0, 20000);
  std::vector<int32_t> streamed;
  size_t last_done = 0, calls = 0;
  gpt2().encode_stream(
      text,
      [&](std::span<const int32_t> ids, size_t done) {
        EXPECT_GE(done, last_done);
        last_done = done;
        ++calls;
        streamed.insert(streamed.end(), ids.begin(), ids.end());
      },
      1000);
  EXPECT_EQ(streamed, gpt2().encode(text));
  EXPECT_EQ(last_done, text.size());
  EXPECT_GT(calls, 3u);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  // The second thread may find the word cache busy and encode without it: same ids.
  const std::string text =
      testing::read_bytes(testing::repo_data_dir() + "/tinyshakespeare/input.txt").substr(5000, 30000);
  std::vector<int32_t> a, b;
  std::thread t([&] { a = gpt2().encode(text); });
  b = gpt2().encode(text);
  t.join();
  EXPECT_EQ(a, b);
}

TEST(Tokenizer, ByteTokenizerIsIdentity) {
  const ByteTokenizer t;
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_FALSE(t.eot_id().has_value());
  EXPECT_EQ(t.encode("A\xff"), (std::vector<int32_t>{65, 255}));
  EXPECT_NE(error_of([&] { t.decode(std::vector<int32_t>{256}); }).find("outside the byte tokenizer"),
            std::string::npos);
}

TEST(Tokenizer, ErrorsNameTheProblem) {
  EXPECT_NE(error_of([] { make_tokenizer("sentencepiece"); }).find("unknown tokenizer 'sentencepiece'"),
            std::string::npos);
  const std::string missing = error_of([] { make_tokenizer("gpt2", "/nonexistent/loom"); });
  EXPECT_NE(missing.find("encoder.json"), std::string::npos) << missing;
  EXPECT_NE(missing.find("LOOM_DATA_DIR"), std::string::npos) << missing;
  EXPECT_NE(error_of([] { gpt2().decode(std::vector<int32_t>{50257}); }).find("outside gpt2's vocabulary"),
            std::string::npos);
  EXPECT_EQ(make_tokenizer("gpt2", testing::repo_data_dir())->vocab_size(), 50257);
}

}  // namespace
}  // namespace loom::data
