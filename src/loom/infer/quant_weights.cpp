#include "loom/infer/quant_weights.h"

#include "loom/core/error.h"
#include "loom/model/block.h"
#include "loom/model/param_layout.h"

namespace loom::infer {

std::string QuantSpec::describe() const {
  std::string s = cpu::quant_format_name(format);
  if (format != cpu::QuantFormat::bf16) s += group > 0 ? str_cat(" g", group) : std::string(" per-channel");
  if (zero_point) s += " zero-point";
  s += !head ? " head f32" : format == cpu::QuantFormat::bf16 ? " head bf16" : " head int8";
  return s;
}

std::optional<QuantSpec> parse_quant_spec(const std::string& name, int64_t group, const std::string& head,
                                          bool zero_point) {
  LOOM_CHECK(head == "int8" || head == "f32", "quant", "--quant-head ", head, ": expected int8 or f32");
  LOOM_CHECK(group == -1 || group >= 0, "quant", "--group ", group,
             ": expected a group size (weights per scale, e.g. 32, 64 or 128) or 0 for one scale per row");
  if (name == "fp32" || name == "f32") {
    LOOM_CHECK(group == -1 && !zero_point, "quant", "--group and --zero-point need --quant int8 or int4");
    return std::nullopt;
  }
  QuantSpec s;
  if (name == "bf16") {
    LOOM_CHECK(group == -1 && !zero_point, "quant", "--group and --zero-point need --quant int8 or int4 ",
               "(bf16 weights have no scales)");
    s.format = cpu::QuantFormat::bf16;
  } else if (name == "int8") {
    s.format = cpu::QuantFormat::int8;
    s.group = group < 0 ? 0 : group;
    LOOM_CHECK(!zero_point, "quant", "--zero-point is for --quant int4 (int8 is symmetric)");
  } else if (name == "int4") {
    s.format = cpu::QuantFormat::int4;
    s.group = group < 0 ? 64 : group;
  } else {
    fail("quant", "--quant ", name, ": expected fp32, bf16, int8 or int4");
  }
  s.zero_point = zero_point;
  s.head = head == "int8";
  s.default_group = group == -1;
  return s;
}

cpu::QuantView QuantizedMatrix::view() const {
  cpu::QuantView v;
  v.format = format;
  v.rows = rows;
  v.cols = cols;
  v.group = group;
  v.q = static_cast<const uint8_t*>(q.raw());
  v.scales = scales.defined() ? scales.data<float>() : nullptr;
  v.offsets = offsets.defined() ? offsets.data<float>() : nullptr;
  return v;
}

int64_t QuantizedMatrix::bytes() const {
  return int64_t(q.nbytes() + (scales.defined() ? scales.nbytes() : 0) + (offsets.defined() ? offsets.nbytes() : 0));
}

QuantizedMatrix QuantizedMatrix::quantize(const Tensor& w, cpu::QuantFormat f, int64_t group, bool zero_point) {
  LOOM_CHECK(w.dtype() == DType::f32 && w.ndim() == 2, "quant", "expected an f32 matrix, got ", w.describe());
  QuantizedMatrix m;
  m.format = f;
  m.rows = w.size(0);
  m.cols = w.size(1);
  m.group = group > 0 ? group : m.cols;
  const bool bf16 = f == cpu::QuantFormat::bf16;
  const int64_t groups = m.cols / m.group;
  cpu::quant_bytes(f, m.rows, m.cols, m.group, zero_point);  // throws for a group that does not fit
  m.q = bf16 ? Tensor::empty({m.rows, m.cols}, DType::bf16, MemCategory::params)
             : Tensor::empty({m.rows, cpu::quant_row_bytes(f, m.cols)}, DType::u8, MemCategory::params);
  if (!bf16) m.scales = Tensor::empty({m.rows, groups}, DType::f32, MemCategory::params);
  if (zero_point) m.offsets = Tensor::empty({m.rows, groups}, DType::f32, MemCategory::params);
  cpu::quantize_weights(w.data<float>(), m.rows, m.cols, f, m.group, zero_point, static_cast<uint8_t*>(m.q.raw()),
                        bf16 ? nullptr : m.scales.data<float>(), zero_point ? m.offsets.data<float>() : nullptr);
  return m;
}

void QuantizedMatrix::dequantize_into(const Tensor& out) const {
  LOOM_CHECK(out.dtype() == DType::f32 && out.numel() == rows * cols, "quant", "dequantize_into needs an f32 [", rows,
             ", ", cols, "] tensor, got ", out.describe());
  cpu::dequantize_weights(view(), out.data<float>());
}

BlockMatrices block_matrices(const model::Decoder& model, int layer) {
  const model::BlockWeights w = model::block_weights(model.config(), model.layout(), model.params(), layer);
  return {w.qkv_w, w.proj_w, w.fc_w, w.out_w};
}

Tensor head_matrix(const model::Decoder& model) { return model.param(model::lm_head_name(model.config())); }

QuantizedModel QuantizedModel::assemble(model::Decoder& model, const QuantSpec& spec, const MakeMatrix& make) {
  LOOM_CHECK(model.layout().whole_model() && model.params().dtype() == DType::f32, "quant",
             "quantization needs the whole model in f32 on one process");
  LOOM_CHECK(!model.config().moe.enabled(), "quant", "model ", model.config().name,
             " has Mixture-of-Experts blocks, whose experts have no quantized kernels yet; serve it in "
             "fp32 (drop --quant)");
  QuantizedModel qm;
  qm.spec = spec;
  auto one = [&](const Tensor& w, cpu::QuantFormat f, bool zero_point) {
    QuantizedMatrix m = make(w, f, zero_point);
    m.dequantize_into(w);  // every path (a tied table's embedding rows too) sees these values
    return m;
  };
  for (int l = 0; l < int(model.config().n_layer); ++l) {
    const BlockMatrices b = block_matrices(model, l);
    qm.blocks.push_back({one(b.qkv, spec.format, spec.zero_point), one(b.proj, spec.format, spec.zero_point),
                         one(b.fc, spec.format, spec.zero_point), one(b.out, spec.format, spec.zero_point)});
  }
  // The head in int8 whatever the integer body's format: it is the model's largest matrix in
  // GPT-2 and the most sensitive to rounding (docs/INFERENCE.md has both measured).
  if (spec.head) qm.head = one(head_matrix(model), qm.head_format(), false);
  return qm;
}

QuantizedModel QuantizedModel::quantize(model::Decoder& model, const QuantSpec& spec) {
  return assemble(model, spec, [&](const Tensor& w, cpu::QuantFormat f, bool zero_point) {
    return QuantizedMatrix::quantize(w, f, spec.group, zero_point);
  });
}

cpu::QuantFormat QuantizedModel::head_format() const {
  return spec.format == cpu::QuantFormat::bf16 ? cpu::QuantFormat::bf16 : cpu::QuantFormat::int8;
}

int64_t QuantizedModel::bytes() const {
  int64_t b = head ? head->bytes() : 0;
  for (const Block& k : blocks) b += k.qkv.bytes() + k.proj.bytes() + k.fc.bytes() + k.out.bytes();
  return b;
}

}  // namespace loom::infer
