// model.activation_dtype: a block's activations stored in 16 bits between its forward and
// backward (BlockActs::allocate_stored, stash_activations / unstash_activations).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "loom/model/block.h"
#include "loom/model/decoder.h"
#include "testing/gradcheck.h"
#include "testing/random_batch.h"

using namespace loom;
using namespace loom::model;

namespace {

void round_by_hand(const Tensor& t, DType dt) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = dt == DType::bf16 ? bf16_to_f32(f32_to_bf16(p[i])) : f16_to_f32(f32_to_f16(p[i]));
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

// Backward from stored activations is backward from the f32 activations with exactly the stored
// fields (ln1, qkv, att, ln2, fc, act) rounded to the 16-bit type and everything else (norm
// statistics, lse, x_mid, MoE buffers) untouched, bit for bit, even after another forward ran
// in the working set in between; the forward itself does not change. GPT-2, LLaMA and a MoE
// block with a shared expert, bf16 and fp16.
TEST(StoredActivations, BackwardReadsExactlyTheRoundedFields) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "llama-moe-tiny"})
    for (DType dt : {DType::bf16, DType::f16}) {
      const std::string what = std::string(name) + " " + dtype_name(dt);
      ModelConfig cfg = preset(name);
      if (cfg.moe.enabled()) cfg.moe.num_shared_experts = 1;
      const ParamLayout layout(cfg);
      Tensor params = Tensor::empty({layout.total()}, DType::f32);
      init_params(layout, 7, params.data<float>());
      const BlockWeights w = block_weights(cfg, layout, params, 0);
      const int64_t B = 2, T = 12, N = B * T, C = cfg.d_model;
      std::mt19937 rng(3);
      const Tensor x = loom::testing::randn({N, C}, rng, 1.0, DType::f32);
      const Tensor x2 = loom::testing::randn({N, C}, rng, 1.0, DType::f32);
      const Tensor dy = loom::testing::randn({N, C}, rng, 1.0, DType::f32);
      Tensor pos = Tensor::empty({N}, DType::i32);
      for (int64_t n = 0; n < N; ++n) pos.data<int32_t>()[n] = int32_t(n % T);
      Allocator& alloc = cpu_allocator();

      auto backward = [&](BlockActs& a, Tensor& grads, Tensor& dres) {
        grads = Tensor::zeros({layout.total()}, DType::f32);
        dres = dy.clone();
        BlockScratch s = BlockScratch::allocate(cfg, B, T, DType::f32, alloc);
        a.moe.loss_weight = 1.0;
        block_backward(cfg, 0, w, block_weights(cfg, layout, grads, 0), x, pos, a, s, dres);
      };
      // Reference: f32 activations, the stored fields rounded by hand.
      BlockActs ref = BlockActs::allocate(cfg, B, T, DType::f32, alloc);
      Tensor y_ref = Tensor::empty({N, C}, DType::f32);
      block_forward(cfg, 0, w, x, pos, ref, y_ref);
      for (const Tensor* t : {&ref.ln1, &ref.qkv, &ref.att, &ref.ln2, &ref.fc, &ref.act})
        if (t->defined()) round_by_hand(*t, dt);
      Tensor g_ref, dx_ref;
      backward(ref, g_ref, dx_ref);

      BlockActs work = BlockActs::allocate(cfg, B, T, DType::f32, alloc);
      BlockActs stored = BlockActs::allocate_stored(cfg, B, T, dt, alloc, BlockDims::of(cfg));
      EXPECT_EQ(stored.ln1.dtype(), dt) << what;
      EXPECT_EQ(stored.x_mid.dtype(), DType::f32) << what;
      Tensor y = Tensor::empty({N, C}, DType::f32), y2 = Tensor::empty({N, C}, DType::f32);
      block_forward(cfg, 0, w, x, pos, work, y);
      EXPECT_TRUE(same_bits(y, y_ref)) << what << ": the forward changed";
      stash_activations(work, stored);
      block_forward(cfg, 0, w, x2, pos, work, y2);  // the next block's forward in the working set
      unstash_activations(stored, work);
      Tensor g, dx;
      backward(work, g, dx);
      EXPECT_TRUE(same_bits(g, g_ref)) << what << ": parameter gradients differ from the hand-rounded reference";
      EXPECT_TRUE(same_bits(dx, dx_ref)) << what << ": input gradient differs from the hand-rounded reference";
      EXPECT_LT(stored.bytes(), work.bytes()) << what;
    }
}

// The whole decoder under bf16 training: the same losses as with f32 saved activations (forward
// is untouched) and gradients close to them (backward reads bf16-rounded attention and MLP
// inputs: a few bf16 ulps), for 16-bit bytes in place of f32 ones (plus one f32 working set, so
// the saving grows with the depth: 8 blocks here).
TEST(StoredActivations, DecoderGradientsStayCloseAndActivationsShrink) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig cfg = preset(name);
    cfg.precision = Precision::bf16;
    cfg.n_layer = 8;
    const int64_t B = 4, T = 32;
    std::vector<int32_t> tok, tgt;
    loom::testing::random_batch(B, T, cfg.vocab_size, tok, tgt, 5);
    double loss[2];
    std::vector<float> grads[2];
    int64_t bytes[2];
    for (int k = 0; k < 2; ++k) {
      cfg.activation_dtype = k == 0 ? DType::f32 : DType::bf16;
      Decoder m(cfg, DecoderOptions{}, DType::f32);
      m.init_weights(42);
      loss[k] = m.forward_backward(tok.data(), tgt.data(), B, T, 1.0 / double(B * T));
      grads[k] = m.grads().to_f32_vector();
      bytes[k] = m.activation_bytes();
    }
    EXPECT_EQ(loss[1], loss[0]) << name;
    double num = 0, den = 0;
    for (size_t i = 0; i < grads[0].size(); ++i) {
      num += double(grads[1][i] - grads[0][i]) * double(grads[1][i] - grads[0][i]);
      den += double(grads[0][i]) * double(grads[0][i]);
    }
    // bf16 keeps 8 significant bits (relative rounding error up to 2^-9 = 0.2%).
    EXPECT_GT(num, 0) << name << ": no activation was rounded";
    EXPECT_LT(std::sqrt(num / den), 1e-2) << name << ": gradient moved by " << std::sqrt(num / den);
    EXPECT_LT(double(bytes[1]), 0.85 * double(bytes[0])) << name << ": " << bytes[1] << " vs " << bytes[0] << " bytes";
  }
}
