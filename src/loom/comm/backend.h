// The interface a transport (MPI, NCCL, single process) implements for comm::Group. Internal
// to the comm module: a Backend's methods run on the group's worker thread, after the Group has
// checked shapes and dtypes, and they block until the operation is done. The one exception:
// a transport whose posts_from_any_thread() is true has post_send/post_recv called on the
// issuing thread too, concurrently with the worker's calls.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/group.h"
#include "loom/comm/progress_board.h"
#include "loom/comm/record.h"

namespace loom::comm {

// A posted point-to-point transfer; the worker polls test() until it returns true.
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  virtual bool test() = 0;  // throws on a transport error
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual Device device() const = 0;  // where the tensors it takes live
  // Whether the transport handles this dtype (the Group names the supported ones).
  virtual bool supports(DType t) const = 0;

  virtual void all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  virtual void all_gather(const Tensor& in, const Tensor& out) = 0;
  virtual void broadcast(const Tensor& t, int root) = 0;
  virtual void all_to_all(const Tensor& in, const Tensor& out) = 0;
  virtual void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                            const std::vector<int64_t>& recv_counts) = 0;
  virtual void barrier() = 0;
  virtual std::unique_ptr<PendingTransfer> post_send(const Tensor& t, int dst, int tag) = 0;
  virtual std::unique_ptr<PendingTransfer> post_recv(const Tensor& t, int src, int tag) = 0;
  // Whether post_send/post_recv may run on any thread while the worker runs other calls (MPI
  // under MPI_THREAD_MULTIPLE). Then a transfer issued while the worker has nothing queued is
  // posted before send_async/recv_async return: a pipeline stage's output is on its way as soon
  // as the pass ends, not when the worker thread next gets a core (which, with every core
  // computing, is up to a scheduler slice later).
  virtual bool posts_from_any_thread() const { return false; }
  // Collective; null when this rank passed a negative color.
  virtual std::unique_ptr<Backend> split(int color, int key) = 0;
  // The members' ranks in the world, in group-rank order; empty when the transport cannot
  // tell (the group is then not tracked on the progress board).
  virtual std::vector<int> world_ranks() const { return {}; }

  // Collective algorithms (algorithm.h). A transport runs its own collectives ("mpi"); the
  // algorithm backend (p2p_collectives.h) runs what use_algorithm() last set, which the
  // worker calls before each all-reduce, reduce-scatter and all-gather with the algorithm
  // the group had when the operation was issued.
  virtual void use_algorithm(Algorithm) {}
  virtual Algorithm algorithm() const { return Algorithm::mpi; }
  // What a collective over `bytes` runs under `requested` (auto and fallbacks resolved).
  virtual Algorithm resolve(Algorithm /*requested*/, CollectiveOp, int64_t /*bytes*/) const { return Algorithm::mpi; }
  // Host id of each member, by group rank; empty when unknown (taken as one host).
  virtual std::vector<int> host_of() const { return {}; }
};

// Wraps a backend in a Group with its own worker thread, recording into `record` and, when
// `board` is given, posting its collectives' progress there.
Group make_group(std::unique_ptr<Backend> backend, const std::string& name, std::shared_ptr<CommRecord> record,
                 std::shared_ptr<ProgressBoard> board = nullptr);

std::unique_ptr<Backend> make_single_backend();
// The record `g` writes to, for a group built beside it (e.g. a NCCL group).
std::shared_ptr<CommRecord> shared_record(const Group& g);

// The element types every CPU backend moves and reduces: f32, f64, i32, i64, u8.
bool is_host_comm_dtype(DType t);
inline constexpr const char* kHostCommDtypes = "f32, f64, bf16 (sum and avg), f16 (moved, not reduced), i32, i64, u8";

// Divides every element by n (the avg of ReduceOp::avg after a sum); CPU tensors.
void divide_in_place(const Tensor& t, int n);

}  // namespace loom::comm
