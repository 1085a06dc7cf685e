#include "loom/parallel/data_parallel.h"

#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/kernels/ops.h"
#include "loom/optim/schedule.h"

namespace loom::parallel {

using model::BlockWeights;
using model::ParamUnit;

model::DecoderOptions decoder_options_for(model::DecoderOptions base, int zero_stage, int dp_size) {
  LOOM_CHECK(zero_stage >= 0 && zero_stage <= 3, "config", "parallel.zero_stage=", zero_stage,
             " must be 0, 1, 2 or 3");
  base.unit_align = dp_size;
  base.allocate_flat_grads = zero_stage < 2;
  base.allocate_flat_params = zero_stage < 3;
  return base;
}

ModelStateBytes zero_model_state_bytes(int64_t P, int stage, int N) {
  ModelStateBytes b;
  b.params = stage >= 3 ? 4 * P / N : 4 * P;
  b.grads = stage >= 2 ? 4 * P / N : 4 * P;
  b.optimizer = stage >= 1 ? 8 * P / N : 8 * P;
  return b;
}

DataParallel::DataParallel(model::Decoder& model, comm::Group dp, const optim::AdamWConfig& adam,
                           const DataParallelOptions& opt, uint64_t init_seed, comm::Group expert_dp)
    : model_(model), cfg_(model.config()), layout_(model.layout()), dp_(std::move(dp)),
      expert_dp_(expert_dp.valid() ? std::move(expert_dp) : dp_), opt_(opt), n_(dp_.size()), r_(dp_.rank()),
      en_(expert_dp_.size()), er_(expert_dp_.rank()), adam_cfg_(adam) {
  const auto& mo = model.options();
  LOOM_CHECK(mo.unit_align % n_ == 0, "zero", "the model's unit_align=", mo.unit_align,
             " is not a multiple of the dp size ", n_, "; build it with decoder_options_for()");
  LOOM_CHECK(opt_.zero_stage >= 2 || mo.allocate_flat_grads, "zero", "stage ", opt_.zero_stage,
             " needs the model's flat gradient buffer");
  LOOM_CHECK(opt_.zero_stage >= 3 || mo.allocate_flat_params, "zero", "stage ", opt_.zero_stage,
             " needs the model's flat parameter buffer");
  LOOM_CHECK(opt_.bucket_mb > 0, "config", "parallel.bucket_mb must be positive");
  LOOM_CHECK(opt_.grad_dtype == DType::f32 || opt_.grad_dtype == DType::bf16, "config",
             "parallel.grad_dtype must be fp32 or bf16, got ", dtype_name(opt_.grad_dtype));
  LOOM_CHECK(n_ % en_ == 0, "zero", "the expert data-parallel group (", en_, " ranks) does not divide the dp group (",
             n_, ")");
  if (n_ == 1) opt_.grad_dtype = DType::f32;  // nothing crosses a wire: no rounding either
  std::vector<optim::DecaySpan> spans;
  for (const auto& p : layout_.params()) spans.push_back({p.offset, p.offset + p.numel(), p.weight_decay});
  const auto& units = layout_.units();
  int64_t shard = 0;
  for (const auto& u : units) {
    shard_off_.push_back(shard);
    shard += chunk_size(u);
  }
  for (const auto& u : units) {
    const int64_t b = opt_.zero_stage == 0 ? u.begin : u.begin + r_of(u) * chunk_size(u);
    const int64_t e = opt_.zero_stage == 0 ? u.end : b + chunk_size(u);
    adam_.push_back(std::make_unique<optim::AdamW>(adam, b, e, spans));
  }
  LOOM_CHECK(adam.name == "adamw" || adam.name == "onebit_adam", "config", "optim.name '", adam.name,
             "' is not adamw or onebit_adam");
  if (adam.name == "onebit_adam" && n_ > 1) {
    LOOM_CHECK(opt_.zero_stage <= 1, "config", "optim.name=onebit_adam needs parallel.zero_stage 0 or 1, got ",
               opt_.zero_stage);
    LOOM_CHECK(en_ == n_, "config", "optim.name=onebit_adam with expert parallelism (parallel.ep > 1) is not ",
               "supported; use optim.name=adamw");
    for (const auto& u : units) onebit_.push_back(std::make_unique<comm::OneBitAllReduce>(dp_, u.size()));
  }
  if (opt_.zero_stage >= 2) grad_shard_ = Tensor::zeros({shard}, DType::f32, MemCategory::grads);
  if (opt_.zero_stage >= 3) {
    param_shard_ = Tensor::zeros({shard}, DType::f32, MemCategory::params);
    for (const auto& u : units)
      model::init_params_range(layout_, init_seed, u.begin + r_of(u) * chunk_size(u),
                               u.begin + (r_of(u) + 1) * chunk_size(u),
                               param_shard_.data<float>() + shard_offset(u));
  }
  // Stage 0/1 buckets: blocks grouped from the last one backwards until each holds about
  // bucket_mb (units of one group only: expert units reduce over their own); embed and head
  // are buckets of their own (their gradients finish last).
  bucket_of_unit_.assign(units.size(), -1);
  if (opt_.zero_stage < 2) {
    const int64_t cap = std::max<int64_t>(1, int64_t(opt_.bucket_mb * 1024 * 1024 / 4));
    const size_t L = units.size() - 2;
    size_t hi = L;  // unit index of the last block
    while (hi >= 1) {
      size_t lo = hi;
      int64_t elems = units[hi].size();
      while (lo > 1 && elems < cap && units[lo - 1].experts == units[hi].experts) elems += units[--lo].size();
      buckets_.push_back({lo, hi, int(hi - lo + 1)});
      for (size_t u = lo; u <= hi; ++u) bucket_of_unit_[u] = int(buckets_.size() - 1);
      if (lo == 1) break;
      hi = lo - 1;
    }
    buckets_.push_back({0, 0, 1});
    bucket_of_unit_[0] = int(buckets_.size() - 1);
    buckets_.push_back({units.size() - 1, units.size() - 1, 1});
    bucket_of_unit_[units.size() - 1] = int(buckets_.size() - 1);
  }
  {
    const auto& units = layout_.units();
    const auto& sl = layout_.slice();
    early_outer_ = opt_.zero_stage < 2 && n_ > 1 && sl.has_embedding && sl.has_head && sl.tp == 1 &&
                   units.front().size() > 0 && units.back().size() > 0;
  }
  model_.set_param_source(this);
}

DataParallel::~DataParallel() {
  try {
    finish_grads();
  } catch (...) {
  }
  model_.set_param_source(nullptr);
}

const ParamUnit& DataParallel::unit_of(int layer) const { return layout_.block_unit(layer); }

const ParamUnit* DataParallel::expert_unit_of(int layer) const {
  const int i = layout_.expert_unit_index(layer);
  return i < 0 ? nullptr : &layout_.units()[size_t(i)];
}

const ParamUnit& DataParallel::outer_unit(const std::string& name) const {
  const int64_t off = layout_.get(name).offset;
  const auto& units = layout_.units();
  return off < units.front().end ? units.front() : units.back();
}

Tensor DataParallel::chunk_view(const Tensor& t, const ParamUnit& u, bool shard) const {
  const int64_t cs = chunk_size(u);
  return t.slice(shard ? shard_offset(u) : u.begin + r_of(u) * cs, {cs});
}

void DataParallel::zero_grads() {
  finish_grads();
  grad_scale_ = 1.0;
  if (opt_.zero_stage < 2)
    model_.zero_grads();
  else
    grad_shard_.zero();
}

// ---- gradients on the wire in bf16 --------------------------------------------------------

namespace {

// dst (bf16) = src (f32) rounded to nearest even.
void narrow_to_bf16(const Tensor& src, const Tensor& dst) {
  const float* s = src.data<float>();
  bf16_t* d = dst.data<bf16_t>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}

// dst (f32) = or += the bf16 values of src.
void widen_bf16(const Tensor& src, float* dst, bool add) {
  const bf16_t* s = src.data<bf16_t>();
  const int64_t n = src.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) dst[i] = (add ? dst[i] : 0.f) + bf16_to_f32(s[i]);
}

}  // namespace

