// GGUF block formats against gguf-py (tests/golden/gguf_quants/, made by make_golden.py there):
// every dequantizer bit for bit, the quantizers byte for byte, unaligned and multi-threaded
// inputs, and the refusals of unsupported types and partial blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/gguf_quants.h"

using namespace loom;
using io::GgmlType;

namespace {

std::string golden(const std::string& file) {
  return io::read_file(std::string(LOOM_SOURCE_DIR) + "/tests/golden/gguf_quants/" + file);
}

std::vector<float> as_floats(const std::string& bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// Bitwise equality (so -0 vs +0 and any last-bit difference fail), naming the first mismatch.
::testing::AssertionResult bitwise_equal(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", reference " << want[i];
  return ::testing::AssertionSuccess();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Block shapes written out independently of the library's table (ggml's block structs).
struct Format {
  const char* file;  // golden file stem
  GgmlType type;
  int64_t block_elems, block_bytes;
};
const Format kFormats[] = {
    {"f32", GgmlType::f32, 1, 4},       {"f16", GgmlType::f16, 1, 2},       {"bf16", GgmlType::bf16, 1, 2},
    {"f64", GgmlType::f64, 1, 8},       {"q8_0", GgmlType::q8_0, 32, 34},   {"q4_0", GgmlType::q4_0, 32, 18},
    {"q4_1", GgmlType::q4_1, 32, 20},   {"q5_0", GgmlType::q5_0, 32, 22},   {"q5_1", GgmlType::q5_1, 32, 24},
    {"q2_k", GgmlType::q2_k, 256, 84},  {"q3_k", GgmlType::q3_k, 256, 110}, {"q4_k", GgmlType::q4_k, 256, 144},
    {"q5_k", GgmlType::q5_k, 256, 176}, {"q6_k", GgmlType::q6_k, 256, 210},
};

void PrintTo(const Format& f, std::ostream* os) { *os << f.file; }

class GgufQuantsDequantize : public ::testing::TestWithParam<Format> {};

TEST_P(GgufQuantsDequantize, MatchesReferenceBitForBit) {
  const Format& f = GetParam();
  const std::string blocks = golden(std::string(f.file) + ".blocks");
  const std::vector<float> want = as_floats(golden(std::string(f.file) + ".f32"));
  ASSERT_EQ(blocks.size() % size_t(f.block_bytes), 0u);
  const int64_t n = int64_t(blocks.size()) / f.block_bytes * f.block_elems;
  ASSERT_EQ(size_t(n), want.size());
  ASSERT_TRUE(io::ggml_type_supported(f.type));

  std::vector<float> got(size_t(n), -1.f);
  io::dequantize(f.type, blocks.data(), got.data(), n);
  EXPECT_TRUE(bitwise_equal(got, want));

  // Blocks sit at any byte offset inside a GGUF data section.
  std::string shifted = "x" + blocks;
  std::fill(got.begin(), got.end(), -1.f);
  io::dequantize(f.type, shifted.data() + 1, got.data(), n);
  EXPECT_TRUE(bitwise_equal(got, want)) << "source at an odd address";
}

// Enough blocks to take the OpenMP path: the golden blocks repeated.
TEST_P(GgufQuantsDequantize, ManyBlocksInParallel) {
  const Format& f = GetParam();
  const std::string blocks = golden(std::string(f.file) + ".blocks");
  const std::vector<float> once = as_floats(golden(std::string(f.file) + ".f32"));
  const int reps = int((1 << 17) / once.size()) + 1;
  std::string many;
  std::vector<float> want;
  for (int r = 0; r < reps; ++r) {
    many += blocks;
    want.insert(want.end(), once.begin(), once.end());
  }
  std::vector<float> got(want.size());
  io::dequantize(f.type, many.data(), got.data(), int64_t(got.size()));
  EXPECT_TRUE(bitwise_equal(got, want));
}

INSTANTIATE_TEST_SUITE_P(GgufQuants, GgufQuantsDequantize, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(info.param.file); });

class GgufQuantsQuantize : public ::testing::TestWithParam<Format> {};

TEST_P(GgufQuantsQuantize, MatchesReferenceByteForByte) {
  const Format& f = GetParam();
  const std::vector<float> x = as_floats(golden("quant_input.f32"));
  const std::string want = golden(std::string(f.file) + ".quant");
  const std::string got = io::quantize(f.type, x.data(), int64_t(x.size()));
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(uint8_t(got[i]), uint8_t(want[i]))
        << "byte " << i << " (block " << i / size_t(f.block_bytes) << ", offset " << i % size_t(f.block_bytes) << ")";
}

const Format kQuantizers[] = {
    {"f16", GgmlType::f16, 1, 2},     {"bf16", GgmlType::bf16, 1, 2},   {"q8_0", GgmlType::q8_0, 32, 34},
    {"q4_0", GgmlType::q4_0, 32, 18}, {"q4_1", GgmlType::q4_1, 32, 20}, {"q5_0", GgmlType::q5_0, 32, 22},
    {"q5_1", GgmlType::q5_1, 32, 24},
};
INSTANTIATE_TEST_SUITE_P(GgufQuants, GgufQuantsQuantize, ::testing::ValuesIn(kQuantizers),
                         [](const auto& info) { return std::string(info.param.file); });

}  // namespace

