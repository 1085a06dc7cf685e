// Ring, tree (recursive doubling/halving) and hierarchical collectives over point-to-point
// messages, run by the group's worker thread on a private communicator so their messages
// never match the group's own send/recv. Every algorithm leaves bitwise-identical results
// on all ranks: each reduced element is computed once and copied (ring, hierarchical), or
// computed by pairs that add the same two operands (tree; IEEE addition commutes).
#include "loom/comm/p2p_collectives.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "loom/core/error.h"

namespace loom::comm {

namespace {

template <class T>
void reduce_typed(T* d, const T* s, int64_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      for (int64_t i = 0; i < n; ++i) d[i] = T(d[i] + s[i]);
      break;
    case ReduceOp::max:
      for (int64_t i = 0; i < n; ++i) d[i] = std::max(d[i], s[i]);
      break;
    case ReduceOp::min:
      for (int64_t i = 0; i < n; ++i) d[i] = std::min(d[i], s[i]);
      break;
  }
}

}  // namespace

void reduce_into(void* dst, const void* src, int64_t n, DType t, ReduceOp op) {
  switch (t) {
    case DType::f32: reduce_typed(static_cast<float*>(dst), static_cast<const float*>(src), n, op); break;
    case DType::f64: reduce_typed(static_cast<double*>(dst), static_cast<const double*>(src), n, op); break;
    case DType::i32: reduce_typed(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, op); break;
    case DType::i64: reduce_typed(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, op); break;
    case DType::u8: reduce_typed(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, op); break;
    case DType::bf16: {
      LOOM_CHECK(op == ReduceOp::sum || op == ReduceOp::avg, "comm", "bf16 reductions are sum and avg, not ",
                 reduce_op_name(op));
      auto* d = static_cast<bf16_t*>(dst);
      const auto* s = static_cast<const bf16_t*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(bf16_to_f32(d[i]) + bf16_to_f32(s[i]));
      break;
    }
    default: fail("comm", "cannot reduce ", dtype_name(t));
  }
}

namespace {

struct Span {
  int64_t off = 0, n = 0;
};

// `count` elements in `parts` pieces, the first count % parts one element longer.
std::vector<Span> split_even(int64_t count, int parts) {
  std::vector<Span> s(static_cast<size_t>(parts));
  int64_t base = count / parts, extra = count % parts, off = 0;
  for (int i = 0; i < parts; ++i) {
    s[size_t(i)] = {off, base + (i < extra ? 1 : 0)};
    off += s[size_t(i)].n;
  }
  return s;
}

// `parts` pieces of `n` elements each, starting at `off`.
std::vector<Span> equal_spans(int64_t off, int64_t n, int parts) {
  std::vector<Span> s(static_cast<size_t>(parts));
  for (int i = 0; i < parts; ++i) s[size_t(i)] = {off + i * n, n};
  return s;
}

Tensor piece(const Tensor& flat, const Span& s) { return flat.slice(s.off, {s.n}); }

// Point-to-point exchanges among an ordered subset of the private communicator's ranks
// (`members`, which must outlive the Peers).
class Peers {
 public:
  Peers(Backend& net, const std::vector<int>& members, int me_rank) : net_(net), members_(members) {
    me_ = int(std::find(members_.begin(), members_.end(), me_rank) - members_.begin());
    LOOM_CHECK(me_ < int(members_.size()), "comm", "rank ", me_rank, " is not among its collective's members");
  }
  int size() const { return int(members_.size()); }
  int me() const { return me_; }
  int at(int pos) const { return members_[size_t(((pos % size()) + size()) % size())]; }

