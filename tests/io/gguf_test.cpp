// GGUF container: written and read back (every metadata type, alignment, tensor ranges), every
// validation error on damaged files, and the facts of the real test model when it is fetched.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/gguf.h"

using namespace loom;
using namespace loom::io;

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + name; }

std::string open_error(const std::string& path) {
  try {
    GgufFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

GgufWriter sample_writer() {
  GgufWriter w;
  w.set("general.architecture", gguf_string("llama"));
  w.set("u8", gguf_int(200, GgufType::u8));
  w.set("i8", gguf_int(-5, GgufType::i8));
  w.set("u16", gguf_int(60000, GgufType::u16));
  w.set("i16", gguf_int(-30000, GgufType::i16));
  w.set("u32", gguf_uint(4000000000u));
  w.set("i32", gguf_int(-7));
  w.set("u64", gguf_uint(uint64_t(1) << 63, GgufType::u64));
  w.set("i64", gguf_int(-(int64_t(1) << 40), GgufType::i64));
  w.set("f32", gguf_float(0.5));
  w.set("f64", gguf_float(1e-300, GgufType::f64));
  w.set("bool", gguf_bool(true));
  w.set("strings", gguf_strings({"a", "", "ü 🦙"}));
  w.set("ints", gguf_array(GgufType::i32, {gguf_int(1), gguf_int(-2), gguf_int(3)}));
  w.set("nested", gguf_array(GgufType::array, {gguf_array(GgufType::f32, {gguf_float(1.5)})}));
  std::string f32(4 * 6, '\0');
  for (int k = 0; k < 6; ++k) {
    const float v = float(k) - 2.5f;
    std::memcpy(&f32[size_t(4 * k)], &v, 4);
  }
  w.add_tensor("a", GgmlType::f32, {3, 2}, f32);
  w.add_tensor("q", GgmlType::q8_0, {32, 2}, std::string(68, '\x01'));
  return w;
}

TEST(Gguf, RoundTripsEveryMetadataTypeAndTensorRanges) {
  for (uint64_t alignment : {32u, 64u}) {
    GgufWriter w = sample_writer();
    w.set_alignment(alignment);
    const std::string path = tmp("roundtrip.gguf");
    w.write(path);
    const GgufFile g = GgufFile::open(path);
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.alignment(), alignment);
    EXPECT_EQ(g.get_string("general.architecture"), "llama");
    EXPECT_EQ(g.get_int("u8"), 200);
    EXPECT_EQ(g.get_int("i8"), -5);
    EXPECT_EQ(g.get_int("u16"), 60000);
    EXPECT_EQ(g.get_int("i16"), -30000);
    EXPECT_EQ(g.get_int("u32"), 4000000000ll);
    EXPECT_EQ(g.get_int("i32"), -7);
    EXPECT_EQ(g.value("u64").u, uint64_t(1) << 63);
    EXPECT_EQ(g.get_int("i64"), -(int64_t(1) << 40));
    EXPECT_EQ(g.get_float("f32"), 0.5);
    EXPECT_EQ(g.get_float("f64"), 1e-300);
    EXPECT_EQ(g.get_float("i32"), -7.0);  // integers read as numbers too
    EXPECT_TRUE(g.get_bool("bool", false));
    EXPECT_FALSE(g.get_bool("absent", false));
    EXPECT_EQ(g.get_strings("strings"), (std::vector<std::string>{"a", "", "ü 🦙"}));
    EXPECT_EQ(g.get_ints("ints"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(g.value("nested").items.at(0).items.at(0).f, 1.5);
    EXPECT_EQ(g.get_int("absent", 9), 9);
    ASSERT_EQ(g.tensors().size(), 2u);
    const GgufTensor& a = g.tensor("a");
    EXPECT_EQ(a.ne, (std::vector<int64_t>{3, 2}));
    EXPECT_EQ(a.torch_shape(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(a.nbytes, 24u);
    EXPECT_EQ(a.rows(), 2);
    float v[6];
    std::memcpy(v, g.data(a), 24);
    EXPECT_EQ(v[0], -2.5f);
    EXPECT_EQ(v[5], 2.5f);
    const GgufTensor& q = g.tensor("q");
    EXPECT_EQ(q.nbytes, 68u);
    EXPECT_EQ(q.offset % alignment, 0u);
    EXPECT_EQ(g.data(q)[67], 1);
  }
}

TEST(Gguf, TypedReadsNameTheKeyAndTheKind) {
  const std::string path = tmp("typed.gguf");
  sample_writer().write(path);
  const GgufFile g = GgufFile::open(path);
  auto message = [](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([&] { g.get_int("general.architecture"); }).find("'general.architecture' holds a string"),
            std::string::npos);
  EXPECT_NE(message([&] { g.get_string("missing.key"); }).find("'missing.key' is missing"), std::string::npos);
  EXPECT_NE(message([&] { g.get_strings("ints"); }).find("not an array of strings"), std::string::npos);
  EXPECT_NE(message([&] { g.tensor("output.weight"); }).find("tensor 'output.weight' is missing"), std::string::npos);
}

TEST(Gguf, EveryTruncationIsAnErrorNamingTheFile) {
  const std::string whole = sample_writer().bytes();
  // Cut at every byte of the header and a few inside the data: each must fail cleanly.
  for (size_t cut = 0; cut < whole.size(); cut += (cut < 600 ? 1 : 37)) {
    const std::string path = tmp("cut.gguf");
    write_file_atomic(path, whole.substr(0, cut));
    const std::string e = open_error(path);
    ASSERT_FALSE(e.empty()) << "a file cut at byte " << cut << " of " << whole.size() << " opened";
    EXPECT_NE(e.find(path), std::string::npos) << e;
  }
}

TEST(Gguf, DamagedHeadersAreRefusedByName) {
  const std::string whole = sample_writer().bytes();
  auto damaged = [&](size_t at, const std::string& bytes) {
    std::string b = whole;
    b.replace(at, bytes.size(), bytes);
    const std::string path = tmp("damaged.gguf");
    write_file_atomic(path, b);
    return open_error(path);
  };
  EXPECT_NE(damaged(0, "GGML").find("not a GGUF file"), std::string::npos);
  EXPECT_NE(damaged(4, std::string("\x01\0\0\0", 4)).find("GGUF version 1 is not supported"), std::string::npos);
  EXPECT_EQ(damaged(4, std::string("\x02\0\0\0", 4)), "");  // version 2 has the same layout
  // A metadata count far past the file.
  EXPECT_NE(damaged(16, std::string("\xff\xff\xff\xff\0\0\0\0", 8)), "");
  // The first key's length made huge.
  EXPECT_NE(damaged(24, std::string("\0\0\0\0\0\0\0\x10", 8)).find("corrupt"), std::string::npos);
  // An unknown tensor type: find tensor "q"'s type field (after its name, dims) and set 99.
  const size_t q = whole.find(std::string("\x01\0\0\0\0\0\0\0q", 9));
  ASSERT_NE(q, std::string::npos);
  const size_t type_at = q + 9 + 4 + 16;
  EXPECT_NE(damaged(type_at, std::string("\x63\0\0\0", 4)).find("tensor type 99"), std::string::npos);
  // Its offset moved past the end of the data, and onto the other tensor.
  EXPECT_NE(damaged(type_at + 4, std::string("\0\x10\0\0\0\0\0\0", 8)).find("ends past"), std::string::npos);
  EXPECT_NE(damaged(type_at + 4, std::string("\0\0\0\0\0\0\0\0", 8)).find("overlap"), std::string::npos);
}

// The real test model (scripts/fetch-test-model.sh), when it is there.
TEST(Gguf, SmolLM2HeaderFacts) {
  const char* env = std::getenv("LOOM_TEST_MODEL");
  const std::string home = std::getenv("HOME") ? std::getenv("HOME") : "";
  const std::string path = env ? env
                           : std::getenv("LOOM_MODEL_CACHE")
                               ? std::string(std::getenv("LOOM_MODEL_CACHE")) + "/SmolLM2-135M-Instruct.Q4_1.gguf"
                               : home + "/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "SmolLM2 GGUF not found at " << path << ": run scripts/fetch-test-model.sh";
  const GgufFile g = GgufFile::open(path);
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.get_int("llama.block_count"), 30);
  EXPECT_EQ(g.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(g.get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(g.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(g.get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(g.get_strings("tokenizer.ggml.tokens").size(), 49152u);
  EXPECT_EQ(g.get_strings("tokenizer.ggml.merges").size(), 48900u);
  EXPECT_EQ(g.tensor("token_embd.weight").type, GgmlType::q8_0);
  EXPECT_EQ(g.tensor("blk.0.attn_q.weight").type, GgmlType::q4_1);
  EXPECT_EQ(g.tensor("blk.0.attn_norm.weight").type, GgmlType::f32);
  EXPECT_EQ(g.tensor("blk.0.attn_k.weight").ne, (std::vector<int64_t>{576, 192}));
  EXPECT_FALSE(g.contains("output.weight"));  // tied
}

}  // namespace
