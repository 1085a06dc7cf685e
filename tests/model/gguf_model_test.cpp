// GGUF models (model/gguf_model.h): tiny random Decoders written as llama.cpp's converter
// writes them (tests/testing/gguf_fixture.h: names, ggml dims, llama's permuted q/k rows) in
// F32, F16 and Q8_0, read back into a fresh Decoder: F32 exactly (parameters and logits), the
// others to the dequantized values. Then the refusals, each naming the key or tensor at fault.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "loom/io/file.h"
#include "loom/io/gguf.h"
#include "loom/io/gguf_quants.h"
#include "loom/model/gguf_model.h"
#include "testing/errors.h"
#include "testing/gguf_fixture.h"

using namespace loom;
using namespace loom::model;
using loom::testing::error_of;
using loom::testing::gguf_writer_of;
using loom::testing::GgufFixture;
namespace fs = std::filesystem;

namespace {

// Dimensions that are multiples of 32, so that every matrix row is whole Q8_0 blocks; norm_eps
// as f32 holds it (GGUF stores it in f32), so the config read back is the same model exactly.
ModelConfig tiny(Family f, bool tied, int64_t n_kv_head) {
  ModelConfig c = preset(f == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.name = "tiny gguf model";
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = n_kv_head;
  c.d_ff = 96;
  c.vocab_size = 40;
  c.n_ctx = 32;
  c.tied_embeddings = tied;
  c.norm_eps = double(float(1e-5));
  c.rope_theta = 10000.0;
  return c;
}

// Random values in every parameter, norms and biases included, so that a tensor loaded into
// the wrong place (or rows in the wrong order) changes the model.
void randomize(Decoder& m, uint64_t seed) {
  m.init_weights(seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0.f, 0.05f);
  float* p = m.params().data<float>();
  for (int64_t i = 0; i < m.flat_size(); ++i) p[i] += noise(rng);
}

// ctest runs each test in its own process, two at a time: the process id keeps their files apart.
std::string temp_path(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("gguf-model-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

std::string write_gguf(const Decoder& m, const std::string& name, const GgufFixture& f = {}) {
  const std::string path = temp_path(name);
  gguf_writer_of(m, f).write(path);
  return path;
}

const std::vector<int32_t> kTokens = {3, 17, 0, 39, 25, 8, 8, 12, 30, 1, 22, 5};

std::vector<float> logits_of(Decoder& m) {
  const int64_t T = int64_t(kTokens.size()), V = m.config().vocab_size;
  Tensor out = Tensor::zeros({1, T, V}, DType::f32, MemCategory::workspace);
  m.logits(kTokens.data(), 1, T, out);
  return {out.data<float>(), out.data<float>() + T * V};
}

// The model the file describes, with its weights.
std::unique_ptr<Decoder> load(const std::string& path, GgufLoadReport* report = nullptr) {
  const io::GgufFile g = io::GgufFile::open(path);
  auto m = std::make_unique<Decoder>(gguf_model_config(g));
  const GgufLoadReport r = load_gguf_weights(g, *m);
  if (report) *report = r;
  return m;
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.n_ctx, b.n_ctx);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.name, b.name);
}

// Every parameter of `got` equals `want`'s as stored in `type` (2-D tensors; 1-D ones are F32):
// dequantize(quantize(x)) of the original, in Hugging Face's row order.
void expect_params_as_stored(const Decoder& want, const Decoder& got, io::GgmlType type) {
  for (const ParamInfo& p : want.layout().params()) {
    const Tensor a = want.param(p.name), b = got.param(p.name);
    ASSERT_EQ(a.numel(), b.numel()) << p.name;
    std::vector<float> expected(a.data<float>(), a.data<float>() + a.numel());
    if (p.shape.ndim() == 2) {
      const std::string q = io::quantize(type, expected.data(), a.numel());
      io::dequantize(type, q.data(), expected.data(), a.numel());
    }
    const float* g = b.data<float>();
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < a.numel(); ++i)
      if (std::memcmp(&expected[size_t(i)], &g[i], sizeof(float)) != 0 && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0) << p.name << ": " << bad << " of " << a.numel() << " elements differ, first at " << first << " ("
                      << expected[size_t(std::max<int64_t>(first, 0))] << " vs " << g[std::max<int64_t>(first, 0)]
                      << ")";
  }
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

float max_abs(const std::vector<float>& a) {
  float d = 0;
  for (float x : a) d = std::max(d, std::fabs(x));
  return d;
}

}  // namespace

// (family, tied head, kv heads)
class GgufRoundTrip : public ::testing::TestWithParam<std::tuple<Family, bool, int64_t>> {};

TEST_P(GgufRoundTrip, F32IsExact) {
  const auto [family, tied, kv] = GetParam();
  Decoder src(tiny(family, tied, kv));
  randomize(src, 7);
  const std::string path = write_gguf(src, "round_trip_f32.gguf");
  GgufLoadReport report;
  auto dst = load(path, &report);
  expect_same_config(src.config(), dst->config());
  EXPECT_EQ(report.quantized_elements, 0);
  EXPECT_EQ(report.elements, src.num_params());
  ASSERT_EQ(src.flat_size(), dst->flat_size());
  EXPECT_EQ(std::memcmp(src.params().data<float>(), dst->params().data<float>(), size_t(src.flat_size()) * 4), 0);
  expect_params_as_stored(src, *dst, io::GgmlType::f32);  // names the tensor when the above fails
  const std::vector<float> want = logits_of(src), got = logits_of(*dst);
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
      << "logits differ by up to " << max_abs_diff(want, got);
}

TEST_P(GgufRoundTrip, F16AndQ8_0LoadTheDequantizedValues) {
  const auto [family, tied, kv] = GetParam();
  Decoder src(tiny(family, tied, kv));
  randomize(src, 11);
  const std::vector<float> want = logits_of(src);
  // F16 rounds each weight to 11 significant bits, Q8_0 to one of 255 steps of its block's
  // largest magnitude: logits move by about 0.06% and 1.5% of their largest magnitude here
  // (q and k rows left in llama.cpp's order move them by about 10%).
  for (const auto& [type, tol] : {std::pair{io::GgmlType::f16, 5e-3f}, std::pair{io::GgmlType::q8_0, 5e-2f}}) {
    SCOPED_TRACE(io::ggml_type_name(type));
    GgufFixture f;
    f.matrix_type = type;
    GgufLoadReport report;
    auto dst = load(write_gguf(src, "round_trip_quant.gguf", f), &report);
    expect_same_config(src.config(), dst->config());
    EXPECT_GT(report.quantized_elements, 0);
    EXPECT_EQ(report.tensors_by_type.count(io::ggml_type_name(type)), 1u) << report.describe();
    expect_params_as_stored(src, *dst, type);
    const std::vector<float> got = logits_of(*dst);
    EXPECT_LT(max_abs_diff(want, got), tol * max_abs(want));
    EXPECT_GT(max_abs_diff(want, got), 0.f) << "a quantized model computes exactly what the f32 one does?";
  }
}

namespace {
std::string variant_name(const ::testing::TestParamInfo<std::tuple<Family, bool, int64_t>>& info) {
  const auto [family, tied, kv] = info.param;
  return str_cat(family == Family::gpt2 ? "gpt2" : "llama", tied ? "_tied" : "_untied", "_kv", kv);
}
}  // namespace

INSTANTIATE_TEST_SUITE_P(Variants, GgufRoundTrip,
                         ::testing::Values(std::tuple{Family::llama, false, int64_t(2)},  // GQA, own head
                                           std::tuple{Family::llama, true, int64_t(2)},   // GQA, tied head
                                           std::tuple{Family::llama, false, int64_t(4)},  // MHA
                                           std::tuple{Family::gpt2, true, int64_t(4)},
                                           std::tuple{Family::gpt2, false, int64_t(4)}),
                         variant_name);

// The file really holds llama.cpp's order: its attn_q rows are not Hugging Face's, so the exact
// round trip above depends on the loader undoing the permutation.
TEST(GgufLlama, FileHoldsPermutedQRows) {
  Decoder src(tiny(Family::llama, false, 2));
  randomize(src, 3);
  const io::GgufFile g = io::GgufFile::open(write_gguf(src, "permuted.gguf"));
  const io::GgufTensor& t = g.tensor("blk.0.attn_q.weight");
  ASSERT_EQ(t.type, io::GgmlType::f32);
  const Tensor q = src.param("model.layers.0.self_attn.q_proj.weight");
  const int64_t C = 64, D = 16;
  // File row 1 is HF row D/2 (the second half's first row of head 0).
  EXPECT_EQ(std::memcmp(g.data(t) + 1 * C * 4, q.data<float>() + (D / 2) * C, size_t(C) * 4), 0);
  EXPECT_NE(std::memcmp(g.data(t) + 1 * C * 4, q.data<float>() + 1 * C, size_t(C) * 4), 0);
}

TEST(GgufLlama, NameFromMetadataElseFileStem) {
  ModelConfig c = tiny(Family::llama, true, 2);
  Decoder src(c);
  io::GgufWriter w = gguf_writer_of(src);
  w.set("general.name", io::gguf_string(""));
  const std::string path = temp_path("my-model.Q8_0.gguf");
  w.write(path);
  EXPECT_EQ(gguf_model_name(io::GgufFile::open(path)), "my-model.Q8_0");
  EXPECT_TRUE(is_gguf_file(path));
  EXPECT_FALSE(is_gguf_file(temp_path("no-such.gguf")));
}

// ---- refusals -------------------------------------------------------------------------------

namespace {

// The error of reading (config, then weights) the file `w` writes.
std::string load_error(const io::GgufWriter& w, const std::string& name = "refused.gguf") {
  const std::string path = temp_path(name);
  w.write(path);
  return error_of([&] { load(path); });
}

io::GgufWriter llama_writer(const GgufFixture& f = {}) {
  Decoder src(tiny(Family::llama, false, 2));
  randomize(src, 5);
  return gguf_writer_of(src, f);
}

}  // namespace

TEST(GgufRefusals, TheUnmodifiedFileLoads) { EXPECT_EQ(load_error(llama_writer()), ""); }

TEST(GgufRefusals, UnknownArchitecture) {
  io::GgufWriter w = llama_writer();
  w.set("general.architecture", io::gguf_string("falcon"));
  const std::string e = load_error(w);
  EXPECT_NE(e.find("general.architecture 'falcon' is not supported"), std::string::npos) << e;
}

TEST(GgufRefusals, RopeScalingLoomDoesNotApply) {
  io::GgufWriter w = llama_writer();
  w.set("llama.rope.scaling.type", io::gguf_string("yarn"));
  w.set("llama.rope.scaling.factor", io::gguf_float(4.0));
  const std::string e = load_error(w);
  EXPECT_NE(e.find("llama.rope.scaling.type is 'yarn'"), std::string::npos) << e;
}

TEST(GgufLlama, LinearRopeScalingIsRead) {
  io::GgufWriter w = llama_writer();
  w.set("llama.rope.scaling.type", io::gguf_string("linear"));
  w.set("llama.rope.scaling.factor", io::gguf_float(4.0));
  const std::string path = temp_path("linear_rope.gguf");
  w.write(path);
  const ModelConfig c = gguf_model_config(io::GgufFile::open(path));
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::linear);
  EXPECT_EQ(c.rope_scaling.factor, 4.0);
}

