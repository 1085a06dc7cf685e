// Quantized weights for inference: the matrices of every block (q|k|v, attention output, MLP in
// and out) and, unless asked otherwise, the LM head, as int8 or int4 with f32 scales per group,
// or as bf16 (kernels/cpu/quant_linear.h holds the storage and the kernels). Made from a model's f32
// weights (quantize on load) or read from a quantized checkpoint (`loom quantize`). Token and
// position embeddings, norms and biases stay f32. Not for training: nothing here has a backward.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/io/gguf.h"
#include "loom/kernels/cpu/quant_linear.h"
#include "loom/model/decoder.h"

namespace loom::infer {

struct QuantSpec {
  cpu::QuantFormat format = cpu::QuantFormat::int8;
  int64_t group = 0;           // weights per scale along a row; 0: one scale per row (per channel)
  bool zero_point = false;     // int4 only: asymmetric, w = scale * q + offset (offset = -scale * zero)
  bool head = true;            // the LM head too (int8 with the same group rule, or bf16 for bf16)
  bool default_group = false;  // no group was asked for: `group` is the format's default
  // "int8 per-channel", "int4 g64 zero-point", "bf16", each with " head int8" (" head bf16") or
  // " head f32".
  std::string describe() const;
};

// From the command line's --quant NAME (fp32, int8, int4, bf16), --group N (0 or absent: int8
// per channel, int4 64; not for bf16), --quant-head int8|f32 (int8 means the head in the body's
// format for bf16) and --zero-point. nullopt for fp32. Throws "[quant] ..." naming the option
// and the accepted values.
std::optional<QuantSpec> parse_quant_spec(const std::string& name, int64_t group = -1, const std::string& head = "int8",
                                          bool zero_point = false);

// One quantized [rows, cols] matrix: its packed weights (u8; bf16 [rows, cols] for bf16),
// scales (none for bf16) and (asymmetric int4) offsets, owned as tensors
// (MemCategory::params).
struct QuantizedMatrix {
  cpu::QuantFormat format = cpu::QuantFormat::int8;
  int64_t rows = 0, cols = 0, group = 0;
  Tensor q, scales, offsets;
  cpu::QuantView view() const;
  int64_t bytes() const;
  // Quantizes w [rows, cols] (f32); group 0 means cols.
  static QuantizedMatrix quantize(const Tensor& w, cpu::QuantFormat f, int64_t group, bool zero_point);
  // The f32 values the kernels compute with, into `out` [rows, cols].
  void dequantize_into(const Tensor& out) const;
};

// The quantized matrices of a whole model, by role.
struct QuantizedModel {
  QuantSpec spec;
  struct Block {
    QuantizedMatrix qkv, proj, fc, out;
  };
  std::vector<Block> blocks;
  std::optional<QuantizedMatrix> head;  // with spec.head

  // Quantizes the model's matrices, then overwrites their f32 values in the model with the
  // dequantized ones, so that every path (a tied token table's embedding rows included) sees
  // the weights a quantized checkpoint holds: quantizing on load and loading `loom quantize`'s
  // output give the same outputs. The model must be whole (no tensor or pipeline slice), f32.
  static QuantizedModel quantize(model::Decoder& model, const QuantSpec& spec);
  // The same for a model load_gguf_weights filled from `g`, but a matrix whose blocks in the
  // file loom's format holds exactly is taken from them with no round trip through f32: Q8_0
  // as int8, Q4_0 as int4 and Q4_1 as int4 with offsets, when the spec's format is that one
  // and its group 32 (GGUF's block). The rest are quantized from the dequantized weights, as
  // `quantize` does. `how` (when not null) gets what was kept and what was requantized.
  static QuantizedModel from_gguf(model::Decoder& model, const io::GgufFile& g, const QuantSpec& spec,
                                  std::string* how = nullptr);
  int64_t bytes() const;                 // of the quantized matrices
  cpu::QuantFormat head_format() const;  // the head's, when spec.head

 private:
  // The model's matrices by role, each made by `make` from its f32 weights, format and zero
  // point flag, then written back dequantized into the model; quantize and from_gguf differ
  // only in `make`.
  using MakeMatrix = std::function<QuantizedMatrix(const Tensor& w, cpu::QuantFormat f, bool zero_point)>;
  static QuantizedModel assemble(model::Decoder& model, const QuantSpec& spec, const MakeMatrix& make);
};

// The matrices a block's roles name in the model (the views runner and quantizer share).
struct BlockMatrices {
  Tensor qkv, proj, fc, out;
};
BlockMatrices block_matrices(const model::Decoder& model, int layer);
// The LM head's weight [vocab, d_model] (the token table when tied).
Tensor head_matrix(const model::Decoder& model);

}  // namespace loom::infer
