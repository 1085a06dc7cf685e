#include "loom/model/decoder.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "loom/core/trace.h"
#include "loom/kernels/ops.h"

namespace loom::model {

void ParamSource::embedding_backward(const Tensor& tokens, const Tensor& pos, const Tensor& dres, const Tensor& dwte,
                                     const Tensor& dwpe) {
  ops::embedding_backward(tokens, pos, dres, dwte, dwpe);
}

namespace {
// The default ParamSource: views of the decoder's flat buffers.
class FlatParamSource final : public ParamSource {
 public:
  FlatParamSource(const ModelConfig& cfg, const ParamLayout& layout, const Tensor& params, const Tensor& grads)
      : layout_(layout), params_(params), grads_(grads) {
    for (const int l : layout.layers()) {
      if (params.defined()) w_.push_back(block_weights(cfg, layout, params, l));
      if (grads.defined()) gw_.push_back(block_weights(cfg, layout, grads, l));
    }
  }
  BlockWeights block_params(int l, Phase) override { return w_.at(local(l)); }
  BlockWeights block_grads(int l) override { return gw_.at(local(l)); }
  Tensor outer_param(const std::string& n) override { return view(params_, n); }
  Tensor outer_grad(const std::string& n) override { return view(grads_, n); }

 private:
  size_t local(int l) const { return size_t(layout_.local_index(l)); }
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

// LoRA training: the frozen model's weights from its own flat buffer (base), the adapters and
// every gradient from the trainable source (*inner: the adapters' flat buffers or a data-parallel
// engine over them). The model's parameters have no gradient: outer_grad is undefined and the
// blocks' gradient views hold the adapters only, so no weight gradient of theirs is computed.
// A bf16 base (LoraConfig::base_dtype) is widened block by block into one f32 buffer as each is
// asked for (the decoder holds one block's weights at a time), and its embeddings, final norm and
// head are kept as f32 copies (refresh()).
class LoraParamSource final : public ParamSource {
 public:
  LoraParamSource(const ModelConfig& cfg, const ParamLayout& base_layout, const Tensor& base_params,
                  ParamSource* const& inner, Allocator& alloc)
      : cfg_(cfg), layout_(base_layout), base_(base_params), inner_(inner) {
    if (!sixteen()) {
      flat_ = std::make_unique<FlatParamSource>(cfg, base_layout, base_params, Tensor{});
      return;
    }
    int64_t widest = 0, outer = 0;
    for (const int l : base_layout.layers()) {
      const auto [b, e] = base_layout.block_range(l);
      widest = std::max(widest, e - b);
    }
    for (const ParamInfo& p : base_layout.params())
      if (p.layer < 0) outer += p.numel();
    block32_ = Tensor::empty({std::max<int64_t>(widest, 1)}, DType::f32, MemCategory::workspace, alloc);
    outer32_ = Tensor::zeros({std::max<int64_t>(outer, 1)}, DType::f32, MemCategory::params, alloc);
  }
  bool sixteen() const { return base_.dtype() == DType::bf16; }
  int64_t copy_bytes() const { return sixteen() ? int64_t(outer32_.nbytes()) : 0; }
  // After the base's values change: the f32 copies of a bf16 base's outer parameters.
  void refresh() {
    if (!sixteen()) return;
    int64_t at = 0;
    outer_.clear();
    for (const ParamInfo& p : layout_.params()) {
      if (p.layer >= 0) continue;
      const Tensor dst = outer32_.slice(at, p.shape);
      ops::widen_from_16(base_.slice(p.offset, {p.numel()}), dst.slice(0, {p.numel()}));
      outer_[p.name] = dst;
      at += p.numel();
    }
  }
  BlockWeights block_params(int l, Phase ph) override {
    BlockWeights w;
    if (!sixteen()) {
      w = flat_->block_params(l, ph);
    } else {
      LOOM_CHECK(widened_ < 0, "model", "block ", l, " asked for while block ", widened_,
                 "'s widened weights are in use");
      const auto [b, e] = layout_.block_range(l);
      ops::widen_from_16(base_.slice(b, {e - b}), block32_.slice(0, {e - b}));
      w = block_weights(cfg_, layout_, block32_, l, b);
      widened_ = l;
    }
    w.lora = inner_->block_params(l, ph).lora;
    return w;
  }
  void release_block_params(int l, Phase ph) override {
    widened_ = -1;
    inner_->release_block_params(l, ph);
  }
  BlockWeights block_grads(int l) override { return inner_->block_grads(l); }
  void block_grads_done(int l) override { inner_->block_grads_done(l); }
  Tensor outer_param(const std::string& n) override {
    if (!sixteen()) return flat_->outer_param(n);
    auto it = outer_.find(n);
    LOOM_CHECK(it != outer_.end(), "model", "no outer parameter ", n, " in this slice");
    return it->second;
  }
  Tensor outer_grad(const std::string&) override { return {}; }
  void outer_grads_done() override { inner_->outer_grads_done(); }
  void head_grads_done() override { inner_->head_grads_done(); }
  void embedding_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void pass_begin(bool train) override { inner_->pass_begin(train); }
  void pass_end(bool train) override { inner_->pass_end(train); }