TEST(GgufRefusals, PartialRotaryDimensions) {
  io::GgufWriter w = llama_writer();
  w.set("llama.rope.dimension_count", io::gguf_uint(8));
  const std::string e = load_error(w);
  EXPECT_NE(e.find("llama.rope.dimension_count=8 rotates part of each head of 16"), std::string::npos) << e;
}

TEST(GgufRefusals, MixtureOfExperts) {
  io::GgufWriter w = llama_writer();
  w.set("llama.expert_count", io::gguf_uint(8));
  w.set("llama.expert_used_count", io::gguf_uint(2));
  const std::string e = load_error(w);
  EXPECT_NE(e.find("llama.expert_count=8"), std::string::npos) << e;
}

TEST(GgufRefusals, MissingTensor) {
  GgufFixture f;
  f.edit = [](std::string& name, std::vector<int64_t>&) { return name != "blk.1.ffn_gate.weight"; };
  const std::string e = load_error(llama_writer(f));
  EXPECT_NE(e.find("missing 1 tensor"), std::string::npos) << e;
  EXPECT_NE(e.find("model.layers.1.mlp.gate_proj.weight"), std::string::npos) << e;
}

TEST(GgufRefusals, MissingTokenTable) {
  GgufFixture f;
  f.edit = [](std::string& name, std::vector<int64_t>&) { return name != "token_embd.weight"; };
  const std::string e = load_error(llama_writer(f));
  EXPECT_NE(e.find("tensor token_embd.weight is missing"), std::string::npos) << e;
}

