// QuantizedModel::from_gguf: a GGUF file's Q4_1, Q4_0 and Q8_0 blocks become loom's int4 (with
// offsets, or symmetric) and int8 matrices with the very values llama.cpp's reference
// dequantizes (compared bitwise with load_gguf_weights', whose dequantizers are checked against
// gguf-py), where quantizing the dequantized weights again would move them; matrices in other
// types, or under another group, are requantized and the report says so; and the runner on the
// kept matrices computes what the f32 runner computes on the file's weights, to the rounding of
// the activations.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "infer/infer_testing.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/infer/quant_weights.h"
#include "loom/io/gguf.h"
#include "loom/model/gguf_model.h"
#include "testing/gguf_fixture.h"

using namespace loom;
using namespace loom::infer;
namespace fs = std::filesystem;

namespace {

// Rows of whole 32-weight blocks; grouped-query attention and an untied head, so that q and k
// (rows permuted in the file), v, the fused gate|up and the head are all exercised.
model::ModelConfig tiny() {
  model::ModelConfig c = model::preset("llama-tiny");
  c.name = "tiny";
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = 96;
  c.vocab_size = 40;
  c.n_ctx = 32;
  c.tied_embeddings = false;
  c.norm_eps = double(float(1e-5));
  return c;
}

const std::vector<int32_t> kPrompt = {3, 17, 0, 39, 25, 8, 8, 12, 30, 1, 22, 5};

struct Loaded {
  std::unique_ptr<io::GgufFile> file;
  std::unique_ptr<model::Decoder> model;
};

// A random model written as GGUF with its matrices in `type`, loaded back (f32, dequantized).
Loaded write_and_load(io::GgmlType type, const std::string& name) {
  model::Decoder src(tiny());
  src.init_weights(5);
  std::mt19937_64 rng(5);
  std::normal_distribution<float> noise(0.f, 0.05f);
  for (int64_t i = 0; i < src.flat_size(); ++i) src.params().data<float>()[i] += noise(rng);
  const fs::path dir = fs::path(::testing::TempDir()) / ("quant-gguf-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  loom::testing::GgufFixture f;
  f.matrix_type = type;
  loom::testing::gguf_writer_of(src, f).write((dir / name).string());
  Loaded l;
  l.file = std::make_unique<io::GgufFile>(io::GgufFile::open((dir / name).string()));
  l.model = std::make_unique<model::Decoder>(model::gguf_model_config(*l.file));
  model::load_gguf_weights(*l.file, *l.model);
  return l;
}

QuantSpec spec(cpu::QuantFormat f, int64_t group, bool zero_point = false) {
  QuantSpec s;
  s.format = f;
  s.group = group;
  s.zero_point = zero_point;
  return s;
}

std::vector<float> params_of(const model::Decoder& m) {
  return {m.params().data<float>(), m.params().data<float>() + m.flat_size()};
}

int64_t differing(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// Elements of m's parameters that differ from `before`, outside the LM head's matrix.
int64_t differing_outside_head(const model::Decoder& m, const std::vector<float>& before) {
  const Tensor head = head_matrix(m);
  const int64_t at = head.data<float>() - m.params().data<float>();
  std::vector<float> a(before), b = params_of(m);
  a.erase(a.begin() + at, a.begin() + at + head.numel());
  b.erase(b.begin() + at, b.begin() + at + head.numel());
  return differing(a, b);
}

}  // namespace

TEST(QuantFromGguf, Q4_1BlocksAreKeptWithTheirOffsetsBitForBit) {
  Loaded l = write_and_load(io::GgmlType::q4_1, "q4_1.gguf");
  const std::vector<float> file_values = params_of(*l.model);
  std::string how;
  const QuantizedModel q = QuantizedModel::from_gguf(*l.model, *l.file, spec(cpu::QuantFormat::int4, 32), &how);
  // q, k, v, o, gate, up, down of 2 blocks; the head is int8, which Q4_1 blocks are not.
  EXPECT_EQ(how, "kept from the file's blocks: Q4_1 x14; quantized from the dequantized weights: Q4_1 x1") << how;
  EXPECT_TRUE(q.blocks[0].qkv.offsets.defined());
  EXPECT_EQ(q.blocks[1].fc.group, 32);
  // Every block matrix holds what llama.cpp's reference made of the file; only the head moved.
  EXPECT_EQ(differing_outside_head(*l.model, file_values), 0);
  EXPECT_GT(differing(file_values, params_of(*l.model)), 0) << "the int8 head should have been requantized";

  // Quantizing the same weights again (integer zero points) does move them: what keeping avoids.
  Loaded again = write_and_load(io::GgmlType::q4_1, "q4_1_again.gguf");
  (void)QuantizedModel::quantize(*again.model, spec(cpu::QuantFormat::int4, 32, /*zero_point=*/true));
  EXPECT_GT(differing(file_values, params_of(*again.model)), file_values.size() / 4);
}

TEST(QuantFromGguf, Q4_0AndQ8_0BlocksAreKeptBitForBit) {
  for (auto [type, format] :
       {std::pair{io::GgmlType::q4_0, cpu::QuantFormat::int4}, std::pair{io::GgmlType::q8_0, cpu::QuantFormat::int8}}) {
    SCOPED_TRACE(io::ggml_type_name(type));
    Loaded l = write_and_load(type, str_cat(io::ggml_type_name(type), ".gguf"));
    const std::vector<float> file_values = params_of(*l.model);
    std::string how;
    const QuantizedModel q = QuantizedModel::from_gguf(*l.model, *l.file, spec(format, 32), &how);
    const bool int8 = format == cpu::QuantFormat::int8;
    EXPECT_EQ(how, str_cat("kept from the file's blocks: ", io::ggml_type_name(type), int8 ? " x15" : " x14",
                           int8 ? "" : "; quantized from the dequantized weights: Q4_0 x1"));
    EXPECT_FALSE(q.blocks[0].qkv.offsets.defined()) << "Q4_0 is symmetric int4";
    EXPECT_EQ(differing_outside_head(*l.model, file_values), 0);
    if (int8) {
      EXPECT_EQ(differing(file_values, params_of(*l.model)), 0) << "the head too";
    }
  }
}

TEST(QuantFromGguf, OtherGroupsAndTypesAreRequantizedAndSaidSo) {
  Loaded l = write_and_load(io::GgmlType::q4_1, "q4_1_g64.gguf");
  std::string how;
  (void)QuantizedModel::from_gguf(*l.model, *l.file, spec(cpu::QuantFormat::int4, 0), &how);  // one per row
  EXPECT_EQ(how,
            "no GGUF blocks kept; quantized from the dequantized weights: Q4_1 x15 (GGUF blocks are kept with "
            "--group 32)");
  Loaded f16 = write_and_load(io::GgmlType::f16, "f16.gguf");
  (void)QuantizedModel::from_gguf(*f16.model, *f16.file, spec(cpu::QuantFormat::int8, 32), &how);
  EXPECT_EQ(how, "no GGUF blocks kept; quantized from the dequantized weights: F16 x15");
}

TEST(QuantFromGguf, TheRunnerOnKeptBlocksMatchesF32OnTheFilesWeights) {
  for (auto [type, format] :
       {std::pair{io::GgmlType::q4_1, cpu::QuantFormat::int4}, std::pair{io::GgmlType::q4_0, cpu::QuantFormat::int4},
        std::pair{io::GgmlType::q8_0, cpu::QuantFormat::int8}}) {
    SCOPED_TRACE(io::ggml_type_name(type));
    Loaded l = write_and_load(type, str_cat("run_", io::ggml_type_name(type), ".gguf"));
    QuantSpec s = spec(format, 32);
    s.head = false;  // the head stays f32, so every matrix the runner quantizes is a kept one
    const QuantizedModel q = QuantizedModel::from_gguf(*l.model, *l.file, s);
    const std::vector<float> want = fixtures::last_logits(*l.model, nullptr, kPrompt),
                             got = fixtures::last_logits(*l.model, &q, kPrompt);
    float diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::fabs(want[i] - got[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    // Only the activations' rounding to 8 bits per block of 32 differs (about 0.4% per product).
    EXPECT_LT(diff, 2e-2f * scale) << "max |diff| " << diff << " of " << scale;
  }
}