// ---- stage 0/1: bucketed all-reduce -----------------------------------------------------

void DataParallel::unit_ready(size_t ui) {
  Bucket& b = buckets_[size_t(bucket_of_unit_[ui])];
  if (--b.remaining > 0) return;
  const auto& units = layout_.units();
  const int64_t begin = units[b.first_unit].begin, end = units[b.last_unit].end;
  // A pipeline stage without the embeddings or the head has empty units: nothing to send.
  if (end > begin) {
    const ParamUnit& first = units[b.first_unit];
    const comm::Group& g = group_of(first);
    const int n = n_of(first);
    const Tensor grads = model_.grads().slice(begin, {end - begin});
    wire_bytes_ += 2 * (n - 1) * ((end - begin) * int64_t(dtype_size(opt_.grad_dtype)) / n);
    if (opt_.grad_dtype == DType::bf16) {
      Tensor wire = take_buffer(end - begin, DType::bf16);
      narrow_to_bf16(grads, wire);
      inflight_.push_back({g.all_reduce_async(wire), wire, grads});
    } else {
      inflight_.push_back({g.all_reduce_async(grads), {}, {}});
    }
  }
  b.remaining = int(b.last_unit - b.first_unit + 1);
}

// ---- stage 2/3: staged reduce-scatter ---------------------------------------------------

