// ShardedAdamW: the owned ranges and the whole moments for checkpoints.
#include "loom/optim/sharded_adamw.h"

namespace loom::optim {

ShardedAdamW::ShardedAdamW(const AdamWConfig& cfg, std::vector<Unit> units, bool sharded,
                           const std::vector<DecaySpan>& spans, OffloadTarget offload_to,
                           const std::string& offload_dir)
    : units_(std::move(units)), sharded_(sharded) {
  for (const Unit& u : units_) {
    const int64_t chunk = u.size / u.group.size();
    const int64_t b = sharded_ ? u.begin + u.group.rank() * chunk : u.begin;
    const int64_t e = sharded_ ? b + chunk : u.begin + u.size;
    adam_.push_back(std::make_unique<AdamW>(cfg, b, e, spans, cpu_allocator(), offload_to == OffloadTarget::none));
  }
  offload(offload_to, offload_dir);
}

void ShardedAdamW::offload(OffloadTarget target, const std::string& dir, int64_t piece_elems) {
  if (target == OffloadTarget::none) return;
  std::vector<int64_t> sizes;
  for (const auto& a : adam_) sizes.push_back(a->end() - a->begin());
  offload_ = std::make_unique<MomentOffload>(target, dir, sizes, piece_elems);
  for (const auto& a : adam_) a->release_moments();  // (never allocated when the constructor offloads)
}

void ShardedAdamW::step_unit(size_t i, float* p, const float* g, double lr, double grad_scale) {
  AdamW& a = *adam_[i];
  if (!offload_) return a.step(p, g, lr, grad_scale);
  a.begin_step();
  const auto [first, last] = offload_->pieces_of(i);
  for (size_t k = first; k < last; ++k) {
    const MomentOffload::Piece& piece = offload_->piece(k);
    float* mv = offload_->acquire(k);
    a.update(p + piece.offset, g + piece.offset, mv, mv + piece.size, a.begin() + piece.offset,
             a.begin() + piece.offset + piece.size, lr, grad_scale);
    offload_->release(k);
  }
}

void ShardedAdamW::gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const {
  exp_avg.zero();
  exp_avg_sq.zero();
  for (size_t i = 0; i < units_.size(); ++i) {
    const Unit& u = units_[i];
    const AdamW& a = *adam_[i];
    Tensor m = a.exp_avg(), v = a.exp_avg_sq();
    if (offload_) {  // read back into whole-sized scratch, then as if resident
      m = Tensor::empty({a.end() - a.begin()}, DType::f32, MemCategory::workspace);
      v = Tensor::empty({a.end() - a.begin()}, DType::f32, MemCategory::workspace);
      offload_->read(i, m.data<float>(), v.data<float>());
    }
    if (!sharded_) {
      exp_avg.slice(u.begin, {u.size}).copy_from(m);
      exp_avg_sq.slice(u.begin, {u.size}).copy_from(v);
    } else {
      u.group.all_gather(m, exp_avg.slice(u.begin, {u.size}));
      u.group.all_gather(v, exp_avg_sq.slice(u.begin, {u.size}));
    }
  }
}

void ShardedAdamW::load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t step_count) {
  for (size_t i = 0; i < adam_.size(); ++i) {
    AdamW& a = *adam_[i];
    const Tensor m = exp_avg.slice(a.begin(), {a.end() - a.begin()});
    const Tensor v = exp_avg_sq.slice(a.begin(), {a.end() - a.begin()});
    if (offload_) {
      offload_->write(i, m.data<float>(), v.data<float>());
    } else {
      a.exp_avg().copy_from(m);
      a.exp_avg_sq().copy_from(v);
    }
    a.set_step_count(step_count);
  }
}

}  // namespace loom::optim
