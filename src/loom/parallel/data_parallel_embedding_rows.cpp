// BucketedAllReduce's embedding-row path (the whole model on this rank): the head and token-table
// units are all-reduced as soon as the head's gradients exist, and the lookup's gradient travels
// separately as the batch's (token, position, row) triples.
#include "loom/kernels/ops.h"
#include "loom/parallel/data_parallel.h"

namespace loom::parallel {

void BucketedAllReduce::head_grads_done(bool sync) {
  if (!early_outer_ || !sync) return;
  // The head unit is complete, and so is the token table but for the lookup rows, which
  // embedding_backward() sends separately: both all-reduces overlap the blocks' backward.
  const auto& units = d_.layout_.units();
  unit_ready(units.size() - 1);
  unit_ready(0);
  outer_fired_ = true;
}

bool BucketedAllReduce::embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres,
                                           const Tensor& dwte, const Tensor& dwpe) {
  if (!outer_fired_) return false;
  // Every rank gathers every rank's (token, position, row) and adds them all, in rank order,
  // after the dense all-reduce has landed (finish_grads), so replicas stay identical.
  SparseRows s;
  const int64_t N = tokens.numel(), C = dres.numel() / N;
  const int n = d_.n_;
  const comm::Group& dp = d_.dp_;
  s.tokens = Tensor::empty({N * n}, DType::i32, MemCategory::comm);
  s.pos = Tensor::empty({N * n}, DType::i32, MemCategory::comm);
  s.rows = Tensor::empty({N * n, C}, dres.dtype(), MemCategory::comm);
  s.w_tok = dp.all_gather_async(tokens, s.tokens);
  s.w_pos = dp.all_gather_async(pos, s.pos);
  Tensor mine = Tensor::empty({N, C}, dres.dtype(), MemCategory::comm);
  mine.copy_from(dres);  // dres is the decoder's scratch: it changes before the gather ends
  s.w_rows = dp.all_gather_async(mine, s.rows);
  d_.wire_bytes_ += (n - 1) * int64_t(tokens.nbytes() + pos.nbytes() + mine.nbytes());  // ours to every other rank
  s.dwte = dwte;
  s.dwpe = dwpe;
  sparse_.push_back(std::move(s));
  return true;
}

void BucketedAllReduce::wait_embedding_rows() {
  for (auto& sp : sparse_) {
    sp.w_tok.wait();
    sp.w_pos.wait();
    sp.w_rows.wait();
  }
}

void BucketedAllReduce::add_embedding_rows() {
  for (auto& sp : sparse_) ops::embedding_backward(sp.tokens, sp.pos, sp.rows, sp.dwte, sp.dwpe);
  sparse_.clear();
}

}  // namespace loom::parallel
