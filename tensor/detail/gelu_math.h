// GELU and its derivative per element, shared by the CPU and CUDA kernels so both compute the
// same thing: PyTorch's formulas, in the compute type A (float for f32/f16/bf16, double for
// f64). The exact form is x * Phi(x) with Phi through erf; the tanh form is
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))).
#pragma once

#include <cmath>

#include "../dtype.h"

namespace ember::detail {

template <typename A>
EMBER_HOST_DEVICE inline A gelu_erf_of(A x) {
  if constexpr (sizeof(A) == sizeof(float))
    return ::erff(x);
  else
    return ::erf(x);
}
template <typename A>
EMBER_HOST_DEVICE inline A gelu_tanh_of(A x) {
  if constexpr (sizeof(A) == sizeof(float))
    return ::tanhf(x);
  else
    return ::tanh(x);
}
template <typename A>
EMBER_HOST_DEVICE inline A gelu_exp_of(A x) {
  if constexpr (sizeof(A) == sizeof(float))
    return ::expf(x);
  else
    return ::exp(x);
}

inline constexpr double kGeluSqrt1_2 = 0.70710678118654752440;   // 1 / sqrt(2)
inline constexpr double kGeluPdfScale = 0.39894228040143267794;  // 1 / sqrt(2 pi)
inline constexpr double kGeluTanhBeta = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluTanhKappa = 0.044715;

template <typename A>
EMBER_HOST_DEVICE inline A gelu_forward(A x, bool tanh_form) {
  if (tanh_form) {
    const A inner = A(kGeluTanhBeta) * (x + A(kGeluTanhKappa) * x * x * x);
    return A(0.5) * x * (A(1) + gelu_tanh_of(inner));
  }
  return x * A(0.5) * (A(1) + gelu_erf_of(x * A(kGeluSqrt1_2)));
}

// dy * gelu'(x).
template <typename A>
EMBER_HOST_DEVICE inline A gelu_backward(A dy, A x, bool tanh_form) {
  if (tanh_form) {
    const A x_sq = x * x;
    const A inner = A(kGeluTanhBeta) * (x + A(kGeluTanhKappa) * x_sq * x);
    const A t = gelu_tanh_of(inner);
    const A left = A(0.5) * x, right = A(1) + t;
    const A left_derivative = A(0.5) * right;
    const A inner_derivative = A(kGeluTanhBeta) * (A(1) + A(3 * kGeluTanhKappa) * x_sq);
    const A right_derivative = left * (A(1) - t * t) * inner_derivative;
    return dy * (left_derivative + right_derivative);
  }
  const A cdf = A(0.5) * (A(1) + gelu_erf_of(x * A(kGeluSqrt1_2)));
  const A pdf = A(kGeluPdfScale) * gelu_exp_of(x * x * A(-0.5));
  return dy * (cdf + x * pdf);
}

}  // namespace ember::detail
