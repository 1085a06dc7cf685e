// The weight sources of data_parallel_weight_source.h but ServedWeights' shared serving
// (data_parallel_served_weights.cpp): the model's flat buffer (FullWeights), the 16-bit replica
// (ReplicaWeights) and ZeRO-3's gathered units (GatheredWeights).
#include "loom/core/timer.h"
#include "loom/core/trace.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

using model::ParamUnit;

// ---- FullWeights ---------------------------------------------------------------------------

FullWeights::FullWeights(DataParallel& dp, bool sharded) : d_(dp), sharded_(sharded) {}

model::BlockWeights FullWeights::block_params(int layer, Phase) {
  return model::block_weights(d_.cfg_, d_.layout_, d_.model_.params(), layer);
}

Tensor FullWeights::outer_param(const std::string& name) {
  const auto& p = d_.layout_.get(name);
  return d_.model_.params().slice(p.offset, p.shape);
}

float* FullWeights::masters(const ParamUnit&, int64_t begin) { return d_.model_.params().data<float>() + begin; }

// 16-bit gathers leave the other ranks' chunks rounded: the masters are only this rank's.
bool FullWeights::params_are_masters() const { return !sharded_ || !d_.sixteen_bit_gathers(); }

int64_t FullWeights::refresh() {
  if (!sharded_) return 0;
  // Our chunk to every other rank, into the flat buffer (16-bit gathers widen the other ranks'
  // chunks there and keep this rank's fp32 master).
  const auto& units = d_.layout_.units();
  const Tensor& params = d_.model_.params();
  int64_t sent = 0;
  std::vector<comm::Work> works(units.size());
  std::vector<Tensor> wires(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    if (u.size() == 0) continue;  // a pipeline stage's missing embedding or head unit
    sent += d_.gather_wire_bytes(u);
    works[i] = d_.start_unit_gather(u, d_.chunk_view(params, u, false), params.slice(u.begin, {u.size()}), wires[i]);
  }
  {
    trace::Span wait("wait weight all_gather", "wait");
    Stopwatch sw;
    for (auto& w : works) w.wait();
    d_.wait_s_ += sw.seconds();
  }
  for (size_t i = 0; i < units.size(); ++i)
    d_.finish_unit_gather(units[i], wires[i], params.slice(units[i].begin, {units[i].size()}), true);
  return sent;
}

void FullWeights::gather_full(const Tensor& flat) const {
  const Tensor& params = d_.model_.params();
  if (params_are_masters()) {
    if (flat.raw() != params.raw()) flat.copy_from(params);
    return;
  }
  // The owners' fp32 chunks.
  for (const auto& u : d_.layout_.units())
    if (u.size() > 0) d_.group_of(u).all_gather(d_.chunk_view(params, u, false), flat.slice(u.begin, {u.size()}));
}

void FullWeights::load_full(const Tensor& flat) {
  if (flat.raw() != d_.model_.params().raw()) d_.model_.params().copy_from(flat);
}

// ---- ReplicaWeights ------------------------------------------------------------------------

// The masters are the optimizer's under mixed-precision ZeRO-1/2.
ReplicaWeights::ReplicaWeights(DataParallel& dp, int64_t shard_elems, uint64_t init_seed)
    : ServedWeights(dp, shard_elems, init_seed, MemCategory::optimizer) {
  for (const auto& u : d_.layout_.units())
    replicas_.push_back(Tensor::empty({d_.n_of(u) * d_.wire_units_[d_.index_of(u)].slot_elems()}, d_.opt_.gather_dtype,
                                      MemCategory::params));
  all_gather_replica();
}

ServedWeights::Served ReplicaWeights::serve(const ParamUnit& u) {
  Served s;
  const auto& w = d_.wire_units_[d_.index_of(u)];
  if (w.n16 == 0 && w.n32 == d_.chunk_size(u)) {
    // Nothing rounded (an embedding unit): the replica's slots are the unit's f32 chunks in order.
    s.buf = Tensor::borrow(replicas_[d_.index_of(u)].raw(), {u.size()}, DType::f32);
    s.borrowed = true;
  } else {
    trace::Span span("widen weights", "compute");
    s.buf = d_.take_buffer(u.size());
    d_.unpack_unit(u, replicas_[d_.index_of(u)], s.buf.data<float>());
  }
  return s;
}

int64_t ReplicaWeights::refresh() {
  int64_t sent = 0;
  for (const auto& u : d_.layout_.units()) sent += u.size() > 0 ? d_.gather_wire_bytes(u) : 0;
  all_gather_replica();
  return sent;
}

// Each rank's fp32 chunk packed into its slot and all-gathered.
void ReplicaWeights::all_gather_replica() {
  const auto& units = d_.layout_.units();
  std::vector<comm::Work> works(units.size());
  for (size_t i = 0; i < units.size(); ++i) {
    const ParamUnit& u = units[i];
    if (u.size() == 0) continue;  // a pipeline stage's missing embedding or head unit
    const int64_t e = d_.wire_units_[i].slot_elems();
    d_.pack_chunk(u, d_.chunk_view(shard_, u, true).data<float>(), replicas_[i], d_.r_of(u));
    works[i] = d_.group_of(u).all_gather_async(replicas_[i].slice(d_.r_of(u) * e, {e}), replicas_[i]);
  }
  trace::Span wait("wait weight all_gather", "wait");
  Stopwatch sw;
  for (auto& w : works) w.wait();
  d_.wait_s_ += sw.seconds();
}

// Every slot packed here from the whole weights: no communication.
void ReplicaWeights::load_full(const Tensor& flat) {
  ServedWeights::load_full(flat);
  for (const auto& u : d_.layout_.units())
    for (int q = 0; q < d_.n_of(u); ++q)
      d_.pack_chunk(u, flat.data<float>() + u.begin + q * d_.chunk_size(u), replicas_[d_.index_of(u)], q);
}

// ---- GatheredWeights -----------------------------------------------------------------------

GatheredWeights::GatheredWeights(DataParallel& dp, int64_t shard_elems, uint64_t init_seed,
                                 optim::OffloadTarget offload, const std::string& offload_dir)
    : ServedWeights(dp, shard_elems, init_seed, MemCategory::params, offload, offload_dir) {}

ServedWeights::Served GatheredWeights::serve(const ParamUnit& u) {
  Served s;
  s.buf = d_.take_buffer(u.size());
  s.staged = chunk_of(u);  // sent from until the gather is done
  s.work = d_.start_unit_gather(u, s.staged, s.buf, s.wire);
  d_.wire_bytes_ += d_.gather_wire_bytes(u);
  return s;
}

int64_t GatheredWeights::refresh() {
  if (offload_) write_back_update();
  return 0;
}

void GatheredWeights::wait(const ParamUnit& u, Served& s) {
  {
    trace::Span span("wait weight all_gather", "wait");
    Stopwatch sw;
    s.work.wait();
    d_.wait_s_ += sw.seconds();
  }
  d_.finish_unit_gather(u, s.wire, s.buf, false);
  s.staged = Tensor{};
}

}  // namespace loom::parallel
