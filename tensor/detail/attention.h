// What the attention front end, autograd and both kernels share: the dropout rule on the
// attention weights, and the backward computation autograd's formula calls.
#pragma once

#include <array>
#include <cstdint>

#include "../tensor.h"
#include "kernel_table.h"
#include "philox.h"

namespace ember::detail {

// Whether weight `index` ((b * Lq + i) * Lk + j) survives dropout: the uniform draw rand()
// gives that element in f32 is below keep = float(1 - p) (see attention.h's NOTE).
EMBER_HOST_DEVICE inline bool attention_keep(uint64_t seed, uint64_t offset, uint64_t index,
                                             float keep) {
  return philox_uniform(philox(seed, offset, index).x[0]) < keep;
}

// Gradients of q, k, v (undefined where needs[i] is false) for the saved forward.
std::array<Tensor, 3> scaled_dot_product_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out, const Tensor& lse,
                                                            const AttentionParams& params,
                                                            std::array<bool, 3> needs);

}  // namespace ember::detail