Tensor DataParallel::take_staging(int64_t elems) {
  for (size_t i = 0; i < staging_pool_.size(); ++i)
    if (staging_pool_[i].numel() >= elems) {
      Tensor t = staging_pool_[i];
      staging_pool_.erase(staging_pool_.begin() + long(i));
      t = t.slice(0, {elems});
      t.zero();
      return t;
    }
  if (pending_.size() >= 2) {  // bound staging memory: recycle the oldest in flight
    drain(pending_.size() - 1);
    return take_staging(elems);
  }
  return Tensor::zeros({elems}, DType::f32, MemCategory::comm);
}

Tensor DataParallel::take_buffer(int64_t elems, DType dt) {
  for (size_t i = 0; i < spare_buffers_.size(); ++i)
    if (spare_buffers_[i].numel() == elems && spare_buffers_[i].dtype() == dt) {
      Tensor t = std::move(spare_buffers_[i]);
      spare_buffers_.erase(spare_buffers_.begin() + long(i));
      return t;
    }
  return Tensor::empty({elems}, dt, MemCategory::comm);
}

void DataParallel::recycle(Tensor buf) {
  // Bounded: at most as many as a pass keeps in flight (two gathers, two reductions) plus the
  // embedding and head units, and never more bytes than two block units (the large embedding
  // and head buffers go back to the heap); beyond that, memory goes back to the heap too.
  constexpr size_t kMaxSpares = 6;
  int64_t held = buf.numel();
  for (const Tensor& t : spare_buffers_) held += t.numel();
  int64_t limit = 0;
  for (const auto& u : layout_.units())
    if (u.layer >= 0) limit = std::max(limit, 2 * u.size());
  // A buffer something still views (a caller's weights, a collective's handle) is left alone.
  if (buf.sole_owner() && spare_buffers_.size() < kMaxSpares && held <= limit)
    spare_buffers_.push_back(std::move(buf));
}

void DataParallel::reduce_scatter_unit(const ParamUnit& u, const Tensor& staging, bool pooled) {
  Pending p;
  p.staging = staging;
  p.pooled = pooled;
  p.shard_offset = shard_offset(u);
  p.chunk_tmp = take_buffer(chunk_size(u), opt_.grad_dtype);
  if (opt_.grad_dtype == DType::bf16) {
    p.wire = take_buffer(staging.numel(), DType::bf16);
    narrow_to_bf16(staging, p.wire);
    p.work = group_of(u).reduce_scatter_async(p.wire, p.chunk_tmp);
  } else {
    p.work = group_of(u).reduce_scatter_async(staging, p.chunk_tmp);
  }
  pending_.push_back(std::move(p));
}

