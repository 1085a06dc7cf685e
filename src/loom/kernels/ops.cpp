#include "loom/kernels/ops.h"

#include <cmath>

#include "loom/kernels/cuda/cuda_ops.h"

namespace loom::ops {
namespace {

// Calls f.template operator()<T>() for the tensor's float dtype.
template <class F>
void dispatch_float(const char* op, DType dt, F&& f) {
  switch (dt) {
    case DType::f32: f.template operator()<float>(); return;
    case DType::f64: f.template operator()<double>(); return;
    default: fail(op, "unsupported dtype ", dtype_name(dt), " (f32 and f64 are supported)");
  }
}

void same_dtype(const char* op, const Tensor& ref, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined())
      LOOM_CHECK(t->dtype() == ref.dtype(), op, "dtype mismatch: ", ref.describe(), " vs ", t->describe());
}

void want_shape(const char* op, const char* name, const Tensor& t, const Shape& s) {
  LOOM_CHECK(t.defined(), op, name, " is undefined; expected ", s.str());
  LOOM_CHECK(t.shape() == s, op, name, " has shape ", t.shape().str(), ", expected ", s.str());
}

void want_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  LOOM_CHECK(t.defined(), op, name, " is undefined");
  LOOM_CHECK(t.numel() == n, op, name, " has shape ", t.shape().str(), " (", t.numel(), " elements), expected ", n,
             " elements");
}

bool on_cuda(std::initializer_list<const Tensor*> ts) {
  bool any = false;
  for (const Tensor* t : ts) any = any || (t->defined() && t->device() == Device::cuda);
  return any;
}

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

int64_t rows_of(const Tensor& t) { return t.ndim() <= 1 ? 1 : t.numel() / t.size(-1); }

void check_precision(const char* op, const Tensor& t, ProductPrecision prec) {
  LOOM_CHECK(prec == ProductPrecision::f32 || (t.dtype() == DType::f32 && t.device() == Device::cpu), op,
             cpu::product_precision_name(prec), " products need f32 tensors on the CPU, got ", t.describe());
}

}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, ProductPrecision prec) {
  const char* op = "linear";
  LOOM_CHECK(w.ndim() == 2, op, "weight must be 2-D [out, in], got ", w.describe());
  const int64_t O = w.size(0), I = w.size(1);
  LOOM_CHECK(x.ndim() >= 1 && x.size(-1) == I, op, "input ", x.shape().str(), " does not match weight ",
             w.shape().str(), " (last dim must be ", I, ")");
  const int64_t N = rows_of(x);
  want_numel(op, "output", y, N * O);
  if (b.defined()) want_shape(op, "bias", b, {O});
  same_dtype(op, x, {&w, &b, &y});
  check_precision(op, x, prec);
  if (on_cuda({&x, &w, &y})) return cuda::linear_forward(x, w, b, y);
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::linear_forward<T>(x.data<T>(), w.data<T>(), ptr<T>(b), y.data<T>(), N, I, O, prec);
  });
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx, const Tensor& dw,
                     const Tensor& db, bool accumulate_dx, ProductPrecision prec) {
  const char* op = "linear_backward";
  LOOM_CHECK(w.ndim() == 2, op, "weight must be 2-D [out, in], got ", w.describe());
  const int64_t O = w.size(0), I = w.size(1);
  const int64_t N = rows_of(x);
  want_numel(op, "input", x, N * I);
  want_numel(op, "grad output", dy, N * O);
  if (dx.defined()) want_numel(op, "grad input", dx, N * I);
  if (dw.defined()) want_shape(op, "grad weight", dw, w.shape());
  if (db.defined()) want_shape(op, "grad bias", db, {O});
  same_dtype(op, x, {&dy, &w, &dx, &dw, &db});
  check_precision(op, x, prec);
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::linear_backward<T>(dy.data<T>(), x.data<T>(), w.data<T>(), ptr<T>(dx), ptr<T>(dw), ptr<T>(db), N, I, O,
                            accumulate_dx, prec);
  });
}

