// Data parallelism with ZeRO stages 0-3 over the dp group, as a model::ParamSource.
//   stage 0: full weights, grads and Adam moments on every rank; gradient buckets (about
//            bucket_mb each) are all-reduced asynchronously as soon as backward has produced
//            their last gradient, only on the last micro-batch (no_sync before it).
//   stage 1: as 0, but each rank keeps Adam moments for its 1/N chunk of every unit, updates
//            that chunk, then all-gathers the weights (Rajbhandari et al. 2020, P_os).
//   stage 2: also gradients: each unit's gradients are staged in a comm buffer, reduce-
//            scattered into the rank's gradient chunk as soon as the unit is done (P_os+g).
//   stage 3: also weights: only chunks are stored; each unit is all-gathered just before use
//            (the next one prefetched while the current one computes) and freed after (P_os+g+p).
// With 16-bit weight all-gathers (gather_dtype bf16 or fp16) stages 1-2 keep no fp32 copy of
// the whole model: each rank holds the fp32 masters of its chunks beside the Adam moments, and
// every unit as it arrived from the last all-gather (the "replica": product operands in 16 bits,
// the rest in f32), widened into a unit buffer just before use and freed after, as stage 3
// serves its gathered units (mixed-precision ZeRO: 2 bytes per product weight, 12 per owned
// parameter).
// Units are the layout's (embed, block i, experts i for MoE blocks, head), padded so N equal
// chunks tile each. Under expert parallelism the expert units are data-parallel (reduced,
// sharded, gathered) over `expert_dp`, the ranks holding the same experts, and every other
// unit over `dp`, all the ranks that see different data.
// Gradients are synchronised by one strategy chosen at construction (data_parallel_grad_sync.h:
// BucketedAllReduce for stages 0-1, ShardedReduceScatter for 2-3), and the weights come from
// another (data_parallel_weight_source.h: FullWeights, ReplicaWeights, GatheredWeights); 1-bit
// Adam's compressed steps are optim::OneBitAdam's; what a configuration builds is
// plan_data_parallel's choice.
// Files: data_parallel.cpp (construction, ParamSource dispatch), data_parallel_buckets.cpp and
// _embedding_rows.cpp (BucketedAllReduce), _sharded_grads.cpp (ShardedReduceScatter),
// _weight_source.cpp and _served_weights.cpp (the weight sources), _weight_wire.cpp (16-bit
// weight all-gathers, 1-3), _optimizer.cpp (step, norm, checkpoint state); data_parallel_plan.h
// and data_parallel_options.h (the choices and the configuration rules).
#pragma once
#include <memory>
#include <vector>

#include "loom/comm/group.h"
#include "loom/model/decoder.h"
#include "loom/optim/adamw.h"
#include "loom/optim/onebit_adam.h"
#include "loom/optim/sharded_adamw.h"
#include "loom/parallel/data_parallel_grad_sync.h"
#include "loom/parallel/data_parallel_plan.h"
#include "loom/parallel/data_parallel_weight_source.h"

namespace loom::parallel {

class DataParallel final : public model::ParamSource {
  // The strategies share the unit geometry, the buffer pool and the counters.
  friend class BucketedAllReduce;
  friend class ShardedReduceScatter;
  friend class FullWeights;
  friend class ServedWeights;
  friend class ReplicaWeights;
  friend class GatheredWeights;

 public:
  // `model` must have been built with decoder_options_for(...). For stage 3 and the weight
  // replica (a model without its flat parameter buffer) the weights are initialised here from
  // `init_seed` (each rank its chunks); otherwise call init on the model.
  DataParallel(model::Decoder& model, comm::Group dp, const optim::AdamWConfig& adam, const DataParallelOptions& opt,
               uint64_t init_seed, comm::Group expert_dp = {});
  ~DataParallel() override;

