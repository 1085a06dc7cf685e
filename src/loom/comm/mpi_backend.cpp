// The MPI backend: blocking MPI collectives on host tensors (run on the group's worker
// thread, hence MPI_THREAD_MULTIPLE), non-blocking send/recv posted by the issuing thread or
// the worker and polled by the worker.
// Counts above INT_MAX are split into chunks where the operation allows it.
#include "loom/comm/mpi_backend.h"

#include <mpi.h>

#include <climits>
#include <cstring>

#include "loom/core/error.h"

namespace loom::comm {

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("comm", what, " failed: ", std::string(msg, size_t(len)));
}

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16: return MPI_UINT16_T;  // moved as bits; sums through bf16_sum_op()
    case DType::f16: return MPI_UINT16_T;   // moved as bits; not reduced (mpi_op refuses)
    default: fail("comm", "mpi: dtype ", dtype_name(t), " is not supported");
  }
}

// MPI has no bf16: a user operation adds pairs in f32 and rounds the sum to bf16 (nearest even),
// so every step of the reduction tree rounds once, as NCCL's bf16 sum does.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16_t*>(in);
  auto* b = static_cast<bf16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

MPI_Op bf16_sum_op() {
  static const MPI_Op op = [] {
    MPI_Op o;
    mpi_check(MPI_Op_create(&bf16_sum, /*commute=*/1, &o), "MPI_Op_create");
    return o;
  }();
  return op;
}

