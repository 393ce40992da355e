// The ops neural-network layers are made of: convolution, batch normalisation, pooling,
// dropout, linear maps and losses. Definitions follow PyTorch's (torch.nn.functional), so
// results are comparable; all are differentiable. Images are [N, C, H, W] in either memory
// format: channels_last inputs give channels_last outputs (conv2d and batch_norm compute in
// it; the pooling ops compute in NCHW and convert), and gradients keep their tensors' format.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "random.h"
#include "tensor.h"

namespace ember {

using Pair = std::array<int64_t, 2>;

// input [N, C, H, W], weight [O, C / groups, kH, kW], bias [O] (or undefined). Its gradients,
// as the pooling ops', are differentiable again (create_graph: gradient penalties, Hessian-vector
// products).
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = {},
              Pair stride = {1, 1}, Pair padding = {0, 0}, Pair dilation = {1, 1},
              int64_t groups = 1);

// Normalises over every dim but dim 1 (input [N, C] or [N, C, ...]). In training, batch
// statistics normalise (biased variance) and, when given, running_mean/running_var are
// updated in place with `momentum` (unbiased variance), as torch.nn.functional.batch_norm.
// In eval, the running statistics normalise. weight/bias [C] may be undefined. Its backward
// (and its fused forms') is differentiable again (create_graph): in training a second
// backward sees the batch statistics' dependence on the input; the running ones are constants.
Tensor batch_norm(const Tensor& input, const Tensor& weight, const Tensor& bias,
                  const Tensor& running_mean, const Tensor& running_var, bool training,
                  double momentum = 0.1, double eps = 1e-5);

// Fused batch norm + ReLU, as eager PyTorch's relu(batch_norm(...)) but in one pass over the
// activations: batch_norm_relu = relu(batch_norm(input, ...)), and batch_norm_add_relu =
// relu(batch_norm(input, ...) + residual) (ResNet's block ending). Arguments, statistics,
// running-stat updates, memory formats and mixed precision are batch_norm's; residual has
// the input's shape. The backward keeps only the output (its ReLU mask), the input and the
// statistics, and gives the residual the masked gradient. Results equal the unfused
// composition within the dtype's rounding (on the CPU exactly: the fused pass rounds where
// it does); a residual of another dtype than the input's (a bf16 activation beside an f32
// shortcut) runs that composition itself.
Tensor batch_norm_relu(const Tensor& input, const Tensor& weight, const Tensor& bias,
                       const Tensor& running_mean, const Tensor& running_var, bool training,
                       double momentum = 0.1, double eps = 1e-5);
Tensor batch_norm_add_relu(const Tensor& input, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, bool training, double momentum = 0.1,
                           double eps = 1e-5);

// stride {0, 0} means stride = kernel.
Tensor max_pool2d(const Tensor& input, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  Pair dilation = {1, 1}, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  bool ceil_mode = false, bool count_include_pad = true);
Tensor adaptive_avg_pool2d(const Tensor& input, Pair output_size);

// Zeroes elements with probability p and scales the rest by 1 / (1 - p); identity when
// not training. The gradient is grad * mask / (1 - p) with the forward's mask.
//
// Reproducibility: the mask is drawn in f32 from `gen` (the default generator when null) as
// one Philox draw, so element i's keep/drop is a pure function of (seed, draw offset, i): the
// same seed and the same sequence of draws give the same mask on the CPU and on CUDA, for
// every dtype and thread count; each call advances the generator by one draw. Data-parallel
// ranks seeded with seed + rank draw different masks; ranks seeded alike draw equal ones.
Tensor dropout(const Tensor& input, double p, bool training, Generator* gen = nullptr);

// input [..., in], weight [out, in], bias [out] (or undefined): input @ weight^T + bias.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias = {});

// ---- GPT layers ------------------------------------------------------------------------
// As torch.nn.functional's gelu, layer_norm and embedding. gelu's and embedding's gradients
// are differentiable again (create_graph gives second derivatives); layer_norm's is first-order
// (as conv2d's and batch_norm's): a second backward through a gradient create_graph took of it
// is an ember::Error naming the op.

// GELU's form: exact x * Phi(x) (erf), or PyTorch's tanh approximation
// 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))) (approximate="tanh").
enum class GeluApproximate { kNone, kTanh };

// Elementwise, in the input's dtype (16-bit inputs compute in f32 per element); on no
// autocast list, as in PyTorch.
Tensor gelu(const Tensor& input, GeluApproximate approximate = GeluApproximate::kNone);

// silu(x) = x * sigmoid(x) (torch.nn.functional.silu), the activation of LLaMA-style MLPs.
// Elementwise, in the input's dtype (16-bit inputs compute in f32 per element); on no autocast
// list, as in PyTorch. Its backward is differentiable again (create_graph).
Tensor silu(const Tensor& input);

