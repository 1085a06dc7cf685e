// ServedWeights: units served whole for the span of a pass (ZeRO-3's gathered units and the
// 16-bit replica's widened ones), asked for in the order the decoder will use them (pass_begin
// plans it), the next one started while the current one computes where the strategy prefetches,
// and freed after; and the fp32 chunks this rank owns, which the optimizer updates.
#include <algorithm>

#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

ServedWeights::ServedWeights(DataParallel& dp, int64_t shard_elems, uint64_t init_seed, MemCategory category,
                             optim::OffloadTarget offload, const std::string& offload_dir)
    : d_(dp) {
  if (offload == optim::OffloadTarget::none)
    shard_ = Tensor::zeros({shard_elems}, DType::f32, category);
  else
    offload_ = std::make_unique<ShardOffload>(offload, offload_dir, shard_elems);
  for (const auto& u : d_.layout_.units()) {
    const int64_t cs = d_.chunk_size(u), r = d_.r_of(u);
    if (!offload_) {
      model::init_params_range(d_.layout_, init_seed, u.begin + r * cs, u.begin + (r + 1) * cs,
                               shard_.data<float>() + d_.shard_offset(u));
    } else if (cs > 0) {  // a unit's chunk at a time: the whole shard is never resident
      Tensor chunk = Tensor::empty({cs}, DType::f32, MemCategory::workspace);
      model::init_params_range(d_.layout_, init_seed, u.begin + r * cs, u.begin + (r + 1) * cs, chunk.data<float>());
      offload_->write(d_.shard_offset(u), cs, chunk.data<float>());
    }
  }
}

float* ServedWeights::masters(const ParamUnit& u, int64_t) {
  if (!offload_) return shard_.data<float>() + d_.shard_offset(u);
  // Offloaded: units come in order; the previous one goes back as this one is handed out, and the
  // next one is read while this one is updated.
  write_back_update();
  const auto& units = d_.layout_.units();
  const size_t i = d_.index_of(u);
  for (size_t j = i + 1; j < units.size(); ++j)
    if (const int64_t cs = d_.chunk_size(units[j]); cs > 0) {
      offload_->prefetch(d_.shard_offset(units[j]), cs);
      break;
    }
  static float nothing = 0;  // a unit without elements on this rank: nothing to update
  if (d_.chunk_size(u) == 0) return &nothing;
  updating_ = offload_->take(d_.shard_offset(u), d_.chunk_size(u));
  updating_at_ = d_.shard_offset(u);
  return updating_.data<float>();
}

void ServedWeights::write_back_update() {
  if (updating_at_ < 0) return;
  offload_->write_back(updating_at_, std::move(updating_));
  updating_ = Tensor{};
  updating_at_ = -1;
}

Tensor ServedWeights::chunk_of(const ParamUnit& u) {
  if (!offload_) return d_.chunk_view(shard_, u, true);
  if (d_.chunk_size(u) == 0) return Tensor::empty({0}, DType::f32, MemCategory::params);
  return offload_->take(d_.shard_offset(u), d_.chunk_size(u));
}

Tensor ServedWeights::served_unit(const ParamUnit& u, int key) {
  auto it = served_.find(key);
  if (it == served_.end()) {
    start(u, key);
    it = served_.find(key);
  }
  wait(u, it->second);
  ++it->second.users;
  return it->second.buf;
}

void ServedWeights::drop(Served& s) {
  s.work.wait();
  if (s.wire.defined()) d_.recycle(std::move(s.wire));
  if (!s.borrowed) d_.recycle(std::move(s.buf));
}

void ServedWeights::prefetch_after(size_t pos) {
  if (!prefetches() || pos >= plan_.size()) return;
  const int next = plan_[pos].first;
  if (!served_.count(next)) start(d_.unit_of(next), next);
  const int ekey = DataParallel::expert_unit_key(next);
  if (const ParamUnit* e = d_.expert_unit_of(next); e && !served_.count(ekey)) start(*e, ekey);
  // Offloaded chunks: the unit after that one is read while these compute and gather.
  if (!offload_) return;
  for (size_t k = pos + 1; k < plan_.size(); ++k) {
    const int later = plan_[k].first;
    if (later == next || served_.count(later)) continue;
    const ParamUnit* e = d_.expert_unit_of(later);
    for (const ParamUnit* v : {&d_.unit_of(later), e})
      if (v && d_.chunk_size(*v) > 0) offload_->prefetch(d_.shard_offset(*v), d_.chunk_size(*v));
    break;
  }
}