MPI_Op mpi_op(ReduceOp op, DType t) {
  LOOM_CHECK(t != DType::f16, "comm", "mpi: f16 tensors are moved (send, recv, all-gather, broadcast), not reduced; ",
             "reduce in f32 or bf16");
  if (t == DType::bf16) {
    LOOM_CHECK(op == ReduceOp::sum || op == ReduceOp::avg, "comm", "mpi: bf16 reductions are sum and avg, not ",
               reduce_op_name(op));
    return bf16_sum_op();
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

int int_count(int64_t n, const char* op) {
  LOOM_CHECK(n <= INT_MAX, "comm", op, ": ", n, " elements per rank exceed MPI's int count (", INT_MAX,
             "); split the tensor into smaller pieces");
  return int(n);
}

bool overlaps(const Tensor& a, const Tensor& b) {
  auto pa = static_cast<const char*>(a.raw()), pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// A private copy of `in` when it overlaps `out` in a way MPI's in-place forms do not cover.
Tensor separate_input(const Tensor& in, const Tensor& out) {
  return overlaps(in, out) ? in.clone(MemCategory::comm) : in;
}

constexpr int64_t kChunk = int64_t(1) << 30;  // elements per call for splittable operations

class MpiTransfer final : public PendingTransfer {
 public:
  MpiTransfer(MPI_Request req, int64_t expect, MPI_Datatype type, int peer)
      : req_(req), expect_(expect), type_(type), peer_(peer) {}
  bool test() override {
    int flag = 0;
    MPI_Status st;
    mpi_check(MPI_Test(&req_, &flag, &st), "MPI_Test");
    if (flag && expect_ >= 0) {  // a receive: a shorter message is a protocol error
      int got = 0;
      MPI_Get_count(&st, type_, &got);
      LOOM_CHECK(got == expect_, "comm", "recv: rank ", peer_, " sent ", got, " elements but the tensor holds ",
                 expect_, "; both sides must agree on the size");
    }
    return flag != 0;
  }

 private:
  MPI_Request req_;
  int64_t expect_;  // -1 for a send
  MPI_Datatype type_;
  int peer_;
};

class MpiBackend final : public Backend {
 public:
  explicit MpiBackend(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Group mine, world;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> local(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) local[size_t(i)] = i;
    world_ranks_.assign(size_t(size_), MPI_UNDEFINED);
    MPI_Group_translate_ranks(mine, size_, local.data(), world, world_ranks_.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
  }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu; }
  bool supports(DType t) const override { return is_host_comm_dtype(t); }
  std::vector<int> world_ranks() const override { return world_ranks_; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    auto* p = static_cast<char*>(t.raw());
    size_t es = dtype_size(t.dtype());
    for (int64_t off = 0; off < t.numel(); off += kChunk) {
      int n = int(std::min(kChunk, t.numel() - off));
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, p + size_t(off) * es, n, mpi_type(t.dtype()), mpi_op(op, t.dtype()), comm_),
                "MPI_Allreduce");
    }
    if (op == ReduceOp::avg) divide_in_place(t, size_);
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    Tensor src = separate_input(in, out);
    mpi_check(MPI_Reduce_scatter_block(src.raw(), out.raw(), int_count(out.numel(), "reduce_scatter"),
                                       mpi_type(in.dtype()), mpi_op(op, in.dtype()), comm_),
              "MPI_Reduce_scatter_block");
    if (op == ReduceOp::avg) divide_in_place(out, size_);
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    int n = int_count(in.numel(), "all_gather");
    auto* mine = static_cast<char*>(out.raw()) + size_t(rank_) * in.nbytes();
    if (in.raw() == mine) {  // in-place: the input is already chunk `rank` of the output
      mpi_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out.raw(), n, mpi_type(in.dtype()), comm_),
                "MPI_Allgather");
      return;
    }
    Tensor src = separate_input(in, out);
    mpi_check(MPI_Allgather(src.raw(), n, mpi_type(in.dtype()), out.raw(), n, mpi_type(in.dtype()), comm_),
              "MPI_Allgather");
  }

  void broadcast(const Tensor& t, int root) override {
    auto* p = static_cast<char*>(t.raw());
    size_t es = dtype_size(t.dtype());
    for (int64_t off = 0; off < t.numel(); off += kChunk) {
      int n = int(std::min(kChunk, t.numel() - off));
      mpi_check(MPI_Bcast(p + size_t(off) * es, n, mpi_type(t.dtype()), root, comm_), "MPI_Bcast");
    }
  }

  void all_to_all(const Tensor& in, const Tensor& out) override {
    int n = int_count(in.numel() / size_, "all_to_all");
    Tensor src = separate_input(in, out);
    mpi_check(MPI_Alltoall(src.raw(), n, mpi_type(in.dtype()), out.raw(), n, mpi_type(in.dtype()), comm_),
              "MPI_Alltoall");
  }

  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    const size_t n = size_t(size_);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    int64_t so = 0, ro = 0;
    for (size_t i = 0; i < n; ++i) {
      sc[i] = int_count(send_counts[i], "all_to_all_v");
      rc[i] = int_count(recv_counts[i], "all_to_all_v");
      sd[i] = int_count(so, "all_to_all_v");
      rd[i] = int_count(ro, "all_to_all_v");
      so += send_counts[i];
      ro += recv_counts[i];
    }
    Tensor src = separate_input(in, out);
    MPI_Datatype type = mpi_type(in.dtype());
    mpi_check(MPI_Alltoallv(src.raw(), sc.data(), sd.data(), type, out.raw(), rc.data(), rd.data(), type, comm_),
              "MPI_Alltoallv");
  }

  void barrier() override { mpi_check(MPI_Barrier(comm_), "MPI_Barrier"); }

  std::unique_ptr<PendingTransfer> post_send(const Tensor& t, int dst, int tag) override {
    MPI_Request req;
    mpi_check(MPI_Isend(t.raw(), int_count(t.numel(), "send"), mpi_type(t.dtype()), dst, tag, comm_, &req),
              "MPI_Isend");
    return std::make_unique<MpiTransfer>(req, -1, mpi_type(t.dtype()), dst);
  }

  std::unique_ptr<PendingTransfer> post_recv(const Tensor& t, int src, int tag) override {
    MPI_Request req;
    mpi_check(MPI_Irecv(t.raw(), int_count(t.numel(), "recv"), mpi_type(t.dtype()), src, tag, comm_, &req),
              "MPI_Irecv");
    return std::make_unique<MpiTransfer>(req, t.numel(), mpi_type(t.dtype()), src);
  }

  bool posts_from_any_thread() const override { return true; }  // world.cpp asks for MPI_THREAD_MULTIPLE

  std::unique_ptr<Backend> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiBackend>(sub);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_ranks_;
};

}  // namespace

std::unique_ptr<Backend> make_mpi_world_backend() {
  MPI_Comm comm;
  // A private duplicate, so loom's traffic never matches messages of other MPI users.
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  return std::make_unique<MpiBackend>(comm);
}

}  // namespace loom::comm
