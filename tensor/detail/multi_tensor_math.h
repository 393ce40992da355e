// The per-element arithmetic of the multi-tensor optimizer updates (tensor/multi_tensor.h),
// shared by the CPU loop and the CUDA kernel so both follow the per-parameter ops in the same
// order: every product and sum below is one op of optim/sgd.cpp or optim/adam.cpp, with the
// op's scalar rounded to the compute type A as the per-parameter op rounds it.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "../dtype.h"
#include "../multi_tensor.h"

namespace ember::detail {

// SGD's scalars in the compute type; lr is u.lr, or the device's lr read in the kernel.
template <typename A>
struct SGDConsts {
  A weight_decay, momentum, one_minus_dampening, neg_lr;
  bool has_weight_decay, has_momentum, nesterov;

  EMBER_HOST_DEVICE SGDConsts(const SGDUpdate& u, double lr)
      : weight_decay(static_cast<A>(u.weight_decay)),
        momentum(static_cast<A>(u.momentum)),
        one_minus_dampening(static_cast<A>(1.0 - u.dampening)),
        neg_lr(static_cast<A>(-lr)),
        has_weight_decay(u.weight_decay != 0.0),
        has_momentum(u.momentum != 0.0),
        nesterov(u.nesterov) {}
};

// The new value of p; `buffer` (the momentum buffer, ignored without momentum) is updated in
// place, or set to the gradient when `fresh`.
template <typename A>
EMBER_HOST_DEVICE inline A sgd_element(A p, A g, A& buffer, bool fresh, const SGDConsts<A>& c) {
  A d = g;
  if (c.has_weight_decay) d = d + c.weight_decay * p;
  if (c.has_momentum) {
    if (fresh) {
      buffer = d;
    } else {
      buffer = buffer * c.momentum;
      buffer = buffer + c.one_minus_dampening * d;
    }
    d = c.nesterov ? static_cast<A>(d + c.momentum * buffer) : buffer;
  }
  return p + c.neg_lr * d;
}

// Adam's scalars shared by all tensors, in the compute type; lr as SGDConsts'.
template <typename A>
struct AdamConsts {
  A beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decay;
  bool has_weight_decay, decoupled, amsgrad;

  EMBER_HOST_DEVICE AdamConsts(const AdamUpdate& u, double lr)
      : beta1(static_cast<A>(u.beta1)),
        one_minus_beta1(static_cast<A>(1.0 - u.beta1)),
        beta2(static_cast<A>(u.beta2)),
        one_minus_beta2(static_cast<A>(1.0 - u.beta2)),
        eps(static_cast<A>(u.eps)),
        weight_decay(static_cast<A>(u.weight_decay)),
        decay(static_cast<A>(1.0 - lr * u.weight_decay)),
        has_weight_decay(u.weight_decay != 0.0),
        decoupled(u.decoupled_weight_decay),
        amsgrad(u.amsgrad) {}
};

// The scalars that depend on a tensor's step count (computed in double, as optim/adam.cpp;
// on the host or, from a device step count, in the kernel).
template <typename A>
struct AdamStepConsts {
  A neg_step_size, bias_correction2_sqrt;
};

template <typename A>
EMBER_HOST_DEVICE inline AdamStepConsts<A> adam_step_consts(const AdamUpdate& u, double lr,
                                                            int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - ::pow(u.beta1, t);
  const double bias_correction2_sqrt = ::sqrt(1.0 - ::pow(u.beta2, t));
  return {static_cast<A>(-(lr / bias_correction1)), static_cast<A>(bias_correction2_sqrt)};
}

template <typename A>
EMBER_HOST_DEVICE inline A sqrt_of(A x) {
  if constexpr (sizeof(A) == sizeof(float))
    return sqrtf(x);
  else
    return sqrt(x);
}

// The new value of p; m, v and (with amsgrad) v_max are updated in place. v_max follows
// ember's maximum: NaN in either operand propagates.
template <typename A>
EMBER_HOST_DEVICE inline A adam_element(A p, A g, A& m, A& v, A& v_max, const AdamConsts<A>& c,
                                        const AdamStepConsts<A>& s) {
  if (c.has_weight_decay) {
    if (c.decoupled)
      p = p * c.decay;
    else
      g = g + c.weight_decay * p;
  }
  m = m * c.beta1;
  m = m + c.one_minus_beta1 * g;
  const A g2 = g * g;
  v = v * c.beta2;
  v = v + c.one_minus_beta2 * g2;
  A denom = v;
  if (c.amsgrad) {
    // The sum (NaN) is formed unconditionally so that only selects remain and the loop
    // vectorises.
    const A nan_sum = v_max + v;
    const A larger = v_max > v ? v_max : v;
    v_max = (v_max != v_max || v != v) ? nan_sum : larger;
    denom = v_max;
  }
  denom = sqrt_of(denom);
  denom = denom / s.bias_correction2_sqrt;
  denom = denom + c.eps;
  return p + s.neg_step_size * (m / denom);
}

// |x|^p for the norm, with exact forms for p = 1 and 2 (as the per-tensor reduce).
template <typename A>
EMBER_HOST_DEVICE inline A norm_term(A x, A p) {
  const A a = x < A(0) ? -x : x;
  if (p == A(2)) return a * a;
  if (p == A(1)) return a;
  return pow(a, p);
}

// max for the infinity norm: NaN, once seen, stays.
template <typename A>
EMBER_HOST_DEVICE inline A norm_max(A m, A x) {
  if (m != m) return m;
  const A a = x < A(0) ? -x : x;
  return (a > m || a != a) ? a : m;
}

}  // namespace ember::detail
