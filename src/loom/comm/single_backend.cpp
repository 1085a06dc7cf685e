// The one-process backend: what every collective means when the group has a single rank,
// so code written for N ranks runs unchanged without mpiexec.
#include <cstring>

#include "loom/comm/backend.h"

namespace loom::comm {

namespace {

class SingleBackend final : public Backend {
 public:
  const char* name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Device device() const override { return Device::cpu; }
  // The MPI set, so that code that works on one process keeps working on many.
  bool supports(DType t) const override { return is_host_comm_dtype(t); }

  // With one rank the reduction of one value is the value, the average included.
  void all_reduce(const Tensor&, ReduceOp) override {}
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp) override { copy(in, out); }
  void all_gather(const Tensor& in, const Tensor& out) override { copy(in, out); }
  void broadcast(const Tensor&, int) override {}
  void all_to_all(const Tensor& in, const Tensor& out) override { copy(in, out); }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>&) override {
    if (send_counts[0] > 0) std::memmove(out.raw(), in.raw(), size_t(send_counts[0]) * dtype_size(in.dtype()));
  }
  void barrier() override {}
  // The Group rejects peers other than rank 0 and rank 0 is this process: unreachable.
  std::unique_ptr<PendingTransfer> post_send(const Tensor&, int, int) override {
    fail("comm", "send: a single-process group has no peer");
  }
  std::unique_ptr<PendingTransfer> post_recv(const Tensor&, int, int) override {
    fail("comm", "recv: a single-process group has no peer");
  }
  std::unique_ptr<Backend> split(int color, int) override {
    if (color < 0) return nullptr;
    return std::make_unique<SingleBackend>();
  }

 private:
  static void copy(const Tensor& in, const Tensor& out) {
    if (in.raw() != out.raw()) std::memmove(out.raw(), in.raw(), in.nbytes());
  }
};

}  // namespace

std::unique_ptr<Backend> make_single_backend() { return std::make_unique<SingleBackend>(); }

Group Group::single(const std::string& name) {
  return make_group(make_single_backend(), name, std::make_shared<CommRecord>());
}

}  // namespace loom::comm
