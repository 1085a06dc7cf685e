#include "loom/model/decoder.h"

#include <algorithm>
#include <cstring>

#include "loom/kernels/ops.h"

namespace loom::model {

namespace {
const char* token_table(const ModelConfig& c) {
  return c.family == Family::gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
}
const char* head_name(const ModelConfig& c) {
  return c.tied_embeddings ? token_table(c) : "lm_head.weight";
}

// The default ParamSource: views of the decoder's flat buffers.
class FlatParamSource final : public ParamSource {
 public:
  FlatParamSource(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& params,
                  const Tensor& grads)
      : layout_(layout), params_(params), grads_(grads) {
    for (int l = 0; l < int(cfg.n_layer); ++l) {
      if (params.defined()) w_.push_back(block_weights(cfg, layout, params, l));
      if (grads.defined()) gw_.push_back(block_weights(cfg, layout, grads, l));
    }
  }
  BlockWeights block_params(int l, Phase) override { return w_.at(size_t(l)); }
  BlockWeights block_grads(int l) override { return gw_.at(size_t(l)); }
  Tensor outer_param(const std::string& n) override { return view(params_, n); }
  Tensor outer_grad(const std::string& n) override { return view(grads_, n); }

 private:
  Tensor view(const Tensor& flat, const std::string& n) const {
    LOOM_CHECK(flat.defined(), "model", "no flat buffer for ", n,
               " (allocate_flat_params/grads=false needs a ParamSource)");
    const auto& p = layout_.get(n);
    return flat.slice(p.offset, p.shape);
  }
  const ParamLayout& layout_;
  Tensor params_, grads_;
  std::vector<BlockWeights> w_, gw_;
};
}  // namespace

Decoder::Decoder(const ModelConfig& cfg, const DecoderOptions& opt, DType dtype, Allocator& alloc)
    : cfg_(cfg), opt_(opt), layout_(cfg, opt.unit_align), dtype_(dtype), alloc_(alloc) {
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::f64, "model",
             "training dtype must be f32 (or f64 for checks), got ", dtype_name(dtype));
  set_options(opt);
  if (opt.allocate_flat_params)
    params_ = Tensor::zeros({layout_.total()}, dtype, MemCategory::params, alloc);
  if (opt.allocate_flat_grads)
    grads_ = Tensor::zeros({layout_.total()}, dtype, MemCategory::grads, alloc);
  default_src_ = std::make_unique<FlatParamSource>(cfg_, layout_, params_, grads_);
  src_ = default_src_.get();
}

void Decoder::set_options(const DecoderOptions& opt) {
  LOOM_CHECK(opt.activation_checkpoint_interval >= 0, "config",
             "model.activation_checkpoint_interval must be >= 0, got ",
             opt.activation_checkpoint_interval);
  LOOM_CHECK(opt.xent_chunk > 0, "config", "model.xent_chunk must be positive, got ",
             opt.xent_chunk);
  const bool changed = opt.activation_checkpoint_interval != opt_.activation_checkpoint_interval;
  opt_ = opt;
  if (changed) B_ = T_ = 0;  // buffers are laid out for the old setting
}

Tensor Decoder::param(const std::string& name) const {
  const auto& p = layout_.get(name);
  return params_.slice(p.offset, p.shape);
}

Tensor Decoder::grad(const std::string& name) const {
  const auto& p = layout_.get(name);
  return grads_.slice(p.offset, p.shape);
}

void Decoder::init_weights(uint64_t seed) {
  LOOM_CHECK(params_.defined(), "model", "init_weights needs the flat parameter buffer");
  if (dtype_ == DType::f32) {
    init_params(layout_, seed, params_.data<float>());
  } else {
    std::vector<float> tmp(static_cast<size_t>(layout_.total()));
    init_params(layout_, seed, tmp.data());
    double* p = params_.data<double>();
    for (size_t i = 0; i < tmp.size(); ++i) p[i] = tmp[i];
  }
}

