// The decoder-only transformer: embeddings, blocks, final norm and LM head over one flat
// parameter buffer and one flat gradient buffer (category params / grads), with the
// training forward+backward (activation checkpointing optional) and an evaluation forward.
// A decoder may hold one slice of the model (DecoderOptions::slice): a pipeline stage, run one
// micro-batch at a time through the stage_* entry points with several micro-batches in
// flight, and/or a tensor-parallel slice whose communication goes through TensorParallelOps.
// Under LoRA (model.lora) those buffers hold the adapters, and the model's own weights sit frozen
// beside them (base_params). Knows nothing of data, optimizers or communication.
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
  // The final norm's and head's gradients are complete (called early in backward, on the
  // stage with the head): a data-parallel engine can start reducing them.
  virtual void head_grads_done() {}
  // Adds the embedding lookup's gradient (rows of dres at tokens / positions) to dwte / dwpe.
  // The default does it densely here; an engine may instead send the few rows involved.
  virtual void embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres, const Tensor& dwte,
                                  const Tensor& dwpe);
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
  // The part of the model this decoder holds (a pipeline stage, a tp slice); default: all.
  ModelSlice slice;
};

class Decoder {
 public:
  explicit Decoder(const ModelConfig& cfg, const DecoderOptions& opt = {}, DType dtype = DType::f32,
                   Allocator& alloc = cpu_allocator());

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  const DecoderOptions& options() const { return opt_; }
  void set_options(const DecoderOptions& opt);
  int64_t num_params() const { return layout_.num_params(); }  // parameters, no padding
  int64_t flat_size() const { return layout_.total(); }        // flat buffer length

  const Tensor& params() const { return params_; }  // flat [P]
  const Tensor& grads() const { return grads_; }    // flat [P]
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;

  void init_weights(uint64_t seed);
  void zero_grads() {
    if (grads_.defined()) grads_.zero();
  }
  // Replaces where weights and gradients come from (nullptr: the flat buffers). Not owned. Under
  // LoRA it serves the adapters and their gradients; the frozen weights stay base_params().
  void set_param_source(ParamSource* src);

  // ---- LoRA training (cfg.lora, options().slice.lora_adapters) ------------------------------
  // layout(), params(), grads() and the ParamSource then hold the adapters only; the model's own
  // weights sit frozen in base_params() (laid out as base_layout(): this rank's slice of the
  // model), get no gradient, and their weight gradients are not computed.
  bool lora() const { return layout_.slice().lora_adapters; }
  const ParamLayout& base_layout() const { return base_layout_ ? *base_layout_ : layout_; }
  // The frozen weights as held: f32, or bf16 with model.lora.base_dtype=bf16.
  const Tensor& base_params() const { return base_layout_ ? base_params_ : params_; }
  // Sets them from f32 values laid out as base_layout() (narrowed to a bf16 base).
  void set_base_params(const Tensor& f32);
  // Bytes the frozen model takes (a bf16 base's f32 copies of its embeddings and head included).
  int64_t frozen_bytes() const;
  void init_base_weights(uint64_t seed);  // random frozen weights (tests); a run loads a model
  // LoRA dropout (model.lora.dropout): the masks of a training micro-batch are a pure function of
  // (seed, step, the micro-batch's index since set_dropout_step, block, adapter, element), so a
  // resumed run draws the same ones. The trainer calls it at each step with a seed of its rank.
  void set_dropout_step(uint64_t seed, int64_t step) {
    dropout_seed_ = seed;
    dropout_step_ = step;
    dropout_micro_.clear();
  }
  // The tensor-parallel communication (required when options().slice.tp > 1). Not owned.
  void set_tensor_parallel(TensorParallelOps* tp) { tp_ = tp; }
  // The expert-parallel exchange (required when options().slice.ep > 1). Not owned.
  void set_expert_parallel(ExpertParallelOps* ep) { ep_ = ep; }

