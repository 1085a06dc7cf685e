// Quantized inference weights: the spec parser, quantizing a model (its f32 values become the
// dequantized ones), the runner through the quantized kernels against the f32 runner on the
// dequantized weights, the byte count a decode step reads, and the quantized checkpoint's round
// trip (bitwise the same weights and logits as quantizing on load) and its verification.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "infer/infer_testing.h"
#include "loom/core/error.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/model_runner.h"
#include "loom/infer/quant_checkpoint.h"
#include "loom/infer/quant_weights.h"
#include "loom/model/hf_weights.h"
#include "testing/errors.h"

using namespace loom;
using namespace loom::infer;
using model::Family;
namespace fs = std::filesystem;
using loom::testing::error_of;

namespace {

QuantSpec spec(cpu::QuantFormat f, int64_t group, bool zero_point = false, bool head = true) {
  QuantSpec s;
  s.format = f;
  s.group = group;
  s.zero_point = zero_point;
  s.head = head;
  return s;
}

}  // namespace

TEST(QuantSpec, ParsesTheCommandLineAndRefusesNonsense) {
  EXPECT_FALSE(parse_quant_spec("fp32").has_value());
  const QuantSpec i8 = *parse_quant_spec("int8");
  EXPECT_EQ(i8.group, 0);
  EXPECT_EQ(i8.describe(), "int8 per-channel head int8");
  const QuantSpec i4 = *parse_quant_spec("int4", -1, "f32", true);
  EXPECT_EQ(i4.group, 64);
  EXPECT_EQ(i4.describe(), "int4 g64 zero-point head f32");
  const QuantSpec b16 = *parse_quant_spec("bf16");
  EXPECT_EQ(b16.format, cpu::QuantFormat::bf16);
  EXPECT_EQ(b16.describe(), "bf16 head bf16");
  EXPECT_EQ(parse_quant_spec("bf16", -1, "f32")->describe(), "bf16 head f32");
  EXPECT_NE(error_of([] { parse_quant_spec("bf16", 64); }).find("bf16 weights have no scales"), std::string::npos);
  EXPECT_NE(error_of([] { parse_quant_spec("int3"); }).find("[quant] --quant int3: expected fp32, bf16, int8 or int4"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_quant_spec("int8", 64, "int8", true); }).find("--zero-point is for --quant int4"),
            std::string::npos);
  EXPECT_NE(error_of([] { parse_quant_spec("int4", 64, "int2"); }).find("--quant-head int2"), std::string::npos);
  EXPECT_NE(error_of([] { parse_quant_spec("fp32", 64); }).find("need --quant int8 or int4"), std::string::npos);
  // A group that does not divide a row is refused when the model is quantized, naming it.
  auto m = fixtures::wandering_model(Family::gpt2, DType::f32, 3, true);
  const std::string e = error_of([&] { QuantizedModel::quantize(*m, spec(cpu::QuantFormat::int4, 24)); });
  EXPECT_NE(e.find("[quant]"), std::string::npos) << e;
  EXPECT_NE(e.find("24"), std::string::npos) << e;
}

class QuantRunner : public ::testing::TestWithParam<Family> {};