  // Sends `out` to member `dst` and receives `in` from member `src` (positions), at once;
  // an empty tensor is not sent (its peer computes the same empty size and posts nothing).
  void exchange(const Tensor& out, int dst, const Tensor& in, int src) {
    std::unique_ptr<PendingTransfer> r, s;
    if (in.defined() && in.numel() > 0) r = net_.post_recv(in, at(src), kTag);
    if (out.defined() && out.numel() > 0) s = net_.post_send(out, at(dst), kTag);
    bool rd = !r, sd = !s;
    while (!rd || !sd) {
      if (!rd) rd = r->test();
      if (!sd) sd = s->test();
      // Give the core away between polls: with more ranks than cores (or a busy host) a
      // spinning rank would take the time its peers, and the kernel's network stack, need.
      if (!rd || !sd) std::this_thread::yield();
    }
  }
  void send(const Tensor& out, int dst) { exchange(out, dst, Tensor(), 0); }
  void recv(const Tensor& in, int src) { exchange(Tensor(), 0, in, src); }

 private:
  static constexpr int kTag = 7;
  Backend& net_;
  const std::vector<int>& members_;
  int me_ = 0;
};

// Ring reduce-scatter in place: afterwards span me() of `buf` holds the reduction over all
// members of that span. `tmp` holds at least the largest span.
void ring_reduce_scatter(Peers& p, const Tensor& buf, const std::vector<Span>& spans, ReduceOp op, const Tensor& tmp) {
  const int n = p.size(), me = p.me();
  for (int s = 0; s < n - 1; ++s) {
    const Span& out = spans[size_t((me - s - 1 + 2 * n) % n)];
    const Span& in = spans[size_t((me - s - 2 + 2 * n) % n)];
    Tensor got = tmp.slice(0, {in.n});
    p.exchange(piece(buf, out), me + 1, got, me - 1);
    reduce_into(piece(buf, in).raw(), got.raw(), in.n, buf.dtype(), op);
  }
}

// Ring all-gather in place: span me() of `buf` is this member's; afterwards all are filled.
void ring_all_gather(Peers& p, const Tensor& buf, const std::vector<Span>& spans) {
  const int n = p.size(), me = p.me();
  for (int s = 0; s < n - 1; ++s)
    p.exchange(piece(buf, spans[size_t((me - s + n) % n)]), me + 1, piece(buf, spans[size_t((me - s - 1 + 2 * n) % n)]),
               me - 1);
}

void ring_all_reduce(Peers& p, const Tensor& buf, ReduceOp op, const Tensor& tmp) {
  std::vector<Span> spans = split_even(buf.numel(), p.size());
  ring_reduce_scatter(p, buf, spans, op, tmp);
  ring_all_gather(p, buf, spans);
}

int pow2_floor(int n) {
  int q = 1;
  while (q * 2 <= n) q *= 2;
  return q;
}

// Recursive doubling; members above the largest power of two fold into a partner first
// and receive the result from it last.
void tree_all_reduce(Peers& p, const Tensor& buf, ReduceOp op, const Tensor& tmp) {
  const int n = p.size(), me = p.me(), p2 = pow2_floor(n);
  Tensor got = tmp.slice(0, {buf.numel()});
  if (me >= p2) {
    p.send(buf, me - p2);
    p.recv(buf, me - p2);
    return;
  }
  if (me + p2 < n) {
    p.recv(got, me + p2);
    reduce_into(buf.raw(), got.raw(), buf.numel(), buf.dtype(), op);
  }
  for (int mask = 1; mask < p2; mask *= 2) {
    p.exchange(buf, me ^ mask, got, me ^ mask);
    reduce_into(buf.raw(), got.raw(), buf.numel(), buf.dtype(), op);
  }
  if (me + p2 < n) p.send(buf, me + p2);
}

// Recursive halving over equal spans (power-of-two members): afterwards span me() of `buf`
// holds its reduction.
void tree_reduce_scatter(Peers& p, const Tensor& buf, const std::vector<Span>& spans, ReduceOp op, const Tensor& tmp) {
  const int me = p.me();
  int lo = 0, hi = p.size();
  for (int mask = p.size() / 2; mask >= 1; mask /= 2) {
    const int mid = lo + (hi - lo) / 2;
    const bool upper = (me & mask) != 0;
    const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
    const int send_lo = upper ? lo : mid;
    Span keep{spans[size_t(keep_lo)].off,
              spans[size_t(keep_hi - 1)].off + spans[size_t(keep_hi - 1)].n - spans[size_t(keep_lo)].off};
    Span give{spans[size_t(send_lo)].off, keep.n};
    Tensor got = tmp.slice(0, {keep.n});
    p.exchange(piece(buf, give), me ^ mask, got, me ^ mask);
    reduce_into(piece(buf, keep).raw(), got.raw(), keep.n, buf.dtype(), op);
    lo = keep_lo, hi = keep_hi;
  }
}

// Recursive doubling over equal spans (power-of-two members): span me() is this member's.
void tree_all_gather(Peers& p, const Tensor& buf, const std::vector<Span>& spans) {
  const int me = p.me();
  for (int mask = 1; mask < p.size(); mask *= 2) {
    const int mine = me & ~(mask - 1), theirs = (me ^ mask) & ~(mask - 1);
    const int64_t n = spans[size_t(mine)].n * mask;
    p.exchange(buf.slice(spans[size_t(mine)].off, {n}), me ^ mask, buf.slice(spans[size_t(theirs)].off, {n}),
               me ^ mask);
  }
}

// Refuses, on every rank before anything is sent, a reduction the algorithms cannot do: a
// rank that threw halfway would leave its peers waiting for its messages.
void check_reducible(DType t, ReduceOp op) {
  LOOM_CHECK(t != DType::bf16 || op == ReduceOp::sum || op == ReduceOp::avg, "comm",
             "bf16 reductions are sum and avg, not ", reduce_op_name(op));
  LOOM_CHECK(t != DType::f16, "comm", "f16 tensors are moved, not reduced; reduce in f32 or bf16");
}

class AlgorithmBackend final : public Backend {
 public:
  AlgorithmBackend(std::unique_ptr<Backend> transport, std::vector<int> host_of_world, Algorithm a,
                   std::shared_ptr<const CostModel> model)
      : transport_(std::move(transport)),
        host_of_world_(std::move(host_of_world)),
        algorithm_(a),
        model_(std::move(model)) {
    std::vector<int> wr = transport_->world_ranks();
    for (int r = 0; r < transport_->size(); ++r) {
      size_t w = r < int(wr.size()) ? size_t(wr[size_t(r)]) : 0;
      topo_.host_of.push_back(w < host_of_world_.size() ? host_of_world_[w] : 0);
    }
    for (int r = 0; r < size(); ++r) {
      all_.push_back(r);
      slot_.push_back(int64_t(topo_.local_index(r)) * topo_.hosts() + topo_.host_index(r));
    }
    local_ = topo_.host_members(rank());
    cross_ = topo_.peers_across_hosts(rank());
    net_ = transport_->split(0, transport_->rank());  // private messages of the algorithms
  }