void Decoder::ensure_buffers(int64_t B, int64_t T, bool train) {
  LOOM_CHECK(B > 0 && T > 0, "model", "batch and sequence length must be positive, got B=", B,
             " T=", T);
  LOOM_CHECK(T <= cfg_.n_ctx, "model", "sequence length ", T, " exceeds the context of ",
             cfg_.n_ctx, " (model.n_ctx)");
  if (B == B_ && T == T_ && (train_buffers_ || !train)) return;
  const int64_t N = B * T, C = cfg_.d_model, L = cfg_.n_layer;
  const auto act = MemCategory::activations, work = MemCategory::workspace;
  // Free the old buffers first so peaks reflect one set at a time.
  res_.clear();
  saved_.clear();
  recompute_.clear();
  scratch_ = {};
  tokens_ = Tensor::empty({N}, DType::i32, act, alloc_);
  targets_ = Tensor::empty({N}, DType::i32, act, alloc_);
  pos_ = Tensor::empty({N}, DType::i32, act, alloc_);
  int32_t* pos = pos_.data<int32_t>();
  for (int64_t n = 0; n < N; ++n) pos[n] = int32_t(n % T);
  for (int64_t l = 0; l <= L; ++l) res_.push_back(Tensor::empty({N, C}, dtype_, act, alloc_));
  const int64_t seg = checkpointed() ? std::min<int64_t>(opt_.activation_checkpoint_interval, L) : 1;
  if (train && !checkpointed())
    for (int64_t l = 0; l < L; ++l) saved_.push_back(BlockActs::allocate(cfg_, B, T, dtype_, alloc_));
  for (int64_t i = 0; i < (train ? seg : 1); ++i)
    if (!train || checkpointed())
      recompute_.push_back(BlockActs::allocate(cfg_, B, T, dtype_, alloc_));
  lnf_ = Tensor::empty({N, C}, dtype_, act, alloc_);
  if (cfg_.family == Family::gpt2) lnf_mean_ = Tensor::empty({N}, dtype_, act, alloc_);
  lnf_rstd_ = Tensor::empty({N}, dtype_, act, alloc_);
  losses_ = Tensor::empty({N}, dtype_, act, alloc_);
  ce_work_ = Tensor::empty({std::min(opt_.xent_chunk, N) * cfg_.vocab_size}, dtype_, work, alloc_);
  if (train) {
    dlnf_ = Tensor::empty({N, C}, dtype_, work, alloc_);
    dres_ = Tensor::empty({N, C}, dtype_, work, alloc_);
    scratch_ = BlockScratch::allocate(cfg_, B, T, dtype_, alloc_);
  } else {
    dlnf_ = dres_ = {};
  }
  B_ = B;
  T_ = T;
  train_buffers_ = train;
}

int64_t Decoder::activation_bytes() const {
  int64_t b = 0;
  for (const auto& t : res_) b += int64_t(t.nbytes());
  for (const auto& a : saved_) b += a.bytes();
  for (const auto& a : recompute_) b += a.bytes();
  for (const Tensor* t : {&tokens_, &targets_, &pos_, &lnf_, &lnf_mean_, &lnf_rstd_, &losses_})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

void Decoder::embed_forward() {
  const Tensor wpe =
      cfg_.family == Family::gpt2 ? src_->outer_param("transformer.wpe.weight") : Tensor{};
  ops::embedding_forward(tokens_, pos_, src_->outer_param(token_table(cfg_)), wpe, res_[0]);
}

// Forward through all blocks. In training without checkpointing each block keeps its own
// activations; otherwise they go to a reusable set (recomputed later when training).
void Decoder::run_blocks_forward(bool train) {
  for (int l = 0; l < int(cfg_.n_layer); ++l) {
    BlockActs& a = (train && !checkpointed()) ? saved_[size_t(l)] : recompute_[0];
    block_forward(cfg_, src_->block_params(l, ParamSource::Phase::forward), res_[size_t(l)], pos_,
                  a, res_[size_t(l) + 1]);
    src_->release_block_params(l, ParamSource::Phase::forward);
  }
}

void Decoder::final_norm_forward() {
  const Tensor& x = res_.back();
  if (cfg_.family == Family::gpt2)
    ops::layernorm_forward(x, src_->outer_param("transformer.ln_f.weight"),
                           src_->outer_param("transformer.ln_f.bias"), lnf_, lnf_mean_, lnf_rstd_,
                           cfg_.norm_eps);
  else
    ops::rmsnorm_forward(x, src_->outer_param("model.norm.weight"), lnf_, lnf_rstd_, cfg_.norm_eps);
}


double Decoder::count_and_sum(const int32_t* targets, int64_t N, int64_t* n_valid) {
  int64_t cnt = 0;
  double sum = 0;
  for (int64_t n = 0; n < N; ++n)
    if (targets[n] >= 0) {
      ++cnt;
      sum += double(dtype_ == DType::f32 ? losses_.data<float>()[n] : losses_.data<double>()[n]);
    }
  if (n_valid) *n_valid = cnt;
  return sum;
}

double Decoder::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                        int64_t* n_valid) {
  ensure_buffers(B, T, false);
  const int64_t N = B * T;
  std::memcpy(tokens_.raw(), tokens, size_t(N) * 4);
  std::memcpy(targets_.raw(), targets, size_t(N) * 4);
  src_->pass_begin(false);
  embed_forward();
  // Evaluation always runs through one reusable activation set.
  for (int l = 0; l < int(cfg_.n_layer); ++l) {
    block_forward(cfg_, src_->block_params(l, ParamSource::Phase::forward), res_[size_t(l)], pos_,
                  recompute_.empty() ? saved_[size_t(l)] : recompute_[0], res_[size_t(l) + 1]);
    src_->release_block_params(l, ParamSource::Phase::forward);
  }
  final_norm_forward();
  ops::lm_head_xent(lnf_, src_->outer_param(head_name(cfg_)), targets_, losses_, {}, {}, 1.0,
                    opt_.xent_chunk, ce_work_);
  src_->pass_end(false);
  return count_and_sum(targets, N, n_valid);
}