 private:
  const ModelConfig& cfg_;
  const ParamLayout& layout_;
  Tensor base_;
  ParamSource* const& inner_;
  std::unique_ptr<FlatParamSource> flat_;  // an f32 base
  Tensor block32_, outer32_;               // a bf16 base's widened block and outer copies
  std::map<std::string, Tensor> outer_;
  int widened_ = -1;
};

// Packed rows' positions: each row starts a document, and a position is 0 (another document
// starts) or one more than the one before it. Attention reads a document's start from them.
void check_packed_positions(const int32_t* pos, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t p = pos[b * T + t], want = t == 0 ? 0 : pos[b * T + t - 1] + 1;
      LOOM_CHECK(p == want || (t > 0 && p == 0), "model", "packed positions of row ", b, " give ", p, " at token ", t,
                 " where ", want,
                 " or 0 was expected: a row's positions start at 0 and count up by one, restarting "
                 "at 0 where another document starts");
    }
}
}  // namespace

Decoder::Decoder(const ModelConfig& cfg, const DecoderOptions& opt, DType dtype, Allocator& alloc)
    : cfg_(cfg),
      opt_(opt),
      layout_(cfg, opt.unit_align, opt.slice),
      dims_(BlockDims::of(cfg, layout_.slice().tp, layout_.slice().tp_rank)),
      dtype_(dtype),
      alloc_(alloc) {
  LOOM_CHECK(dtype == DType::f32 || dtype == DType::f64, "model",
             "training dtype must be f32 (or f64 for checks), got ", dtype_name(dtype));
  // Micro-batch slots are reused across chunks, so every chunk has the same number of blocks.
  for (const LayerRange& r : layout_.chunks())
    LOOM_CHECK(r.last - r.first == n_local(), "model", "the slice's chunks of blocks differ in size (",
               r.last - r.first, " and ", n_local(), "); interleaved stages need equal chunks");
  // Tensor-parallel training's layers are f32 only; inference (no gradients) runs f64 too.
  LOOM_CHECK(layout_.slice().tp == 1 || dtype == DType::f32 || !opt.allocate_flat_grads, "model",
             "tensor-parallel training runs in f32 only, got ", dtype_name(dtype));
  set_options(opt);
  if (opt.allocate_flat_params) params_ = Tensor::zeros({layout_.total()}, dtype, MemCategory::params, alloc);
  if (opt.allocate_flat_grads) grads_ = Tensor::zeros({layout_.total()}, dtype, MemCategory::grads, alloc);
  default_src_ = std::make_unique<FlatParamSource>(cfg_, layout_, params_, grads_);
  train_src_ = src_ = default_src_.get();
  if (lora()) {
    LOOM_CHECK(cfg.lora.enabled(), "model", "an adapter layout (ModelSlice::lora_adapters) needs model.lora.rank > 0");
    ModelSlice base_slice = layout_.slice();
    base_slice.lora_adapters = false;
    base_layout_ = std::make_unique<ParamLayout>(cfg, 1, base_slice);
    const bool bf16 = cfg.lora.base_dtype == DType::bf16;
    LOOM_CHECK(!bf16 || dtype == DType::f32, "model", "a bf16 LoRA base trains in f32");
    base_params_ = Tensor::zeros({base_layout_->total()}, bf16 ? DType::bf16 : dtype, MemCategory::params, alloc);
    auto src = std::make_unique<LoraParamSource>(cfg_, *base_layout_, base_params_, train_src_, alloc);
    src->refresh();
    src_ = src.get();
    lora_src_ = std::move(src);
  }
  reset_moe_stats();
  if (cfg.moe.enabled() && cfg.moe.bias_update_rate > 0)
    router_bias_ = Tensor::zeros({cfg.num_moe_layers() * cfg.moe.num_experts}, DType::f32, MemCategory::params, alloc);
}

void Decoder::set_options(const DecoderOptions& opt) {
  LOOM_CHECK(opt.activation_checkpoint_interval >= 0, "config",
             "model.activation_checkpoint_interval must be >= 0, got ", opt.activation_checkpoint_interval);
  LOOM_CHECK(opt.xent_chunk > 0, "config", "model.xent_chunk must be positive, got ", opt.xent_chunk);
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

void Decoder::set_param_source(ParamSource* src) {
  train_src_ = src ? src : default_src_.get();
  src_ = lora() ? lora_src_.get() : train_src_;
}

void Decoder::init_base_weights(uint64_t seed) {
  LOOM_CHECK(lora(), "model", "init_base_weights is for LoRA training; init_weights initialises the model");
  Tensor f32 = Tensor::empty({base_layout_->total()}, DType::f32, MemCategory::workspace, alloc_);
  init_params(*base_layout_, seed, f32.data<float>());
  set_base_params(f32);
}

int64_t Decoder::frozen_bytes() const {
  if (!lora()) return 0;
  return int64_t(base_params_.nbytes()) + static_cast<const LoraParamSource*>(lora_src_.get())->copy_bytes();
}

void Decoder::set_base_params(const Tensor& f32) {
  LOOM_CHECK(lora() && f32.dtype() == DType::f32 && f32.numel() == base_layout_->total(), "model",
             "set_base_params takes the frozen model's f32 weights (", base_layout_->total(), " elements), got ",
             f32.describe());
  if (base_params_.dtype() == DType::bf16) {
    ops::narrow_to_16(f32, base_params_);
  } else if (base_params_.dtype() == DType::f32) {
    if (f32.data<float>() != base_params_.data<float>()) base_params_.copy_from(f32);
  } else {
    double* p = base_params_.data<double>();
    for (int64_t i = 0; i < f32.numel(); ++i) p[i] = f32.data<float>()[i];
  }
  static_cast<LoraParamSource*>(lora_src_.get())->refresh();
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
  LOOM_CHECK(B > 0 && T > 0, "model", "batch and sequence length must be positive, got B=", B, " T=", T);
  LOOM_CHECK(T <= cfg_.n_ctx, "model", "sequence length ", T, " exceeds the context of ", cfg_.n_ctx, " (model.n_ctx)");
  if (B == B_ && T == T_ && (train_buffers_ || !train)) return;
  for (const auto& s : slots_)
    LOOM_CHECK(!s.busy, "model", "micro-batch shape changed to B=", B, " T=", T, " while micro-batches of B=", B_,
               " T=", T_, " are in flight");
  const int64_t N = B * T, L = n_local();
  const auto act = MemCategory::activations, work = MemCategory::workspace;
  // Free the old buffers first so peaks reflect one set at a time.
  slots_.clear();
  recompute_.clear();
  scratch_ = {};
  dres_ = ce_work_ = {};
  pos_ = Tensor::empty({N}, DType::i32, act, alloc_);
  lora_u_ = lora_x_ = {};
  if (cfg_.lora.enabled()) {  // LoRA's forward scratch, shared by the blocks (prepare_block)
    lora_u_ = Tensor::empty({N, cfg_.lora.rank}, dtype_, act, alloc_);
    if (cfg_.lora.dropout > 0) lora_x_ = Tensor::empty({N * lora_widest_input(cfg_, dims_)}, dtype_, act, alloc_);
  }
  int32_t* pos = pos_.data<int32_t>();
  for (int64_t n = 0; n < N; ++n) pos[n] = int32_t(n % T);
  const int64_t seg = checkpointed() ? std::min<int64_t>(opt_.activation_checkpoint_interval, L) : 1;
  if (L > 0)
    for (int64_t i = 0; i < (train ? seg : 1); ++i)
      if (!train || checkpointed() || stores_16bit())
        recompute_.push_back(BlockActs::allocate(cfg_, B, T, dtype_, alloc_, dims_));
  if (last_stage() && !tp_)
    ce_work_ = Tensor::empty({std::min(opt_.xent_chunk, N) * cfg_.vocab_size}, dtype_, work, alloc_);
  if (train) {
    dres_ = Tensor::empty({N, cfg_.d_model}, dtype_, work, alloc_);
    scratch_ = BlockScratch::allocate(cfg_, B, T, dtype_, alloc_, dims_);
  }
  B_ = B;
  T_ = T;
  train_buffers_ = train;
}

int Decoder::stage_begin(int64_t B, int64_t T, bool train, int chunk) {
  LOOM_CHECK(chunk >= 0 && chunk < num_chunks(), "model", "chunk ", chunk, " of a slice with ", num_chunks());
  LOOM_CHECK(layout_.slice().tp == 1 || tp_, "model",
             "a tensor-parallel slice needs set_tensor_parallel() before it runs");
  LOOM_CHECK(layout_.slice().ep == 1 || ep_, "model",
             "an expert-parallel slice needs set_expert_parallel() before it runs");
  ensure_buffers(B, T, train);
  // SplitMix-style mix of (seed, step, micro-batch): the micro-batch's dropout key.
  // Each chunk counts its own micro-batches (they enter every chunk in the same order).
  if (dropout_micro_.size() != size_t(num_chunks())) dropout_micro_.assign(size_t(num_chunks()), 0);
  uint64_t key = dropout_seed_ * 0x9e3779b97f4a7c15ULL ^ uint64_t(dropout_step_) * 0xbf58476d1ce4e5b9ULL ^
                 uint64_t(train ? dropout_micro_[size_t(chunk)]++ : 0) * 0x94d049bb133111ebULL;
  key ^= key >> 29;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].busy && (slots_[i].train_buffers || !train)) {
      slots_[i].busy = true;
      slots_[i].train = train;
      slots_[i].dropout_key = key;
      slots_[i].chunk = chunk;
      return int(i);
    }
  const int64_t N = B * T, C = cfg_.d_model, L = n_local();
  const auto act = MemCategory::activations;
  Slot s;
  s.train_buffers = s.train = train;
  s.busy = true;
  s.dropout_key = key;
  s.chunk = chunk;
  s.tokens = Tensor::empty({N}, DType::i32, act, alloc_);
  s.targets = Tensor::empty({N}, DType::i32, act, alloc_);
  for (int64_t l = 0; l <= L; ++l) s.res.push_back(Tensor::empty({N, C}, dtype_, act, alloc_));
  if (train && !checkpointed())
    for (int64_t l = 0; l < L; ++l)
      s.saved.push_back(stores_16bit() ? BlockActs::allocate_stored(cfg_, B, T, cfg_.activation_dtype, alloc_, dims_)
                                       : BlockActs::allocate(cfg_, B, T, dtype_, alloc_, dims_));
  if (last_stage()) {
    s.lnf = Tensor::empty({N, C}, dtype_, act, alloc_);
    if (cfg_.traits().norm == NormKind::layer_norm) s.lnf_mean = Tensor::empty({N}, dtype_, act, alloc_);
    s.lnf_rstd = Tensor::empty({N}, dtype_, act, alloc_);
    s.losses = Tensor::empty({N}, dtype_, act, alloc_);
    if (train) s.dlnf = Tensor::empty({N, C}, dtype_, MemCategory::workspace, alloc_);
  }
  slots_.push_back(std::move(s));
  return int(slots_.size() - 1);
}