TEST(GgufQuants, F32QuantizeIsACopy) {
  const std::vector<float> x = as_floats(golden("quant_input.f32"));
  const std::string got = io::quantize(GgmlType::f32, x.data(), int64_t(x.size()));
  ASSERT_EQ(got.size(), x.size() * 4);
  EXPECT_EQ(std::memcmp(got.data(), x.data(), got.size()), 0);
}

TEST(GgufQuants, RefusesUnsupportedTypesNamingThem) {
  float out[256];
  const uint8_t zeros[512] = {};
  EXPECT_FALSE(io::ggml_type_supported(GgmlType::q8_1));
  EXPECT_FALSE(io::ggml_type_supported(GgmlType::i32));
  EXPECT_FALSE(io::ggml_type_supported(GgmlType(23)));
  const std::string q8_1 = error_of([&] { io::dequantize(GgmlType::q8_1, zeros, out, 32); });
  EXPECT_NE(q8_1.find("[gguf] tensor type Q8_1 is not supported"), std::string::npos) << q8_1;
  EXPECT_NE(q8_1.find("Q4_K"), std::string::npos) << "lists what is supported: " << q8_1;
  const std::string unknown = error_of([&] { io::dequantize(GgmlType(23), zeros, out, 32); });
  EXPECT_NE(unknown.find("type 23"), std::string::npos) << unknown;
  const std::string q4_k = error_of([&] { io::quantize(GgmlType::q4_k, out, 256); });
  EXPECT_NE(q4_k.find("[gguf] quantizing to Q4_K is not supported"), std::string::npos) << q4_k;
}

TEST(GgufQuants, RefusesPartialBlocksNamingTheType) {
  float out[512] = {};
  const uint8_t zeros[1024] = {};
  const std::string k = error_of([&] { io::dequantize(GgmlType::q4_k, zeros, out, 300); });
  EXPECT_NE(k.find("[gguf] Q4_K"), std::string::npos) << k;
  EXPECT_NE(k.find("256"), std::string::npos) << k;
  const std::string q = error_of([&] { io::dequantize(GgmlType::q8_0, zeros, out, 33); });
  EXPECT_NE(q.find("Q8_0"), std::string::npos) << q;
  EXPECT_NE(error_of([&] { io::dequantize(GgmlType::f16, zeros, out, -1); }), "");
  const std::string quant = error_of([&] { io::quantize(GgmlType::q4_0, out, 48); });
  EXPECT_NE(quant.find("Q4_0"), std::string::npos) << quant;
  EXPECT_NE(quant.find("32"), std::string::npos) << quant;
  // Whole blocks, and zero elements, are fine.
  EXPECT_EQ(error_of([&] { io::dequantize(GgmlType::q4_k, zeros, out, 256); }), "");
  EXPECT_EQ(error_of([&] { io::dequantize(GgmlType::q4_k, zeros, out, 0); }), "");
}

// Q8_0 values read back within half a step, plus the scale's own f16 rounding (127 * 2^-11).
TEST(GgufQuants, Q8_0RoundTripIsWithinHalfAStep) {
  const std::vector<float> x = as_floats(golden("quant_input.f32"));
  const std::string q = io::quantize(GgmlType::q8_0, x.data(), 32 * 4);  // the ordinary blocks
  std::vector<float> back(32 * 4);
  io::dequantize(GgmlType::q8_0, q.data(), back.data(), int64_t(back.size()));
  for (size_t b = 0; b < 4; ++b) {
    float amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    for (size_t j = 0; j < 32; ++j)
      EXPECT_NEAR(back[b * 32 + j], x[b * 32 + j], amax / 127 * 0.6f + 1e-6f) << b << "," << j;
  }
}
