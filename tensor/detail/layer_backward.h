// The backward computations of the layer ops, for autograd's formulas: each allocates the
// gradients asked for (needs[i]) and runs the device's backward kernel.
#pragma once

#include <array>

#include "../tensor.h"
#include "kernel_table.h"

namespace ember::detail {

// grad where the relu's output is positive, else 0, in one pass.
Tensor relu_backward(const Tensor& grad, const Tensor& output);

// t [N, C, ...] as the [N, C, S] view the batch-norm kernels take, dense in `format`: NCHW
// rows, or (channels_last) strides {S * C, 1, C}, which the kernels walk as N * S rows of C.
Tensor batch_norm_rows(const Tensor& t, MemoryFormat format);

// Gradients for input, weight and bias (undefined where not needed).
std::array<Tensor, 3> conv2d_backward(const Tensor& grad_out, const Tensor& input,
                                      const Tensor& weight, const Conv2dParams& params,
                                      std::array<bool, 3> needs);
// The input's and the weight's gradient of conv2d alone, as recorded ops (a create_graph
// backward's, differentiable again); `input` gives the first only its shape and format, and
// `weight` the second.
Tensor conv2d_input_grad(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                         const Conv2dParams& params);
Tensor conv2d_weight_grad(const Tensor& grad_out, const Tensor& input, const Tensor& weight,
                          const Conv2dParams& params);
std::array<Tensor, 3> batch_norm_backward(const Tensor& grad_out, const Tensor& input,
                                          const Tensor& weight, const Tensor& save_mean,
                                          const Tensor& save_invstd, bool training,
                                          std::array<bool, 3> needs);
// The recorded (create_graph) forms of the normalization gradients, written in differentiable
// ops: xhat = (x - mean) * rstd over `dims` with the biased variance and rstd =
// rsqrt(var + eps), recomputed from x so a second backward sees the statistics' dependence on it.
struct Normalized {
  Tensor xhat, rstd;  // rstd keeps the reduced dims (size 1)
};
Normalized normalize_recorded(const Tensor& x, const Shape& dims, double eps);
// The gradient of x from the gradient of xhat: rstd * (g - mean(g) - xhat * mean(g * xhat)).
Tensor normalize_backward_recorded(const Tensor& grad_xhat, const Normalized& n, const Shape& dims);
// The pooling gradients take the layout the forward computed in (params.channels_last).
// Gradients of batch_norm_relu / batch_norm_add_relu for input, weight, bias and residual,
// from the op's output (its ReLU mask).
std::array<Tensor, 4> batch_norm_relu_backward(const Tensor& grad_out, const Tensor& output,
                                               const Tensor& input, const Tensor& weight,
                                               const Tensor& save_mean, const Tensor& save_invstd,
                                               bool training, std::array<bool, 4> needs);
// The pooling gradients are ops of their own, recorded when grad_out requires grad
// (create_graph): linear in grad_out, differentiable again.
Tensor max_pool2d_backward(const Tensor& grad_out, const Shape& input_sizes, const Tensor& indices,
                           const Pool2dParams& params);
Tensor avg_pool2d_backward(const Tensor& grad_out, const Shape& input_sizes,
                           const Pool2dParams& params);
// (adaptive pooling reads only params.channels_last).
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_out, const Shape& input_sizes,
                                    const Pool2dParams& params = {});
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits, const Tensor& lse,
                              const Tensor& target, int64_t ignore_index, double smoothing);

// --- GPT layers.
// grad * gelu'(input), in one pass; recorded (create_graph) as the op gelu_backward.
Tensor gelu_backward(const Tensor& grad, const Tensor& input, GeluApproximate approximate);
// Gradients for input, weight and bias of layer_norm from its saved mean and rstd.
std::array<Tensor, 3> layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd, const Shape& normalized_shape,
                                          std::array<bool, 3> needs);
// The dense gradient of embedding's weight [num_embeddings, dim]: grad rows summed into the
// rows `indices` (flat i64) picked, except those equal to padding_idx (-1: none).
Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_embeddings,
                          int64_t padding_idx);

}  // namespace ember::detail