namespace {
// The shared checks of lora_forward/backward: shapes, the column range, one dtype.
void check_lora(const char* op, const Tensor& x, const Tensor& a, const Tensor& b, const Tensor& y, int64_t col0,
                const std::vector<const Tensor*>& scratch) {
  LOOM_CHECK(a.ndim() == 2 && b.ndim() == 2 && b.size(1) == a.size(0), op, "adapter A ", a.describe(), " and B ",
             b.describe(), " are not [r, in] and [out, r]");
  const int64_t r = a.size(0), I = a.size(1), O = b.size(0), N = rows_of(x), W = y.size(-1);
  want_numel(op, "input", x, N * I);
  LOOM_CHECK(col0 >= 0 && col0 + O <= W && y.numel() == N * W, op, "output ", y.describe(), " has no columns [", col0,
             ", ", col0 + O, ") for ", N, " rows");
  for (const Tensor* t : scratch) want_numel(op, "scratch", *t, N * r);
}
}  // namespace

void lora_forward(const Tensor& x, const Tensor& a, const Tensor& b, double scale, const Tensor& y, int64_t col0,
                  const Tensor& u) {
  const char* op = "lora_forward";
  check_lora(op, x, a, b, y, col0, {&u});
  same_dtype(op, x, {&a, &b, &y, &u});
  const int64_t r = a.size(0), I = a.size(1), O = b.size(0), N = rows_of(x);
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::lora_forward<T>(x.data<T>(), a.data<T>(), b.data<T>(), T(scale), y.data<T>(), y.size(-1), col0, u.data<T>(), N,
                         I, O, r);
  });
}

void lora_backward(const Tensor& dy, int64_t col0, const Tensor& x, const Tensor& a, const Tensor& b, double scale,
                   const Tensor& u, const Tensor& du, const Tensor& dx, const Tensor& da, const Tensor& db) {
  const char* op = "lora_backward";
  check_lora(op, x, a, b, dy, col0, {&u, &du});
  const int64_t r = a.size(0), I = a.size(1), O = b.size(0), N = rows_of(x);
  if (dx.defined()) want_numel(op, "grad input", dx, N * I);
  if (da.defined()) want_shape(op, "grad A", da, a.shape());
  if (db.defined()) want_shape(op, "grad B", db, b.shape());
  same_dtype(op, x, {&dy, &a, &b, &u, &du, &dx, &da, &db});
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::lora_backward<T>(dy.data<T>(), dy.size(-1), col0, x.data<T>(), a.data<T>(), b.data<T>(), T(scale), u.data<T>(),
                          du.data<T>(), ptr<T>(dx), ptr<T>(da), ptr<T>(db), N, I, O, r);
  });
}

namespace {
void keyed_dropout(const char* op, const Tensor& x, const Tensor& out, double p, uint64_t key, bool add) {
  LOOM_CHECK(p >= 0 && p < 1, op, "probability ", p, " outside [0, 1)");
  want_numel(op, "output", out, x.numel());
  same_dtype(op, x, {&out});
  dispatch_float(op, x.dtype(),
                 [&]<class T>() { cpu::dropout<T>(x.data<T>(), out.data<T>(), x.numel(), p, key, add); });
}
}  // namespace

void dropout(const Tensor& x, const Tensor& out, double p, uint64_t key) {
  keyed_dropout("dropout", x, out, p, key, false);
}

void dropout_add(const Tensor& acc, const Tensor& g, double p, uint64_t key) {
  keyed_dropout("dropout_add", g, acc, p, key, true);
}

