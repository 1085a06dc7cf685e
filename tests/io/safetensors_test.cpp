// safetensors: round trips of every dtype, the exact on-disk layout, borrowing from the
// mapping, files written by hand the way other tools write them, and every validation error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "loom/core/error.h"
#include "loom/io/file.h"
#include "loom/io/safetensors.h"

using namespace loom;

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + name; }

// A file from a header text and a data section, exactly as given (no padding added).
std::string raw_file(const std::string& name, const std::string& header, const std::string& data) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  bytes += header + data;
  const std::string path = tmp(name);
  io::write_file_atomic(path, bytes);
  return path;
}

// The message of the error opening `path` throws ("" if none).
std::string open_error(const std::string& path) {
  try {
    io::SafetensorsFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

}  // namespace

TEST(Safetensors, RoundTripsEveryDTypeAndMetadata) {
  io::SafetensorsWriter w;
  Tensor a = Tensor::from_vector<float>({1.5f, -2.f, 3.f, 4.f, 5.f, 6.f}, {2, 3});
  w.add("a.f32", a);
  w.add("b.f64", Tensor::from_vector<double>({0.1, 0.2}, {2}));
  w.add("c.bf16", Tensor::from_vector<bf16_t>({f32_to_bf16(1.f), f32_to_bf16(-0.5f)}, {1, 2}));
  w.add("d.f16", Tensor::from_vector<f16_t>({f32_to_f16(2.f)}, {1}));
  w.add("e.i32", Tensor::from_vector<int32_t>({7, -8, 9}, {3}));
  w.add("f.i64", Tensor::from_vector<int64_t>({int64_t(1) << 40}, {1, 1, 1, 1}));
  const int8_t i8[3] = {-1, 2, -3};
  w.add("g.i8", DType::i8, {3}, i8, 3);
  w.add("h.u8", Tensor::from_vector<uint8_t>({255}, {}));  // a scalar
  w.add("i.empty", Tensor::empty({0, 4}, DType::f32));
  w.set_metadata("format", "pt");
  w.set_metadata("note", "hello");
  const std::string path = tmp("loom_st_roundtrip.safetensors");
  a.data<float>()[0] = 9.f;  // add() shares storage: the value at write() time is saved
  w.write(path);

  auto f = io::SafetensorsFile::open(path);
  ASSERT_EQ(f.entries().size(), 9u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "hello");
  Tensor ra = f.get("a.f32");
  EXPECT_EQ(ra.describe(), "f32[2, 3]");
  EXPECT_EQ(ra.data<float>()[0], 9.f);
  EXPECT_EQ(ra.data<float>()[5], 6.f);
  EXPECT_EQ(f.get("b.f64").data<double>()[1], 0.2);
  EXPECT_EQ(bf16_to_f32(f.get("c.bf16").data<bf16_t>()[1]), -0.5f);
  EXPECT_EQ(f16_to_f32(f.get("d.f16").data<f16_t>()[0]), 2.f);
  EXPECT_EQ(f.get("e.i32").data<int32_t>()[1], -8);
  EXPECT_EQ(f.get("f.i64").data<int64_t>()[0], int64_t(1) << 40);
  EXPECT_EQ(f.get("f.i64").ndim(), 4);
  EXPECT_EQ(f.get("g.i8").data<int8_t>()[2], -3);
  EXPECT_EQ(f.get("h.u8").ndim(), 0);
  EXPECT_EQ(f.get("h.u8").data<uint8_t>()[0], 255);
  EXPECT_EQ(f.get("i.empty").describe(), "f32[0, 4]");
  EXPECT_EQ(f.entry("c.bf16").shape_str(), "[1, 2]");
}

TEST(Safetensors, OnDiskLayoutIsAlignedAndHoleFree) {
  io::SafetensorsWriter w;
  w.add("small", Tensor::from_vector<uint8_t>({1, 2, 3}, {3}));
  w.add("big", Tensor::from_vector<double>({1.0}, {1}));
  w.add("mid", Tensor::from_vector<float>({1.f}, {1}));
  const std::string path = tmp("loom_st_layout.safetensors");
  w.write(path);
  const std::string bytes = io::read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // the header is space-padded so the data section starts 8-aligned
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + n + 8 + 4 + 3);
  auto f = io::SafetensorsFile::open(path);
  // Largest elements first: f64 at 0, f32 at 8, u8 at 12.
  EXPECT_EQ(f.entry("big").begin, 0u);
  EXPECT_EQ(f.entry("mid").begin, 8u);
  EXPECT_EQ(f.entry("small").begin, 12u);
}

TEST(Safetensors, BorrowedTensorsOutliveTheFileAndNeverWriteIt) {
  const std::string path = raw_file("loom_st_borrow.safetensors",
                                    R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}    )", f32_bytes({1, 2}));
  Tensor x;
  {
    auto f = io::SafetensorsFile::open(path);
    x = f.get("x");
  }
  EXPECT_EQ(x.data<float>()[1], 2.f);  // the mapping lives as long as the tensor
  x.data<float>()[1] = 42.f;           // copy-on-write: the file is unchanged
  EXPECT_EQ(io::SafetensorsFile::open(path).get("x").data<float>()[1], 2.f);
}

