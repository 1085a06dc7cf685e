// Tensor parallelism's communication operators, named once (Megatron-LM, Shoeybi et al. 2019,
// section 3): two conjugate functions over the tp group, each with a forward and a backward half.
//   copy_to_tp     (f): forward identity (the input is already on every rank);
//                       backward all-reduce (each rank holds a partial input gradient).
//   reduce_from_tp (g): forward all-reduce (each rank holds a partial output);
//                       backward identity (the output gradient is already on every rank).
// A column-parallel linear sits after f, a row-parallel linear before g; the vocabulary-
// parallel embedding ends in g, the vocabulary-parallel loss starts with f.
#pragma once
#include "loom/comm/group.h"

namespace loom::parallel::tp {

inline void copy_to_tp_forward(const comm::Group&, const Tensor&) {}
void copy_to_tp_backward(const comm::Group& tp, const Tensor& grad);
void reduce_from_tp_forward(const comm::Group& tp, const Tensor& partial);
inline void reduce_from_tp_backward(const comm::Group&, const Tensor&) {}

// The vocabulary-parallel softmax's row statistics (not a conjugate pair: no gradient flows
// through them).
void max_over_tp(const comm::Group& tp, const Tensor& t);
void sum_over_tp(const comm::Group& tp, const Tensor& t);

}  // namespace loom::parallel::tp