void embedding_forward(const Tensor& tok, const Tensor& pos, const Tensor& wte, const Tensor& wpe, const Tensor& out) {
  const char* op = "embedding";
  tok.check_dtype(DType::i32, op);
  const int64_t N = tok.numel(), C = wte.size(-1), V = wte.size(0);
  want_numel(op, "output", out, N * C);
  if (wpe.defined()) {
    pos.check_dtype(DType::i32, op);
    want_numel(op, "positions", pos, N);
    LOOM_CHECK(wpe.ndim() == 2 && wpe.size(1) == C, op, "position table ", wpe.shape().str(),
               " does not match token table ", wte.shape().str());
  }
  const int32_t* t = tok.data<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    LOOM_CHECK(t[i] >= 0 && t[i] < V, op, "token id ", t[i], " at position ", i, " is outside the vocabulary [0, ", V,
               ")");
  if (wpe.defined()) {
    const int32_t* p = pos.data<int32_t>();
    for (int64_t i = 0; i < N; ++i)
      LOOM_CHECK(p[i] >= 0 && p[i] < wpe.size(0), op, "position ", p[i], " is outside [0, ", wpe.size(0),
                 "): the sequence is longer than the model's context");
  }
  same_dtype(op, wte, {&wpe, &out});
  dispatch_float(op, wte.dtype(), [&]<class T>() {
    cpu::embedding_forward<T>(t, wpe.defined() ? pos.data<int32_t>() : nullptr, wte.data<T>(), ptr<T>(wpe),
                              out.data<T>(), N, C);
  });
}

void embedding_backward(const Tensor& tok, const Tensor& pos, const Tensor& dout, const Tensor& dwte,
                        const Tensor& dwpe) {
  const char* op = "embedding_backward";
  const int64_t N = tok.numel(), C = dwte.size(-1);
  want_numel(op, "grad output", dout, N * C);
  same_dtype(op, dout, {&dwte, &dwpe});
  dispatch_float(op, dout.dtype(), [&]<class T>() {
    cpu::embedding_backward<T>(tok.data<int32_t>(), dwpe.defined() ? pos.data<int32_t>() : nullptr, dout.data<T>(),
                               dwte.data<T>(), ptr<T>(dwpe), N, C, dwte.size(0), dwpe.defined() ? dwpe.size(0) : 0);
  });
}

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& mean,
                       const Tensor& rstd, double eps) {
  const char* op = "layernorm";
  const int64_t C = x.size(-1), N = rows_of(x);
  want_shape(op, "weight", w, {C});
  if (b.defined()) want_shape(op, "bias", b, {C});
  want_numel(op, "output", y, N * C);
  want_numel(op, "mean", mean, N);
  want_numel(op, "rstd", rstd, N);
  same_dtype(op, x, {&w, &b, &y, &mean, &rstd});
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::layernorm_forward<T>(x.data<T>(), w.data<T>(), ptr<T>(b), y.data<T>(), mean.data<T>(), rstd.data<T>(), N, C,
                              eps);
  });
}

void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx, const Tensor& dw, const Tensor& db, bool accumulate_dx) {
  const char* op = "layernorm_backward";
  const int64_t C = x.size(-1), N = rows_of(x);
  want_numel(op, "grad output", dy, N * C);
  if (dx.defined()) want_numel(op, "grad input", dx, N * C);
  if (dw.defined()) want_shape(op, "grad weight", dw, {C});
  if (db.defined()) want_shape(op, "grad bias", db, {C});
  same_dtype(op, x, {&dy, &w, &mean, &rstd, &dx, &dw, &db});
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::layernorm_backward<T>(dy.data<T>(), x.data<T>(), w.data<T>(), mean.data<T>(), rstd.data<T>(), ptr<T>(dx),
                               ptr<T>(dw), ptr<T>(db), N, C, accumulate_dx);
  });
}