void DataParallel::retire(Pending& p) {
  {
    trace::Span span("wait grad reduce_scatter", "wait");
    Stopwatch sw;
    p.work.wait();
    p.work = comm::Work();  // releases the collective's hold on its buffers
    wait_s_ += sw.seconds();
  }
  float* dst = grad_shard_.data<float>() + p.shard_offset;
  if (p.wire.defined()) {
    widen_bf16(p.chunk_tmp, dst, true);
    recycle(std::move(p.wire));
  } else {
    const float* src = p.chunk_tmp.data<float>();
    const int64_t n = p.chunk_tmp.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
  recycle(std::move(p.chunk_tmp));
  if (p.pooled) staging_pool_.push_back(p.staging);
}

void DataParallel::drain(size_t keep) {
  while (pending_.size() > keep) {
    retire(pending_.front());
    pending_.pop_front();
  }
}

void DataParallel::finish_grads() {
  if (!inflight_.empty() || !sparse_.empty()) {
    trace::Span span("wait grad all_reduce", "wait");
    Stopwatch sw;
    for (auto& f : inflight_) f.work.wait();
    for (auto& sp : sparse_) {
      sp.w_tok.wait();
      sp.w_pos.wait();
      sp.w_rows.wait();
    }
    wait_s_ += sw.seconds();
  }
  for (auto& f : inflight_)
    if (f.wire.defined()) {
      widen_bf16(f.wire, f.grads.data<float>(), false);
      f.work = comm::Work();  // releases the collective's hold on the buffer
      recycle(std::move(f.wire));
    }
  inflight_.clear();
  for (auto& sp : sparse_)
    ops::embedding_backward(sp.tokens, sp.pos, sp.rows, sp.dwte, sp.dwpe);
  sparse_.clear();
  drain(0);
}

// ---- stage 3: gathered weights ----------------------------------------------------------

void DataParallel::launch_gather(const ParamUnit& u, int key) {
  Gathered g;
  g.buf = take_buffer(u.size());
  g.work = group_of(u).all_gather_async(chunk_view(param_shard_, u, true), g.buf);
  gathered_[key] = std::move(g);
}

Tensor DataParallel::gathered_unit(const ParamUnit& u, int key) {
  auto it = gathered_.find(key);
  if (it == gathered_.end()) {
    launch_gather(u, key);
    it = gathered_.find(key);
  }
  {
    trace::Span span("wait weight all_gather", "wait");
    Stopwatch sw;
    it->second.work.wait();
    wait_s_ += sw.seconds();
  }
  ++it->second.users;
  return it->second.buf;
}

// gathered_ keys: a block's unit by its layer, its experts' unit by kExpertKey + layer, the
// embedding -1, the head -2.
constexpr int kExpertKey = 1 << 20;

void DataParallel::prefetch_after(size_t pos) {
  if (pos >= plan_.size()) return;
  const int next = plan_[pos].first;
  if (!gathered_.count(next)) launch_gather(unit_of(next), next);
  if (const ParamUnit* e = expert_unit_of(next); e && !gathered_.count(kExpertKey + next))
    launch_gather(*e, kExpertKey + next);
}

// ---- ParamSource ------------------------------------------------------------------------

BlockWeights DataParallel::block_params(int layer, Phase phase) {
  if (opt_.zero_stage < 3) return model::block_weights(cfg_, layout_, model_.params(), layer);
  if (plan_pos_ < plan_.size() && plan_[plan_pos_] == std::pair{layer, phase}) ++plan_pos_;
  const ParamUnit& u = unit_of(layer);
  Tensor buf = gathered_unit(u, layer);
  const ParamUnit* e = expert_unit_of(layer);
  Tensor ebuf = e ? gathered_unit(*e, kExpertKey + layer) : Tensor{};
  prefetch_after(plan_pos_);
  return model::block_weights(cfg_, layout_, buf, layer, u.begin, ebuf, e ? e->begin : 0);
}

void DataParallel::release_block_params(int layer, Phase) {
  if (opt_.zero_stage < 3) return;
  const bool needed_next = plan_pos_ < plan_.size() && plan_[plan_pos_].first == layer;
  for (const int key : {layer, kExpertKey + layer}) {
    auto it = gathered_.find(key);
    if (it == gathered_.end() || --it->second.users > 0) continue;
    if (!needed_next) {
      it->second.work.wait();
      recycle(std::move(it->second.buf));
      gathered_.erase(it);
    }
  }
}

BlockWeights DataParallel::block_grads(int layer) {
  if (opt_.zero_stage < 2) return model::block_weights(cfg_, layout_, model_.grads(), layer);
  const ParamUnit& u = unit_of(layer);
  Tensor staging = take_staging(u.size());
  staging_of_layer_[layer] = staging;
  const ParamUnit* e = expert_unit_of(layer);
  Tensor estaging;
  if (e) {
    estaging = take_staging(e->size());
    staging_of_layer_[kExpertKey + layer] = estaging;
  }
  return model::block_weights(cfg_, layout_, staging, layer, u.begin, estaging, e ? e->begin : 0);
}

void DataParallel::block_grads_done(int layer) {
  const ParamUnit* e = expert_unit_of(layer);
  if (opt_.zero_stage < 2) {
    if (sync_) {
      if (e) unit_ready(index_of(*e));
      unit_ready(layout_.block_unit_index(layer));
    }
    return;
  }
  if (e) {
    auto it = staging_of_layer_.find(kExpertKey + layer);
    reduce_scatter_unit(*e, it->second, true);
    staging_of_layer_.erase(it);
  }
  auto it = staging_of_layer_.find(layer);
  reduce_scatter_unit(unit_of(layer), it->second, true);
  staging_of_layer_.erase(it);
}

Tensor DataParallel::outer_param(const std::string& name) {
  const auto& p = layout_.get(name);
  if (opt_.zero_stage < 3) return model_.params().slice(p.offset, p.shape);
  const ParamUnit& u = outer_unit(name);
  const int key = &u == &layout_.units().front() ? -1 : -2;
  auto it = gathered_.find(key);
  LOOM_CHECK(it != gathered_.end(), "zero", "weights of ", u.name, " used outside a pass");
  it->second.work.wait();
  return it->second.buf.slice(p.offset - u.begin, p.shape);
}

Tensor DataParallel::outer_grad(const std::string& name) {
  const auto& p = layout_.get(name);
  if (opt_.zero_stage < 2) return model_.grads().slice(p.offset, p.shape);
  const ParamUnit& u = outer_unit(name);
  const Tensor& staging = &u == &layout_.units().front() ? embed_staging_ : head_staging_;
  LOOM_CHECK(staging.defined(), "zero", "gradients of ", u.name, " used outside a training pass");
  return staging.slice(p.offset - u.begin, p.shape);
}

void DataParallel::head_grads_done() {
  if (!early_outer_ || !sync_) return;
  // The head unit is complete, and so is the token table but for the lookup rows, which
  // embedding_backward() sends separately: both all-reduces overlap the blocks' backward.
  const auto& units = layout_.units();
  unit_ready(units.size() - 1);
  unit_ready(0);
  outer_fired_ = true;
}

void DataParallel::embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres,
                                      const Tensor& dwte, const Tensor& dwpe) {
  if (!outer_fired_) return model::ParamSource::embedding_backward(tokens, pos, dres, dwte, dwpe);
  // Every rank gathers every rank's (token, position, row) and adds them all, in rank order,
  // after the dense all-reduce has landed (finish_grads), so replicas stay identical.
  SparseRows s;
  const int64_t N = tokens.numel(), C = dres.numel() / N;
  s.tokens = Tensor::empty({N * n_}, DType::i32, MemCategory::comm);
  s.pos = Tensor::empty({N * n_}, DType::i32, MemCategory::comm);
  s.rows = Tensor::empty({N * n_, C}, dres.dtype(), MemCategory::comm);
  s.w_tok = dp_.all_gather_async(tokens, s.tokens);
  s.w_pos = dp_.all_gather_async(pos, s.pos);
  Tensor mine = Tensor::empty({N, C}, dres.dtype(), MemCategory::comm);
  mine.copy_from(dres);  // dres is the decoder's scratch: it changes before the gather ends
  s.w_rows = dp_.all_gather_async(mine, s.rows);
  wire_bytes_ += (n_ - 1) * int64_t(tokens.nbytes() + pos.nbytes() + mine.nbytes());  // ours to every other rank
  s.dwte = dwte;
  s.dwpe = dwpe;
  sparse_.push_back(std::move(s));
}

