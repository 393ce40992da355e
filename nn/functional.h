// torch.nn.functional's counterpart: the functional forms of ember's layers, reachable as
// ember::nn::functional::X (namespace F = ember::nn::functional; F::linear(x, w, b)) the way
// PyTorch code calls them. They are the ops of tensor/ (layer_ops.h, attention.h, ops.h);
// these are the same functions, not copies.
#pragma once

#include <ember/tensor/attention.h>
#include <ember/tensor/layer_ops.h>
#include <ember/tensor/ops.h>

namespace ember::nn::functional {

using ember::adaptive_avg_pool2d;
using ember::avg_pool2d;
using ember::batch_norm;
using ember::binary_cross_entropy_with_logits;
using ember::conv2d;
using ember::cross_entropy;
using ember::dropout;
using ember::l1_loss;
using ember::linear;
using ember::log_softmax;
using ember::max_pool2d;
using ember::mse_loss;
using ember::nll_loss;
using ember::relu;
using ember::scaled_dot_product_attention;
using ember::sigmoid;
using ember::silu;
using ember::smooth_l1_loss;
using ember::softmax;
using ember::tanh;

}  // namespace ember::nn::functional