void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, double eps) {
  const char* op = "rmsnorm";
  const int64_t C = x.size(-1), N = rows_of(x);
  want_shape(op, "weight", w, {C});
  want_numel(op, "output", y, N * C);
  want_numel(op, "rstd", rstd, N);
  same_dtype(op, x, {&w, &y, &rstd});
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::rmsnorm_forward<T>(x.data<T>(), w.data<T>(), y.data<T>(), rstd.data<T>(), N, C, eps);
  });
}

void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dw, bool accumulate_dx) {
  const char* op = "rmsnorm_backward";
  const int64_t C = x.size(-1), N = rows_of(x);
  want_numel(op, "grad output", dy, N * C);
  if (dx.defined()) want_numel(op, "grad input", dx, N * C);
  if (dw.defined()) want_shape(op, "grad weight", dw, {C});
  same_dtype(op, x, {&dy, &w, &rstd, &dx, &dw});
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::rmsnorm_backward<T>(dy.data<T>(), x.data<T>(), w.data<T>(), rstd.data<T>(), ptr<T>(dx), ptr<T>(dw), N, C,
                             accumulate_dx);
  });
}

void gelu_forward(const Tensor& x, const Tensor& y) {
  want_numel("gelu", "output", y, x.numel());
  same_dtype("gelu", x, {&y});
  if (on_cuda({&x, &y})) return cuda::gelu_forward(x, y);
  dispatch_float("gelu", x.dtype(), [&]<class T>() { cpu::gelu_forward<T>(x.data<T>(), y.data<T>(), x.numel()); });
}

void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  want_numel("gelu_backward", "grad output", dy, x.numel());
  want_numel("gelu_backward", "grad input", dx, x.numel());
  same_dtype("gelu_backward", x, {&dy, &dx});
  dispatch_float("gelu_backward", x.dtype(),
                 [&]<class T>() { cpu::gelu_backward<T>(x.data<T>(), dy.data<T>(), dx.data<T>(), x.numel()); });
}

void swiglu_forward(const Tensor& in, const Tensor& out) {
  const char* op = "swiglu";
  LOOM_CHECK(in.size(-1) % 2 == 0, op, "input last dim must be even ([gate | up]), got ", in.shape().str());
  const int64_t F = in.size(-1) / 2, N = rows_of(in);
  want_numel(op, "output", out, N * F);
  same_dtype(op, in, {&out});
  dispatch_float(op, in.dtype(), [&]<class T>() { cpu::swiglu_forward<T>(in.data<T>(), out.data<T>(), N, F); });
}

void swiglu_backward(const Tensor& in, const Tensor& dout, const Tensor& din) {
  const char* op = "swiglu_backward";
  const int64_t F = in.size(-1) / 2, N = rows_of(in);
  want_numel(op, "grad output", dout, N * F);
  want_numel(op, "grad input", din, N * 2 * F);
  same_dtype(op, in, {&dout, &din});
  dispatch_float(op, in.dtype(),
                 [&]<class T>() { cpu::swiglu_backward<T>(in.data<T>(), dout.data<T>(), din.data<T>(), N, F); });
}

void add_forward(const Tensor& a, const Tensor& b, const Tensor& out) {
  LOOM_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add", "shape mismatch: ", a.shape().str(), " + ",
             b.shape().str(), " -> ", out.shape().str());
  same_dtype("add", a, {&b, &out});
  dispatch_float("add", a.dtype(),
                 [&]<class T>() { cpu::add_forward<T>(a.data<T>(), b.data<T>(), out.data<T>(), a.numel()); });
}

void add_inplace(const Tensor& acc, const Tensor& x) {
  LOOM_CHECK(acc.numel() == x.numel(), "add", "shape mismatch: ", acc.shape().str(), " += ", x.shape().str());
  same_dtype("add", acc, {&x});
  dispatch_float("add", acc.dtype(), [&]<class T>() { cpu::add_inplace<T>(acc.data<T>(), x.data<T>(), acc.numel()); });
}