TEST(GgufRefusals, UnexpectedTensor) {
  io::GgufWriter w = llama_writer();
  std::vector<float> ones(16, 1.f);
  w.add_tensor("blk.0.attn_q_norm.weight", io::GgmlType::f32, {16}, io::quantize(io::GgmlType::f32, ones.data(), 16));
  const std::string e = load_error(w);
  EXPECT_NE(e.find("1 tensor that"), std::string::npos) << e;
  EXPECT_NE(e.find("'blk.0.attn_q_norm.weight'"), std::string::npos) << e;
}

TEST(GgufRefusals, MisshapenTensor) {
  GgufFixture f;
  f.edit = [](std::string& name, std::vector<int64_t>& ne) {
    if (name == "blk.0.attn_k.weight") std::swap(ne[0], ne[1]);  // same bytes, [32, 64] in ggml order
    return true;
  };
  const std::string e = load_error(llama_writer(f));
  EXPECT_NE(e.find("tensor 'blk.0.attn_k.weight' has ggml shape"), std::string::npos) << e;
  EXPECT_NE(e.find("expects [32, 64] (model.layers.0.self_attn.k_proj.weight)"), std::string::npos) << e;
}

TEST(GgufRefusals, TruncatedFile) {
  const std::string path = temp_path("truncated.gguf");
  llama_writer().write(path);
  const std::string bytes = io::read_file(path);
  io::write_file_atomic(path, std::string_view(bytes).substr(0, bytes.size() - 100));
  const std::string e = error_of([&] { load(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}
