// comm::Group: a process group and its collectives on loom Tensors, each with an async form
// that returns a Work handle. A Group is a small value (a shared_ptr inside); copies refer to
// the same group. There is no global communicator: main() owns a World and passes groups in.
//
// Ordering contract: operations on one group run in issue order on a per-group worker
// thread, so every rank must issue the collectives of a group in the same order (the same
// rule as MPI and NCCL). send/recv are matched by (peer, tag) in issue order and do not
// block the collectives issued after them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/algorithm.h"
#include "loom/core/tensor.h"

namespace loom::comm {

enum class ReduceOp : uint8_t { sum, max, min, avg };
const char* reduce_op_name(ReduceOp op);

class CommRecord;
class GroupImpl;
struct WorkState;

// Completion handle of an asynchronous operation. wait() blocks until the operation has
// finished and rethrows its error, if any; test() never blocks. A default Work is complete.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<WorkState> s) : state_(std::move(s)) {}
  void wait() const;
  bool test() const;

 private:
  std::shared_ptr<WorkState> state_;
};

class Group {
 public:
  Group() = default;  // not a group; valid() is false
  // A group of one process without MPI: every collective is a local copy or a no-op.
  static Group single(const std::string& name = "single");

  bool valid() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  const std::string& name() const;
  const char* backend_name() const;  // "mpi", "single", "nccl"
  // The record of this group's operations (shared with the groups split from it).
  const CommRecord& record() const;

  // In place: every rank ends with the reduction of all ranks' `t`.
  Work all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum) const;
  // `in` has size() * out.numel() elements; rank r receives the reduction of chunk r.
  Work reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum) const;
  // `out` has size() * in.numel() elements; chunk r is rank r's `in`. `in` may be chunk
  // rank() of `out` itself (in-place all-gather).
  Work all_gather_async(const Tensor& in, const Tensor& out) const;
  Work broadcast_async(const Tensor& t, int root) const;
  Work send_async(const Tensor& t, int dst, int tag = 0) const;
  Work recv_async(const Tensor& t, int src, int tag = 0) const;
  // Equal chunks: chunk j of `in` goes to rank j; chunk i of `out` comes from rank i.
  Work all_to_all_async(const Tensor& in, const Tensor& out) const;
  // Counts in elements, one per rank; chunks are packed back to back in rank order.
  Work all_to_all_v_async(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                          const std::vector<int64_t>& recv_counts) const;
  Work barrier_async() const;

  // Blocking forms: the async form followed by wait().
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) const { all_reduce_async(t, op).wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum) const {
    reduce_scatter_async(in, out, op).wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) const { all_gather_async(in, out).wait(); }
  void broadcast(const Tensor& t, int root) const { broadcast_async(t, root).wait(); }
  void send(const Tensor& t, int dst, int tag = 0) const { send_async(t, dst, tag).wait(); }
  void recv(const Tensor& t, int src, int tag = 0) const { recv_async(t, src, tag).wait(); }
  void all_to_all(const Tensor& in, const Tensor& out) const { all_to_all_async(in, out).wait(); }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) const {
    all_to_all_v_async(in, send_counts, out, recv_counts).wait();
  }
  void barrier() const { barrier_async().wait(); }

  // The algorithm this group's all-reduce, reduce-scatter and all-gather run (algorithm.h;
  // "mpi" for groups without the algorithm layer: single-process and NCCL groups). It
  // applies to operations issued after the call; every rank must set the same. Groups split
  // from this one start with its algorithm.
  void set_algorithm(Algorithm a) const;
  Algorithm algorithm() const;
  // What a collective over `bytes` issued now would run, with `auto` and fallbacks resolved.
  Algorithm algorithm_for(CollectiveOp op, int64_t bytes) const;
  // The host of each member by group rank (equal ids: one host), and how many hosts.
  std::vector<int> host_of() const;
  int hosts() const;

  // Collective over this group (ordered like the other collectives): ranks with the same
  // color form a new group, ordered by key (ties by rank). A negative color joins no group
  // and gets an invalid Group back. `name` defaults to "<parent>.<color>".
  Group split(int color, int key, const std::string& name = "") const;

  explicit Group(std::shared_ptr<GroupImpl> impl) : impl_(std::move(impl)) {}

 private:
  friend std::shared_ptr<CommRecord> shared_record(const Group& g);
  const GroupImpl& impl(const char* op) const;
  std::shared_ptr<GroupImpl> impl_;
};

}  // namespace loom::comm