namespace {
void check_16(const char* op, const Tensor& f32, const Tensor& h) {
  LOOM_CHECK(f32.numel() == h.numel(), op, "element counts differ: ", f32.describe(), " and ", h.describe());
  LOOM_CHECK(f32.dtype() == DType::f32 && (h.dtype() == DType::bf16 || h.dtype() == DType::f16), op,
             "converts f32 and bf16/f16, got ", f32.describe(), " and ", h.describe());
  LOOM_CHECK(f32.device() == Device::cpu && h.device() == Device::cpu, op, "runs on the CPU, got ", f32.describe(),
             " and ", h.describe());
}
}  // namespace

void narrow_to_16(const Tensor& src, const Tensor& dst) {
  check_16("narrow", src, dst);
  cpu::narrow_to_16(dst.dtype() == DType::bf16, src.data<float>(), static_cast<uint16_t*>(dst.raw()), src.numel());
}

void widen_from_16(const Tensor& src, const Tensor& dst) {
  check_16("widen", dst, src);
  cpu::widen_from_16(src.dtype() == DType::bf16, static_cast<const uint16_t*>(src.raw()), dst.data<float>(),
                     src.numel());
}

void rope_apply(const Tensor& x, int64_t col0, int64_t n_heads, int64_t D, const Tensor& pos, double theta,
                bool inverse) {
  LOOM_CHECK(D % 2 == 0, "rope", "head dim ", D, " must be even");
  std::vector<double> inv_freq(static_cast<size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) inv_freq[size_t(i)] = std::pow(theta, -double(2 * i) / double(D));
  rope_apply(x, col0, n_heads, D, pos, inv_freq, inverse);
}

void rope_apply(const Tensor& x, int64_t col0, int64_t n_heads, int64_t D, const Tensor& pos,
                const std::vector<double>& inv_freq, bool inverse) {
  const char* op = "rope";
  LOOM_CHECK(D % 2 == 0, op, "head dim ", D, " must be even");
  LOOM_CHECK(int64_t(inv_freq.size()) == D / 2, op, inv_freq.size(), " inverse frequencies for head dim ", D);
  const int64_t W = x.size(-1), N = rows_of(x);
  LOOM_CHECK(col0 >= 0 && col0 + n_heads * D <= W, op, "heads [", col0, ", ", col0 + n_heads * D, ") exceed row width ",
             W, " of ", x.shape().str());
  pos.check_dtype(DType::i32, op);
  want_numel(op, "positions", pos, N);
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::rope_apply<T>(x.data<T>(), N, W, col0, n_heads, D, pos.data<int32_t>(), inv_freq.data(), inverse);
  });
}

static void check_attention(const char* op, const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t H,
                            int64_t KVH, int64_t& B, int64_t& T, int64_t& D) {
  LOOM_CHECK(qkv.ndim() == 3, op, "qkv must be [B, T, (H + 2 KVH) D], got ", qkv.describe());
  LOOM_CHECK(H > 0 && KVH > 0 && H % KVH == 0, op, "n_head=", H, " must be a positive multiple of n_kv_head=", KVH);
  B = qkv.size(0);
  T = qkv.size(1);
  LOOM_CHECK(qkv.size(2) % (H + 2 * KVH) == 0, op, "qkv width ", qkv.size(2),
             " is not a multiple of n_head + 2 n_kv_head = ", H + 2 * KVH);
  D = qkv.size(2) / (H + 2 * KVH);
  want_shape(op, "output", out, {B, T, H * D});
  want_shape(op, "lse", lse, {B, H, T});
  same_dtype(op, qkv, {&out, &lse});
}

namespace {
const int32_t* attention_positions(const char* op, const Tensor& pos, int64_t B, int64_t T) {
  if (!pos.defined()) return nullptr;
  LOOM_CHECK(pos.dtype() == DType::i32 && pos.numel() == B * T && pos.device() == Device::cpu, op,
             ": positions must be i32[", B * T, "] on the CPU, got ", pos.describe());
  return pos.data<int32_t>();
}
}  // namespace

