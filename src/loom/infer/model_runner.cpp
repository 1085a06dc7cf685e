// The batched forward over a StepPlan, layer by layer, each layer model::block_forward (the
// one written for training too) with the runner's parts: f32 or quantized linears, K/V
// scattered into the cache and paged attention per sequence, the serving tp group's
// all-reduce. MoE blocks route the step's tokens and run each chosen expert once over all its
// rows (model/moe.h), so an expert's weights are read once per step however many sequences
// chose it.
#include "loom/infer/model_runner.h"

#include <algorithm>
#include <cstring>

#include "loom/kernels/cpu/decode_linear.h"
#include "loom/kernels/ops.h"

namespace loom::infer {

using model::Family;

// y = x W^T + b. Quantized matrices go to the quantized kernels; few-row f32 batches
// (decoding) stream W once instead of packing it for BLAS.
void ModelRunner::linear(const Tensor& x, const Tensor& w, const QuantizedMatrix* q, const Tensor& b,
                         const Tensor& y) const {
  const int64_t M = x.size(0);
  if (q) {
    cpu::quant_linear(x.data<float>(), q->view(), b.defined() ? b.data<float>() : nullptr, y.data<float>(), M);
  } else if (x.dtype() == DType::f32 && M <= cpu::kDecodeLinearMaxRows) {
    cpu::decode_linear(x.data<float>(), w.data<float>(), b.defined() ? b.data<float>() : nullptr, y.data<float>(), M,
                       w.size(1), w.size(0));
  } else {
    ops::linear_forward(x, w, b, y);
  }
}

ModelRunner::ModelRunner(const model::Decoder& model, KVCache& cache, int64_t max_batched_tokens, int64_t max_seqs,
                         const QuantizedModel* quant, int64_t max_logit_rows, const comm::Group* tp, Allocator& alloc)
    : model_(model),
      cfg_(model.config()),
      cache_(cache),
      quant_(quant),
      tp_(tp),
      max_batched_tokens_(max_batched_tokens),
      max_seqs_(max_seqs),
      max_logit_rows_(max_logit_rows > 0 ? max_logit_rows : max_seqs) {
  const model::ModelConfig kv = kv_cache_config(model);  // checks the split
  tp_size_ = model.layout().slice().tp;
  tp_rank_ = model.layout().slice().tp_rank;
  LOOM_CHECK(tp_size_ == 1 || (tp && tp->size() == tp_size_ && tp->rank() == tp_rank_), "infer",
             "the model is tensor-parallel slice ", tp_rank_, " of ", tp_size_,
             " but the runner was given no tp group of that size and rank");
  LOOM_CHECK(cache.k(0).size(1) == kv.n_kv_head, "infer", "the KV cache holds ", cache.k(0).size(1),
             " kv heads per layer but this rank computes ", kv.n_kv_head, " (build it from kv_cache_config)");
  H_ = cfg_.n_head / tp_size_;
  KVH_ = kv.n_kv_head;
  F_ = cfg_.d_ff / tp_size_;
  if (tp_size_ > 1) vocab_rows_ = model::vocab_rows_per_rank(cfg_, tp_size_);
  const model::FamilyTraits traits = cfg_.traits();
  const bool learned_positions = traits.position == model::PositionKind::learned;
  // A token's experts must not depend on which other requests share its step.
  cfg_.moe.capacity_factor = 0;
  for (int l = 0; l < int(cfg_.n_layer); ++l) {
    w_.push_back(model::block_weights(cfg_, model.layout(), model.params(), l));
    w_.back().router_bias = model.router_bias_of(l);  // DeepSeek-V3's selection bias, if any
  }
  wte_ = model.param(model::token_table_name(cfg_));
  if (learned_positions) wpe_ = model.param(model::position_table_name(cfg_));
  dims_.C = cfg_.d_model;
  dims_.H = H_;
  dims_.KVH = KVH_;
  dims_.D = cfg_.head_dim();
  dims_.F = F_;
  dims_.bias_owner = tp_rank_ == 0;  // row-parallel biases are added once, before the sum
  if (traits.position == model::PositionKind::rope) dims_.rope_inv_freq = cfg_.rope_inv_freq();
  lnf_w_ = model.param(model::final_norm_name(cfg_, "weight"));
  if (traits.linear_biases) lnf_b_ = model.param(model::final_norm_name(cfg_, "bias"));
  head_ = model.param(model::lm_head_name(cfg_));

  const DType dt = model.params().dtype();
  LOOM_CHECK(dt == cache.dtype(), "runner", "model dtype ", dtype_name(dt), " differs from the KV cache's ",
             dtype_name(cache.dtype()));
  LOOM_CHECK(!quant || (dt == DType::f32 && int64_t(quant->blocks.size()) == cfg_.n_layer), "runner",
             "quantized weights need an f32 model with one quantized block per layer");
  const int64_t N = max_batched_tokens, C = cfg_.d_model, D = cfg_.head_dim(), F = F_;
  const int64_t W = (H_ + 2 * KVH_) * D;
  const auto cat = MemCategory::activations;
  tok_ = Tensor::empty({N}, DType::i32, cat, alloc);
  pos_ = Tensor::empty({N}, DType::i32, cat, alloc);
  x_ = Tensor::empty({N, C}, dt, cat, alloc);
  ln_ = Tensor::empty({N, C}, dt, cat, alloc);
  mean_ = Tensor::empty({N}, dt, cat, alloc);
  rstd_ = Tensor::empty({N}, dt, cat, alloc);
  qkv_ = Tensor::empty({N, W}, dt, cat, alloc);
  att_ = Tensor::empty({N, H_ * D}, dt, cat, alloc);
  x_mid_ = Tensor::empty({N, C}, dt, cat, alloc);
  // The dense MLP buffers serve dense blocks and MoE blocks' shared experts.
  const int64_t Fm = std::max<int64_t>(cfg_.dense_mlp_width(F), 1);
  fc_ = Tensor::empty({N, traits.mlp_fan_out() * Fm}, dt, cat, alloc);
  act_ = Tensor::empty({N, Fm}, dt, cat, alloc);
  if (cfg_.moe.enabled()) {
    LOOM_CHECK(!quant, "runner", "quantized weights of MoE models are not supported; serve ", cfg_.name, " in fp32");
    moe_ = model::MoeActs::allocate(cfg_, N, dt, alloc);
    reset_expert_load();
  }
  const int64_t S = max_logit_rows_;
  xs_ = Tensor::empty({S, C}, dt, cat, alloc);
  lnf_ = Tensor::empty({S, C}, dt, cat, alloc);
  lnf_mean_ = Tensor::empty({S}, dt, cat, alloc);
  lnf_rstd_ = Tensor::empty({S}, dt, cat, alloc);
  logits_ = Tensor::empty({S, cfg_.vocab_size}, dt, cat, alloc);
  if (tp_size_ > 1) {
    local_logits_ = Tensor::empty({S, vocab_rows_}, dt, cat, alloc);
    gathered_ = Tensor::empty({tp_size_ * S * vocab_rows_}, dt, MemCategory::comm, alloc);
  }
  slots_.reserve(size_t(N));
  pseqs_.reserve(size_t(S));
  sample_rows_.reserve(size_t(S));
}

model::ModelConfig ModelRunner::kv_cache_config(const model::Decoder& model) {
  model::ModelConfig c = model.config();
  const model::ModelSlice& sl = model.layout().slice();
  if (sl.tp == 1) return c;
  LOOM_CHECK(!c.moe.enabled(), "infer", "tensor-parallel inference of a Mixture-of-Experts model (", c.name,
             ") is not supported; serve it on one rank (--tp 1)");
  LOOM_CHECK(c.n_kv_head % sl.tp == 0, "infer", "tensor-parallel size ", sl.tp,
             " does not divide model.n_kv_head=", c.n_kv_head,
             ": the KV cache is split by key/value heads; use a tp that divides ", c.n_kv_head);
  LOOM_CHECK(
      sl.first_layer == 0 && (sl.last_layer < 0 || sl.last_layer == c.n_layer) && sl.has_embedding && sl.has_head,
      "infer", "inference needs every layer on each tensor-parallel rank (no pipeline stages)");
  c.n_kv_head /= sl.tp;
  return c;
}

void ModelRunner::all_reduce(const Tensor& t) const {
  if (tp_size_ > 1) tp_->all_reduce(t);
}

// The vocabulary-parallel embedding: each rank adds the rows of the tokens its part of the
// table holds (rank 0 also the positions), then the sum over the group.
template <class T>
void ModelRunner::embed_vocab_parallel(int64_t N) {
  const int64_t C = cfg_.d_model, first = tp_rank_ * vocab_rows_;
  const int32_t* tok = tok_.data<int32_t>();
  const int32_t* pos = pos_.data<int32_t>();
  const T* table = wte_.data<T>();
  const T* ptable = wpe_.defined() && tp_rank_ == 0 ? wpe_.data<T>() : nullptr;
  T* x = x_.data<T>();
  for (int64_t n = 0; n < N; ++n) {
    T* row = x + n * C;
    const int64_t t = tok[n] - first;
    if (t >= 0 && t < vocab_rows_)
      std::copy(table + t * C, table + (t + 1) * C, row);
    else
      std::fill(row, row + C, T(0));
    if (ptable)
      for (int64_t c = 0; c < C; ++c) row[c] += ptable[int64_t(pos[n]) * C + c];
  }
  all_reduce(x_.narrow0(0, N));
}

// Rank r's [S, vocab_rows_] logits hold vocabulary columns [r * vocab_rows_, ...); the
// all-gather stacks them by rank, and each row of logits_ is put back together in order
// (the padding columns past the vocabulary dropped).
template <class T>
void ModelRunner::gather_logits(int64_t S) {
  const int64_t R = vocab_rows_, V = cfg_.vocab_size;
  const Tensor in = local_logits_.narrow0(0, S).view({S * R});
  const Tensor out = gathered_.narrow0(0, tp_size_ * S * R);
  tp_->all_gather(in, out);
  const T* g = out.data<T>();
  T* l = logits_.data<T>();
  for (int64_t r = 0; r < tp_size_; ++r) {
    const int64_t c0 = r * R, n = std::min(R, V - c0);
    if (n <= 0) continue;
    for (int64_t s = 0; s < S; ++s) std::copy(g + (r * S + s) * R, g + (r * S + s) * R + n, l + s * V + c0);
  }
}

int64_t ModelRunner::logit_rows(const StepPlan& plan) {
  int64_t n = 0;
  for (const ScheduledSeq& s : plan.seqs) n += s.sample ? 1 + s.num_spec : 0;
  return n;
}

void ModelRunner::reset_expert_load() {
  expert_load_.assign(size_t(cfg_.num_moe_layers()), std::vector<int64_t>(size_t(cfg_.moe.num_experts), 0));
}

int64_t ModelRunner::weight_bytes_per_token() const {
  const int64_t es = int64_t(dtype_size(model_.params().dtype()));
  const int64_t row = cfg_.d_model * es;
  int64_t b = model_.num_params() * es;
  b -= int64_t(wte_.nbytes()) - row;  // the input embedding reads one row
  if (wpe_.defined()) b -= int64_t(wpe_.nbytes()) - row;
  if (cfg_.tied_embeddings) b += int64_t(head_.nbytes());  // the head reads the table in full
  if (cfg_.moe.enabled())                                  // one token reads its top_k experts of each MoE block
    b -= cfg_.num_moe_layers() * (cfg_.moe.num_experts - cfg_.moe.top_k) * cfg_.expert_params() * es;
  if (!quant_) return b;
  for (int l = 0; l < int(cfg_.n_layer); ++l) {  // quantized matrices: packed bytes, not f32
    const model::BlockWeights& w = w_[size_t(l)];
    const QuantizedModel::Block& q = quant_->blocks[size_t(l)];
    b += q.qkv.bytes() + q.proj.bytes() + q.fc.bytes() + q.out.bytes() -
         int64_t(w.qkv_w.nbytes() + w.proj_w.nbytes() + w.fc_w.nbytes() + w.out_w.nbytes());
  }
  if (quant_->head) b += quant_->head->bytes() - int64_t(head_.nbytes());
  return b;
}

template <class T>
class ModelRunner::ForwardOps : public model::BlockForwardOps {
 public:
  ForwardOps(ModelRunner& r, int64_t N) : r_(r), N_(N) {}
  void linear(Linear which, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) override {
    const QuantizedModel::Block* q = r_.quant_ ? &r_.quant_->blocks[size_t(layer_)] : nullptr;
    const QuantizedMatrix* m = !q                      ? nullptr
                               : which == Linear::qkv  ? &q->qkv
                               : which == Linear::proj ? &q->proj
                               : which == Linear::fc   ? &q->fc
                                                       : &q->out;
    r_.linear(x, w, m, b, y);
  }
  void attention(int layer, const Tensor& qkv, const Tensor& att) override {
    const int64_t H = r_.H_, KVH = r_.KVH_, D = r_.cfg_.head_dim(), W = (H + 2 * KVH) * D;
    const int64_t bs = r_.cache_.block_size();
    T* kc = r_.cache_.k(layer).data<T>();
    T* vc = r_.cache_.v(layer).data<T>();
    const T* q = qkv.data<T>();
    cpu::paged_kv_write<T>(q + H * D, q + (H + KVH) * D, W, r_.slots_.data(), N_, kc, vc, bs, KVH, D);
    cpu::paged_attention_forward<T>(q, W, kc, vc, bs, r_.pseqs_.data(), int64_t(r_.pseqs_.size()), att.data<T>(), H * D,
                                    H, KVH, D);
  }
  void row_parallel_output(const Tensor& y) override { r_.all_reduce(y); }
  void moe_begin(int, const model::BlockWeights&, const Tensor& ln2) override { ln2_ = ln2; }
  void moe_end(int layer, const model::BlockWeights& w, const Tensor& x_out, bool accumulate) override {
    model::moe_forward(r_.cfg_, w, ln2_, r_.moe_, x_out, accumulate);  // MoE models run on one rank
    std::vector<int64_t>& load = r_.expert_load_[size_t(r_.cfg_.moe_index(layer))];
    for (size_t e = 0; e < load.size(); ++e) load[e] += r_.moe_.load[e];
  }
  int layer_ = 0;  // the block whose quantized matrices linear() takes

