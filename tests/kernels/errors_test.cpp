// Bad input: shape and dtype mismatches throw "[op] ..." errors that print the shapes.
#include <gtest/gtest.h>

#include <functional>

#include "loom/kernels/ops.h"

using namespace loom;

static std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OpErrors, LinearShapeMismatchNamesOpAndShapes) {
  Tensor x = Tensor::zeros({4, 8}, DType::f32), w = Tensor::zeros({16, 9}, DType::f32);
  Tensor y = Tensor::zeros({4, 16}, DType::f32);
  std::string e = error_of([&] { ops::linear_forward(x, w, {}, y); });
  EXPECT_EQ(e.rfind("[linear]", 0), 0u) << e;
  EXPECT_NE(e.find("[4, 8]"), std::string::npos) << e;
  EXPECT_NE(e.find("[16, 9]"), std::string::npos) << e;
}

TEST(OpErrors, DtypeMismatch) {
  Tensor x = Tensor::zeros({4, 8}, DType::f32), w = Tensor::zeros({16, 8}, DType::f64);
  Tensor y = Tensor::zeros({4, 16}, DType::f32);
  std::string e = error_of([&] { ops::linear_forward(x, w, {}, y); });
  EXPECT_EQ(e.rfind("[linear]", 0), 0u) << e;
  EXPECT_NE(e.find("f64[16, 8]"), std::string::npos) << e;
  Tensor xi = Tensor::zeros({4, 8}, DType::i32);
  e = error_of([&] { ops::gelu_forward(xi, xi); });
  EXPECT_EQ(e.rfind("[gelu]", 0), 0u) << e;
}

TEST(OpErrors, AttentionAndEmbeddingAndLoss) {
  Tensor qkv = Tensor::zeros({1, 4, 30}, DType::f32), out = Tensor::zeros({1, 4, 12}, DType::f32);
  Tensor lse = Tensor::zeros({1, 4, 4}, DType::f32);
  EXPECT_EQ(error_of([&] { ops::attention_forward(qkv, out, lse, 4, 3); }).rfind("[attention]", 0), 0u);
  Tensor wte = Tensor::zeros({10, 4}, DType::f32), o = Tensor::zeros({2, 4}, DType::f32);
  Tensor tok = Tensor::from_vector<int32_t>({1, 10}, {2});
  std::string e = error_of([&] { ops::embedding_forward(tok, {}, wte, {}, o); });
  EXPECT_NE(e.find("token id 10"), std::string::npos) << e;
  Tensor x = Tensor::zeros({2, 4}, DType::f32), loss = Tensor::zeros({2}, DType::f32);
  Tensor work = Tensor::zeros({20}, DType::f32);
  Tensor tgt = Tensor::from_vector<int32_t>({1, 11}, {2});
  e = error_of([&] { ops::lm_head_xent(x, wte, tgt, loss, {}, {}, 1, 2, work); });
  EXPECT_NE(e.find("target 11"), std::string::npos) << e;
}