void DataParallel::outer_grads_done() {
  const auto& units = layout_.units();
  if (opt_.zero_stage < 2) {
    if (sync_ && !outer_fired_) {
      unit_ready(units.size() - 1);
      unit_ready(0);
    }
    outer_fired_ = false;
    return;
  }
  if (units.back().size() > 0) reduce_scatter_unit(units.back(), head_staging_, false);
  if (units.front().size() > 0) reduce_scatter_unit(units.front(), embed_staging_, false);
  head_staging_ = embed_staging_ = {};
}

void DataParallel::pass_begin(bool train) {
  const auto& units = layout_.units();
  if (opt_.zero_stage >= 2 && train) {
    embed_staging_ = Tensor::zeros({units.front().size()}, DType::f32, MemCategory::comm);
    head_staging_ = Tensor::zeros({units.back().size()}, DType::f32, MemCategory::comm);
  }
  if (opt_.zero_stage < 3) return;
  if (!gathered_.count(-1) && units.front().size() > 0) launch_gather(units.front(), -1);
  if (!gathered_.count(-2) && units.back().size() > 0) launch_gather(units.back(), -2);
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

void DataParallel::pass_end(bool) {
  if (opt_.zero_stage < 3) return;
  for (auto& [key, g] : gathered_) {
    g.work.wait();
    recycle(std::move(g.buf));
  }
  gathered_.clear();
  plan_.clear();
  plan_pos_ = 0;
}

// ---- optimizer ----------------------------------------------------------------------------

void DataParallel::set_norm_skip(std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  norm_skip_ = std::move(ranges);
}

// Sum of squares of grads[0, n) standing for flat indices [flat0, flat0 + n), minus the
// skipped ranges.
double DataParallel::counted_sum_squares(const float* g, int64_t flat0, int64_t n) const {
  double total = 0;
  int64_t at = flat0;
  const int64_t end = flat0 + n;
  for (const auto& [b, e] : norm_skip_) {
    if (e <= at || b >= end) continue;
    if (b > at) total += optim::sum_squares(g + (at - flat0), b - at);
    at = std::max(at, e);
  }
  if (at < end) total += optim::sum_squares(g + (at - flat0), end - at);
  return total;
}

std::vector<Tensor> DataParallel::held_grads(int64_t begin, int64_t end) const {
  if (opt_.zero_stage < 2) return {model_.grads().slice(begin, {end - begin})};
  std::vector<Tensor> out;
  for (const auto& u : layout_.units()) {
    const int64_t c0 = u.begin + r_of(u) * chunk_size(u), c1 = c0 + chunk_size(u);
    const int64_t b = std::max(begin, c0), e = std::min(end, c1);
    if (b < e) out.push_back(grad_shard_.slice(shard_offset(u) + (b - c0), {e - b}));
  }
  return out;
}

double DataParallel::grad_norm_sq() {
  finish_grads();
  if (compressing()) {
    // Local gradients only: the mean over ranks of the squared norm of each rank's own
    // batch-mean gradient (its gradient here is that over n), an upper estimate of the
    // global gradient's squared norm (which no rank has) for clipping and overflow checks.
    Tensor s = Tensor::from_vector<double>(
        {counted_sum_squares(model_.grads().data<float>(), 0, model_.grads().numel())}, {1});
    dp_.all_reduce(s);
    return s.data<double>()[0] * n_;
  }
  double local = 0;
  if (opt_.zero_stage < 2) {
    // Every rank of the dp group holds the same reduced dense gradients; expert units differ
    // between the dp group's expert-parallel ranks and repeat over each expert-dp group.
    if (en_ == n_) return counted_sum_squares(model_.grads().data<float>(), 0, model_.grads().numel());
    for (const auto& u : layout_.units())
      local += counted_sum_squares(model_.grads().data<float>() + u.begin, u.begin, u.size()) /
               double(n_of(u));
  } else {
    for (const auto& u : layout_.units())
      local += counted_sum_squares(grad_shard_.data<float>() + shard_offset(u), u.begin + r_of(u) * chunk_size(u),
                                   chunk_size(u));
  }
  Tensor s = Tensor::from_vector<double>({local}, {1});
  trace::Span span("wait grad norm all_reduce", "wait");
  Stopwatch sw;
  dp_.all_reduce(s);
  wait_s_ += sw.seconds();
  return s.data<double>()[0];
}

void DataParallel::onebit_step_zero0(double lr) {
  const auto& units = layout_.units();
  // Each rank's momentum estimate b1 m / n + (1 - b1) g (its gradient is its share of the
  // sum over ranks), summed over ranks by the 1-bit all-reduce, is the new momentum.
  const float b1 = float(adam_cfg_.beta1), gs = float(grad_scale_), inv_n = 1.f / float(n_);
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].size() == 0) continue;
    float* m = adam_[i]->exp_avg().data<float>();
    const float* g = model_.grads().data<float>() + adam_[i]->begin();
    const int64_t n = adam_[i]->end() - adam_[i]->begin();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) m[j] = b1 * m[j] * inv_n + (1.f - b1) * g[j] * gs;
    onebit_[i]->sum(m);
    wait_s_ += onebit_[i]->last_comm_seconds();
    compress_s_ += onebit_[i]->last_compute_seconds();
    wire_bytes_ += onebit_[i]->wire_bytes();
    adam_[i]->step_frozen_variance(model_.params().data<float>() + adam_[i]->begin(), lr, adam_cfg_.freeze_step);
  }
}