Decoder::Slot& Decoder::slot(int id) {
  LOOM_CHECK(id >= 0 && size_t(id) < slots_.size() && slots_[size_t(id)].busy, "model", "micro-batch slot ", id,
             " is not in flight");
  return slots_[size_t(id)];
}

Tensor Decoder::stage_input(int id) const {
  LOOM_CHECK(id >= 0 && size_t(id) < slots_.size(), "model", "no micro-batch slot ", id);
  return slots_[size_t(id)].res.front();
}

Tensor Decoder::stage_output(int id) const {
  LOOM_CHECK(id >= 0 && size_t(id) < slots_.size(), "model", "no micro-batch slot ", id);
  return slots_[size_t(id)].res.back();
}

void Decoder::stage_release(int id) { slot(id).busy = false; }

int64_t Decoder::activation_bytes() const {
  int64_t b = 0;
  for (const auto& s : slots_) {
    for (const auto& t : s.res) b += int64_t(t.nbytes());
    for (const auto& a : s.saved) b += a.bytes();
    if (stores_16bit())  // otherwise they live in the activations' buffers
      for (const auto& g : s.deferred) b += g.bytes();
    for (const Tensor* t : {&s.tokens, &s.targets, &s.positions, &s.lnf, &s.lnf_mean, &s.lnf_rstd, &s.losses})
      if (t->defined()) b += int64_t(t->nbytes());
  }
  for (const auto& a : recompute_) b += a.bytes();
  for (const Tensor* t : {&pos_, &lora_u_, &lora_x_})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

void Decoder::embed_forward(Slot& s) {
  trace::Span span("embedding forward", "compute");
  const bool learned = cfg_.traits().position == PositionKind::learned;
  const Tensor wpe = learned ? src_->outer_param(position_table_name(cfg_)) : Tensor{};
  const Tensor wte = src_->outer_param(token_table_name(cfg_));
  if (tp_)
    tp_->embedding_forward(s.tokens, positions(s), wte, wpe, s.res[0]);
  else
    ops::embedding_forward(s.tokens, positions(s), wte, wpe, s.res[0]);
}

// Forward through the stage's blocks. In training without checkpointing each block keeps its
// own activations (in 16 bits: computed in the working set, then stashed); otherwise they go to
// a reusable set (recomputed later when training).
void Decoder::run_blocks_forward(Slot& s) {
  const int first = layout_.chunks()[size_t(s.chunk)].first;
  const bool stash = s.train_buffers && stores_16bit();
  for (int i = 0; i < n_local(); ++i) {
    BlockActs& a = (s.train_buffers && !checkpointed() && !stash) ? s.saved[size_t(i)] : recompute_[0];
    a.moe.times = &moe_times_;
    prepare_block(a, s, first + i);
    trace::Span span("forward block", "compute", {{"layer", first + i}});
    block_forward(cfg_, first + i,
                  with_router_bias(first + i, src_->block_params(first + i, ParamSource::Phase::forward)),
                  s.res[size_t(i)], positions(s), a, s.res[size_t(i) + 1], tp_, ep_);
    src_->release_block_params(first + i, ParamSource::Phase::forward);
    if (cfg_.is_moe_layer(first + i)) record_moe(first + i, a.moe, s);
    if (stash && s.train) stash_activations(a, s.saved[size_t(i)]);
  }
}

void Decoder::prepare_block(BlockActs& a, const Slot& s, int layer) const {
  a.attention_pos = s.packed ? s.positions : Tensor{};
  a.lora_u = lora_u_;
  a.lora_x = lora_x_;
  a.lora_dropout = s.train && lora() && cfg_.lora.dropout > 0;
  a.lora_key = s.dropout_key ^ (uint64_t(layer) + 1) * 0xff51afd7ed558ccdULL;
}

Tensor Decoder::router_bias_of(int layer) const {
  if (!router_bias_.defined() || !cfg_.is_moe_layer(layer)) return {};
  return router_bias_.slice(cfg_.moe_index(layer) * cfg_.moe.num_experts, {cfg_.moe.num_experts});
}

BlockWeights Decoder::with_router_bias(int layer, BlockWeights w) const {
  w.router_bias = router_bias_of(layer);
  return w;
}

void Decoder::record_moe(int layer, const MoeActs& a, Slot& s) {
  const MoeConfig& m = cfg_.moe;
  s.router_loss += m.router_aux_loss_coef * a.aux + m.router_z_loss_coef * a.z;
  if (!s.train) return;
  MoeLayerStats& st = moe_stats_[size_t(cfg_.moe_index(layer))];
  st.layer = layer;
  st.load.resize(a.load.size());
  for (size_t e = 0; e < a.load.size(); ++e) st.load[e] += a.load[e];
  st.choices += a.tokens * m.top_k;
  st.dropped += a.dropped;
  st.aux_sum += a.aux;
  st.z_sum += a.z;
  ++st.forwards;
}

void Decoder::reset_moe_stats() { moe_stats_.assign(size_t(cfg_.num_moe_layers()), MoeLayerStats{}); }

void Decoder::set_router_bias(const std::vector<float>& b) {
  LOOM_CHECK(router_bias_.defined() && int64_t(b.size()) == router_bias_.numel(), "model", "router bias of ", b.size(),
             " values for a model with ", router_bias_.defined() ? router_bias_.numel() : 0,
             " (model.moe.bias_update_rate > 0 and the same experts)");
  std::copy(b.begin(), b.end(), router_bias_.data<float>());
}

void Decoder::update_router_bias(const std::vector<MoeLayerStats>& stats, double rate) {
  LOOM_CHECK(router_bias_.defined(), "model", "update_router_bias needs model.moe.bias_update_rate > 0");
  const int64_t E = cfg_.moe.num_experts;
  float* b = router_bias_.data<float>();
  for (size_t i = 0; i < stats.size(); ++i) {
    const auto& load = stats[i].load;
    if (load.empty()) continue;
    double mean = 0;
    for (int64_t l : load) mean += double(l);
    mean /= double(E);
    // DeepSeek-V3: raise the bias of underloaded experts, lower that of overloaded ones.
    for (int64_t e = 0; e < E; ++e) {
      const double d = mean - double(load[size_t(e)]);
      b[int64_t(i) * E + e] += float(d > 0 ? rate : d < 0 ? -rate : 0.0);
    }
  }
}

void Decoder::final_norm_forward(Slot& s) {
  const FamilyTraits t = cfg_.traits();
  const Tensor b = t.linear_biases ? src_->outer_param(final_norm_name(cfg_, "bias")) : Tensor{};
  norm_forward(t, s.res.back(), src_->outer_param(final_norm_name(cfg_, "weight")), b, s.lnf, s.lnf_mean, s.lnf_rstd,
               cfg_.norm_eps);
}

double Decoder::count_and_sum(const Slot& s, int64_t N, int64_t* n_valid) {
  int64_t cnt = 0;
  double sum = 0;
  const int32_t* targets = s.targets.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    if (targets[n] >= 0) {
      ++cnt;
      sum += double(dtype_ == DType::f32 ? s.losses.data<float>()[n] : s.losses.data<double>()[n]);
    }
  if (n_valid) *n_valid = cnt;
  return sum;
}

double Decoder::stage_forward(int id, const int32_t* tokens, const int32_t* targets, double grad_scale,
                              int64_t* n_valid, const int32_t* positions) {
  Slot& s = slot(id);
  const int64_t N = B_ * T_;
  std::memcpy(s.tokens.raw(), tokens, size_t(N) * 4);
  std::memcpy(s.targets.raw(), targets, size_t(N) * 4);
  s.packed = positions != nullptr;
  if (s.packed) {
    check_packed_positions(positions, B_, T_);
    if (!s.positions.defined()) s.positions = Tensor::empty({N}, DType::i32, MemCategory::activations, alloc_);
    std::memcpy(s.positions.raw(), positions, size_t(N) * 4);
  }
  s.grad_scale = grad_scale;
  s.router_loss = 0;
  if (embeds(s)) embed_forward(s);
  run_blocks_forward(s);
  last_router_loss_ = s.router_loss;
  if (!heads(s)) {
    if (n_valid) *n_valid = 0;
    return 0;
  }
  trace::Span span("head+loss", "compute");
  final_norm_forward(s);
  // Head and loss, fused with their backward in training: dlnf and the head gradient come out here.
  const Tensor head = src_->outer_param(lm_head_name(cfg_));
  const Tensor dhead = s.train ? src_->outer_grad(lm_head_name(cfg_)) : Tensor{};
  if (tp_)
    tp_->head_xent(s.lnf, head, s.targets, s.losses, s.dlnf, dhead, grad_scale, opt_.xent_chunk);
  else
    ops::lm_head_xent(s.lnf, head, s.targets, s.losses, s.dlnf, dhead, grad_scale, opt_.xent_chunk, ce_work_,
                      cfg_.products());
  return count_and_sum(s, N, n_valid);
}

void Decoder::stage_backward(int id, const Tensor& dy) { backward_pass(id, dy, false); }

void Decoder::stage_backward_input(int id, const Tensor& dy) {
  LOOM_CHECK(!checkpointed(), "model", "a backward split into input and weight gradients needs every block's ",
             "saved activations; set model.activation_checkpoint_interval=0 (zero-bubble pipeline schedules)");
  backward_pass(id, dy, true);
}

void Decoder::stage_backward_weights(int id) {
  Slot& s = slot(id);
  LOOM_CHECK(s.weights_pending, "model", "stage_backward_weights on micro-batch slot ", id,
             " before its stage_backward_input");
  const int first = layout_.chunks()[size_t(s.chunk)].first;
  for (int64_t i = n_local() - 1; i >= 0; --i) {
    const int l = first + int(i);
    trace::Span span("weight gradient block", "compute", {{"layer", l}});
    if (stores_16bit()) unstash_activations(s.saved[size_t(i)], recompute_[0]);
    block_weight_backward(cfg_, l, src_->block_grads(l), stores_16bit() ? recompute_[0] : s.saved[size_t(i)],
                          s.deferred[size_t(i)]);
    src_->block_grads_done(l);
  }
  if (s.chunk == 0) src_->outer_grads_done();
  s.weights_pending = false;
  s.busy = false;
}

// Where block i's deferred output gradients wait for the weight pass: in place where the
// activations allow it, each in a buffer the block's backward has finished reading when that
// gradient appears (the block's output, its mid residual, MLP pre-activation and q|k|v), so a
// split backward holds nothing beyond the activations 1F1B holds. The 16-bit stored activations
// leave no such room: buffers of their own.
BlockDeferredGrads Decoder::deferred_grads(Slot& s, int i) {
  if (stores_16bit()) return BlockDeferredGrads::allocate(cfg_, B_, T_, dtype_, alloc_, dims_);
  const int64_t N = B_ * T_;
  BlockActs& a = s.saved[size_t(i)];
  BlockDeferredGrads g;
  if (!cfg_.is_moe_layer(layout_.chunks()[size_t(s.chunk)].first + i)) {  // a MoE block's MLP is not deferred
    g.d_out = s.res[size_t(i) + 1];
    g.d_fc = a.fc.slice(0, {N, cfg_.traits().mlp_fan_out() * dims_.F});
  }
  g.d_proj = a.x_mid;
  g.d_qkv = a.qkv.slice(0, {B_, T_, dims_.qkv_width()});
  return g;
}

void Decoder::backward_pass(int id, const Tensor& dy, bool defer) {
  Slot& s = slot(id);
  LOOM_CHECK(s.train, "model", "stage_backward on micro-batch slot ", id, " whose forward was an evaluation");
  LOOM_CHECK(!s.weights_pending, "model", "micro-batch slot ", id, " ran its backward already");
  if (defer && s.deferred.empty())
    for (int i = 0; i < n_local(); ++i) s.deferred.push_back(deferred_grads(s, i));
  const FamilyTraits t = cfg_.traits();
  using Phase = ParamSource::Phase;
  if (heads(s)) {
    trace::Span span("final norm backward", "compute");
    const std::string g = final_norm_name(cfg_, "weight");
    norm_backward(t, s.dlnf, s.res.back(), src_->outer_param(g), s.lnf_mean, s.lnf_rstd, dres_, src_->outer_grad(g),
                  t.linear_biases ? src_->outer_grad(final_norm_name(cfg_, "bias")) : Tensor{},
                  /*accumulate_dx=*/false);
    src_->head_grads_done();
  } else {
    LOOM_CHECK(dy.defined() && dy.numel() == dres_.numel(), "model",
               "stage_backward needs the gradient of the stage output, [", B_ * T_, ", ", cfg_.d_model, "]");
    dres_.copy_from(dy);
  }
  const int first = layout_.chunks()[size_t(s.chunk)].first;
  auto backward_block = [&](int64_t i, BlockActs& acts) {
    const int l = first + int(i);
    trace::Span span("backward block", "compute", {{"layer", l}});
    {  // the weights' views end before the release, so a ZeRO-3 source can reuse the buffer
      const BlockWeights w = with_router_bias(l, src_->block_params(l, Phase::backward));
      acts.moe.loss_weight = s.grad_scale * double(B_ * T_);
      acts.moe.times = &moe_times_;
      prepare_block(acts, s, l);
      block_backward(cfg_, l, w, src_->block_grads(l), s.res[size_t(i)], positions(s), acts, scratch_, dres_, tp_, ep_,
                     defer ? &s.deferred[size_t(i)] : nullptr);
    }
    src_->release_block_params(l, Phase::backward);
    if (!defer) src_->block_grads_done(l);
  };
  const int64_t L = n_local();
  if (stores_16bit()) {
    for (int64_t i = L - 1; i >= 0; --i) {
      unstash_activations(s.saved[size_t(i)], recompute_[0]);
      backward_block(i, recompute_[0]);
    }
  } else if (!checkpointed()) {
    for (int64_t i = L - 1; i >= 0; --i) backward_block(i, s.saved[size_t(i)]);
  } else {
    const int64_t k = opt_.activation_checkpoint_interval;
    const int64_t n_seg = (L + k - 1) / k;
    for (int64_t g = n_seg - 1; g >= 0; --g) {
      const int64_t b = g * k, e = std::min(L, b + k);
      for (int64_t i = b; i < e; ++i) {  // recompute the segment from its saved input
        const int l = first + int(i);
        trace::Span span("recompute block", "compute", {{"layer", l}});
        recompute_[size_t(i - b)].moe.times = &moe_times_;
        prepare_block(recompute_[size_t(i - b)], s, l);
        block_forward(cfg_, l, with_router_bias(l, src_->block_params(l, Phase::recompute)), s.res[size_t(i)],
                      positions(s), recompute_[size_t(i - b)], s.res[size_t(i) + 1], tp_, ep_);
        src_->release_block_params(l, Phase::recompute);
      }
      for (int64_t i = e - 1; i >= b; --i) backward_block(i, recompute_[size_t(i - b)]);
    }
  }
  if (embeds(s) && !lora()) {
    trace::Span span("embedding backward", "compute");
    const Tensor dwte = src_->outer_grad(token_table_name(cfg_));
    const Tensor dwpe = t.position == PositionKind::learned ? src_->outer_grad(position_table_name(cfg_)) : Tensor{};
    if (tp_)
      tp_->embedding_backward(s.tokens, positions(s), dres_, dwte, dwpe);
    else
      src_->embedding_backward(s.tokens, positions(s), dres_, dwte, dwpe);
  }
  if (defer) {
    s.weights_pending = true;
    return;
  }
  // Chunk 0 runs a micro-batch's last backward on this stage: the outer gradients are then whole.
  if (s.chunk == 0) src_->outer_grads_done();
  s.busy = false;
}

double Decoder::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, int64_t* n_valid,
                        const int32_t* positions) {
  LOOM_CHECK(first_stage() && last_stage(), "model",
             "forward() runs the whole model; a pipeline stage runs through stage_forward()");
  const int id = stage_begin(B, T, false);
  src_->pass_begin(false);
  const double loss = stage_forward(id, tokens, targets, 1.0, n_valid, positions);
  stage_release(id);
  src_->pass_end(false);
  return loss;
}