 private:
  ModelRunner& r_;
  int64_t N_;
  Tensor ln2_;
};

template <class T>
void ModelRunner::run_layers(int64_t N) {
  // One norm buffer serves both norms of a block: the first's output is consumed by then.
  const Tensor ln = ln_.narrow0(0, N), mean = mean_.narrow0(0, N), rstd = rstd_.narrow0(0, N);
  const model::BlockForwardBuffers b{
      ln, mean, rstd, qkv_.narrow0(0, N), att_.narrow0(0, N), x_mid_.narrow0(0, N), ln, mean, rstd, fc_, act_};
  const Tensor x = x_.narrow0(0, N), pos = pos_.narrow0(0, N);
  ForwardOps<T> ops(*this, N);
  for (int l = 0; l < int(cfg_.n_layer); ++l) {
    ops.layer_ = l;
    model::block_forward(cfg_, l, w_[size_t(l)], dims_, x, pos, b, ops, x);
  }
}

int64_t ModelRunner::run_plan(const StepPlan& plan) {
  const int64_t N = plan.num_tokens();
  LOOM_CHECK(N <= max_batched_tokens_, "runner", "plan has ", N, " tokens, more than the ", max_batched_tokens_,
             " the runner was sized for (max_batched_tokens)");
  LOOM_CHECK(int64_t(plan.seqs.size()) <= max_seqs_, "runner", "plan has ", plan.seqs.size(),
             " sequences, more than the ", max_seqs_, " the runner was sized for (max_num_seqs)");
  cache_.copy_blocks(plan.copies);
  if (N == 0) return 0;
  const int64_t bs = cache_.block_size();
  int32_t* tok = tok_.data<int32_t>();
  int32_t* pos = pos_.data<int32_t>();
  slots_.clear();
  pseqs_.clear();
  sample_rows_.clear();
  int64_t row = 0;
  for (const ScheduledSeq& s : plan.seqs) {
    pseqs_.push_back({s.block_table.data(), s.start, s.num_tokens, row});
    for (int64_t i = 0; i < s.num_tokens; ++i, ++row) {
      const int64_t p = s.start + i;
      tok[row] = s.tokens[size_t(i)];
      pos[row] = int32_t(p);
      slots_.push_back(int64_t(s.block_table[size_t(p / bs)]) * bs + p % bs);
    }
    if (s.sample)
      for (int64_t i = s.num_spec; i >= 0; --i) sample_rows_.push_back(row - 1 - i);
  }
  const bool f32 = x_.dtype() == DType::f32;
  if (tp_size_ == 1)
    ops::embedding_forward(tok_.narrow0(0, N), pos_.narrow0(0, N), wte_, wpe_, x_.narrow0(0, N));
  else if (f32)
    embed_vocab_parallel<float>(N);
  else
    embed_vocab_parallel<double>(N);
  if (f32)
    run_layers<float>(N);
  else
    run_layers<double>(N);
  return N;
}

Tensor ModelRunner::execute(const StepPlan& plan) {
  const int64_t S = logit_rows(plan);
  LOOM_CHECK(S <= max_logit_rows_, "runner", "plan asks for ", S, " rows of logits, more than the ", max_logit_rows_,
             " the runner was sized for");
  if (run_plan(plan) == 0 || S == 0) return logits_.narrow0(0, 0);
  // Only the rows that sample go through the final norm and the head.
  const size_t row_bytes = size_t(cfg_.d_model) * dtype_size(x_.dtype());
  const char* xb = static_cast<const char*>(x_.raw());
  char* xsb = static_cast<char*>(xs_.raw());
  for (int64_t i = 0; i < S; ++i)
    std::memcpy(xsb + size_t(i) * row_bytes, xb + size_t(sample_rows_[size_t(i)]) * row_bytes, row_bytes);
  const Tensor logits = logits_.narrow0(0, S);
  norm_and_head(xs_.narrow0(0, S), lnf_.narrow0(0, S), lnf_mean_.narrow0(0, S), lnf_rstd_.narrow0(0, S),
                tp_size_ > 1 ? local_logits_.narrow0(0, S) : logits);
  if (tp_size_ > 1) {
    if (x_.dtype() == DType::f32)
      gather_logits<float>(S);
    else
      gather_logits<double>(S);
  }
  return logits;
}

void ModelRunner::norm_and_head(const Tensor& x, const Tensor& ln, const Tensor& mean, const Tensor& rstd,
                                const Tensor& logits) const {
  model::norm_forward(cfg_.traits(), x, lnf_w_, lnf_b_, ln, mean, rstd, cfg_.norm_eps);
  linear(ln, head_, quant_ && quant_->head ? &*quant_->head : nullptr, {}, logits);
}

Tensor ModelRunner::execute_all_rows(const StepPlan& plan) {
  LOOM_CHECK(x_.dtype() == DType::f32, "runner", "execute_all_rows needs an f32 model");
  LOOM_CHECK(tp_size_ == 1, "runner", "execute_all_rows runs on one rank (no tensor parallelism)");
  if (!all_logits_.defined())
    all_logits_ = Tensor::empty({max_batched_tokens_, cfg_.vocab_size}, DType::f32, MemCategory::activations);
  const int64_t N = run_plan(plan);
  if (N == 0) return all_logits_.narrow0(0, 0);
  // Every row through the final norm (into ln_, free after the last block) and the head.
  const Tensor logits = all_logits_.narrow0(0, N);
  norm_and_head(x_.narrow0(0, N), ln_.narrow0(0, N), mean_.narrow0(0, N), rstd_.narrow0(0, N), logits);
  return logits;
}

}  // namespace loom::infer
