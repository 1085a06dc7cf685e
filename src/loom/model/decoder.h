// The decoder-only transformer: embeddings, blocks, final norm and LM head over one flat
// parameter buffer and one flat gradient buffer (category params / grads), with the
// training forward+backward (activation checkpointing optional) and an evaluation forward.
// Knows nothing of data, optimizers or communication.
#pragma once
#include <memory>
#include <vector>

#include "loom/core/tensor.h"
#include "loom/model/block.h"
#include "loom/model/config.h"
#include "loom/model/param_layout.h"

namespace loom::model {

// Where the decoder reads weights and accumulates gradients, asked block by block in
// execution order. The default serves views of the decoder's own flat buffers; parallel
// engines substitute gathered weights (ZeRO-3) or staging gradient buckets (ZeRO-2), and use
// the *_done calls to start communication while computation continues.
class ParamSource {
 public:
  enum class Phase { forward, recompute, backward };
  virtual ~ParamSource() = default;
  virtual BlockWeights block_params(int layer, Phase phase) = 0;
  virtual void release_block_params(int /*layer*/, Phase) {}
  virtual BlockWeights block_grads(int layer) = 0;
  virtual void block_grads_done(int /*layer*/) {}
  // Embeddings, final norm and head, by parameter name.
  virtual Tensor outer_param(const std::string& name) = 0;
  virtual Tensor outer_grad(const std::string& name) = 0;
  virtual void outer_grads_done() {}
  // Brackets of one forward (+ backward) pass.
  virtual void pass_begin(bool /*train*/) {}
  virtual void pass_end(bool /*train*/) {}
};

struct DecoderOptions {
  // 0: off. N > 0: blocks run in segments of N; only each segment's input is kept and the
  // segment is recomputed during backward.
  int activation_checkpoint_interval = 0;
  // Rows of logits materialised at once by the fused head + loss. Each chunk re-reads the head
  // weight three times and rewrites its gradient, so larger chunks trade memory for traffic.
  int64_t xent_chunk = 1024;
  // false: no flat parameter (or gradient) buffer; a ParamSource must serve them (ZeRO-2/3).
  bool allocate_flat_params = true;
  bool allocate_flat_grads = true;
  int64_t unit_align = 1;  // see ParamLayout: the data-parallel degree under ZeRO
};

class Decoder {
 public:
  explicit Decoder(const ModelConfig& cfg, const DecoderOptions& opt = {},
                   DType dtype = DType::f32, Allocator& alloc = cpu_allocator());

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const DecoderOptions& options() const { return opt_; }
  void set_options(const DecoderOptions& opt);
  int64_t num_params() const { return layout_.num_params(); }  // parameters, no padding
  int64_t flat_size() const { return layout_.total(); }      // flat buffer length

  const Tensor& params() const { return params_; }  // flat [P]
  const Tensor& grads() const { return grads_; }    // flat [P]
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  void init_weights(uint64_t seed);
  void zero_grads() {
    if (grads_.defined()) grads_.zero();
  }
  // Replaces where weights and gradients come from (nullptr: the flat buffers). Not owned.
  void set_param_source(ParamSource* src) { src_ = src ? src : default_src_.get(); }

  // Training step on one micro-batch: tokens and targets are [B, T] (targets < 0 ignored).
  // Parameter gradients accumulate as grad_scale * d(sum of token losses). Returns the sum of
  // token losses; *n_valid receives the number of counted targets.
  double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                          double grad_scale, int64_t* n_valid = nullptr);
  // Loss only (no gradients). Same return convention.
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                 int64_t* n_valid = nullptr);
  // Logits [B, T, V] for every position (evaluation and tests).
  void logits(const int32_t* tokens, int64_t B, int64_t T, const Tensor& out);

  // Per-token losses of the last forward, [B*T].
  const Tensor& token_losses() const { return losses_; }
  // Bytes of activation buffers the current (B, T) needs (what memory tests compare).
  int64_t activation_bytes() const;

 private:
  void ensure_buffers(int64_t B, int64_t T, bool train);
  void embed_forward();
  void run_blocks_forward(bool train);
  void final_norm_forward();
  double count_and_sum(const int32_t* targets, int64_t N, int64_t* n_valid);
  bool checkpointed() const { return opt_.activation_checkpoint_interval > 0; }

  ModelConfig cfg_;
  DecoderOptions opt_;
  ParamLayout layout_;
  DType dtype_;
  Allocator& alloc_;
  Tensor params_, grads_;
  std::unique_ptr<ParamSource> default_src_;
  ParamSource* src_ = nullptr;

  // Buffers for the current (B, T).
  int64_t B_ = 0, T_ = 0;
  bool train_buffers_ = false;
  Tensor tokens_, targets_, pos_;
  std::vector<Tensor> res_;        // residual stream: res_[l] is block l's input, res_[L] output
  std::vector<BlockActs> saved_;   // per block when not checkpointed
  std::vector<BlockActs> recompute_;  // checkpointed segment (or evaluation) activations
  Tensor lnf_, lnf_mean_, lnf_rstd_, losses_;
  Tensor dlnf_, dres_, ce_work_;
  BlockScratch scratch_;
};

}  // namespace loom::model