void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, int64_t H, int64_t KVH,
                       const Tensor& pos) {
  int64_t B, T, D;
  check_attention("attention", qkv, out, lse, H, KVH, B, T, D);
  const int32_t* p = attention_positions("attention", pos, B, T);
  dispatch_float("attention", qkv.dtype(), [&]<class T_>() {
    cpu::attention_forward<T_>(qkv.data<T_>(), out.data<T_>(), lse.data<T_>(), B, T, H, KVH, D, p);
  });
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& dout, const Tensor& lse, const Tensor& dqkv,
                        int64_t H, int64_t KVH, const Tensor& pos) {
  int64_t B, T, D;
  check_attention("attention_backward", qkv, out, lse, H, KVH, B, T, D);
  want_shape("attention_backward", "grad output", dout, out.shape());
  want_shape("attention_backward", "grad qkv", dqkv, qkv.shape());
  same_dtype("attention_backward", qkv, {&dout, &dqkv});
  const int32_t* p = attention_positions("attention_backward", pos, B, T);
  dispatch_float("attention_backward", qkv.dtype(), [&]<class T_>() {
    cpu::attention_backward<T_>(qkv.data<T_>(), out.data<T_>(), dout.data<T_>(), lse.data<T_>(), dqkv.data<T_>(), B, T,
                                H, KVH, D, p);
  });
}

void lm_head_xent(const Tensor& x, const Tensor& w, const Tensor& targets, const Tensor& loss, const Tensor& dx,
                  const Tensor& dw, double grad_scale, int64_t chunk, const Tensor& workspace, ProductPrecision prec) {
  const char* op = "cross_entropy";
  LOOM_CHECK(w.ndim() == 2, op, "head weight must be [V, C], got ", w.describe());
  const int64_t V = w.size(0), C = w.size(1), N = rows_of(x);
  LOOM_CHECK(x.size(-1) == C, op, "hidden ", x.shape().str(), " does not match head ", w.shape().str());
  targets.check_dtype(DType::i32, op);
  want_numel(op, "targets", targets, N);
  want_numel(op, "loss", loss, N);
  if (dx.defined()) want_numel(op, "grad input", dx, N * C);
  if (dw.defined()) want_shape(op, "grad head", dw, w.shape());
  LOOM_CHECK(chunk > 0, op, "chunk must be positive, got ", chunk);
  LOOM_CHECK(workspace.numel() >= std::min(chunk, N) * V, op, "workspace of ", workspace.numel(),
             " elements is smaller than chunk * V = ", std::min(chunk, N) * V);
  const int32_t* t = targets.data<int32_t>();
  for (int64_t i = 0; i < N; ++i)
    LOOM_CHECK(t[i] < V, op, "target ", t[i], " at row ", i, " is outside the vocabulary [0, ", V, ")");
  same_dtype(op, x, {&w, &loss, &dx, &dw, &workspace});
  check_precision(op, x, prec);
  dispatch_float(op, x.dtype(), [&]<class T>() {
    cpu::lm_head_xent<T>(x.data<T>(), w.data<T>(), t, loss.data<T>(), ptr<T>(dx), ptr<T>(dw), N, C, V, grad_scale,
                         chunk, workspace.data<T>(), prec);
  });
}

void adamw_update(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const cpu::AdamWParams& h,
                  double weight_decay) {
  const char* op = "adamw";
  want_numel(op, "grad", g, p.numel());
  want_numel(op, "exp_avg", m, p.numel());
  want_numel(op, "exp_avg_sq", v, p.numel());
  same_dtype(op, p, {&g, &m, &v});
  dispatch_float(op, p.dtype(), [&]<class T>() {
    cpu::adamw_update<T>(p.data<T>(), g.data<T>(), m.data<T>(), v.data<T>(), p.numel(), h, weight_decay);
  });
}

}  // namespace loom::ops