void DataParallel::onebit_step_zero1(double lr) {
  const auto& units = layout_.units();
  // ZeRO-1: the owner of each chunk gets the compressed sum of the ranks' gradients for
  // it, updates its momentum (exact) and weights with the frozen variance, and sends the
  // weight change compressed to everyone, itself included, so every copy stays identical.
  const float b1 = float(adam_cfg_.beta1), gs = float(grad_scale_);
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    if (u.size() == 0) continue;
    auto& a = *adam_[i];
    const int64_t c = a.end() - a.begin();
    Tensor scaled = take_buffer(u.size()), ghat = take_buffer(c), next = take_buffer(c);
    const float* g = model_.grads().data<float>() + u.begin;
    float* x = scaled.data<float>();
#pragma omp parallel for schedule(static) if (u.size() > 65536)
    for (int64_t j = 0; j < u.size(); ++j) x[j] = g[j] * gs;
    onebit_[i]->reduce_to_owner(x, ghat.data<float>());
    wait_s_ += onebit_[i]->last_comm_seconds();
    compress_s_ += onebit_[i]->last_compute_seconds();
    float* m = a.exp_avg().data<float>();
    const float* gh = ghat.data<float>();
    for (int64_t j = 0; j < c; ++j) m[j] = b1 * m[j] + (1.f - b1) * gh[j];
    float* p = model_.params().data<float>() + a.begin();
    float* d = next.data<float>();
    std::copy_n(p, c, d);
    // A parameter whose gradient was ~0 until the freeze has v ~ 0, and the sign noise of
    // its compressed gradient divided by sqrt(v) makes a huge step; compressed with its
    // block it would set the whole block's scale. Bounding the step at 2 lr (Adam's own
    // steps are about lr) keeps one such element from wiping out its 1023 neighbours.
    a.step_frozen_variance(d, lr, adam_cfg_.freeze_step, 2.f);
    for (int64_t j = 0; j < c; ++j) d[j] -= p[j];  // the change this step
    onebit_[i]->all_gather_add(d, model_.params().data<float>() + u.begin);
    wait_s_ += onebit_[i]->last_comm_seconds();
    compress_s_ += onebit_[i]->last_compute_seconds();
    wire_bytes_ += onebit_[i]->wire_bytes();
    recycle(std::move(scaled));
    recycle(std::move(ghat));
    recycle(std::move(next));
  }
}

