// ModelRunner: one forward of the decoder over a StepPlan's tokens, all sequences at once:
// the linears, norms and MLP see one [n_tokens, C] batch; attention runs per sequence through
// the paged cache (new K/V are written into the sequence's blocks first). Mirrors
// model/block.cpp's math exactly; only attention differs (paged instead of dense). With a
// QuantizedModel the block matrices (and the head, when it is quantized) run through the
// quantized kernels (kernels/cpu/quant_linear.h) instead of the model's f32 weights.
// Tensor parallel (a model holding tp slice r of tp, model/param_layout.h, and its tp group):
// Megatron-style, each rank computes its heads and its part of the MLP, the attention output
// projection and the MLP's second linear each end in one all-reduce; the token table and the
// head are split by vocabulary rows (the embedding ends in an all-reduce, the logits are
// all-gathered, so every rank samples from the same full rows).
#pragma once
#include <vector>

#include "loom/comm/group.h"
#include "loom/core/tensor.h"
#include "loom/infer/kv_cache.h"
#include "loom/infer/quant_weights.h"
#include "loom/infer/scheduler.h"
#include "loom/kernels/cpu/paged_attention.h"
#include "loom/model/decoder.h"

namespace loom::infer {

class ModelRunner {
 public:
  // max_batched_tokens and max_seqs bound what one plan may hold (the scheduler's budgets); buffers
  // are allocated once here, never per step.
  // quant: quantized matrices of the same model (outlives the runner), or null for f32.
  // max_logit_rows: rows of logits one plan may ask for (0: max_seqs; speculative decoding
  // asks for num_spec + 1 per sequence).
  // tp: the tensor-parallel group when the model is a tp slice (its size and rank those of
  // the slice); the cache then holds this rank's n_kv_head / tp heads (kv_cache_config).
  ModelRunner(const model::Decoder& model, KVCache& cache, int64_t max_batched_tokens, int64_t max_seqs,
              const QuantizedModel* quant = nullptr, int64_t max_logit_rows = 0, const comm::Group* tp = nullptr,
              Allocator& alloc = cpu_allocator());

  // The config a KV cache for this model's slice is built with: n_kv_head / tp heads. Throws
  // "[infer] ..." when tp does not divide the heads or the model cannot be split.
  static model::ModelConfig kv_cache_config(const model::Decoder& model);

  // Runs the plan (copy-on-write copies first) and returns logits [rows, V] for every
  // sequence with sample set, in plan order: its last num_spec + 1 tokens' rows (one row
  // without proposals). The view is valid until the next call.
  Tensor execute(const StepPlan& plan);
  // Rows of logits execute() returns for this plan.
  static int64_t logit_rows(const StepPlan& plan);
  // The same forward, returning logits [num_tokens, V] for every token of the plan (a
  // language-model evaluation: each position predicts the next). Needs an f32 model; its
  // buffer is allocated on the first call.
  Tensor execute_all_rows(const StepPlan& plan);

  // MoE models: the tokens each MoE block has routed to each expert (with the balancing bias,
  // dropless) since construction or reset_expert_load, in MoE-block order (model::ModelConfig::
  // moe_layer); `loom eval` reports them as the router's load over a split.
  const std::vector<std::vector<int64_t>>& expert_load() const { return expert_load_; }
  void reset_expert_load();

  // Weight bytes one decode step reads at batch 1 (every matrix once, quantized ones in their
  // packed form with scales, one embedding row).
  int64_t weight_bytes_per_token() const;

 private:
  template <class T>
  class ForwardOps;  // the runner's parts of model::block_forward (model_runner.cpp)
  template <class T>
  void run_layers(int64_t N);
  template <class T>
  void embed_vocab_parallel(int64_t N);
  template <class T>
  void gather_logits(int64_t S);
  void all_reduce(const Tensor& t) const;
  // Fills the token, position and slot tables from the plan, embeds and runs every block;
  // x_ then holds the last layer's output of every token. Returns the plan's token count.
  int64_t run_plan(const StepPlan& plan);
  // The final norm of rows x (into ln; mean and rstd its statistics) and the head into logits.
  void norm_and_head(const Tensor& x, const Tensor& ln, const Tensor& mean, const Tensor& rstd,
                     const Tensor& logits) const;
  // y = x W^T + b through the quantized matrix when there is one, else the f32 weight.
  void linear(const Tensor& x, const Tensor& w, const QuantizedMatrix* q, const Tensor& b, const Tensor& y) const;

  const model::Decoder& model_;
  model::ModelConfig cfg_;  // the model's, with MoE capacity off: inference routes dropless
  KVCache& cache_;
  const QuantizedModel* quant_;
  const comm::Group* tp_;
  int64_t tp_size_ = 1, tp_rank_ = 0;
  int64_t H_, KVH_, F_;             // this rank's attention heads, kv heads and MLP width
  int64_t vocab_rows_ = 0;          // tp: this rank's rows of the token table and head
  Tensor local_logits_, gathered_;  // tp: [rows, vocab_rows_] and [tp, rows, vocab_rows_]
  int64_t max_batched_tokens_, max_seqs_, max_logit_rows_;
  std::vector<model::BlockWeights> w_;
  Tensor wte_, wpe_, lnf_w_, lnf_b_, head_;
  model::BlockDims dims_;  // this rank's share of a block, RoPE frequencies computed once
  // Activations for up to max_batched_tokens rows (views of the first N rows are used per step).
  Tensor tok_, pos_, x_, ln_, mean_, rstd_, qkv_, att_, x_mid_, fc_, act_;
  model::MoeActs moe_;                              // MoE blocks' routing and expert buffers (MoE models)
  std::vector<std::vector<int64_t>> expert_load_;   // per MoE block and expert
  Tensor xs_, lnf_, lnf_mean_, lnf_rstd_, logits_;  // the rows that need logits only
  Tensor all_logits_;                               // execute_all_rows: [max_batched_tokens, V]
  std::vector<int64_t> slots_;
  std::vector<cpu::PagedSeq> pseqs_;
  std::vector<int64_t> sample_rows_;
};

}  // namespace loom::infer
