// How DataParallel synchronises gradients over its groups, one type per strategy, chosen once at
// construction by the ZeRO stage:
//   BucketedAllReduce (stages 0-1): whole gradients in the model's flat buffer, all-reduced in
//     buckets of about bucket_mb as soon as backward has produced each bucket's last gradient;
//     the embedding lookup's gradient travels as the batch's rows (data_parallel_embedding_rows.cpp).
//   ShardedReduceScatter (stages 2-3): each unit's gradients staged in a communication buffer and
//     reduce-scattered into this rank's gradient chunk as soon as the unit is done.
// Both use DataParallel's unit geometry, communication buffer pool and counters.
#pragma once
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "loom/comm/group.h"
#include "loom/model/decoder.h"

namespace loom::parallel {

class DataParallel;

class GradSync {
 public:
  virtual ~GradSync() = default;
  // Zeroes the gradients this rank holds.
  virtual void zero() = 0;
  // model::ParamSource's gradient side. `sync` false (no_sync, all but the last micro-batch):
  // strategies that can accumulate locally send nothing.
  virtual model::BlockWeights block_grads(int layer) = 0;
  virtual void block_grads_done(int layer, bool sync) = 0;
  virtual Tensor outer_grad(const std::string& name) = 0;
  virtual void outer_grads_done(bool sync) = 0;
  virtual void head_grads_done(bool sync) { (void)sync; }
  // True where the strategy took the lookup's gradient itself (else the decoder's own path runs).
  virtual bool embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres, const Tensor& dwte,
                                  const Tensor& dwpe) {
    (void)tokens, (void)pos, (void)dres, (void)dwte, (void)dwpe;
    return false;
  }
  virtual void pass_begin(bool train) { (void)train; }
  // Waits for every reduction in flight: afterwards the held gradients are sums over ranks.
  virtual void finish() = 0;
  // The gradients the optimizer of unit `u` reads, from flat index `begin` (its AdamW's).
  virtual const float* unit_grads(const model::ParamUnit& u, int64_t begin) const = 0;
  // Squared global gradient norm, after finish() (the skipped ranges left out).
  virtual double norm_sq() = 0;
  // Views of the gradient elements this rank holds in flat range [begin, end).
  virtual std::vector<Tensor> held(int64_t begin, int64_t end) const = 0;
};

class BucketedAllReduce final : public GradSync {
 public:
  explicit BucketedAllReduce(DataParallel& dp);
  void zero() override;
  model::BlockWeights block_grads(int layer) override;
  void block_grads_done(int layer, bool sync) override;
  Tensor outer_grad(const std::string& name) override;
  void outer_grads_done(bool sync) override;
  void head_grads_done(bool sync) override;
  bool embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres, const Tensor& dwte,
                          const Tensor& dwpe) override;
  void finish() override;
  const float* unit_grads(const model::ParamUnit& u, int64_t begin) const override;
  double norm_sq() override;
  std::vector<Tensor> held(int64_t begin, int64_t end) const override;

 private:
  void unit_ready(size_t unit_index);
  void wait_buckets();         // blocks on the buckets' all-reduces
  void land_buckets();         // after wait_buckets: bf16 sums widened into the gradients
  void wait_embedding_rows();  // blocks on the rows' all-gathers
  void add_embedding_rows();   // after wait_embedding_rows and land_buckets

  DataParallel& d_;
  // Unit index ranges, in backward order; a bucket fires when all its units are done.
  struct Bucket {
    size_t first_unit, last_unit;  // inclusive, layout order
    int remaining = 0;
  };
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_unit_;
  struct Inflight {  // a bucket's all-reduce; with bf16 on the wire, where its sum goes back to
    comm::Work work;
    Tensor wire, grads;
  };
  std::vector<Inflight> inflight_;
  // With the whole model on this rank: the embedding and head units are reduced as soon as the
  // head's gradients exist, and the lookup's gradient travels as the batch's rows.
  bool early_outer_ = false;
  bool outer_fired_ = false;  // this pass launched them already
  struct SparseRows {
    Tensor tokens, pos, rows;  // gathered from every rank
    comm::Work w_tok, w_pos, w_rows;
    Tensor dwte, dwpe;
  };
  std::vector<SparseRows> sparse_;
};

class ShardedReduceScatter final : public GradSync {
 public:
  // `shard_elems`: the rank's chunks of every unit, concatenated (DataParallel's shard layout).
  ShardedReduceScatter(DataParallel& dp, int64_t shard_elems);
  void zero() override { grad_shard_.zero(); }
  model::BlockWeights block_grads(int layer) override;
  void block_grads_done(int layer, bool sync) override;
  Tensor outer_grad(const std::string& name) override;
  void outer_grads_done(bool sync) override;
  void pass_begin(bool train) override;
  void finish() override { drain(0); }
  const float* unit_grads(const model::ParamUnit& u, int64_t begin) const override;
  double norm_sq() override;
  std::vector<Tensor> held(int64_t begin, int64_t end) const override;

 private:
  struct Pending {  // an asynchronous reduce-scatter and what to do when it completes
    comm::Work work;
    Tensor staging, chunk_tmp;  // the unit's gradients; the reduce-scatter output, added into the shard
    Tensor wire;                // bf16 on the wire: the staging's bf16 copy (chunk_tmp is bf16)
    int64_t shard_offset = 0;
    bool pooled = false;  // staging returns to the block staging pool
  };
  Tensor take_staging(int64_t elems);
  void reduce_scatter_unit(const model::ParamUnit& u, const Tensor& staging, bool pooled);
  void retire(Pending& p);
  void drain(size_t keep);

  DataParallel& d_;
  Tensor grad_shard_;
  std::deque<Pending> pending_;
  std::vector<Tensor> staging_pool_;
  std::map<int, Tensor> staging_of_layer_;  // by unit key: a block's, its experts'
  Tensor embed_staging_, head_staging_;
};

}  // namespace loom::parallel