void DataParallel::step(double lr) {
  finish_grads();
  trace::Span span("optimizer", "compute");
  const auto& units = layout_.units();
  if (compressing()) {
    if (opt_.zero_stage == 1) onebit_step_zero1(lr);
    else onebit_step_zero0(lr);
    grad_scale_ = 1.0;
    last_wire_bytes_ = wire_bytes_;
    wire_bytes_ = 0;
    return;
  }
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    float* p = opt_.zero_stage < 3 ? model_.params().data<float>() + adam_[i]->begin()
                                   : param_shard_.data<float>() + shard_offset(u);
    const float* g = opt_.zero_stage < 2 ? model_.grads().data<float>() + adam_[i]->begin()
                                         : grad_shard_.data<float>() + shard_offset(u);
    adam_[i]->step(p, g, lr, grad_scale_);
  }
  grad_scale_ = 1.0;
  last_wire_bytes_ = wire_bytes_;
  wire_bytes_ = 0;
  if (opt_.zero_stage == 1 || opt_.zero_stage == 2) {
    std::vector<comm::Work> works;
    for (const auto& u : units)
      if (u.size() > 0)  // a pipeline stage's missing embedding or head unit is empty
        last_wire_bytes_ += (n_of(u) - 1) * chunk_size(u) * 4;  // our chunk to every other rank
    for (const auto& u : units)
      if (u.size() > 0)
        works.push_back(group_of(u).all_gather_async(chunk_view(model_.params(), u, false),
                                                     model_.params().slice(u.begin, {u.size()})));
    trace::Span wait("wait weight all_gather", "wait");
    Stopwatch sw;
    for (auto& w : works) w.wait();
    wait_s_ += sw.seconds();
  }
}