void Decoder::logits(const int32_t* tokens, int64_t B, int64_t T, const Tensor& out) {
  std::vector<int32_t> no_targets(size_t(B * T), -1);
  forward(tokens, no_targets.data(), B, T, nullptr);
  LOOM_CHECK(out.numel() == B * T * cfg_.vocab_size, "model", "logits output ", out.describe(),
             " should hold ", B, "*", T, "*", cfg_.vocab_size, " values");
  src_->pass_begin(false);
  ops::linear_forward(lnf_, src_->outer_param(head_name(cfg_)), {}, out);
  src_->pass_end(false);
}

double Decoder::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                 int64_t T, double grad_scale, int64_t* n_valid) {
  ensure_buffers(B, T, true);
  const int64_t N = B * T, L = cfg_.n_layer;
  std::memcpy(tokens_.raw(), tokens, size_t(N) * 4);
  std::memcpy(targets_.raw(), targets, size_t(N) * 4);
  const bool gpt2 = cfg_.family == Family::gpt2;
  using Phase = ParamSource::Phase;
  src_->pass_begin(true);
  embed_forward();
  run_blocks_forward(true);
  final_norm_forward();
  // Head and loss, fused with their backward: dlnf and the head gradient come out here.
  ops::lm_head_xent(lnf_, src_->outer_param(head_name(cfg_)), targets_, losses_, dlnf_,
                    src_->outer_grad(head_name(cfg_)), grad_scale, opt_.xent_chunk, ce_work_);
  const double loss_sum = count_and_sum(targets, N, n_valid);

  if (gpt2)
    ops::layernorm_backward(dlnf_, res_.back(), src_->outer_param("transformer.ln_f.weight"),
                            lnf_mean_, lnf_rstd_, dres_, src_->outer_grad("transformer.ln_f.weight"),
                            src_->outer_grad("transformer.ln_f.bias"));
  else
    ops::rmsnorm_backward(dlnf_, res_.back(), src_->outer_param("model.norm.weight"), lnf_rstd_,
                          dres_, src_->outer_grad("model.norm.weight"));

  auto backward_block = [&](int64_t l, BlockActs& acts) {
    const BlockWeights w = src_->block_params(int(l), Phase::backward);
    block_backward(cfg_, w, src_->block_grads(int(l)), res_[size_t(l)], pos_, acts, scratch_, dres_);
    src_->release_block_params(int(l), Phase::backward);
    src_->block_grads_done(int(l));
  };
  if (!checkpointed()) {
    for (int64_t l = L - 1; l >= 0; --l) backward_block(l, saved_[size_t(l)]);
  } else {
    const int64_t k = opt_.activation_checkpoint_interval;
    const int64_t n_seg = (L + k - 1) / k;
    for (int64_t s = n_seg - 1; s >= 0; --s) {
      const int64_t b = s * k, e = std::min(L, b + k);
      for (int64_t l = b; l < e; ++l) {  // recompute the segment from its saved input
        block_forward(cfg_, src_->block_params(int(l), Phase::recompute), res_[size_t(l)], pos_,
                      recompute_[size_t(l - b)], res_[size_t(l) + 1]);
        src_->release_block_params(int(l), Phase::recompute);
      }
      for (int64_t l = e - 1; l >= b; --l) backward_block(l, recompute_[size_t(l - b)]);
    }
  }
  ops::embedding_backward(tokens_, pos_, dres_, src_->outer_grad(token_table(cfg_)),
                          gpt2 ? src_->outer_grad("transformer.wpe.weight") : Tensor{});
  src_->outer_grads_done();
  src_->pass_end(true);
  return loss_sum;
}

}  // namespace loom::model
