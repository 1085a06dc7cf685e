// comm::Group's public operations: argument checks on the caller's thread (so bad input
// fails where it was written, naming both sizes), then hand-off to the group's worker.
#include "loom/comm/group.h"

#include <numeric>

#include "loom/comm/group_impl.h"

namespace loom::comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::avg: return "avg";
  }
  return "?";
}

bool is_host_comm_dtype(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16 || t == DType::i32 ||
         t == DType::i64 || t == DType::u8;
}

namespace {

void check_tensor(const GroupImpl& g, const char* op, const Tensor& t, const char* what) {
  LOOM_CHECK(t.defined(), "comm", op, ": ", what, " is undefined");
  LOOM_CHECK(t.device() == g.device, "comm", op, ": ", what, " is on ", device_name(t.device()), " but group '", g.name,
             "' uses the ", g.backend_name, " backend, which takes ", device_name(g.device), " tensors");
  LOOM_CHECK(g.backend().supports(t.dtype()), "comm", op, ": ", what, " is ", dtype_name(t.dtype()), "; the ",
             g.backend_name, " backend supports ", kHostCommDtypes);
}

// Host backends move f16 as bits but have no f16 arithmetic.
void check_reducible(const GroupImpl& g, const char* op, const Tensor& t) {
  LOOM_CHECK(t.dtype() != DType::f16 || g.device != Device::cpu, "comm", op,
             ": tensor is f16, which host backends move (send, recv, all-gather, broadcast, all-to-all) but do not "
             "reduce; reduce in f32 or bf16");
}

void check_same_dtype(const char* op, const Tensor& in, const Tensor& out) {
  LOOM_CHECK(in.dtype() == out.dtype(), "comm", op, ": input is ", dtype_name(in.dtype()), " but output is ",
             dtype_name(out.dtype()), "; both must have one dtype");
}

void check_peer(const GroupImpl& g, const char* op, const char* role, int peer) {
  LOOM_CHECK(peer >= 0 && peer < g.size, "comm", op, ": ", role, " ", peer, " is not a rank of group '", g.name,
             "' (ranks 0..", g.size - 1, ")");
}

// A point-to-point transfer's arguments: the tensor, another rank of the group, a tag >= 0.
void check_transfer(const GroupImpl& g, const char* op, const Tensor& t, const char* role, int peer, int tag) {
  check_tensor(g, op, t, "tensor");
  check_peer(g, op, role, peer);
  LOOM_CHECK(peer != g.rank, "comm", op, ": ", role, " ", peer, " is this rank; copy the tensor instead");
  LOOM_CHECK(tag >= 0, "comm", op, ": tag ", tag, " is negative; tags must be >= 0");
}

void check_counts(const GroupImpl& g, const char* op, const char* what, const std::vector<int64_t>& counts,
                  const Tensor& t, const char* tensor_role) {
  LOOM_CHECK(int64_t(counts.size()) == g.size, "comm", op, ": ", what, " has ", counts.size(), " entries but group '",
             g.name, "' has ", g.size, " ranks");
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    LOOM_CHECK(counts[i] >= 0, "comm", op, ": ", what, "[", i, "] is ", counts[i], "; counts must be >= 0");
    total += counts[i];
  }
  LOOM_CHECK(total <= t.numel(), "comm", op, ": ", what, " sum to ", total, " elements but the ", tensor_role,
             " has only ", t.numel());
}

}  // namespace

const GroupImpl& Group::impl(const char* op) const {
  LOOM_CHECK(impl_ != nullptr, "comm", op,
             ": this Group is empty (default-constructed, or split() with a negative color)");
  return *impl_;
}

int Group::rank() const { return impl("rank").rank; }
int Group::size() const { return impl("size").size; }
const std::string& Group::name() const { return impl("name").name; }
const char* Group::backend_name() const { return impl("backend_name").backend_name.c_str(); }
const CommRecord& Group::record() const { return *impl("record").record; }
std::shared_ptr<CommRecord> shared_record(const Group& g) { return g.impl("record").record; }

Work Group::all_reduce_async(const Tensor& t, ReduceOp op) const {
  const GroupImpl& g = impl("all_reduce");
  check_tensor(g, "all_reduce", t, "tensor");
  check_reducible(g, "all_reduce", t);
  return g.submit("all_reduce", int64_t(t.nbytes()), [t, op, a = g.algorithm.load()](Backend& b) {
    b.use_algorithm(a);
    b.all_reduce(t, op);
  });
}

Work Group::reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op) const {
  const GroupImpl& g = impl("reduce_scatter");
  check_tensor(g, "reduce_scatter", in, "input");
  check_tensor(g, "reduce_scatter", out, "output");
  check_same_dtype("reduce_scatter", in, out);
  check_reducible(g, "reduce_scatter", in);
  LOOM_CHECK(in.numel() == g.size * out.numel(), "comm", "reduce_scatter: input has ", in.numel(),
             " elements but group '", g.name, "' has ", g.size, " ranks and the output ", out.numel(),
             ", so the input needs ", g.size * out.numel(), " (", g.size, " x ", out.numel(), ")");
  return g.submit("reduce_scatter", int64_t(in.nbytes()), [in, out, op, a = g.algorithm.load()](Backend& b) {
    b.use_algorithm(a);
    b.reduce_scatter(in, out, op);
  });
}