model::BlockWeights ServedWeights::block_params(int layer, Phase phase) {
  if (plan_pos_ < plan_.size() && plan_[plan_pos_] == std::pair{layer, phase}) ++plan_pos_;
  const ParamUnit& u = d_.unit_of(layer);
  Tensor buf = served_unit(u, layer);
  const ParamUnit* e = d_.expert_unit_of(layer);
  Tensor ebuf = e ? served_unit(*e, DataParallel::expert_unit_key(layer)) : Tensor{};
  prefetch_after(plan_pos_);
  return model::block_weights(d_.cfg_, d_.layout_, buf, layer, u.begin, ebuf, e ? e->begin : 0);
}

void ServedWeights::release_block_params(int layer) {
  const bool needed_next = plan_pos_ < plan_.size() && plan_[plan_pos_].first == layer;
  for (const int key : {layer, DataParallel::expert_unit_key(layer)}) {
    auto it = served_.find(key);
    if (it == served_.end() || --it->second.users > 0) continue;
    if (!needed_next) {
      drop(it->second);
      served_.erase(it);
    }
  }
}

Tensor ServedWeights::outer_param(const std::string& name) {
  const auto& p = d_.layout_.get(name);
  const ParamUnit& u = d_.outer_unit(name);
  auto it = served_.find(d_.outer_unit_key(u));
  LOOM_CHECK(it != served_.end(), "zero", "weights of ", u.name, " used outside a pass");
  wait(u, it->second);
  return it->second.buf.slice(p.offset - u.begin, p.shape);
}

void ServedWeights::pass_begin(bool train) {
  const auto& units = d_.layout_.units();
  if (!served_.count(DataParallel::kEmbeddingUnit) && units.front().size() > 0)
    start(units.front(), DataParallel::kEmbeddingUnit);
  if (!served_.count(DataParallel::kHeadUnit) && units.back().size() > 0) start(units.back(), DataParallel::kHeadUnit);
  // The order in which the decoder will ask for blocks (see Decoder::stage_backward).
  plan_.clear();
  plan_pos_ = 0;
  // (An interleaved stage runs its chunks one after another: forward in model order, backward
  // in reverse, checkpoint segments counted from each chunk's first block.)
  const int k = d_.model_.options().activation_checkpoint_interval;
  const auto& chunks = d_.layout_.chunks();
  for (const int l : d_.layout_.layers()) plan_.push_back({l, Phase::forward});
  if (train) {
    for (auto c = chunks.rbegin(); c != chunks.rend(); ++c) {
      const int f = c->first, L = c->last - c->first;
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
  }
  prefetch_after(0);
}

void ServedWeights::pass_end() {
  for (auto& [key, s] : served_) drop(s);
  served_.clear();
  plan_.clear();
  plan_pos_ = 0;
  if (offload_) offload_->drop_staged();
}

void ServedWeights::gather_full(const Tensor& flat) const {
  for (const auto& u : d_.layout_.units()) {
    if (u.size() == 0) continue;
    Tensor mine;
    if (!offload_) {
      mine = d_.chunk_view(shard_, u, true);
    } else {
      mine = Tensor::empty({d_.chunk_size(u)}, DType::f32, MemCategory::workspace);
      offload_->read(d_.shard_offset(u), d_.chunk_size(u), mine.data<float>());
    }
    d_.group_of(u).all_gather(mine, flat.slice(u.begin, {u.size()}));
  }
}

void ServedWeights::load_full(const Tensor& flat) {
  for (const auto& u : d_.layout_.units()) {
    const Tensor theirs = flat.slice(u.begin + d_.r_of(u) * d_.chunk_size(u), {d_.chunk_size(u)});
    if (!offload_)
      d_.chunk_view(shard_, u, true).copy_from(theirs);
    else if (d_.chunk_size(u) > 0)
      offload_->write(d_.shard_offset(u), d_.chunk_size(u), theirs.data<float>());
  }
}

}  // namespace loom::parallel
