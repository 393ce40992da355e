// silu's own kernels (OpKernels, outside the shared table) and the per-element math its CPU
// (tensor/cpu/silu.cpp) and CUDA (tensor/cuda/silu.cu) kernels share; its front end and
// descriptor are in tensor/ops_silu.cpp.
#pragma once

#include "../tensor.h"
#include "gelu_math.h"
#include "kernel_table.h"

namespace ember::detail {

// silu(x) = x * sigmoid(x), as PyTorch computes it: x / (1 + e^-x), in the compute type A
// (float for f32/f16/bf16, double for f64).
template <typename A>
EMBER_HOST_DEVICE inline A silu_value(A x) {
  return x / (A(1) + gelu_exp_of(-x));
}

// dy * silu'(x) = dy * s * (1 + x * (1 - s)), s = sigmoid(x) (PyTorch's silu_backward).
template <typename A>
EMBER_HOST_DEVICE inline A silu_grad(A dy, A x) {
  const A s = A(1) / (A(1) + gelu_exp_of(-x));
  return dy * s * (A(1) + x * (A(1) - s));
}

// out = silu(in): contiguous, one floating dtype, same numel.
using SiluForwardFn = void (*)(const Tensor& out, const Tensor& in);
// grad_in = grad_out * silu'(in): contiguous, one floating dtype, same numel.
using SiluBackwardFn = void (*)(const Tensor& grad_in, const Tensor& grad_out, const Tensor& in);
inline OpKernels<SiluForwardFn> silu_forward_kernels;
inline OpKernels<SiluBackwardFn> silu_backward_kernels;

}  // namespace ember::detail
