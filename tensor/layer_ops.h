// The ops neural-network layers are made of: convolution, batch normalisation, pooling,
// dropout, linear maps and losses. Definitions follow PyTorch's (torch.nn.functional), so
// results are comparable; all are differentiable. Images are NCHW.
#pragma once

#include <array>
#include <cstdint>

#include "random.h"
#include "tensor.h"

namespace ember {

using Pair = std::array<int64_t, 2>;

// input [N, C, H, W], weight [O, C / groups, kH, kW], bias [O] (or undefined).
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              Pair stride = {1, 1}, Pair padding = {0, 0}, Pair dilation = {1, 1},
              int64_t groups = 1);

// Normalises over every dim but dim 1 (input [N, C] or [N, C, ...]). In training, batch
// statistics normalise (biased variance) and, when given, running_mean/running_var are
// updated in place with `momentum` (unbiased variance), as torch.nn.functional.batch_norm.
// In eval, the running statistics normalise. weight/bias [C] may be undefined.
Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);

// stride {0, 0} means stride = kernel.
Tensor max_pool2d(const Tensor& input, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  Pair dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size);

// Zeroes elements with probability p and scales the rest by 1 / (1 - p); identity when
// not training.
Tensor dropout(const Tensor& input, double p, bool training, Generator* gen = nullptr);

// input [..., in], weight [out, in], bias [out] (or undefined): input @ weight^T + bias.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = {});

enum class Reduction { kNone, kMean, kSum };

// Cross-entropy of logits [N, C] against class indices target [N] (i64), with PyTorch's
// label smoothing and ignore_index; kMean averages over the targets not ignored.
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::kMean, int64_t ignore_index = -100,
                     double label_smoothing = 0.0);
// Negative log-likelihood of log-probabilities [N, C] against target [N].
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                Reduction reduction = Reduction::kMean, int64_t ignore_index = -100);
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);

}  // namespace ember
