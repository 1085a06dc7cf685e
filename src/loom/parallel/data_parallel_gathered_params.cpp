// DataParallel at ZeRO stage 3: only weight chunks are stored; each unit is all-gathered just
// before use, the next one prefetched in the order the decoder will ask (plan_pass) while the
// current one computes, and freed after. Stages 1-2 with the 16-bit weight replica serve their
// units the same way, widened from the replica instead of gathered.
#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

void DataParallel::launch_gather(const ParamUnit& u, int key) {
  Gathered g;
  const WireUnit* w = replica_ ? &wire_units_[index_of(u)] : nullptr;
  if (w && w->n16 == 0 && w->n32 == chunk_size(u)) {
    // Nothing rounded (an embedding unit): the replica's slots are the unit's f32 chunks in order.
    g.buf = Tensor::borrow(replicas_[index_of(u)].raw(), {u.size()}, DType::f32);
    g.borrowed = true;
  } else if (w) {
    trace::Span span("widen weights", "compute");
    g.buf = take_buffer(u.size());
    unpack_unit(u, replicas_[index_of(u)], g.buf.data<float>());
  } else {
    g.buf = take_buffer(u.size());
    g.work = start_unit_gather(u, chunk_view(param_shard_, u, true), g.buf, g.wire);
    wire_bytes_ += gather_wire_bytes(u);
  }
  gathered_[key] = std::move(g);
}

Tensor DataParallel::gathered_unit(const ParamUnit& u, int key) {
  auto it = gathered_.find(key);
  if (it == gathered_.end()) {
    launch_gather(u, key);
    it = gathered_.find(key);
  }
  wait_gathered(u, it->second);
  ++it->second.users;
  return it->second.buf;
}

void DataParallel::wait_gathered(const ParamUnit& u, Gathered& g) {
  if (replica_) return;  // widened when launched
  {
    trace::Span span("wait weight all_gather", "wait");
    Stopwatch sw;
    g.work.wait();
    wait_s_ += sw.seconds();
  }
  finish_unit_gather(u, g.wire, g.buf, false);
}

void DataParallel::drop_gathered(Gathered& g) {
  g.work.wait();
  if (g.wire.defined()) recycle(std::move(g.wire));
  if (!g.borrowed) recycle(std::move(g.buf));
}

void DataParallel::prefetch_after(size_t pos) {
  // Widening from the replica runs on this thread: ahead of time it would only hold one more
  // unit, with nothing to overlap.
  if (replica_ || pos >= plan_.size()) return;
  const int next = plan_[pos].first;
  if (!gathered_.count(next)) launch_gather(unit_of(next), next);
  if (const ParamUnit* e = expert_unit_of(next); e && !gathered_.count(expert_unit_key(next)))
    launch_gather(*e, expert_unit_key(next));
}

model::BlockWeights DataParallel::gathered_block_params(int layer, Phase phase) {
  if (plan_pos_ < plan_.size() && plan_[plan_pos_] == std::pair{layer, phase}) ++plan_pos_;
  const ParamUnit& u = unit_of(layer);
  Tensor buf = gathered_unit(u, layer);
  const ParamUnit* e = expert_unit_of(layer);
  Tensor ebuf = e ? gathered_unit(*e, expert_unit_key(layer)) : Tensor{};
  prefetch_after(plan_pos_);
  return model::block_weights(cfg_, layout_, buf, layer, u.begin, ebuf, e ? e->begin : 0);
}

void DataParallel::release_gathered_block(int layer) {
  const bool needed_next = plan_pos_ < plan_.size() && plan_[plan_pos_].first == layer;
  for (const int key : {layer, expert_unit_key(layer)}) {
    auto it = gathered_.find(key);
    if (it == gathered_.end() || --it->second.users > 0) continue;
    if (!needed_next) {
      drop_gathered(it->second);
      gathered_.erase(it);
    }
  }
}

Tensor DataParallel::gathered_outer_param(const std::string& name) {
  const auto& p = layout_.get(name);
  const ParamUnit& u = outer_unit(name);
  auto it = gathered_.find(outer_unit_key(u));
  LOOM_CHECK(it != gathered_.end(), "zero", "weights of ", u.name, " used outside a pass");
  wait_gathered(u, it->second);
  return it->second.buf.slice(p.offset - u.begin, p.shape);
}

void DataParallel::plan_pass(bool train) {
  const auto& units = layout_.units();
  if (!gathered_.count(kEmbeddingUnit) && units.front().size() > 0) launch_gather(units.front(), kEmbeddingUnit);
  if (!gathered_.count(kHeadUnit) && units.back().size() > 0) launch_gather(units.back(), kHeadUnit);
  // The order in which the decoder will ask for blocks (see Decoder::stage_backward).
  plan_.clear();
  plan_pos_ = 0;
  const int f = layout_.first_layer(), L = layout_.last_layer() - f;
  const int k = model_.options().activation_checkpoint_interval;
  for (int l = 0; l < L; ++l) plan_.push_back({f + l, Phase::forward});
  if (train) {
    if (k <= 0) {
      for (int l = L - 1; l >= 0; --l) plan_.push_back({f + l, Phase::backward});
    } else {
      for (int s = (L + k - 1) / k - 1; s >= 0; --s) {
        const int b = s * k, e = std::min(L, b + k);
        for (int l = b; l < e; ++l) plan_.push_back({f + l, Phase::recompute});
        for (int l = e - 1; l >= b; --l) plan_.push_back({f + l, Phase::backward});
      }
    }
  }
  prefetch_after(0);
}

void DataParallel::release_gathered() {
  for (auto& [key, g] : gathered_) drop_gathered(g);
  gathered_.clear();
  plan_.clear();
  plan_pos_ = 0;
}

}  // namespace loom::parallel