  // --- one optimizer step -----------------------------------------------------------------
  // Also starts staging offloaded optimizer moments for the step that follows.
  void zero_grads();
  // The Adam moments kept off the device (DataParallelOptions::offload_moments; optim/
  // moment_offload.h), staged piece by piece for each step; null when resident.
  const optim::MomentOffload* optimizer_offload() const { return optimizer_->offloaded(); }
  // ZeRO-3's parameter chunks kept off the device (DataParallelOptions::offload_params).
  int64_t offloaded_param_bytes() const { return weights_->offloaded_param_bytes(); }
  // false before all but the last micro-batch: stage 0/1 skip communication (no_sync).
  // 1-bit Adam after its warm-up never reduces gradients (the momentum is reduced instead).
  void set_sync(bool sync) { sync_ = sync && !compressing(); }
  // 1-bit Adam (optim.name=onebit_adam) past its warm-up: gradients stay local, the variance
  // is frozen and step() averages the momentum by the compressed all-reduce.
  bool compressing() const { return onebit_ && onebit_->compressing(optimizer_steps()); }
  // 1-bit Adam's per-unit compressed all-reduces (error-feedback state for checkpoints);
  // empty for AdamW.
  const std::vector<std::unique_ptr<comm::OneBitAllReduce>>& onebit() const;
  // Bytes this rank sent in the last step for gradients (or 1-bit momenta) and weight
  // all-gathers (stages 1-3), counted as wire bytes: a ring all-reduce sends 2(n-1)/n of the
  // buffer, a reduce-scatter or all-gather (n-1)/n.
  int64_t last_step_wire_bytes() const { return last_wire_bytes_; }
  // Waits for outstanding communication: afterwards the (local part of the) gradients are
  // the sum over ranks.
  void finish_grads();
  // Squared global gradient norm (over all ranks' chunks), after finish_grads(). Flat ranges
  // given to set_norm_skip are left out: parameters another rank of a model-parallel group
  // also holds (tp-replicated ones off tp rank 0, the last stage's tied token table).
  double grad_norm_sq();
  void set_norm_skip(std::vector<std::pair<int64_t, int64_t>> ranges);
  // Views of the gradient elements this rank holds in flat range [begin, end), after
  // finish_grads(): the range itself (stages 0-1), or its overlap with the rank's chunks.
  std::vector<Tensor> held_grads(int64_t begin, int64_t end) const;
  // Multiplies the gradients by `factor` (applied inside the next step(), not as a pass).
  void scale_grads(float factor) { grad_scale_ *= factor; }
  // AdamW on the owned ranges, then (stages 1-2) all-gather the updated weights.
  void step(double lr);

  // --- state for checkpoints --------------------------------------------------------------
  int zero_stage() const { return opt_.zero_stage; }
  const comm::Group& group() const { return dp_; }
  // Owned ranges [begin, end) of the flat buffer with their optimizer (one per unit).
  const std::vector<std::unique_ptr<optim::AdamW>>& optimizers() const { return optimizer_->per_unit(); }
  // True when the model's flat buffer holds the fp32 master of every weight (stage 0, and
  // stages 1-2 with f32 gathers); otherwise read the weights with gather_full_params.
  bool params_are_masters() const { return weights_->params_are_masters(); }
  // Stages 1-2 keep the 16-bit weight replica and no flat parameter buffer (weight_replica).
  bool keeps_replica() const { return dynamic_cast<const ReplicaWeights*>(weights_.get()) != nullptr; }
  // Copies every unit's full fp32 weights into `flat` (length flat_size) on every rank (stage
  // 3, and stages 1-2 with 16-bit gathers, all-gather the owners' chunks; otherwise a copy).
  void gather_full_params(const Tensor& flat) const { weights_->gather_full(flat); }
  // Takes the weights from a full flat buffer (stage 3 keeps only its chunks).
  void load_full_params(const Tensor& flat) { weights_->load_full(flat); }
  // Every unit's whole Adam moments into `exp_avg` and `exp_avg_sq` (flat_size each, laid out
  // like the weights; padding zero) on every rank: stages 1-3 all-gather the chunks.
  void gather_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq) const;
  // Takes this rank's moments from whole ones laid out like the weights, and the step count
  // their bias correction continues from.
  void load_full_moments(const Tensor& exp_avg, const Tensor& exp_avg_sq, int64_t optimizer_steps);
  int64_t optimizer_steps() const;
  // Seconds the calling thread spent blocked on communication since the last call (the
  // exposed, i.e. not overlapped, part of it).
  double take_wait_seconds();
  // Seconds 1-bit Adam spent compressing and decoding since the last call (computation on
  // the training thread, not counted as waiting).
  double take_compress_seconds();

