// The quantized checkpoint `loom quantize` writes and `loom generate`, `serve`, `eval` and
// `bench infer` load. A directory:
//   quant.safetensors  every parameter that is not quantized, f32 under its loom name (the
//                      ParamLayout's, [out, in]), and per quantized matrix NAME (a block's
//                      "<prefix>qkv", "proj", "fc", "out", or "head"): NAME.q (u8, packed as
//                      kernels/cpu/quant_linear.h says; bf16 [rows, cols] for bf16), NAME.scales
//                      (f32 [rows, cols/group]; none for bf16),
//                      NAME.offsets (f32 [rows, cols/group], asymmetric int4; checkpoints
//                      written before offsets hold NAME.zeros, u8 zero points z, read as
//                      offsets -scale * z); metadata: the QuantSpec, the
//                      model's name and the source checkpoint with its weights' CRC32C
//   config.json, config.yaml, trainer_state.json   copied from the source checkpoint
//   manifest.json      format "loom-quantized-checkpoint", each file's size and CRC32C
// It holds no optimizer state: it is for inference, not for resuming training.
#pragma once
#include <memory>
#include <string>

#include "loom/infer/quant_weights.h"
#include "loom/model/decoder.h"

namespace loom::infer {

// Writes out_dir (replacing it) from a model already passed through QuantizedModel::quantize
// and the training checkpoint it was loaded from.
void save_quantized_checkpoint(const std::string& out_dir, const std::string& source_dir, const model::Decoder& model,
                               const QuantizedModel& quant);

// True when dir holds a quantized checkpoint's manifest.
bool is_quantized_checkpoint(const std::string& dir);

struct QuantizedCheckpoint {
  std::unique_ptr<model::Decoder> model;  // f32; the quantized matrices hold their dequantized values
  QuantizedModel quant;
  std::string source;         // the training checkpoint it was made from
  std::string source_crc32c;  // of that checkpoint's model.safetensors
};
// Verifies every checksum, then builds the model from config.json and fills it. Throws
// "[quant] DIR ..." naming the file and the fix.
QuantizedCheckpoint load_quantized_checkpoint(const std::string& dir);

}  // namespace loom::infer