void Decoder::logits(const int32_t* tokens, int64_t B, int64_t T, const Tensor& out) {
  LOOM_CHECK(layout_.whole_model(), "model", "logits() needs the whole model on one rank");
  LOOM_CHECK(out.numel() == B * T * cfg_.vocab_size, "model", "logits output ", out.describe(), " should hold ", B, "*",
             T, "*", cfg_.vocab_size, " values");
  std::vector<int32_t> no_targets(size_t(B * T), -1);
  const int id = stage_begin(B, T, false);
  src_->pass_begin(false);
  stage_forward(id, tokens, no_targets.data(), 1.0, nullptr);
  ops::linear_forward(slot(id).lnf, src_->outer_param(lm_head_name(cfg_)), {}, out, cfg_.products());
  stage_release(id);
  src_->pass_end(false);
}

double Decoder::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T, double grad_scale,
                                 int64_t* n_valid, const int32_t* positions) {
  LOOM_CHECK(first_stage() && last_stage(), "model",
             "forward_backward() runs the whole model; a pipeline stage runs through stage_forward()");
  const int id = stage_begin(B, T, true);
  src_->pass_begin(true);
  const double loss_sum = stage_forward(id, tokens, targets, grad_scale, n_valid, positions);
  stage_backward(id, {});
  src_->pass_end(true);
  return loss_sum;
}

}  // namespace loom::model