TEST_P(QuantRunner, MatchesTheF32RunnerOnTheDequantizedWeights) {
  for (const QuantSpec& s :
       {spec(cpu::QuantFormat::int8, 0), spec(cpu::QuantFormat::int8, 16, false, false),
        spec(cpu::QuantFormat::int4, 16), spec(cpu::QuantFormat::int4, 16, true), spec(cpu::QuantFormat::bf16, 0)}) {
    auto m = fixtures::wandering_model(GetParam(), DType::f32, 5, true);
    const auto original = m->params().to_f32_vector();
    const QuantizedModel q = QuantizedModel::quantize(*m, s);
    // The model now holds the dequantized matrices: close to, but not, the originals.
    const auto deq = m->params().to_f32_vector();
    size_t changed = 0;
    for (size_t i = 0; i < deq.size(); ++i) changed += deq[i] != original[i];
    EXPECT_GT(changed, deq.size() / 2) << s.describe();
    ASSERT_EQ(q.blocks.size(), 2u);
    EXPECT_EQ(q.head.has_value(), s.head);
    const auto prompt = fixtures::random_tokens(11, 17);
    const auto want = fixtures::last_logits(*m, nullptr, prompt);  // f32 kernels, dequantized weights
    const auto got = fixtures::last_logits(*m, &q, prompt);        // quantized kernels
    double err = 0, scale = 0;
    for (size_t v = 0; v < want.size(); ++v) {
      err = std::max(err, double(std::fabs(got[v] - want[v])));
      scale = std::max(scale, double(std::fabs(want[v])));
    }
    // Bounds from each path's arithmetic, as fractions of the largest logit. The f32 paths
    // multiply the dequantized weights exactly as the f32 runner does, in another order: 1e-5.
    // avx512-bf16 rounds each activation to bf16 first (half an ulp: 2^-9 relative); the
    // integer paths round it to int8 per block (half a step: 1/254 of the block's largest).
    // Through two blocks and the head, measured here: up to 2.4 bf16 roundings' worth
    // (4.7e-3) and 6 int8 steps' worth (2.3e-2 for llama int4 with offsets); bounds 4 and 8.
    const std::string path = cpu::quant_linear_path(s.format);
    const double bound = path.ends_with("-f32") ? 1e-5 : path == "avx512-bf16" ? 4.0 / 512 : 8.0 / 254;
    EXPECT_LT(err, bound * scale) << s.describe() << " on " << path << ": max |diff| " << err << " of logits up to "
                                  << scale;
    if (s.format == cpu::QuantFormat::int4) {
      // The bound separates: the same kernels against the f32 runner on the weights before
      // quantization (what a runner that skipped the dequantized copy would compute) are 9-34%
      // off at 4 bits.
      auto before = fixtures::wandering_model(GetParam(), DType::f32, 5, true);
      const auto unrounded = fixtures::last_logits(*before, nullptr, prompt);
      double off = 0;
      for (size_t v = 0; v < want.size(); ++v) off = std::max(off, double(std::fabs(got[v] - unrounded[v])));
      EXPECT_GT(off, 2 * bound * scale) << s.describe();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, QuantRunner, ::testing::Values(Family::gpt2, Family::llama));

TEST(QuantRunner, DecodeReadsThePackedBytes) {
  auto m = fixtures::wandering_model(Family::gpt2, DType::f32, 5, true);
  KVCache cache(m->config(), 4, 4, DType::f32);
  const int64_t f32 = ModelRunner(*m, cache, 4, 1).weight_bytes_per_token();
  const QuantizedModel q = QuantizedModel::quantize(*m, spec(cpu::QuantFormat::int4, 16));
  const int64_t i4 = ModelRunner(*m, cache, 4, 1, &q).weight_bytes_per_token();
  // Block matrices and the (tied) head: 4 bytes -> 0.5 (int4) or 1 (int8 head) + 4/16 per weight.
  const model::ModelConfig& c = m->config();
  const int64_t C = c.d_model, F = c.d_ff, V = c.vocab_size;
  const int64_t block = 3 * C * C + C * C + F * C + C * F;
  const int64_t want =
      f32 - 4 * (c.n_layer * block + V * C) + c.n_layer * (block / 2 + block / 16 * 4) + (V * C + V * C / 16 * 4);
  EXPECT_EQ(i4, want);
  EXPECT_EQ(q.bytes(), c.n_layer * (block / 2 + block / 16 * 4) + V * C + V * C / 16 * 4);
  // bf16: 2 bytes per weight, head included, no scales.
  const QuantizedModel b = QuantizedModel::quantize(*m, spec(cpu::QuantFormat::bf16, 0));
  EXPECT_EQ(ModelRunner(*m, cache, 4, 1, &b).weight_bytes_per_token(), f32 - 2 * (c.n_layer * block + V * C));
  EXPECT_EQ(b.bytes(), 2 * (c.n_layer * block + V * C));
}

TEST(QuantCheckpoint, RoundTripIsBitwiseQuantizeOnLoadAndDamageIsRefused) {
  for (const QuantSpec& s : {spec(cpu::QuantFormat::int4, 16, true), spec(cpu::QuantFormat::bf16, 0)}) {
    SCOPED_TRACE(s.describe());
    const fs::path dir = fs::temp_directory_path() / ("loom_quant_ckpt_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "src");
    // A source checkpoint as generate reads it: config.json, model.safetensors, trainer_state.json.
    auto m = fixtures::wandering_model(Family::llama, DType::f32, 7, true);
    model::write_hf_config(m->config(), (dir / "src" / "config.json").string());
    std::ofstream(dir / "src" / "trainer_state.json") << "{\"step\": 3, \"tokenizer\": \"byte\"}";
    const QuantizedModel q = QuantizedModel::quantize(*m, s);
    save_quantized_checkpoint((dir / "q").string(), (dir / "src").string(), *m, q);
    ASSERT_TRUE(is_quantized_checkpoint((dir / "q").string()));
    EXPECT_FALSE(is_quantized_checkpoint((dir / "src").string()));
    QuantizedCheckpoint loaded = load_quantized_checkpoint((dir / "q").string());
    EXPECT_EQ(loaded.quant.spec.describe(), s.describe());
    EXPECT_EQ(loaded.source, fs::absolute(dir / "src").string());
    ASSERT_EQ(loaded.model->params().nbytes(), m->params().nbytes());
    EXPECT_EQ(0, std::memcmp(loaded.model->params().raw(), m->params().raw(), m->params().nbytes()))
        << "the loaded model's f32 weights differ from the quantized-on-load ones";
    EXPECT_EQ(loaded.quant.bytes(), q.bytes());
    const auto prompt = fixtures::random_tokens(9, 23);
    EXPECT_EQ(fixtures::last_logits(*loaded.model, &loaded.quant, prompt), fixtures::last_logits(*m, &q, prompt));
    // The file holds quantized matrices, not f32 copies of them: well under the f32 model's size
    // (bf16: half of it for the matrices, plus the f32 norms and position table).
    const double limit = s.format == cpu::QuantFormat::bf16 ? 0.6 : 0.5;
    EXPECT_LT(double(fs::file_size(dir / "q" / "quant.safetensors")), limit * double(m->params().nbytes()));
    // One flipped byte: refused with the file named.
    {
      std::fstream f(dir / "q" / "quant.safetensors", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-100, std::ios::end);
      f.put('\x5a');
    }
    const std::string e = error_of([&] { load_quantized_checkpoint((dir / "q").string()); });
    EXPECT_NE(e.find("quant.safetensors checksum"), std::string::npos) << e;
    fs::remove_all(dir);
  }
}
