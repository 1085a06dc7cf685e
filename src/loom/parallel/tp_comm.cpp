#include "loom/parallel/tp_comm.h"

namespace loom::parallel::tp {

void copy_to_tp_backward(const comm::Group& tp, const Tensor& grad) {
  if (tp.size() > 1) tp.all_reduce(grad, comm::ReduceOp::sum);
}

void reduce_from_tp_forward(const comm::Group& tp, const Tensor& partial) {
  if (tp.size() > 1) tp.all_reduce(partial, comm::ReduceOp::sum);
}

void max_over_tp(const comm::Group& tp, const Tensor& t) {
  if (tp.size() > 1) tp.all_reduce(t, comm::ReduceOp::max);
}

void sum_over_tp(const comm::Group& tp, const Tensor& t) {
  if (tp.size() > 1) tp.all_reduce(t, comm::ReduceOp::sum);
}

}  // namespace loom::parallel::tp