  // --- model::ParamSource -------------------------------------------------------------------
  model::BlockWeights block_params(int layer, Phase phase) override;
  void release_block_params(int layer, Phase phase) override;
  model::BlockWeights block_grads(int layer) override;
  void block_grads_done(int layer) override;
  Tensor outer_param(const std::string& name) override;
  Tensor outer_grad(const std::string& name) override;
  void outer_grads_done() override;
  void head_grads_done() override;
  void embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres, const Tensor& dwte,
                          const Tensor& dwpe) override;
  void pass_begin(bool train) override;
  void pass_end(bool train) override;

 private:
  // How one unit travels in a 16-bit weight all-gather: each rank's chunk as runs of product
  // operands (16 bits) and of other elements (f32, exact), packed into a slot of `slot_elems`
  // 2-byte elements: the 16-bit values first (n16, padded to the largest rank's count and to an
  // even count), then the f32 values (n32 of them, likewise padded).
  struct WireRun {
    int64_t offset, n;  // within the chunk
    bool rounded;
  };
  struct WireUnit {
    std::vector<std::vector<WireRun>> runs;  // per rank of the unit's group
    int64_t n16 = 0, n32 = 0;
    int64_t slot_elems() const { return n16 + 2 * n32; }
  };

  // Keys of the per-unit maps (served units, staging_of_layer_): a block's unit is keyed by its
  // layer, the experts of MoE block l by expert_unit_key(l), the outer units by these two.
  static constexpr int kEmbeddingUnit = -1;
  static constexpr int kHeadUnit = -2;
  static constexpr int kExpertUnitBase = 1 << 20;  // above any layer index
  static int expert_unit_key(int layer) { return kExpertUnitBase + layer; }

  // --- units and buffers (data_parallel.cpp) ---
  const model::ParamUnit& unit_of(int layer) const;
  const model::ParamUnit* expert_unit_of(int layer) const;  // nullptr for dense blocks
  const model::ParamUnit& outer_unit(const std::string& param_name) const;
  // kEmbeddingUnit or kHeadUnit, for outer_unit()'s result.
  int outer_unit_key(const model::ParamUnit& u) const;
  size_t index_of(const model::ParamUnit& u) const { return size_t(&u - layout_.units().data()); }
  // The unit's data-parallel group, its size and this rank's place in it.
  const comm::Group& group_of(const model::ParamUnit& u) const { return u.experts ? expert_dp_ : dp_; }
  int n_of(const model::ParamUnit& u) const { return u.experts ? en_ : n_; }
  int r_of(const model::ParamUnit& u) const { return u.experts ? er_ : r_; }
  int64_t chunk_size(const model::ParamUnit& u) const { return u.size() / n_of(u); }
  int64_t shard_offset(const model::ParamUnit& u) const { return shard_off_[index_of(u)]; }
  Tensor chunk_view(const Tensor& flat_or_shard, const model::ParamUnit& u, bool shard) const;
  // Unit-sized communication buffers (reduce-scatter outputs, gathered weights, bf16 wire copies
  // of gradients) come back here instead of to the heap: a fresh multi-megabyte allocation is
  // fresh pages, faulted in and zeroed by the kernel, a few times per layer per micro-batch
  // otherwise.
  Tensor take_buffer(int64_t elems, DType dt = DType::f32);
  void recycle(Tensor buf);

  // Squared norm: `local` summed over the dp group (waited for, counted as waiting).
  double sum_over_dp(double local);

  // --- 16-bit weight all-gathers (data_parallel_weight_wire.cpp) ---
  bool sixteen_bit_gathers() const { return opt_.gather_dtype != DType::f32; }
  void build_wire_units();
  // Packs rank q's chunk of u (its fp32 values) into q's slot of `wire` (group size slots).
  void pack_chunk(const model::ParamUnit& u, const float* chunk, const Tensor& wire, int q) const;
  // Unpacks every slot of `wire` but `skip_rank`'s into the unit's whole buffer.
  void unpack_unit(const model::ParamUnit& u, const Tensor& wire, float* unit, int skip_rank = -1) const;
  // Starts gathering u's weights from this rank's chunk into `out` (the whole unit); with
  // 16-bit gathers `wire` receives them and finish_unit_gather unpacks.
  comm::Work start_unit_gather(const model::ParamUnit& u, const Tensor& chunk, const Tensor& out, Tensor& wire);
  // in_place: `out` holds this rank's chunk already (stages 1-2 without the replica: its fp32
  // master, kept).
  void finish_unit_gather(const model::ParamUnit& u, Tensor& wire, const Tensor& out, bool in_place);
  int64_t gather_wire_bytes(const model::ParamUnit& u) const;  // this rank's bytes sent

  // --- the optimizer (data_parallel_optimizer.cpp) ---
  double counted_sum_squares(const float* g, int64_t flat0, int64_t n) const;
  // 1-bit Adam after the freeze: each unit's compressed step (OneBitAdam).
  void onebit_step(double lr);

  model::Decoder& model_;
  const model::ModelConfig cfg_;
  const model::ParamLayout& layout_;
  comm::Group dp_, expert_dp_;
  DataParallelOptions opt_;
  int n_, r_, en_, er_;             // the dp and expert-dp groups' sizes and this rank's places
  std::vector<int64_t> shard_off_;  // per unit: where its chunk sits in the shard buffers
  bool sync_ = true;
  std::unique_ptr<optim::ShardedAdamW> optimizer_;  // AdamW on the owned ranges (sharded at stages 1-3)
  optim::AdamWConfig adam_cfg_;
  std::unique_ptr<optim::OneBitAdam> onebit_;  // 1-bit Adam with dp > 1 only
  int64_t wire_bytes_ = 0, last_wire_bytes_ = 0;

  std::unique_ptr<GradSync> grad_sync_;    // BucketedAllReduce (stages 0-1) or ShardedReduceScatter (2-3)
  std::unique_ptr<WeightSource> weights_;  // FullWeights, ReplicaWeights (1-2) or GatheredWeights (3)
  std::vector<Tensor> spare_buffers_;      // take_buffer / recycle; contents undefined
  double wait_s_ = 0, compress_s_ = 0;
  double grad_scale_ = 1.0;
  std::vector<std::pair<int64_t, int64_t>> norm_skip_;  // sorted flat ranges
  std::vector<WireUnit> wire_units_;                    // per unit; 16-bit gathers only
};

}  // namespace loom::parallel
