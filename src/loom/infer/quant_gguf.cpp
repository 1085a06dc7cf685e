// QuantizedModel::from_gguf: a GGUF file's Q8_0, Q4_0 and Q4_1 blocks moved into loom's int8 and
// int4 formats bit for bit (the scales and offsets are the blocks' fp16 values widened to f32),
// so that a model downloaded at 4 or 8 bits runs at the precision it was published at.
#include <cstring>
#include <map>

#include "loom/core/dtype.h"
#include "loom/core/error.h"
#include "loom/infer/quant_weights.h"
#include "loom/model/gguf_model.h"
#include "loom/model/param_layout.h"

namespace loom::infer {
namespace {

// Blocks of 32 weights. Q8_0: fp16 d, 32 int8 q (d q). Q4_0: fp16 d, 16 bytes of nibbles
// (d (q - 8)). Q4_1: fp16 d, fp16 m, 16 bytes of nibbles (d q + m).
constexpr int64_t kBlock = 32;

float half(const uint8_t* p) {
  f16_t h;
  std::memcpy(&h.bits, p, 2);
  return f16_to_f32(h);
}

// Whether the blocks of type t hold weights that format f with groups of 32 represents exactly.
bool fits(io::GgmlType t, cpu::QuantFormat f) {
  return f == cpu::QuantFormat::int8
             ? t == io::GgmlType::q8_0
             : f == cpu::QuantFormat::int4 && (t == io::GgmlType::q4_0 || t == io::GgmlType::q4_1);
}

// One parameter's rows of a matrix: rows [row0, row0 + rows) of the matrix come from `src`.
struct Part {
  int64_t row0 = 0, rows = 0;
  model::GgufSource src;
};

// Row r of part p into row (p.row0 + r) of m. Q4_0 into a matrix with offsets takes the offset
// -8 d and the unsigned nibble; into one without, the nibble ^ 8 (the signed value q - 8).
void move_row(const io::GgufFile& g, const Part& p, int64_t r, QuantizedMatrix& m) {
  const io::GgufTensor& t = *p.src.tensor;
  int64_t elems = 0, bb = 0;
  io::ggml_block_shape(t.type, &elems, &bb);  // Q8_0 34 bytes, Q4_0 18, Q4_1 20 per 32 weights
  const int64_t cols = m.cols, nb = cols / kBlock;
  const uint8_t* row = g.data(t) + p.src.source_row(r) * nb * bb;
  const int64_t o = p.row0 + r;
  float* scales = m.scales.data<float>() + o * nb;
  float* offsets = m.offsets.defined() ? m.offsets.data<float>() + o * nb : nullptr;
  uint8_t* q = static_cast<uint8_t*>(m.q.raw()) + o * cpu::quant_row_bytes(m.format, cols);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = row + b * bb;
    scales[b] = half(blk);
    if (t.type == io::GgmlType::q8_0) {
      std::memcpy(q + b * kBlock, blk + 2, kBlock);
      continue;
    }
    const uint8_t* qs = blk + (t.type == io::GgmlType::q4_1 ? 4 : 2);
    uint8_t flip = 0;
    if (t.type == io::GgmlType::q4_1)
      offsets[b] = half(blk + 2);
    else if (offsets)
      offsets[b] = -8.f * scales[b];
    else
      flip = 8;
    // GGUF: element j < 16 is the low nibble of byte j, element j + 16 its high nibble; loom:
    // column 2k in the low nibble of byte k, 2k + 1 in the high one.
    auto nib = [&](int64_t e) { return uint8_t(((e < 16 ? qs[e] : qs[e - 16] >> 4) & 0xF) ^ flip); };
    for (int64_t k = 0; k < kBlock / 2; ++k) q[b * kBlock / 2 + k] = uint8_t(nib(2 * k) | (nib(2 * k + 1) << 4));
  }
}

}  // namespace

QuantizedModel QuantizedModel::from_gguf(model::Decoder& model, const io::GgufFile& g, const QuantSpec& spec,
                                         std::string* how) {
  const model::ParamLayout& layout = model.layout();
  const std::map<std::string, model::GgufSource> sources = model::gguf_sources(g, model.config());
  const float* flat = model.params().data<float>();
  std::map<std::string, int> kept, requantized;  // by GGUF type
  // The parameters whose rows make up matrix w (a view into the flat parameters), in order.
  auto parts_of = [&](const Tensor& w) {
    const int64_t begin = w.data<float>() - flat, end = begin + w.numel(), cols = w.size(1);
    std::vector<Part> parts;
    for (const model::ParamInfo& p : layout.params())
      if (p.offset >= begin && p.offset < end)
        parts.push_back({(p.offset - begin) / cols, p.numel() / cols, sources.at(p.name)});
    return parts;
  };
  auto one = [&](const Tensor& w, cpu::QuantFormat f, bool zero_point) {
    const std::vector<Part> parts = parts_of(w);
    bool exact = spec.group == kBlock && w.size(1) % kBlock == 0 && !parts.empty();
    bool offsets = zero_point, any_q4_1 = false;
    for (const Part& p : parts) {
      exact = exact && fits(p.src.tensor->type, f);
      any_q4_1 = any_q4_1 || p.src.tensor->type == io::GgmlType::q4_1;
    }
    QuantizedMatrix m;
    if (!exact) {
      m = QuantizedMatrix::quantize(w, f, spec.group, zero_point);
      for (const Part& p : parts) requantized[io::ggml_type_name(p.src.tensor->type)] += 1;
    } else {
      offsets = offsets || any_q4_1;
      m.format = f;
      m.rows = w.size(0);
      m.cols = w.size(1);
      m.group = kBlock;
      const int64_t groups = m.cols / kBlock;
      m.q = Tensor::empty({m.rows, cpu::quant_row_bytes(f, m.cols)}, DType::u8, MemCategory::params);
      m.scales = Tensor::empty({m.rows, groups}, DType::f32, MemCategory::params);
      if (offsets) m.offsets = Tensor::empty({m.rows, groups}, DType::f32, MemCategory::params);
      for (const Part& p : parts) {
        for (int64_t r = 0; r < p.rows; ++r) move_row(g, p, r, m);
        kept[io::ggml_type_name(p.src.tensor->type)] += 1;
      }
    }
    return m;
  };
  QuantizedModel qm = assemble(model, spec, one);
  if (how) {
    auto list = [](const std::map<std::string, int>& by_type) {
      std::string s;
      for (const auto& [type, n] : by_type) s += str_cat(s.empty() ? "" : ", ", type, " x", n);
      return s;
    };
    *how = kept.empty() ? "no GGUF blocks kept" : str_cat("kept from the file's blocks: ", list(kept));
    if (!requantized.empty())
      *how += str_cat("; quantized from the dequantized weights: ", list(requantized),
                      spec.group == kBlock ? "" : " (GGUF blocks are kept with --group 32)");
  }
  return qm;
}

}  // namespace loom::infer
