// What the tensor-core attention tests share (attention_tc_test.cpp on the GPU,
// cuda_emulated/attention_tc_test.cpp emulated): inputs, the op's forward and gradients, and
// the tolerance, relative to the largest magnitude m of the expected tensor (at least 0.01):
// |got - want| <= f (m + |want|), f = 2e-2 for bf16 and 4e-3 for f16 (the output rounds once
// to the 16-bit type, about 2^-9 resp. 2^-12 relative, and the kernel rounds P and dS to it
// before their products; a few of those roundings add up in a gradient).
#pragma once

#include <optional>

#include <ember/ember.h>

namespace ember::testing::attention_tc {

struct Grads {
  Tensor out, q, k, v;
};

// Uniform in [-1, 1) from `seed`, rounded to `dtype`.
inline Tensor input(const Shape& shape, uint64_t seed, DType dtype) {
  Generator gen(seed);
  return uniform(shape, -1.0, 1.0, kF32, &gen).to(dtype);
}

// The op (whichever kernel its device picks) forward and backward of sum(out * grad_out).
inline Grads through_op(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                        bool causal, double dropout = 0.0, uint64_t seed = 0) {
  Tensor ql = q.clone().requires_grad_(), kl = k.clone().requires_grad_(),
         vl = v.clone().requires_grad_();
  Generator gen(seed);
  Tensor out = scaled_dot_product_attention(ql, kl, vl, causal, dropout, std::nullopt, &gen);
  out.backward(grad_out);
  return {out.detach(), ql.grad(), kl.grad(), vl.grad()};
}

inline double tolerance(DType dtype) { return dtype == kBF16 ? 2e-2 : 4e-3; }

// The floor of m, for gradients that are 0 up to rounding (q's and k's at Lk = 1).
inline double magnitude(const Tensor& want) {
  return std::max(max(abs(want)).item<double>(), 1e-2);
}

}  // namespace ember::testing::attention_tc
