// Starting a run from a model that already exists (model.init_from): a GGUF file, a Hugging
// Face directory, or a loom checkpoint (or a run directory: its newest valid checkpoint). The
// source gives the architecture, the weights (quantized GGUF tensors dequantized to f32) and
// the tokenizer; the optimizer starts fresh at step 0. A resumed run continues from its own
// checkpoints and never reads the source again for weights.
#pragma once
#include <memory>
#include <string>

#include "loom/comm/group.h"
#include "loom/core/tensor.h"
#include "loom/model/config.h"
#include "loom/model/decoder.h"
#include "loom/model/model_source.h"
#include "loom/model/param_layout.h"

namespace loom::train {

// The source's architecture (its config.json, GGUF metadata or checkpoint config), named after
// the file or directory. Throws naming the path when it is none of the three kinds.
model::ModelConfig init_source_config(const std::string& path);

// The source as every rank reads it, resolved once: what it is, and its card (GGUF, Hugging
// Face) or the one checkpoint a loom source names.
struct InitSource {
  std::string path;  // as model.init_from gives it
  model::ModelFormat format = model::ModelFormat::loom;
  std::shared_ptr<const model::ModelCard> card;  // GGUF and Hugging Face sources
  std::string checkpoint;                        // loom sources: the checkpoint directory read
};

// Collective over `g`. A loom run directory becomes the checkpoint rank 0 finds newest and valid
// (verified once there), so that no rank reads another step; a GGUF file or Hugging Face
// directory has its card read here, once per rank.
InitSource resolve_init_source(const std::string& path, const comm::Group& g);

// Checks that the data (`data_vocab` tokens, from data.dir=`data_dir`) was tokenized by a
// tokenizer of the source's vocabulary; throws naming both and the `loom prepare --tokenizer`
// that fixes it otherwise.
void check_init_source_data(const InitSource& src, int64_t data_vocab, const std::string& data_dir);

// The files that carry the source's tokenizer, chat template and end tokens into every
// checkpoint of the run, so that each stands alone as the source did (model::tokenizer_files;
// for a loom checkpoint, the files of io::kTokenizerFiles it holds), and what they record.
model::TokenizerFiles init_source_tokenizer_files(const InitSource& src);

// The identity of the source's weights, for LoRA checkpoints (model::weights_sha256). Seconds for
// a few GB.
std::string init_source_sha256(const InitSource& src);

// Fills local_flat (laid out by m.base_layout(): this rank's slice of the model under any dp, tp,
// pp or ep layout; under LoRA the frozen model's) with the source's weights, and `m`'s MoE balancing biases from a loom
// source. `whole` is the whole model's layout when `local` is a slice, else null. Returns what was read, for the
// start-up line ("GGUF: Q4_1 x210, F32 x61 dequantized to f32 in 1.2 s").
std::string load_init_weights(const InitSource& src, model::Decoder& m, const Tensor& local_flat,
                              const model::ParamLayout* whole);

}  // namespace loom::train
