// The NCCL backend: collectives on CUDA tensors. Each operation is enqueued on the group's
// own CUDA stream and the group's worker thread waits for the stream, so ordering, Work and
// the watchdog behave as with MPI. Built only with LOOM_HAS_CUDA (see nccl.cmake).
// Limitation: each send/recv is its own NCCL group, so a ring of sends before receives
// deadlocks on the GPU; order them by rank parity or use all_to_all_v.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "loom/comm/backend.h"
#include "loom/comm/nccl.h"

namespace loom::comm {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("comm", what, " failed: ", cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("comm", what, " failed: ", ncclGetErrorString(r), " (NCCL_DEBUG=WARN shows more)");
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::i8: return ncclInt8;
    case DType::u8: return ncclUint8;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::avg: return ncclAvg;
  }
  return ncclSum;
}

char* at(const Tensor& t, int64_t elements) {
  return static_cast<char*>(t.device_raw()) + size_t(elements) * dtype_size(t.dtype());
}

class NcclTransfer final : public PendingTransfer {
 public:
  NcclTransfer(cudaEvent_t ev, int device) : ev_(ev), device_(device) {}
  ~NcclTransfer() override { cudaEventDestroy(ev_); }
  bool test() override {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    cuda_check(e, "cudaEventQuery");
    return true;
  }

 private:
  cudaEvent_t ev_;
  int device_;
};

class NcclBackend final : public Backend {
 public:
  NcclBackend(ncclComm_t comm, int device) : comm_(comm), device_(device) {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&issued_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaMalloc(&token_, sizeof(float)), "cudaMalloc");
    nccl_check(ncclCommCount(comm_, &size_), "ncclCommCount");
    nccl_check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
  }
  ~NcclBackend() override {
    cudaSetDevice(device_);
    ncclCommDestroy(comm_);
    cudaFree(token_);
    cudaEventDestroy(issued_);
    cudaStreamDestroy(stream_);
  }

  const char* name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cuda; }
  bool supports(DType) const override { return true; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    begin();
    nccl_check(ncclAllReduce(t.device_raw(), t.device_raw(), size_t(t.numel()), nccl_type(t.dtype()), nccl_op(op),
                             comm_, stream_),
               "ncclAllReduce");
    finish();
  }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    begin();
    nccl_check(ncclReduceScatter(in.device_raw(), out.device_raw(), size_t(out.numel()), nccl_type(in.dtype()),
                                 nccl_op(op), comm_, stream_),
               "ncclReduceScatter");
    finish();
  }
  void all_gather(const Tensor& in, const Tensor& out) override {
    begin();
    nccl_check(
        ncclAllGather(in.device_raw(), out.device_raw(), size_t(in.numel()), nccl_type(in.dtype()), comm_, stream_),
        "ncclAllGather");
    finish();
  }
  void broadcast(const Tensor& t, int root) override {
    begin();
    nccl_check(
        ncclBroadcast(t.device_raw(), t.device_raw(), size_t(t.numel()), nccl_type(t.dtype()), root, comm_, stream_),
        "ncclBroadcast");
    finish();
  }
  void all_to_all(const Tensor& in, const Tensor& out) override {
    std::vector<int64_t> counts(size_t(size_), in.numel() / size_);
    all_to_all_v(in, counts, out, counts);
  }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                    const std::vector<int64_t>& recv_counts) override {
    begin();
    ncclDataType_t type = nccl_type(in.dtype());
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    int64_t so = 0, ro = 0;
    for (int p = 0; p < size_; ++p) {
      size_t sc = size_t(send_counts[size_t(p)]), rc = size_t(recv_counts[size_t(p)]);
      if (sc) nccl_check(ncclSend(at(in, so), sc, type, p, comm_, stream_), "ncclSend");
      if (rc) nccl_check(ncclRecv(at(out, ro), rc, type, p, comm_, stream_), "ncclRecv");
      so += int64_t(sc);
      ro += int64_t(rc);
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    finish();
  }
  // NCCL has no barrier: a one-element all-reduce synchronises the ranks just as well.
  void barrier() override {
    begin();
    nccl_check(ncclAllReduce(token_, token_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    finish();
  }
  std::unique_ptr<PendingTransfer> post_send(const Tensor& t, int dst, int) override {
    begin();
    nccl_check(ncclSend(t.device_raw(), size_t(t.numel()), nccl_type(t.dtype()), dst, comm_, stream_), "ncclSend");
    return event();
  }
  std::unique_ptr<PendingTransfer> post_recv(const Tensor& t, int src, int) override {
    begin();
    nccl_check(ncclRecv(t.device_raw(), size_t(t.numel()), nccl_type(t.dtype()), src, comm_, stream_), "ncclRecv");
    return event();
  }
  std::unique_ptr<Backend> split(int color, int key) override {
    begin();
    ncclComm_t sub = nullptr;
    nccl_check(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, nullptr), "ncclCommSplit");
    if (!sub) return nullptr;
    return std::make_unique<NcclBackend>(sub, device_);
  }

 private:
  // The worker thread's current device may be another group's. The group's stream is
  // non-blocking, so it must be told to wait for what the caller queued on the default
  // stream before issuing the operation: kernels writing its input run asynchronously, and
  // a copy from pageable host memory may still be in flight when cudaMemcpy returns.
  void begin() {
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    cuda_check(cudaEventRecord(issued_, cudaStreamLegacy), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, issued_, 0), "cudaStreamWaitEvent");
  }
  void finish() { cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  std::unique_ptr<PendingTransfer> event() {
    cudaEvent_t ev;
    cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(ev, stream_), "cudaEventRecord");
    return std::make_unique<NcclTransfer>(ev, device_);
  }

  ncclComm_t comm_;
  int device_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t issued_ = nullptr;  // the default stream's work before an operation
  float* token_ = nullptr;
};

}  // namespace

bool nccl_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string nccl_describe() {
  int v = 0;
  ncclGetVersion(&v);
  return str_cat("nccl ", v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

Group nccl_group(const Group& bootstrap, int cuda_device, const std::string& name) {
  LOOM_CHECK(bootstrap.valid(), "comm", "nccl_group: the bootstrap group is empty");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (bootstrap.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  Tensor id_bytes = Tensor::empty({int64_t(sizeof id)}, DType::u8, MemCategory::comm);
  std::memcpy(id_bytes.raw(), &id, sizeof id);
  bootstrap.broadcast(id_bytes, 0);
  std::memcpy(&id, id_bytes.raw(), sizeof id);
  cuda_check(cudaSetDevice(cuda_device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()), "ncclCommInitRank");
  std::string n = name.empty() ? bootstrap.name() + ".nccl" : name;
  // Shares the bootstrap's record, so the watchdog sees NCCL operations too.
  return make_group(std::make_unique<NcclBackend>(comm, cuda_device), n, shared_record(bootstrap));
}

}  // namespace loom::comm
