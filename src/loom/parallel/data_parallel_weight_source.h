// Where DataParallel's weights come from, one type per strategy, chosen once at construction:
//   FullWeights (stage 0, and stages 1-2 with the model's flat parameter buffer): the model's
//     buffer holds every weight; at stages 1-2 each rank updates its chunks and all-gathers them
//     after the step (16-bit gathers keep this rank's fp32 masters and widen the others').
//   ReplicaWeights (stages 1-2 with 16-bit gathers and no flat buffer): every unit as it arrived
//     from the last all-gather (the replica), widened into a unit buffer just before use; the
//     fp32 masters are this rank's chunks only.
//   GatheredWeights (stage 3): only this rank's chunks are stored; each unit is all-gathered just
//     before use, the next one prefetched, and freed at the end of the pass. The chunks may live
//     off the device (parallel.offload.params; shard_offload.h), staged a unit at a time.
// The 16-bit wire packing they share is DataParallel's (data_parallel_weight_wire.cpp).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/comm/group.h"
#include "loom/model/decoder.h"
#include "loom/optim/offload_target.h"
#include "loom/parallel/shard_offload.h"

namespace loom::parallel {

class DataParallel;

class WeightSource {
 public:
  using Phase = model::ParamSource::Phase;
  virtual ~WeightSource() = default;
  // model::ParamSource's weight side.
  virtual model::BlockWeights block_params(int layer, Phase phase) = 0;
  virtual void release_block_params(int layer) { (void)layer; }
  virtual Tensor outer_param(const std::string& name) = 0;
  virtual void pass_begin(bool train) { (void)train; }
  virtual void pass_end() {}
  // The fp32 masters the optimizer of unit `u` updates, from flat index `begin` (its AdamW's).
  virtual float* masters(const model::ParamUnit& u, int64_t begin) = 0;
  // After the optimizer step: this rank's updated chunks to the others. Returns the bytes this
  // rank sent.
  virtual int64_t refresh() { return 0; }
  // True when the model's flat buffer holds the fp32 master of every weight.
  virtual bool params_are_masters() const = 0;
  // Bytes of parameters kept off the device (ZeRO-3 under parallel.offload.params; else 0).
  virtual int64_t offloaded_param_bytes() const { return 0; }
  // Every unit's full fp32 weights into `flat` (length flat_size) on every rank.
  virtual void gather_full(const Tensor& flat) const = 0;
  // Takes the weights from a full flat buffer (this rank's chunks where only those are kept).
  virtual void load_full(const Tensor& flat) = 0;
};

class FullWeights final : public WeightSource {
 public:
  // `sharded`: each rank's optimizer updates only its chunks (stages 1-2).
  FullWeights(DataParallel& dp, bool sharded);
  model::BlockWeights block_params(int layer, Phase phase) override;
  Tensor outer_param(const std::string& name) override;
  float* masters(const model::ParamUnit& u, int64_t begin) override;
  int64_t refresh() override;
  bool params_are_masters() const override;
  void gather_full(const Tensor& flat) const override;
  void load_full(const Tensor& flat) override;

 private:
  DataParallel& d_;
  bool sharded_;
};

// What ReplicaWeights and GatheredWeights share: the fp32 chunks this rank owns (initialised from
// a seed), and units served whole for the span of a pass, by the unit keys of DataParallel.
class ServedWeights : public WeightSource {
 public:
  model::BlockWeights block_params(int layer, Phase phase) override;
  void release_block_params(int layer) override;
  Tensor outer_param(const std::string& name) override;
  void pass_begin(bool train) override;
  void pass_end() override;
  float* masters(const model::ParamUnit& u, int64_t begin) override;
  bool params_are_masters() const override { return false; }
  void gather_full(const Tensor& flat) const override;
  void load_full(const Tensor& flat) override;

 protected:
  struct Served {
    Tensor buf;
    comm::Work work;
    Tensor wire;    // 16-bit gathers: what arrives, unpacked into buf once the gather is done
    Tensor staged;  // offloaded chunks: this rank's chunk, read back for the gather
    int users = 0;
    bool borrowed = false;  // buf views the replica of a unit without 16-bit values: not pooled
  };
  // `category`: what the chunks count as (the optimizer's masters, or stage 3's weights).
  // `offload` other than none: the chunks live there from the start (shard_ stays undefined).
  ServedWeights(DataParallel& dp, int64_t shard_elems, uint64_t init_seed, MemCategory category,
                optim::OffloadTarget offload = optim::OffloadTarget::none, const std::string& offload_dir = "");
  // Makes u's whole weights available in a new entry (waited for by wait).
  virtual Served serve(const model::ParamUnit& u) = 0;
  virtual void wait(const model::ParamUnit& u, Served& s) = 0;
  // Whether units are started ahead of their use, to overlap with the current one's compute.
  virtual bool prefetches() const = 0;

  // This rank's fp32 chunk of u, as the gather sends it: a view of shard_, or (offloaded) a
  // staged copy.
  Tensor chunk_of(const model::ParamUnit& u);

  DataParallel& d_;
  Tensor shard_;  // this rank's fp32 chunks, concatenated in unit order (undefined when offloaded)
  std::unique_ptr<ShardOffload> offload_;
  // Offloaded: the chunk the optimizer is updating, written back when it moves on.
  Tensor updating_;
  int64_t updating_at_ = -1;
  void write_back_update();

 private:
  Tensor served_unit(const model::ParamUnit& u, int key);
  void start(const model::ParamUnit& u, int key) { served_[key] = serve(u); }
  void prefetch_after(size_t position);
  void drop(Served& s);  // waits, buffers back to the pool

  std::map<int, Served> served_;             // by unit key
  std::vector<std::pair<int, Phase>> plan_;  // expected block_params requests of this pass
  size_t plan_pos_ = 0;
};

class ReplicaWeights final : public ServedWeights {
 public:
  ReplicaWeights(DataParallel& dp, int64_t shard_elems, uint64_t init_seed);
  int64_t refresh() override;
  void load_full(const Tensor& flat) override;

 private:
  Served serve(const model::ParamUnit& u) override;
  void wait(const model::ParamUnit&, Served&) override {}  // widened when served
  // Widening runs on this thread: ahead of time it would only hold one more unit.
  bool prefetches() const override { return false; }
  void all_gather_replica();

  std::vector<Tensor> replicas_;  // per unit: every rank's slot as the last all-gather left it
};

class GatheredWeights final : public ServedWeights {
 public:
  GatheredWeights(DataParallel& dp, int64_t shard_elems, uint64_t init_seed, optim::OffloadTarget offload,
                  const std::string& offload_dir);
  int64_t offloaded_param_bytes() const override { return offload_ ? offload_->offloaded_bytes() : 0; }
  int64_t refresh() override;  // the last updated chunk back to its home

 private:
  Served serve(const model::ParamUnit& u) override;
  void wait(const model::ParamUnit& u, Served& s) override;
  bool prefetches() const override { return true; }
};

}  // namespace loom::parallel
