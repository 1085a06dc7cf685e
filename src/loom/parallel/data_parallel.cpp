// DataParallel's construction and its model::ParamSource side: which units a rank holds, the
// pool of communication buffers, the choice of strategies, and each request of the decoder
// passed to its gradient strategy (GradSync) or weight source (WeightSource).
#include "loom/parallel/data_parallel.h"

#include <algorithm>

#include "loom/core/timer.h"
#include "loom/core/trace.h"

namespace loom::parallel {

using model::BlockWeights;
using model::ParamUnit;

DataParallel::DataParallel(model::Decoder& model, comm::Group dp, const optim::AdamWConfig& adam,
                           const DataParallelOptions& opt, uint64_t init_seed, comm::Group expert_dp)
    : model_(model),
      cfg_(model.config()),
      layout_(model.layout()),
      dp_(std::move(dp)),
      expert_dp_(expert_dp.valid() ? std::move(expert_dp) : dp_),
      opt_(opt),
      n_(dp_.size()),
      r_(dp_.rank()),
      en_(expert_dp_.size()),
      er_(expert_dp_.rank()),
      adam_cfg_(adam) {
  const auto& mo = model.options();
  LOOM_CHECK(mo.unit_align % n_ == 0, "zero", "the model's unit_align=", mo.unit_align,
             " is not a multiple of the dp size ", n_, "; build it with decoder_options_for()");
  LOOM_CHECK(opt_.zero_stage >= 2 || mo.allocate_flat_grads, "zero", "stage ", opt_.zero_stage,
             " needs the model's flat gradient buffer");
  LOOM_CHECK(opt_.bucket_mb > 0, "config", "parallel.bucket_mb must be positive");
  LOOM_CHECK(opt_.grad_dtype == DType::f32 || opt_.grad_dtype == DType::bf16, "config",
             "parallel.grad_dtype must be fp32 or bf16, got ", dtype_name(opt_.grad_dtype));
  LOOM_CHECK(n_ % en_ == 0, "zero", "the expert data-parallel group (", en_, " ranks) does not divide the dp group (",
             n_, ")");
  if (n_ == 1) opt_.grad_dtype = DType::f32;  // nothing crosses a wire: no rounding either
  check_gather_dtype(opt_.gather_dtype, cfg_.precision);
  opt_.gather_dtype = effective_gather_dtype(opt_, adam.kind);
  // The caller chose the replica (keeps_weight_replica) by building the model without its flat
  // parameter buffer.
  const bool replica = opt_.zero_stage < 3 && !mo.allocate_flat_params;
  LOOM_CHECK(!replica || weight_replica_possible(opt_, adam.kind), "zero", "stage ", opt_.zero_stage,
             opt_.zero_stage == 0 ? " needs the model's flat parameter buffer"
                                  : " without the model's flat parameter buffer needs 16-bit weight all-gathers (the "
                                    "weight replica)",
             "; build the model with decoder_options_for(..., keeps_weight_replica(...))");
  std::vector<optim::DecaySpan> spans;
  for (const auto& p : layout_.params()) spans.push_back({p.offset, p.offset + p.numel(), p.weight_decay});
  const auto& units = layout_.units();
  int64_t shard = 0;
  for (const auto& u : units) {
    shard_off_.push_back(shard);
    shard += chunk_size(u);
  }
  std::vector<optim::ShardedAdamW::Unit> optimizer_units;
  for (const auto& u : units) optimizer_units.push_back({u.begin, u.size(), group_of(u)});
  LOOM_CHECK(opt_.offload_moments == optim::OffloadTarget::none || adam.kind != optim::OptimizerKind::onebit_adam,
             "config", "parallel.offload.optimizer=", optim::offload_target_name(opt_.offload_moments),
             " with optim.name=onebit_adam is not supported (its momentum exchange reads the moments in place); use "
             "optim.name=adamw or parallel.offload.optimizer=none");
  optimizer_ = std::make_unique<optim::ShardedAdamW>(adam, std::move(optimizer_units), opt_.zero_stage >= 1, spans,
                                                     opt_.offload_moments, opt_.offload_dir);
  if (adam.kind == optim::OptimizerKind::onebit_adam && n_ > 1) {
    LOOM_CHECK(opt_.zero_stage <= 1, "config", "optim.name=onebit_adam needs parallel.zero_stage 0 or 1, got ",
               opt_.zero_stage);
    LOOM_CHECK(en_ == n_, "config", "optim.name=onebit_adam with expert parallelism (parallel.ep > 1) is not ",
               "supported; use optim.name=adamw");
    std::vector<int64_t> sizes;
    for (const auto& u : units) sizes.push_back(u.size());
    onebit_ = std::make_unique<optim::OneBitAdam>(dp_, adam, sizes);
  }
  if (opt_.zero_stage >= 2)
    grad_sync_ = std::make_unique<ShardedReduceScatter>(*this, shard);
  else
    grad_sync_ = std::make_unique<BucketedAllReduce>(*this);
  build_wire_units();  // before the weight source: the replica packs its slots at construction
  LOOM_CHECK(opt_.offload_params == optim::OffloadTarget::none || opt_.zero_stage == 3, "config",
             "parallel.offload.params=", optim::offload_target_name(opt_.offload_params),
             " keeps ZeRO-3's parameter shards off the device; set parallel.zero_stage=3 or "
             "parallel.offload.params=none");
  if (opt_.zero_stage >= 3)
    weights_ = std::make_unique<GatheredWeights>(*this, shard, init_seed, opt_.offload_params, opt_.offload_dir);
  else if (replica)
    weights_ = std::make_unique<ReplicaWeights>(*this, shard, init_seed);
  else
    weights_ = std::make_unique<FullWeights>(*this, opt_.zero_stage >= 1);
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
  grad_sync_->zero();
  optimizer_->prefetch();  // offloaded moments: staged while this step's forward and backward run
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
  if (buf.sole_owner() && spare_buffers_.size() < kMaxSpares && held <= limit) spare_buffers_.push_back(std::move(buf));
}

int DataParallel::outer_unit_key(const ParamUnit& u) const {
  return &u == &layout_.units().front() ? kEmbeddingUnit : kHeadUnit;
}

void DataParallel::finish_grads() { grad_sync_->finish(); }

std::vector<Tensor> DataParallel::held_grads(int64_t begin, int64_t end) const { return grad_sync_->held(begin, end); }

// ---- ParamSource: each request to its strategy -------------------------------------------

BlockWeights DataParallel::block_params(int layer, Phase phase) { return weights_->block_params(layer, phase); }

void DataParallel::release_block_params(int layer, Phase) { weights_->release_block_params(layer); }

BlockWeights DataParallel::block_grads(int layer) { return grad_sync_->block_grads(layer); }

void DataParallel::block_grads_done(int layer) { grad_sync_->block_grads_done(layer, sync_); }

Tensor DataParallel::outer_param(const std::string& name) { return weights_->outer_param(name); }

Tensor DataParallel::outer_grad(const std::string& name) { return grad_sync_->outer_grad(name); }

void DataParallel::outer_grads_done() { grad_sync_->outer_grads_done(sync_); }

void DataParallel::head_grads_done() { grad_sync_->head_grads_done(sync_); }

void DataParallel::embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres, const Tensor& dwte,
                                      const Tensor& dwpe) {
  if (!grad_sync_->embedding_backward(tokens, pos, dres, dwte, dwpe))
    model::ParamSource::embedding_backward(tokens, pos, dres, dwte, dwpe);
}

void DataParallel::pass_begin(bool train) {
  grad_sync_->pass_begin(train);
  weights_->pass_begin(train);
}

void DataParallel::pass_end(bool) { weights_->pass_end(); }

}  // namespace loom::parallel
