// CUDA entry points for the ops that have a device kernel. Built from cuda/*.cu when a CUDA
// toolkit is found; otherwise no_cuda/no_cuda.cpp provides versions that throw.
#pragma once
#include <string>

#include "loom/core/tensor.h"

namespace loom::cuda {

bool available();                                 // a CUDA device is present and usable
std::string describe();                           // "cuda: 1 device (NVIDIA H200, sm_90)" or why not
Allocator& allocator();                           // device memory (cudaMalloc), accounted like host memory
void copy(const Tensor& dst, const Tensor& src);  // any direction, same byte size
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y);
void gelu_forward(const Tensor& x, const Tensor& y);

}  // namespace loom::cuda
