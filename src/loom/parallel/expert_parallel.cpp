#include "loom/parallel/expert_parallel.h"

#include "loom/core/timer.h"

namespace loom::parallel {

void ExpertParallelExchange::exchange_counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv) {
  const int64_t n = int64_t(send.size());
  LOOM_CHECK(n % ep_.size() == 0, "ep", n, " counts do not split over ep=", ep_.size());
  Tensor in = Tensor::from_vector<int64_t>(send, {n});
  Tensor out = Tensor::empty({n}, DType::i64, MemCategory::comm);
  Stopwatch sw;
  ep_.all_to_all(in, out);
  wait_s_ += sw.seconds();
  recv.assign(out.data<int64_t>(), out.data<int64_t>() + n);
}

void ExpertParallelExchange::start_rows(const Tensor& in, const std::vector<int64_t>& send_rows, const Tensor& out,
                                        const std::vector<int64_t>& recv_rows) {
  LOOM_CHECK(!pending_, "ep", "a row exchange is already in flight");
  const int64_t C = in.size(1);
  std::vector<int64_t> sc(send_rows.size()), rc(recv_rows.size());
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = send_rows[i] * C;
  for (size_t i = 0; i < rc.size(); ++i) rc[i] = recv_rows[i] * C;
  inflight_ = ep_.all_to_all_v_async(in, sc, out, rc);
  pending_ = true;
}

void ExpertParallelExchange::wait_rows() {
  if (!pending_) return;
  Stopwatch sw;
  inflight_.wait();
  inflight_ = comm::Work();
  pending_ = false;
  wait_s_ += sw.seconds();
}

double ExpertParallelExchange::take_wait_seconds() {
  const double s = wait_s_;
  wait_s_ = 0;
  return s;
}

}  // namespace loom::parallel