  const char* name() const override { return transport_->name(); }
  int rank() const override { return transport_->rank(); }
  int size() const override { return transport_->size(); }
  Device device() const override { return transport_->device(); }
  bool supports(DType t) const override { return transport_->supports(t); }
  std::vector<int> world_ranks() const override { return transport_->world_ranks(); }
  void use_algorithm(Algorithm a) override { algorithm_ = a; }
  Algorithm algorithm() const override { return algorithm_; }
  // Memoised: a training step issues the same few sizes over and over, and evaluating the
  // model (or a measured table) per call is work on every collective's path. Called from
  // the worker and from Group::algorithm_for on the caller's thread, hence the lock.
  Algorithm resolve(Algorithm requested, CollectiveOp op, int64_t bytes) const override {
    const auto key = std::make_tuple(requested, op, bytes);
    std::lock_guard<std::mutex> lock(resolved_mu_);
    auto it = resolved_.find(key);
    if (it != resolved_.end()) return it->second;
    if (resolved_.size() >= 4096) resolved_.clear();  // bounded; sizes sweeping past it recompute
    const Algorithm a = resolve_algorithm(requested, op, bytes, topo_, *model_);
    resolved_.emplace(key, a);
    return a;
  }
  std::vector<int> host_of() const override { return topo_.host_of; }

