// Exporting a model (model/export_gguf.h, export_hf.h): each family written as GGUF and read back
// by loom's own reader gives the same config and, in F32, the same parameters bit for bit; the
// file matches what the independent test fixture (testing/gguf_fixture.h, written as llama.cpp's
// converter lays files out) writes for the same model, so the q/k permutation is llama.cpp's and
// not merely self-consistent; each --type stores what its quantizer makes; the refusals name the
// fix. The Hugging Face side: config.json names the dtype and the special tokens, and the weights
// load back bit for bit.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "loom/io/gguf.h"
#include "loom/io/gguf_quants.h"
#include "loom/model/export_gguf.h"
#include "loom/model/export_hf.h"
#include "loom/model/gguf_model.h"
#include "loom/model/hf_weights.h"
#include "testing/errors.h"
#include "testing/gguf_fixture.h"

using namespace loom;
using namespace loom::model;
using loom::testing::error_of;
namespace fs = std::filesystem;

namespace {

struct Variant {
  const char* name;
  Family family;
  bool tied, qkv_bias;
  int64_t n_kv_head;
};
constexpr Variant kVariants[] = {
    {"llama_untied_gqa", Family::llama, false, false, 2}, {"llama_tied", Family::llama, true, false, 4},
    {"qwen2_biases", Family::llama, false, true, 2},      {"gpt2_tied", Family::gpt2, true, false, 4},
    {"gpt2_untied", Family::gpt2, false, false, 4},
};

// Matrices' rows are whole 32-element blocks; norm_eps as f32 holds it (GGUF stores f32).
ModelConfig tiny(const Variant& v) {
  ModelConfig c = preset(v.family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.name = "export test";
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = v.n_kv_head;
  c.d_ff = 96;
  c.vocab_size = 40;
  c.n_ctx = 32;
  c.tied_embeddings = v.tied;
  c.qkv_bias = v.qkv_bias;
  c.norm_eps = double(float(1e-5));
  return c;
}

std::unique_ptr<Decoder> random_model(const ModelConfig& c, uint64_t seed) {
  auto m = std::make_unique<Decoder>(c);
  m->init_weights(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.05f);
  float* p = m->params().data<float>();
  for (int64_t i = 0; i < m->flat_size(); ++i) p[i] += noise(rng);
  return m;
}

std::string temp_path(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("export-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string export_gguf(const Decoder& m, GgufExportType type, GgufExportReport* report = nullptr) {
  io::GgufWriter w;
  const GgufExportReport r = add_gguf_model(m, m.config().name, type, w);
  if (report) *report = r;
  const std::string path = temp_path(str_cat("model_", gguf_export_type_name(type), ".gguf"));
  w.write(path);
  return path;
}

std::unique_ptr<Decoder> read_gguf(const std::string& path) {
  const io::GgufFile g = io::GgufFile::open(path);
  auto m = std::make_unique<Decoder>(gguf_model_config(g));
  load_gguf_weights(g, *m);
  return m;
}

int64_t differing(const Tensor& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += std::memcmp(a.data<float>() + i, &b[size_t(i)], 4) != 0;
  return n;
}

}  // namespace

class GgufExport : public ::testing::TestWithParam<Variant> {};

TEST_P(GgufExport, F32ReadsBackBitForBit) {
  const auto src = random_model(tiny(GetParam()), 3);
  const auto dst = read_gguf(export_gguf(*src, GgufExportType::f32));
  const ModelConfig &a = src->config(), &b = dst->config();
  EXPECT_EQ(b.family, a.family);
  EXPECT_EQ(b.qkv_bias, a.qkv_bias);
  EXPECT_EQ(b.tied_embeddings, a.tied_embeddings);
  EXPECT_EQ(b.n_kv_head, a.n_kv_head);
  EXPECT_EQ(b.d_ff, a.d_ff);
  EXPECT_EQ(b.vocab_size, a.vocab_size);
  EXPECT_EQ(b.norm_eps, a.norm_eps);
  EXPECT_EQ(b.name, a.name);
  ASSERT_EQ(dst->flat_size(), src->flat_size());
  for (const ParamInfo& p : src->layout().params()) {
    const Tensor t = src->param(p.name);
    EXPECT_EQ(differing(dst->param(p.name), {t.data<float>(), t.data<float>() + t.numel()}), 0) << p.name;
  }
}

// The exporter's file holds the tensors the fixture (written apart from the exporter, as
// llama.cpp's converter lays them out) holds, byte for byte: the same names, dims and rows.
TEST_P(GgufExport, F32TensorsAreTheConverterLayout) {
  const Variant v = GetParam();
  const auto m = random_model(tiny(v), 5);
  const io::GgufFile ours = io::GgufFile::open(export_gguf(*m, GgufExportType::f32));
  loom::testing::GgufFixture f;
  f.arch = v.qkv_bias ? "qwen2" : "";
  const std::string fixture_path = temp_path("fixture.gguf");
  loom::testing::gguf_writer_of(*m, f).write(fixture_path);
  const io::GgufFile theirs = io::GgufFile::open(fixture_path);
  ASSERT_EQ(ours.tensors().size(), theirs.tensors().size());
  for (const io::GgufTensor& t : theirs.tensors()) {
    ASSERT_TRUE(ours.contains(t.name)) << t.name;
    const io::GgufTensor& o = ours.tensor(t.name);
    EXPECT_EQ(o.ne, t.ne) << t.name;
    ASSERT_EQ(o.nbytes, t.nbytes) << t.name;
    EXPECT_EQ(std::memcmp(ours.data(o), theirs.data(t), t.nbytes), 0) << t.name;
  }
  for (const char* k : {"general.architecture", "llama.rope.dimension_count", "llama.attention.head_count_kv"}) {
    if (theirs.has(k)) {
      EXPECT_EQ(ours.value(k).describe(), theirs.value(k).describe()) << k;
    }
  }
}

// Each type stores what io::quantize makes of the weights, which the reader dequantizes back:
// vectors stay F32, a quantized file's head is Q8_0.
TEST_P(GgufExport, EachTypeReadsBackAsItsQuantizerStoresIt) {
  const auto src = random_model(tiny(GetParam()), 9);
  const std::pair<GgufExportType, io::GgmlType> types[] = {
      {GgufExportType::f16, io::GgmlType::f16},   {GgufExportType::bf16, io::GgmlType::bf16},
      {GgufExportType::q8_0, io::GgmlType::q8_0}, {GgufExportType::q5_1, io::GgmlType::q5_1},
      {GgufExportType::q5_0, io::GgmlType::q5_0}, {GgufExportType::q4_1, io::GgmlType::q4_1},
      {GgufExportType::q4_0, io::GgmlType::q4_0}};
  for (const auto& [type, matrix] : types) {
    SCOPED_TRACE(gguf_export_type_name(type));
    const std::string path = export_gguf(*src, type);
    const io::GgufFile g = io::GgufFile::open(path);
    const auto dst = read_gguf(path);
    for (const ParamInfo& p : src->layout().params()) {
      const io::GgufTensor& t = g.tensor(gguf_tensor_name(src->config(), p.name));
      const bool head = t.name == "output.weight" || (src->config().tied_embeddings && t.name == "token_embd.weight");
      const bool vector = t.ne.size() == 1 || t.name == "position_embd.weight";
      const bool quantized = type != GgufExportType::f16 && type != GgufExportType::bf16;
      const io::GgmlType want = vector ? io::GgmlType::f32 : head && quantized ? io::GgmlType::q8_0 : matrix;
      EXPECT_EQ(t.type, want) << t.name;
      const Tensor w = src->param(p.name);
      std::vector<float> stored(size_t(w.numel()));
      const std::string q = io::quantize(t.type, w.data<float>(), w.numel());
      io::dequantize(t.type, q.data(), stored.data(), w.numel());
      EXPECT_EQ(differing(dst->param(p.name), stored), 0) << p.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GgufExport, ::testing::ValuesIn(kVariants),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GgufExportTypes, MatricesTakeTheTypeAskedFor) {
  const auto m = random_model(tiny(kVariants[0]), 1);
  for (const auto& [type, ggml] : {std::pair{GgufExportType::q4_1, "Q4_1"}, std::pair{GgufExportType::f16, "F16"}}) {
    const io::GgufFile g = io::GgufFile::open(export_gguf(*m, type));
    EXPECT_EQ(io::ggml_type_name(g.tensor("blk.0.attn_q.weight").type), ggml);
    EXPECT_EQ(io::ggml_type_name(g.tensor("blk.1.ffn_down.weight").type), ggml);
    EXPECT_EQ(g.get_int("general.file_type"), type == GgufExportType::q4_1 ? 3 : 1);
  }
  EXPECT_EQ(gguf_export_type("q5_k"), std::nullopt);
  EXPECT_EQ(gguf_export_type("q8_0"), GgufExportType::q8_0);
}

// A matrix whose rows are not whole blocks of 32 is stored in F16, said in a note.
TEST(GgufExportTypes, RowsThatAreNotWholeBlocksStayF16) {
  ModelConfig c = tiny(kVariants[0]);
  c.d_ff = 48;
  const auto m = random_model(c, 2);
  GgufExportReport r;
  const io::GgufFile g = io::GgufFile::open(export_gguf(*m, GgufExportType::q8_0, &r));
  EXPECT_EQ(g.tensor("blk.0.ffn_down.weight").type, io::GgmlType::f16);
  EXPECT_EQ(g.tensor("blk.0.ffn_up.weight").type, io::GgmlType::q8_0);
  ASSERT_EQ(r.notes.size(), 2u);
  EXPECT_EQ(r.notes[0], "blk.0.ffn_down.weight kept in F16: its rows of 48 are not whole blocks of 32");
}

TEST(GgufExportRope, LinearAndLlama3ScalingReadBack) {
  ModelConfig c = tiny(kVariants[0]);
  c.rope_scaling.type = RopeScaling::Type::linear;
  c.rope_scaling.factor = 4;
  EXPECT_EQ(read_gguf(export_gguf(*random_model(c, 4), GgufExportType::f32))->config().rope_inv_freq(),
            c.rope_inv_freq());
  c.rope_scaling = {};
  c.rope_scaling.type = RopeScaling::Type::llama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.original_max_position = 16;  // so that the context's wavelengths span all three regimes
  const auto back = read_gguf(export_gguf(*random_model(c, 4), GgufExportType::f32));
  EXPECT_EQ(back->config().rope_scaling.type, RopeScaling::Type::factors);
  const std::vector<double> want = c.rope_inv_freq(), got = back->config().rope_inv_freq();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i] / want[i], 1.0, 1e-6) << i;
}

TEST(GgufExportRefusals, MixtureOfExpertsNamesTheHfFormat) {
  ModelConfig c = preset("llama-moe-tiny");
  c.name = "moe";
  const auto m = random_model(c, 1);
  io::GgufWriter w;
  EXPECT_EQ(error_of([&] { add_gguf_model(*m, "moe", GgufExportType::f32, w); }),
            "[export] moe is a Mixture-of-Experts model (4 experts); GGUF export writes dense llama, qwen2 and gpt2 "
            "models: use --format hf");
}

TEST(HfExport, ConfigNamesTheDtypeAndSpecialTokens) {
  const ModelConfig c = tiny(kVariants[1]);
  const nlohmann::json j = nlohmann::json::parse(hf_export_config_json(c, {DType::bf16, 1, 2}));
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["bos_token_id"], 1);
  EXPECT_EQ(j["eos_token_id"], 2);
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(nlohmann::json::parse(hf_export_config_json(tiny(kVariants[3]), {}))["architectures"][0],
            "GPT2LMHeadModel");
  const ModelConfig back = parse_hf_config(j.dump(), "config.json");
  EXPECT_EQ(back.n_kv_head, c.n_kv_head);
  EXPECT_EQ(back.tied_embeddings, c.tied_embeddings);
}

TEST(HfExport, F32WeightsLoadBackBitForBit) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const auto src = random_model(tiny(v), 6);
    const fs::path dir = temp_path(std::string("hf_") + v.name);
    fs::create_directories(dir);
    EXPECT_TRUE(write_hf_model(*src, dir.string(), {}).empty());
    const ModelConfig cfg = read_hf_config((dir / "config.json").string());
    Decoder dst(cfg);
    load_hf_safetensors(dst, (dir / "model.safetensors").string());
    ASSERT_EQ(dst.flat_size(), src->flat_size());
    EXPECT_EQ(std::memcmp(dst.params().data<float>(), src->params().data<float>(), size_t(src->flat_size()) * 4), 0);
  }
}