TEST(Safetensors, ReadsUnpaddedHeadersAndCopiesMisalignedTensors) {
  // Another writer may place an F32 at an odd offset and not pad its header.
  std::string data = std::string(1, '\x07') + f32_bytes({3.5f});
  const std::string path = raw_file("loom_st_misaligned.safetensors",
                                    R"({"__metadata__":{"k":"v"},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                    R"("a":{"dtype":"F32","shape":[],"data_offsets":[1,5]}})",
                                    data);
  auto f = io::SafetensorsFile::open(path);
  EXPECT_EQ((f.names() == std::vector<std::string>{"a", "b"}), true);
  EXPECT_EQ(f.get("a").data<float>()[0], 3.5f);
  EXPECT_EQ(f.get("b").data<uint8_t>()[0], 7);
  EXPECT_EQ(f.metadata().at("k"), "v");
}

TEST(Safetensors, ValidationErrorsNameTheFileAndTheProblem) {
  const std::string x = R"("x":{"dtype":"F32","shape":[100],"data_offsets":[0,400]})";
  std::string msg = open_error(raw_file("model.safetensors", "{" + x + "}", std::string(200, '\0')));
  EXPECT_NE(msg.find("[safetensors] "), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors: tensor 'x' has data_offsets [0, 400) but the data "
                     "section is 200 bytes (file truncated?)"),
            std::string::npos)
      << msg;

  struct Case {
    const char* what;
    std::string header, data, expect;
  };
  const Case cases[] = {
      {"unknown dtype", R"({"x":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", std::string(1, '\0'),
       "has dtype 'F8_E4M3', which loom does not read"},
      {"size mismatch", R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0'),
       "is F32[3] = 12 bytes but its data_offsets [0, 8) span 8"},
      {"overlap",
       R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       std::string(12, '\0'), "overlap"},
      {"hole",
       R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"y":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       std::string(12, '\0'), "bytes [4, 8) of the data section belong to no tensor"},
      {"trailing", R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(10, '\0'),
       "data section is 10 bytes but the tensors cover 4"},
      {"reversed", R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", std::string(4, '\0'),
       "ending before they begin"},
      {"negative dim", R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "",
       "non-integer or negative dimension"},
      {"missing field", R"({"x":{"dtype":"F32","shape":[1]}})", std::string(4, '\0'),
       "lacks dtype, shape or data_offsets"},
      {"bad json", R"({"x":)", "", "header is not valid JSON"},
      {"not json", "GARBAGE!", "", "does not start with '{'"},
      {"bad metadata", R"({"__metadata__":{"k":1}})", "", "__metadata__ value 'k' is not a string"},
  };
  for (const auto& c : cases) {
    msg = open_error(raw_file("bad.safetensors", c.header, c.data));
    EXPECT_NE(msg.find("bad.safetensors: "), std::string::npos) << c.what << ": " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
  }

  // Header length fields that cannot be right.
  const std::string short_path = tmp("short.safetensors");
  io::write_file_atomic(short_path, "abc");
  EXPECT_NE(open_error(short_path).find("too short"), std::string::npos);
  std::string huge(16, '\0');
  huge[5] = 1;  // 2^40 bytes of header
  io::write_file_atomic(short_path, huge);
  EXPECT_NE(open_error(short_path).find("implausible"), std::string::npos);
  std::string past(16, '\0');
  past[0] = 100;
  io::write_file_atomic(short_path, past);
  EXPECT_NE(open_error(short_path).find("runs past the end"), std::string::npos);
  EXPECT_NE(open_error(tmp("does_not_exist.safetensors")).find("cannot open"), std::string::npos);
}

TEST(Safetensors, LookupAndWriterErrors) {
  const std::string path =
      raw_file("loom_st_5d.safetensors", R"({"five":{"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]}})", "ab");
  auto f = io::SafetensorsFile::open(path);
  EXPECT_EQ(f.entry("five").numel(), 2);  // listed fine, but no loom Tensor has 5 dims
  EXPECT_THROW(f.get("five"), Error);
  try {
    f.get("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'nope'"), std::string::npos);
  }
  io::SafetensorsWriter w;
  w.add("t", Tensor::zeros({2}, DType::f32));
  EXPECT_THROW(w.add("t", Tensor::zeros({2}, DType::f32)), Error);
  EXPECT_THROW(w.add("__metadata__", Tensor::zeros({2}, DType::f32)), Error);
  EXPECT_THROW(w.add("u", DType::f32, {3}, "abcd", 4), Error);  // 4 bytes for 12
  EXPECT_THROW(w.add("v", Tensor{}), Error);
}
