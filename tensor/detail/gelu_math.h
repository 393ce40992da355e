// GELU and its derivative per element, shared by the CPU and CUDA kernels: PyTorch's
// definitions, in the compute type A (float for f32/f16/bf16, double for f64). The exact form
// is x * Phi(x), Phi(x) = (1 + erf(x / sqrt(2))) / 2; the tanh form is
// 0.5 * x * (1 + tanh(u)), u = sqrt(2 / pi) * (x + 0.044715 * x^3), computed as
// x * sigmoid(2u) (the same value, without cancellation where tanh(u) nears -1).
//
// NOTE: float on the CPU evaluates exp and erf with the polynomials below (Cephes' expf, and
// erf as Abramowitz-Stegun 7.1.26, as PyTorch's vectorised CPU kernels do), which the compiler
// vectorises; libm's scalar erff/tanhf made gelu 4-7x slower than PyTorch. erf is then within
// 1.5e-7 of the true value. CUDA and double use the math library.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "../dtype.h"
#include "../layer_ops.h"

namespace ember::detail {

// e^x for float, about 1 ulp, in straight-line arithmetic: 2^n * e^r with n = floor(x log2 e
// + 1/2) and a degree-7 polynomial for e^r. Arguments are clamped to [-87, 88] (results from
// 1.6e-38 to 1.7e38); NaN stays NaN.
inline float exp_float_poly(float x) {
  const float c = x != x ? 0.0f : (x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x));
  const float t = c * 1.44269504088896341f + 0.5f;
  int32_t n = static_cast<int32_t>(t);
  n -= static_cast<float>(n) > t ? 1 : 0;  // floor for negative t
  const float nf = static_cast<float>(n);
  const float r = c - nf * 0.693359375f - nf * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>(static_cast<int32_t>((n + 127) << 23));
  return x != x ? x : e * scale;
}

// erf(x) for float, within 1.5e-7 (Abramowitz-Stegun 7.1.26).
inline float erf_float_poly(float x) {
  const float a = x < 0.0f ? -x : x;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  float p = 1.061405429f;
  p = p * t - 1.453152027f;
  p = p * t + 1.421413741f;
  p = p * t - 0.284496736f;
  p = p * t + 0.254829592f;
  const float y = 1.0f - p * t * exp_float_poly(-a * a);
  return x < 0.0f ? -y : y;
}

template <typename A>
EMBER_HOST_DEVICE inline A gelu_erf_of(A x) {
  if constexpr (sizeof(A) == sizeof(float)) {
#ifdef __CUDA_ARCH__
    return ::erff(x);
#else
    return erf_float_poly(x);
#endif
  } else {
    return ::erf(x);
  }
}
template <typename A>
EMBER_HOST_DEVICE inline A gelu_exp_of(A x) {
  if constexpr (sizeof(A) == sizeof(float)) {
#ifdef __CUDA_ARCH__
    return ::expf(x);
#else
    return exp_float_poly(x);
#endif
  } else {
    return ::exp(x);
  }
}

inline constexpr double kGeluSqrt1_2 = 0.70710678118654752440;   // 1 / sqrt(2)
inline constexpr double kGeluPdfScale = 0.39894228040143267794;  // 1 / sqrt(2 pi)
inline constexpr double kGeluTanhBeta = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluTanhKappa = 0.044715;

// e^(-2u) for the tanh form's u: sigmoid(2u) = (1 + tanh(u)) / 2 = 1 / (1 + e^(-2u)).
template <typename A>
EMBER_HOST_DEVICE inline A gelu_tanh_exp(A x) {
  const A u = A(kGeluTanhBeta) * (x + A(kGeluTanhKappa) * x * x * x);
  return gelu_exp_of(A(-2) * u);
}

// The GeluApproximate a kernel op carries in its numeric parameter (UnaryOp::kGelu's a,
// BinaryOp::kGeluBackward's alpha, the saved OpArgs::a): static_cast<double>(approximate).
EMBER_HOST_DEVICE inline GeluApproximate gelu_approximate_of(double param) {
  return static_cast<GeluApproximate>(static_cast<int>(param));
}

template <typename A>
EMBER_HOST_DEVICE inline A gelu_forward(A x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::kTanh) return x / (A(1) + gelu_tanh_exp(x));
  return x * A(0.5) * (A(1) + gelu_erf_of(x * A(kGeluSqrt1_2)));
}

// dy * gelu'(x).
template <typename A>
EMBER_HOST_DEVICE inline A gelu_backward(A dy, A x, GeluApproximate approximate) {
  if (approximate == GeluApproximate::kTanh) {
    // With s = sigmoid(2u): gelu = x s, and ds/dx = 2 s (1 - s) u'. 1 - s is computed as
    // 1 / (1 + e^(2u)), not by subtraction, so the tail near s = 1 keeps its digits.
    const A e = gelu_tanh_exp(x);
    const A s = A(1) / (A(1) + e), one_minus_s = A(1) / (A(1) + A(1) / e);
    const A du = A(kGeluTanhBeta) * (A(1) + A(3 * kGeluTanhKappa) * x * x);
    return dy * (s + A(2) * x * s * one_minus_s * du);
  }
  const A cdf = A(0.5) * (A(1) + gelu_erf_of(x * A(kGeluSqrt1_2)));
  const A pdf = A(kGeluPdfScale) * gelu_exp_of(x * x * A(-0.5));
  return dy * (cdf + x * pdf);
}

}  // namespace ember::detail