  void all_reduce(const Tensor& t, ReduceOp op) override {
    Algorithm a = resolve(algorithm_, CollectiveOp::all_reduce, int64_t(t.nbytes()));
    if (a == Algorithm::mpi) return transport_->all_reduce(t, op);
    check_reducible(t.dtype(), op);
    Tensor buf = t.view({t.numel()});
    if (a == Algorithm::hierarchical) {
      hierarchical_all_reduce(buf, op);
    } else {
      Peers p(*net_, all_, rank());
      if (a == Algorithm::tree)
        tree_all_reduce(p, buf, op, scratch(buf.numel(), t.dtype()));
      else
        ring_all_reduce(p, buf, op, scratch(buf.numel() / size() + 1, t.dtype()));
    }
    if (op == ReduceOp::avg) divide_in_place(t, size());
  }

  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    Algorithm a = resolve(algorithm_, CollectiveOp::reduce_scatter, int64_t(in.nbytes()));
    if (a == Algorithm::mpi) return transport_->reduce_scatter(in, out, op);
    check_reducible(in.dtype(), op);
    const int64_t c = out.numel();
    Tensor work = work_buffer(in.numel(), in.dtype());
    Tensor tmp = scratch(in.numel() / 2 + 1, in.dtype());
    if (a == Algorithm::hierarchical) {
      permute_by_host(in, work, c, /*to_host_order=*/true);
      const int h = topo_.hosts();
      Peers local(*net_, local_, rank());
      ring_reduce_scatter(local, work, equal_spans(0, c * h, local.size()), op, tmp);
      Peers cross(*net_, cross_, rank());
      ring_reduce_scatter(cross, work, equal_spans(int64_t(local.me()) * h * c, c, h), op, tmp);
      out.view({c}).copy_from(work.slice(slot_[size_t(rank())] * c, {c}));
    } else {
      work.copy_from(in.view({in.numel()}));
      Peers p(*net_, all_, rank());
      std::vector<Span> spans = equal_spans(0, c, size());
      if (a == Algorithm::tree)
        tree_reduce_scatter(p, work, spans, op, tmp);
      else
        ring_reduce_scatter(p, work, spans, op, tmp);
      out.view({c}).copy_from(work.slice(int64_t(rank()) * c, {c}));
    }
    if (op == ReduceOp::avg) divide_in_place(out, size());
  }

  void all_gather(const Tensor& in, const Tensor& out) override {
    Algorithm a = resolve(algorithm_, CollectiveOp::all_gather, int64_t(out.nbytes()));
    if (a == Algorithm::mpi) return transport_->all_gather(in, out);
    const int64_t c = in.numel();
    Tensor flat = out.view({out.numel()});
    if (a == Algorithm::hierarchical) {
      const int h = topo_.hosts();
      Tensor work = work_buffer(out.numel(), out.dtype());
      work.slice(slot_[size_t(rank())] * c, {c}).copy_from(in.view({c}));
      Peers local(*net_, local_, rank()), cross(*net_, cross_, rank());
      ring_all_gather(cross, work, equal_spans(int64_t(local.me()) * h * c, c, h));
      ring_all_gather(local, work, equal_spans(0, c * h, local.size()));
      permute_by_host(work, flat, c, /*to_host_order=*/false);
      return;
    }
    Tensor mine = flat.slice(int64_t(rank()) * c, {c});
    if (mine.raw() != in.raw()) mine.copy_from(in.view({c}));
    Peers p(*net_, all_, rank());
    std::vector<Span> spans = equal_spans(0, c, size());
    if (a == Algorithm::tree)
      tree_all_gather(p, flat, spans);
    else
      ring_all_gather(p, flat, spans);
  }

