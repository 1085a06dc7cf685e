// The MoE router inside the model module: scores, top-k, gates, loads, capacity and the
// grouping of rows by expert (forward), and the router's exact gradient (backward), for
// moe.cpp's dispatch and combine. Not a public interface; moe.h is.
#pragma once
#include <cstdint>
#include <vector>

#include "loom/model/moe.h"

namespace loom::model {

// Router: scores, top-k on the (biased) scores, normalised gates, loads, capacity, grouping by
// expert, and the two router losses. Leaves a.offsets / a.row_of / a.choice_of describing the
// grouped rows. T: float or double.
template <class T>
void route(const ModelConfig& cfg, const BlockWeights& w, int64_t N, MoeActs& a);

// dz (N x E) from the gates' gradient dgate (N x top_k) and the router losses' weights.
template <class T>
void router_backward(const ModelConfig& cfg, int64_t N, const MoeActs& a, const std::vector<T>& dgate, T* dz);

}  // namespace loom::model
