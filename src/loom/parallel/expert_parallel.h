// Expert parallelism's exchange over the ep group (model::ExpertParallelOps): the counts of
// rows per (peer, expert) by all-to-all, then the rows themselves by an asynchronous
// all-to-all-v, so a MoE block computes its shared experts while its tokens travel (model/moe.h).
// A MoE block holds experts [ep_rank * E / ep, (ep_rank + 1) * E / ep) (ModelSlice::ep); the
// expert parameters are data-parallel over the ranks holding the same experts (the mesh's dp
// group), every other parameter over all ranks that see different data (Mesh::data()).
#pragma once
#include "loom/comm/group.h"
#include "loom/model/moe.h"

namespace loom::parallel {

class ExpertParallelExchange final : public model::ExpertParallelOps {
 public:
  explicit ExpertParallelExchange(comm::Group ep) : ep_(std::move(ep)) {}
  int size() const override { return ep_.size(); }
  int rank() const override { return ep_.rank(); }
  void exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv) override;
  void start_rows(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                  const std::vector<int64_t>& recv_rows) override;
  void wait_rows() override;
  // Seconds blocked waiting for row exchanges (the exposed part) and their count, since the
  // last take; the whole time of each exchange is in the group's CommRecord.
  double take_wait_seconds();
  const comm::Group& group() const { return ep_; }

 private:
  comm::Group ep_;
  comm::Work inflight_;
  bool pending_ = false;
  double wait_s_ = 0;
};

}  // namespace loom::parallel