  void broadcast(const Tensor& t, int root) override { transport_->broadcast(t, root); }
  void all_to_all(const Tensor& in, const Tensor& out) override { transport_->all_to_all(in, out); }
  void all_to_all_v(const Tensor& in, const std::vector<int64_t>& sc, const Tensor& out,
                    const std::vector<int64_t>& rc) override {
    transport_->all_to_all_v(in, sc, out, rc);
  }
  void barrier() override { transport_->barrier(); }
  std::unique_ptr<PendingTransfer> post_send(const Tensor& t, int dst, int tag) override {
    return transport_->post_send(t, dst, tag);
  }
  std::unique_ptr<PendingTransfer> post_recv(const Tensor& t, int src, int tag) override {
    return transport_->post_recv(t, src, tag);
  }
  bool posts_from_any_thread() const override { return transport_->posts_from_any_thread(); }
  std::unique_ptr<Backend> split(int color, int key) override {
    std::unique_ptr<Backend> sub = transport_->split(color, key);
    if (!sub) return nullptr;
    return std::make_unique<AlgorithmBackend>(std::move(sub), host_of_world_, algorithm_, model_);
  }

 private:
  // Copies chunk r of `from` to slot r of `to` (or back).
  void permute_by_host(const Tensor& from, const Tensor& to, int64_t c, bool to_host_order) const {
    Tensor src = from.view({from.numel()}), dst = to.view({to.numel()});
    for (int r = 0; r < size(); ++r) {
      int64_t a = int64_t(r) * c, b = slot_[size_t(r)] * c;
      dst.slice(to_host_order ? b : a, {c}).copy_from(src.slice(to_host_order ? a : b, {c}));
    }
  }

  // Reduce-scatter inside the host, all-reduce of this rank's share among the ranks with
  // the same local index on the other hosts (ring or tree by the model), all-gather inside.
  void hierarchical_all_reduce(const Tensor& buf, ReduceOp op) {
    Peers local(*net_, local_, rank()), cross(*net_, cross_, rank());
    std::vector<Span> spans = split_even(buf.numel(), local.size());
    Tensor tmp = scratch(buf.numel() / local.size() + 1, buf.dtype());
    ring_reduce_scatter(local, buf, spans, op, tmp);
    Tensor mine = piece(buf, spans[size_t(local.me())]);
    const int64_t share = int64_t(buf.nbytes()) / local.size();
    if (cross_phase_algorithm(CollectiveOp::all_reduce, share, topo_, *model_) == Algorithm::tree)
      tree_all_reduce(cross, mine, op, tmp);
    else
      ring_all_reduce(cross, mine, op, tmp);
    ring_all_gather(local, buf, spans);
  }

  // Buffers kept between calls (a fresh multi-megabyte allocation per collective is fresh
  // pages for the kernel to fault in and zero): the received pieces, and reduce-scatter's and
  // hierarchical all-gather's whole-buffer copy.
  static Tensor reuse(Tensor& keep, int64_t n, DType t) {
    if (!keep.defined() || keep.dtype() != t || keep.numel() < n)
      keep = Tensor::empty({std::max<int64_t>(n, 1)}, t, MemCategory::comm);
    return keep.slice(0, {n});
  }
  Tensor scratch(int64_t n, DType t) { return reuse(scratch_, n, t); }
  Tensor work_buffer(int64_t n, DType t) { return reuse(work_, n, t); }

  std::unique_ptr<Backend> transport_;
  std::unique_ptr<Backend> net_;
  std::vector<int> host_of_world_;
  Topology topo_;
  std::vector<int> all_, local_, cross_;  // all members; this host's; one per host with our local index
  std::vector<int64_t> slot_;             // rank r's chunk position when chunks go by local index, then host
  Algorithm algorithm_;
  std::shared_ptr<const CostModel> model_;
  Tensor scratch_, work_;
  mutable std::mutex resolved_mu_;
  mutable std::map<std::tuple<Algorithm, CollectiveOp, int64_t>, Algorithm> resolved_;
};

}  // namespace

std::unique_ptr<Backend> make_algorithm_backend(std::unique_ptr<Backend> transport, std::vector<int> host_of_world_rank,
                                                Algorithm algorithm, std::shared_ptr<const CostModel> model) {
  return std::make_unique<AlgorithmBackend>(std::move(transport), std::move(host_of_world_rank), algorithm,
                                            std::move(model));
}

}  // namespace loom::comm