  // Training step on one micro-batch: tokens and targets are [B, T] (targets < 0 ignored).
  // Parameter gradients accumulate as grad_scale * d(sum of token losses). Returns the sum of
  // token losses; *n_valid receives the number of counted targets. positions (optional, [B, T]):
  // rows that pack several documents, each token's position in its document (0 where one
  // starts, then 1, 2, ...); each document then attends only to itself and is embedded (RoPE, or
  // learned positions) from its own start. Without them every row is one document.
  double forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, double grad_scale,
                          int64_t* n_valid = nullptr, const int32_t* positions = nullptr);
  // Loss only (no gradients). Same return convention.
  double forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, int64_t* n_valid = nullptr,
                 const int32_t* positions = nullptr);
  // Logits [B, T, V] for every position (evaluation and tests).
  void logits(const int32_t* tokens, int64_t B, int64_t T, const Tensor& out);

  // ---- Mixture of Experts -------------------------------------------------------------------
  // The router losses of the last micro-batch's forward over this stage's MoE blocks,
  // sum over blocks of router_aux_loss_coef * aux + router_z_loss_coef * z. Training adds them
  // to the objective per token: their gradient is weighted by grad_scale * B * T, so with
  // grad_scale = 1 / tokens the objective is the mean token loss plus the micro-batches'
  // token-weighted mean router loss.
  double last_router_loss() const { return last_router_loss_; }
  // Router statistics of the training forwards since reset_moe_stats(), one entry per MoE block
  // of the model (blocks outside this stage stay empty).
  const std::vector<MoeLayerStats>& moe_stats() const { return moe_stats_; }
  void reset_moe_stats();
  // Seconds spent routing and in the experts since the last take (benchmarks).
  MoeTimes take_moe_times() {
    const MoeTimes t = moe_times_;
    moe_times_ = {};
    return t;
  }
  // DeepSeek-V3's balancing step: each expert's selection bias moves by `rate` towards balance
  // from `stats` (loads summed over every rank that routes tokens). Needs bias_update_rate > 0.
  void update_router_bias(const std::vector<MoeLayerStats>& stats, double rate);
  // [num_moe_layers * E] f32 selection biases; undefined without bias_update_rate.
  const Tensor& router_bias() const { return router_bias_; }
  // MoE block `layer`'s [E] slice of it; undefined for dense blocks or without the bias.
  Tensor router_bias_of(int layer) const;
  void set_router_bias(const std::vector<float>& b);  // a checkpoint's; sizes must match
  // Bytes of activation buffers the current (B, T) needs (what memory tests compare): every
  // micro-batch slot allocated so far plus the shared buffers.
  int64_t activation_bytes() const;

  // ---- pipeline stages --------------------------------------------------------------------
  // A micro-batch goes through stage_begin -> (receive into stage_input) -> stage_forward ->
  // (send stage_output) ... stage_backward(dy) -> (send stage_input_grad). Each micro-batch
  // in flight holds a slot of activations; slots are reused, so the activation peak is the
  // largest number in flight times one slot. An interleaved slice (ModelSlice::later_chunks)
  // runs one chunk of its blocks per slot: the embeddings with chunk 0, the head with the last.
  int stage_begin(int64_t B, int64_t T, bool train, int chunk = 0);
  int num_chunks() const { return int(layout_.chunks().size()); }
  // [B*T, C]: where a stage without the embedding expects its input before stage_forward.
  Tensor stage_input(int slot) const;
  // [B*T, C]: the output of a stage without the head, after stage_forward.
  Tensor stage_output(int slot) const;
  // tokens [B, T] (embedded on the first stage), targets (the last stage's loss), positions as
  // for forward_backward (every stage: they bound attention and place RoPE). In training the
  // last stage also runs the head's backward, fused with the loss. Returns the sum of token
  // losses on the last stage, 0 elsewhere.
  double stage_forward(int slot, const int32_t* tokens, const int32_t* targets, double grad_scale,
                       int64_t* n_valid = nullptr, const int32_t* positions = nullptr);
  // dy: the gradient of stage_output (stages without the head). Afterwards stage_input_grad()
  // holds the gradient of stage_input (stages without the embedding). Releases the slot.
  void stage_backward(int slot, const Tensor& dy);
  // Zero-bubble schedules split it: stage_backward_input leaves the linear layers' weight
  // gradients for later (keeping their output gradients in the slot; stage_input_grad() is then
  // valid), stage_backward_weights adds them and releases the slot. Gradients come out bitwise as
  // stage_backward's. Not with activation checkpointing (the recomputed activations are gone).
  void stage_backward_input(int slot, const Tensor& dy);
  void stage_backward_weights(int slot);
  const Tensor& stage_input_grad() const { return dres_; }
  void stage_release(int slot);  // after an evaluation forward
  // Brackets of one training step or evaluation pass for the ParamSource (forward_backward
  // and forward call them themselves).
  void begin_pass(bool train) { src_->pass_begin(train); }
  void end_pass(bool train) { src_->pass_end(train); }

 private:
  // One micro-batch's activations, kept from its forward to its backward.
  struct Slot {
    Tensor tokens, targets;
    Tensor positions;              // packed rows' positions (allocated with the first packed micro-batch)
    bool packed = false;           // this micro-batch's rows pack documents: positions, not pos_
    std::vector<Tensor> res;       // res[i]: input of the stage's block i; res.back(): output
    std::vector<BlockActs> saved;  // per block when not checkpointed (16-bit: stored form)
    Tensor lnf, lnf_mean, lnf_rstd, losses, dlnf;  // the head (last stage)
    double grad_scale = 0;                         // of this micro-batch's training forward
    double router_loss = 0;                        // the MoE blocks' weighted router losses
    bool train_buffers = false;                    // holds what backward needs
    bool train = false, busy = false;              // the current micro-batch: training or evaluation
    uint64_t dropout_key = 0;                      // LoRA dropout: this training micro-batch's masks
    int chunk = 0;                                 // which of the slice's chunks of blocks it runs
    std::vector<BlockDeferredGrads> deferred;      // per block, once a split backward used the slot
    bool weights_pending = false;                  // stage_backward_input ran, stage_backward_weights not
  };
  void backward_pass(int slot, const Tensor& dy, bool defer_weights);
  BlockDeferredGrads deferred_grads(Slot& s, int i);
  void ensure_buffers(int64_t B, int64_t T, bool train);
  Slot& slot(int id);
  int n_local() const { return layout_.last_layer() - layout_.first_layer(); }  // blocks of each chunk
  void embed_forward(Slot& s);
  void run_blocks_forward(Slot& s);
  void final_norm_forward(Slot& s);
  double count_and_sum(const Slot& s, int64_t N, int64_t* n_valid);
  bool checkpointed() const { return opt_.activation_checkpoint_interval > 0; }
  // Training keeps each block's activations in 16 bits (ModelConfig::activation_dtype) and runs
  // blocks in the working set recompute_[0].
  bool stores_16bit() const { return !checkpointed() && dtype_ == DType::f32 && cfg_.activation_dtype != DType::f32; }
  BlockWeights with_router_bias(int layer, BlockWeights w) const;
  void record_moe(int layer, const MoeActs& a, Slot& s);
  bool first_stage() const { return layout_.slice().has_embedding; }
  bool last_stage() const { return layout_.slice().has_head; }
  bool embeds(const Slot& s) const { return first_stage() && s.chunk == 0; }
  bool heads(const Slot& s) const { return last_stage() && s.chunk == num_chunks() - 1; }

  ModelConfig cfg_;
  DecoderOptions opt_;
  ParamLayout layout_;
  BlockDims dims_;
  DType dtype_;
  Allocator& alloc_;
  Tensor params_, grads_;
  std::unique_ptr<ParamSource> default_src_;
  ParamSource* src_ = nullptr;                // what the passes read: train_src_, or under LoRA lora_src_
  ParamSource* train_src_ = nullptr;          // the trainable parameters' source (set_param_source)
  std::unique_ptr<ParamLayout> base_layout_;  // LoRA: the frozen model's layout and weights
  Tensor base_params_;
  std::unique_ptr<ParamSource> lora_src_;
  Tensor lora_u_, lora_x_;  // LoRA's forward scratch for the current (B, T)
  uint64_t dropout_seed_ = 0;
  int64_t dropout_step_ = 0;
  std::vector<int64_t> dropout_micro_;  // training micro-batches begun this step, per chunk
  // Before a block runs on slot s's micro-batch: a's attention positions, LoRA scratch, dropout
  // flag and key.
  void prepare_block(BlockActs& a, const Slot& s, int layer) const;
  // The positions slot s's rows are embedded and rotated at.
  const Tensor& positions(const Slot& s) const { return s.packed ? s.positions : pos_; }
  TensorParallelOps* tp_ = nullptr;
  ExpertParallelOps* ep_ = nullptr;
  MoeTimes moe_times_;

  // Buffers for the current (B, T).
  int64_t B_ = 0, T_ = 0;
  bool train_buffers_ = false;
  std::vector<Slot> slots_;
  Tensor pos_;
  std::vector<BlockActs> recompute_;  // checkpointed segment (or evaluation) activations
  Tensor dres_, ce_work_;
  Tensor router_bias_;
  double last_router_loss_ = 0;
  std::vector<MoeLayerStats> moe_stats_;
  BlockScratch scratch_;
};

}  // namespace loom::model