Work Group::all_gather_async(const Tensor& in, const Tensor& out) const {
  const GroupImpl& g = impl("all_gather");
  check_tensor(g, "all_gather", in, "input");
  check_tensor(g, "all_gather", out, "output");
  check_same_dtype("all_gather", in, out);
  LOOM_CHECK(out.numel() == g.size * in.numel(), "comm", "all_gather: output has ", out.numel(),
             " elements but group '", g.name, "' has ", g.size, " ranks and the input ", in.numel(),
             ", so the output needs ", g.size * in.numel(), " (", g.size, " x ", in.numel(), ")");
  return g.submit("all_gather", int64_t(out.nbytes()), [in, out, a = g.algorithm.load()](Backend& b) {
    b.use_algorithm(a);
    b.all_gather(in, out);
  });
}

Work Group::broadcast_async(const Tensor& t, int root) const {
  const GroupImpl& g = impl("broadcast");
  check_tensor(g, "broadcast", t, "tensor");
  check_peer(g, "broadcast", "root", root);
  return g.submit("broadcast", int64_t(t.nbytes()), [t, root](Backend& b) { b.broadcast(t, root); });
}

Work Group::send_async(const Tensor& t, int dst, int tag) const {
  const GroupImpl& g = impl("send");
  check_transfer(g, "send", t, "dst", dst, tag);
  return g.submit_transfer("send", int64_t(t.nbytes()), [t, dst, tag](Backend& b) { return b.post_send(t, dst, tag); });
}

Work Group::recv_async(const Tensor& t, int src, int tag) const {
  const GroupImpl& g = impl("recv");
  check_transfer(g, "recv", t, "src", src, tag);
  return g.submit_transfer("recv", int64_t(t.nbytes()), [t, src, tag](Backend& b) { return b.post_recv(t, src, tag); });
}

Work Group::all_to_all_async(const Tensor& in, const Tensor& out) const {
  const GroupImpl& g = impl("all_to_all");
  check_tensor(g, "all_to_all", in, "input");
  check_tensor(g, "all_to_all", out, "output");
  check_same_dtype("all_to_all", in, out);
  LOOM_CHECK(in.numel() == out.numel(), "comm", "all_to_all: input has ", in.numel(), " elements but output has ",
             out.numel(), "; they must be equal");
  LOOM_CHECK(in.numel() % g.size == 0, "comm", "all_to_all: input has ", in.numel(),
             " elements, not a multiple of group '", g.name, "' size ", g.size,
             " (equal chunks; use all_to_all_v for uneven ones)");
  return g.submit("all_to_all", int64_t(in.nbytes()), [in, out](Backend& b) { b.all_to_all(in, out); });
}

Work Group::all_to_all_v_async(const Tensor& in, const std::vector<int64_t>& send_counts, const Tensor& out,
                               const std::vector<int64_t>& recv_counts) const {
  const GroupImpl& g = impl("all_to_all_v");
  check_tensor(g, "all_to_all_v", in, "input");
  check_tensor(g, "all_to_all_v", out, "output");
  check_same_dtype("all_to_all_v", in, out);
  check_counts(g, "all_to_all_v", "send_counts", send_counts, in, "input");
  check_counts(g, "all_to_all_v", "recv_counts", recv_counts, out, "output");
  int64_t sent = std::accumulate(send_counts.begin(), send_counts.end(), int64_t(0));
  int64_t bytes = sent * int64_t(dtype_size(in.dtype()));
  return g.submit("all_to_all_v", bytes, [in, send_counts, out, recv_counts](Backend& b) {
    b.all_to_all_v(in, send_counts, out, recv_counts);
  });
}

Work Group::barrier_async() const {
  const GroupImpl& g = impl("barrier");
  return g.submit("barrier", 0, [](Backend& b) { b.barrier(); });
}

void Group::set_algorithm(Algorithm a) const { impl("set_algorithm").algorithm = a; }
Algorithm Group::algorithm() const { return impl("algorithm").algorithm.load(); }

Algorithm Group::algorithm_for(CollectiveOp op, int64_t bytes) const {
  const GroupImpl& g = impl("algorithm_for");
  return g.backend().resolve(g.algorithm.load(), op, bytes);
}

std::vector<int> Group::host_of() const {
  const GroupImpl& g = impl("host_of");
  std::vector<int> h = g.backend().host_of();
  if (h.empty()) h.assign(size_t(g.size), 0);
  return h;
}

int Group::hosts() const { return Topology{host_of()}.hosts(); }

Group Group::split(int color, int key, const std::string& name) const {
  const GroupImpl& g = impl("split");
  auto result = std::make_shared<std::unique_ptr<Backend>>();
  g.submit("split", 0, [result, color, key, a = g.algorithm.load()](Backend& b) {
     b.use_algorithm(a);
     *result = b.split(color, key);
   }).wait();
  if (!*result) return Group();
  std::string n = name.empty() ? str_cat(g.name, ".", color) : name;
  return make_group(std::move(*result), n, g.record, g.board);
}

void divide_in_place(const Tensor& t, int n) {
  int64_t count = t.numel();
  auto div = [&](auto* p) {
    for (int64_t i = 0; i < count; ++i) p[i] /= n;
  };
  switch (t.dtype()) {
    case DType::f32: div(static_cast<float*>(t.raw())); break;
    case DType::f64: div(static_cast<double*>(t.raw())); break;
    case DType::i32: div(static_cast<int32_t*>(t.raw())); break;
    case DType::i64: div(static_cast<int64_t*>(t.raw())); break;
    case DType::u8: div(static_cast<uint8_t*>(t.raw())); break;
    case DType::bf16: {
      auto* p = static_cast<bf16_t*>(t.raw());
      for (int64_t i = 0; i < count; ++i) p[i] = f32_to_bf16(bf16_to_f32(p[i]) / float(n));
      break;
    }
    default: fail("comm", "avg: dtype ", dtype_name(t.dtype()), " is not supported");
  }
}

}  // namespace loom::comm
