// Tensor-parallel layers over the tp group, as the model's TensorParallelOps: the block's
// conjugate points (column-parallel q|k|v and fc/gate|up after f, row-parallel output
// projections before g; see tp_comm.h), the vocabulary-parallel embedding, and the
// vocabulary-parallel cross-entropy, which keeps only [chunk, vocab / tp] logits on a rank and
// reduces just three numbers per row across the group. The vocabulary is padded to a multiple
// of tp; the padding rows are masked out of the softmax. Weight slices: ParamLayout (ModelSlice).
#pragma once
#include "loom/comm/group.h"
#include "loom/model/block.h"
#include "loom/model/param_layout.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

class TensorParallelLayers final : public model::TensorParallelOps {
 public:
  TensorParallelLayers(const comm::Group& tp, const model::ModelConfig& cfg);

  void column_parallel_input_grad(const Tensor& dx) override;
  void row_parallel_output(const Tensor& y) override;
  void embedding_forward(const Tensor& tok, const Tensor& pos, const Tensor& wte, const Tensor& wpe,
                         const Tensor& out) override;
  void embedding_backward(const Tensor& tok, const Tensor& pos, const Tensor& dout, const Tensor& dwte,
                          const Tensor& dwpe) override;
  void head_xent(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& loss, const Tensor& dx,
                 const Tensor& dw, double grad_scale, int64_t chunk) override;

  // After the data-parallel reduction: sums over the tp group the gradients that each rank
  // holds only a part of (ParamInfo::tp_grad_partial), wherever the engine keeps them.
  void sum_partial_grads(const model::ParamLayout& layout, const DataParallel& engine) const;
  const comm::Group& group() const { return tp_; }

 private:
  comm::Group tp_;
  model::ModelConfig cfg_;
  int64_t rows_, first_row_;  // vocabulary rows per rank, and this rank's first
  Tensor logits_;             // [chunk, rows_] workspace
};

}  // namespace loom::parallel
