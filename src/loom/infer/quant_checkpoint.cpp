#include "loom/infer/quant_checkpoint.h"

#include <filesystem>
#include <iterator>
#include <map>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "loom/core/error.h"
#include "loom/io/checkpoint_files.h"
#include "loom/io/file.h"
#include "loom/io/manifest.h"
#include "loom/io/safetensors.h"
#include "loom/model/block.h"
#include "loom/model/hf_weights.h"
#include "loom/model/param_layout.h"

namespace loom::infer {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kVersion = 1;
constexpr const char* kWeights = "quant.safetensors";

// The quantized matrices of a model by file name: the slot in `q` (QuantizedModel, const when
// saving) and the model's view of the matrix, which loading fills with the dequantized values.
template <class Q>
struct Named {
  std::string name;
  std::conditional_t<std::is_const_v<Q>, const QuantizedMatrix, QuantizedMatrix>* matrix;
  Tensor target;
};

// q's blocks (and head, when it has one) must be in place.
template <class Q>
std::vector<Named<Q>> named_matrices(const model::Decoder& model, Q& q) {
  std::vector<Named<Q>> out;
  for (int l = 0; l < int(model.config().n_layer); ++l) {
    const std::string p = model.layout().block_prefix(l);
    const BlockMatrices m = block_matrices(model, l);
    auto& b = q.blocks[size_t(l)];
    out.push_back({p + "qkv", &b.qkv, m.qkv});
    out.push_back({p + "proj", &b.proj, m.proj});
    out.push_back({p + "fc", &b.fc, m.fc});
    out.push_back({p + "out", &b.out, m.out});
  }
  if (q.head) out.push_back({"head", &*q.head, head_matrix(model)});
  return out;
}

// Parameters whose elements a quantized matrix holds: every element of theirs lies inside one
// of the matrices' views of the flat buffer.
template <class Q>
bool covered(const model::ParamInfo& p, const model::Decoder& model, const std::vector<Named<Q>>& ms) {
  const auto* base = static_cast<const char*>(model.params().raw());
  const int64_t lo = p.offset * 4, hi = (p.offset + p.numel()) * 4;
  for (const auto& m : ms) {
    const int64_t a = static_cast<const char*>(m.target.raw()) - base, b = a + int64_t(m.target.nbytes());
    if (lo >= a && hi <= b) return true;
  }
  return false;
}

std::string source_weights_crc(const std::string& source_dir) {
  try {
    const json m = json::parse(io::read_file((fs::path(source_dir) / "manifest.json").string()));
    return m.at("files").at("model.safetensors").at("crc32c").get<std::string>();
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

void save_quantized_checkpoint(const std::string& out_dir, const std::string& source_dir, const model::Decoder& model,
                               const QuantizedModel& quant) {
  const auto ms = named_matrices(model, quant);
  const fs::path tmp = fs::path(out_dir).string() + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  LOOM_CHECK(!ec, "quant", "cannot create ", tmp.string(), ": ", ec.message());
  io::SafetensorsWriter w;
  for (const model::ParamInfo& p : model.layout().params())
    if (!covered(p, model, ms)) w.add(p.name, model.param(p.name));
  for (const auto& m : ms) {
    w.add(m.name + ".q", m.matrix->q);
    if (m.matrix->scales.defined()) w.add(m.name + ".scales", m.matrix->scales);
    if (m.matrix->offsets.defined()) w.add(m.name + ".offsets", m.matrix->offsets);
    w.set_metadata(m.name + ".format", cpu::quant_format_name(m.matrix->format));
    w.set_metadata(m.name + ".group", std::to_string(m.matrix->group));
  }
  const std::string crc = source_weights_crc(source_dir);
  w.set_metadata("quant", quant.spec.describe());
  w.set_metadata("model", model.config().name);
  w.set_metadata("source", fs::absolute(source_dir).string());
  w.set_metadata("source_model_crc32c", crc);
  w.write((tmp / kWeights).string());
  io::ManifestWriter manifest(tmp.string());
  manifest.record(kWeights);
  // The model files, and a converted model's own tokenizer and chat files (trainer_state.json
  // names them relative to the checkpoint).
  std::vector<const char*> carried = {"config.json", "config.yaml", "trainer_state.json"};
  carried.insert(carried.end(), std::begin(io::kTokenizerFiles), std::end(io::kTokenizerFiles));
  for (const char* f : carried) {
    const fs::path from = fs::path(source_dir) / f;
    if (!fs::exists(from)) continue;
    fs::copy_file(from, tmp / f, fs::copy_options::overwrite_existing, ec);
    LOOM_CHECK(!ec, "quant", "cannot copy ", from.string(), ": ", ec.message());
    manifest.record(f);
  }
  LOOM_CHECK(fs::exists(tmp / "config.json"), "quant", source_dir, " has no config.json; quantize a loom checkpoint");
  manifest.write(io::kQuantizedCheckpointFormat, kVersion,
                 {{"quant", quant.spec.describe()},
                  {"model", model.config().name},
                  {"source", fs::absolute(source_dir).string()},
                  {"source_model_crc32c", crc}});
  io::fsync_dir(tmp.string());
  fs::remove_all(out_dir, ec);
  fs::rename(tmp, out_dir, ec);
  LOOM_CHECK(!ec, "quant", "cannot rename ", tmp.string(), " to ", out_dir, ": ", ec.message());
}

bool is_quantized_checkpoint(const std::string& dir) {
  return io::manifest_format(dir) == io::kQuantizedCheckpointFormat;
}

QuantizedCheckpoint load_quantized_checkpoint(const std::string& dir) {
  std::string why;
  LOOM_CHECK(io::verify_manifest(dir, io::kQuantizedCheckpointFormat, kVersion, &why), "quant", dir,
             " failed verification: ", why, "; run loom quantize again");
  const auto file = io::SafetensorsFile::open((fs::path(dir) / kWeights).string());
  const auto& meta = file.metadata();
  auto meta_of = [&](const std::string& k) {
    auto it = meta.find(k);
    LOOM_CHECK(it != meta.end(), "quant", file.path(), ": metadata ", k, " is missing; run loom quantize again");
    return it->second;
  };
  model::ModelConfig cfg = model::read_hf_config((fs::path(dir) / "config.json").string());
  cfg.name = meta_of("model");
  QuantizedCheckpoint out;
  model::DecoderOptions opt;
  opt.allocate_flat_grads = false;  // inference only
  out.model = std::make_unique<model::Decoder>(cfg, opt);
  model::Decoder& m = *out.model;
  out.source = meta_of("source");
  out.source_crc32c = meta_of("source_model_crc32c");
  QuantizedModel& q = out.quant;
  q.blocks.resize(size_t(cfg.n_layer));
  if (file.contains("head.q")) q.head.emplace();
  const auto ms = named_matrices(m, q);
  for (const auto& n : ms) {
    QuantizedMatrix& x = *n.matrix;
    const std::string fmt = meta_of(n.name + ".format");
    LOOM_CHECK(fmt == "int8" || fmt == "int4" || fmt == "bf16", "quant", file.path(), ": ", n.name, " has format ", fmt,
               ", expected int8, int4 or bf16");
    x.format = fmt == "int8" ? cpu::QuantFormat::int8 : fmt == "int4" ? cpu::QuantFormat::int4 : cpu::QuantFormat::bf16;
    x.rows = n.target.size(0);
    x.cols = n.target.size(1);
    x.group = std::stoll(meta_of(n.name + ".group"));
    LOOM_CHECK(x.group > 0 && x.cols % x.group == 0, "quant", file.path(), ": ", n.name, " group ", x.group,
               " does not divide its ", x.cols, " columns");
    LOOM_CHECK(x.format != cpu::QuantFormat::bf16 || x.group == x.cols, "quant", file.path(), ": ", n.name,
               " is bf16 with group ", x.group, "; bf16 matrices have one group per row (", x.cols, ")");
    auto get = [&](const std::string& suffix, DType dt, Shape shape) {
      const Tensor t = file.get(n.name + suffix);
      LOOM_CHECK(t.dtype() == dt && t.shape() == shape, "quant", file.path(), ": ", n.name, suffix, " is ",
                 t.describe(), ", expected ", dtype_name(dt), shape.str());
      return t.clone(MemCategory::params);
    };
    if (x.format == cpu::QuantFormat::bf16) {
      x.q = get(".q", DType::bf16, {x.rows, x.cols});
    } else {
      x.q = get(".q", DType::u8, {x.rows, cpu::quant_row_bytes(x.format, x.cols)});
      x.scales = get(".scales", DType::f32, {x.rows, x.cols / x.group});
    }
    if (file.contains(n.name + ".offsets")) {
      x.offsets = get(".offsets", DType::f32, {x.rows, x.cols / x.group});
    } else if (file.contains(n.name + ".zeros")) {  // integer zero points z: offset -scale * z
      const Tensor z = get(".zeros", DType::u8, {x.rows, x.cols / x.group});
      x.offsets = Tensor::empty({x.rows, x.cols / x.group}, DType::f32, MemCategory::params);
      for (int64_t k = 0; k < z.numel(); ++k)
        x.offsets.data<float>()[k] = -x.scales.data<float>()[k] * float(z.data<uint8_t>()[k]);
    }
    x.dequantize_into(n.target);
  }
  for (const model::ParamInfo& p : m.layout().params()) {
    if (covered(p, m, ms)) continue;
    const Tensor t = file.get(p.name);
    LOOM_CHECK(t.dtype() == DType::f32 && t.numel() == p.numel(), "quant", file.path(), ": ", p.name, " is ",
               t.describe(), ", expected f32", p.shape.str());
    m.param(p.name).copy_from(t);
  }
  q.spec.format = q.blocks.empty() ? cpu::QuantFormat::int8 : q.blocks[0].qkv.format;
  q.spec.group = q.blocks.empty() || q.blocks[0].qkv.group == q.blocks[0].qkv.cols ? 0 : q.blocks[0].qkv.group;
  q.spec.zero_point = !q.blocks.empty() && q.blocks[0].qkv.offsets.defined();
  q.spec.head = q.head.has_value();
  return out;
}

}  // namespace loom::infer