double DataParallel::take_wait_seconds() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

double DataParallel::take_compress_seconds() {
  const double s = compress_s_;
  compress_s_ = 0;
  return s;
}

int64_t DataParallel::optimizer_steps() const { return adam_.front()->step_count(); }

void DataParallel::gather_full_params(const Tensor& flat) const {
  if (opt_.zero_stage < 3) {
    if (flat.raw() != model_.params().raw()) flat.copy_from(model_.params());
    return;
  }
  for (const auto& u : layout_.units())
    group_of(u).all_gather(chunk_view(param_shard_, u, true), flat.slice(u.begin, {u.size()}));
}

void DataParallel::load_full_params(const Tensor& flat) {
  if (opt_.zero_stage < 3) {
    if (flat.raw() != model_.params().raw()) model_.params().copy_from(flat);
    return;
  }
  for (const auto& u : layout_.units())
    chunk_view(param_shard_, u, true).copy_from(flat.slice(u.begin + r_of(u) * chunk_size(u), {chunk_size(u)}));
}

void DataParallel::gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const {
  exp_avg.zero();
  exp_avg_sq.zero();
  const auto& units = layout_.units();
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& u = units[i];
    const optim::AdamW& a = *adam_[i];
    if (opt_.zero_stage == 0) {
      exp_avg.slice(u.begin, {u.size()}).copy_from(a.exp_avg());
      exp_avg_sq.slice(u.begin, {u.size()}).copy_from(a.exp_avg_sq());
    } else {
      group_of(u).all_gather(a.exp_avg(), exp_avg.slice(u.begin, {u.size()}));
      group_of(u).all_gather(a.exp_avg_sq(), exp_avg_sq.slice(u.begin, {u.size()}));
    }
  }
}

void DataParallel::load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t optimizer_steps) {
  for (const auto& a : adam_) {
    a->exp_avg().copy_from(exp_avg.slice(a->begin(), {a->end() - a->begin()}));
    a->exp_avg_sq().copy_from(exp_avg_sq.slice(a->begin(), {a->end() - a->begin()}));
    a->set_step_count(optimizer_steps);
  }
}

}  // namespace loom::parallel