// Normalises over the trailing dims `normalized_shape` (input [*, normalized_shape]):
// (x - mean) / sqrt(biased var + eps) * weight + bias, with weight and bias of shape
// normalized_shape (either may be undefined) and of the input's dtype. Statistics are computed
// in f32 or wider (f64 for f64 inputs). Under autocast it runs in f32, as on PyTorch's CUDA list.
// Its backward is differentiable again (create_graph).
Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight = {},
                  const Tensor& bias = {}, double eps = 1e-5);

// Rows of weight [num_embeddings, dim] picked by indices (i64 or i32, any shape): the result is
// [*indices.shape, dim]. An index outside [0, num_embeddings) is an ember::Error naming it.
// weight's gradient is dense (the picked rows' gradients summed); the row padding_idx (negative
// counts from the end, as in PyTorch) gets none.
Tensor embedding(const Tensor& indices, const Tensor& weight,
                 std::optional<int64_t> padding_idx = std::nullopt);
// The activation a fused linear applies after its bias. (GELU joins as kGelu once it exists
// as a unary op: a case in the bias_activation kernels and in its backward.)
enum class Activation : uint8_t { kNone, kRelu };

// activation(input @ weight^T + bias), the bias and the activation applied in one pass over
// the GEMM's output (as a cuBLASLt RELU_BIAS epilogue would) instead of addmm then relu; the
// backward masks the gradient by the output > 0 and sums it for the bias. kNone is the
// 3-argument linear. Same checks and autocast rule as linear.
Tensor linear(const Tensor& input, const Tensor& weight, const Tensor& bias, Activation activation);

// ---- losses ---------------------------------------------------------------------------
// As torch.nn.functional: each takes an options struct written like PyTorch's keyword
// arguments, e.g. cross_entropy(logits, target, {.weight = w, .label_smoothing = 0.1}).
// Fields keep PyTorch's keyword order (designated initializers must follow it); every field
// has a default member initializer, so skipping fields stays quiet under -Wextra. Floating
// targets of another dtype promote as in PyTorch (f32 logits, f64 probabilities: f64 loss).

enum class Reduction { kNone, kMean, kSum };

struct CrossEntropyOptions {
  Tensor weight = {};  // [C] per-class rescaling, input's dtype; undefined: all ones
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  double label_smoothing = 0.0;  // in [0, 1]
};

// Cross-entropy of logits [N, C], [N, C, d1, ...] or unbatched [C] against either
// - class indices (i64) of shape [N], [N, d1, ...] or [] (0-dim): loss =
//   -(1 - s) * w[t] * logp[t] - (s / C) * sum_c w[c] * logp[c]; entries equal to ignore_index
//   contribute 0, and kMean divides by the sum of w[t] over the entries not ignored;
// - class probabilities (floating, same shape as the logits): loss = -sum_c w[c] * p'[c] *
//   logp[c] with p' = p * (1 - s) + s / C; kMean divides by the number of samples N * d1 ...
//   (not by the weights), and ignore_index must stay negative.
// kNone keeps the per-sample shape ([N, d1, ...] or []).
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     const CrossEntropyOptions& options = {});

struct NLLLossOptions {
  Tensor weight = {};  // [C], input's dtype; undefined: all ones
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
};

// Negative log-likelihood of log-probabilities [N, C], [N, C, d1, ...] or [C] against class
// indices (i64) [N], [N, d1, ...] or []: loss = -w[t] * x[t]; kMean divides by the sum of
// w[t] over the entries not equal to ignore_index (NaN when all are ignored, as PyTorch).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const NLLLossOptions& options = {});

struct LossOptions {
  Reduction reduction = Reduction::kMean;
};

struct SmoothL1LossOptions {
  Reduction reduction = Reduction::kMean;
  double beta = 1.0;  // >= 0; 0 gives l1_loss
};

struct BCEWithLogitsOptions {
  Tensor weight = {};  // broadcast against the input: rescales each element's loss
  Reduction reduction = Reduction::kMean;
  // Broadcast against the input (usually [C], the last dim): the weight of positive targets.
  Tensor pos_weight = {};
};

// Elementwise losses of input against a target of the same shape; kMean averages over all
// elements. Shapes must match exactly (PyTorch would broadcast them, with a warning).
// (input - target)^2
Tensor mse_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});
// |input - target|
Tensor l1_loss(const Tensor& input, const Tensor& target, const LossOptions& options = {});
// z = |input - target|: 0.5 * z^2 / beta where z < beta, else z - 0.5 * beta.
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target,
                      const SmoothL1LossOptions& options = {});
// Binary cross-entropy of logits x against targets y in [0, 1], in PyTorch's stable form:
// loss = w * ((1 - y) * x + (1 + (pw - 1) * y) * (log(exp(-m) + exp(-x - m)) + m)),
// m = max(-x, 0).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const BCEWithLogitsOptions& options = {});

}  // namespace ember
