#include "layers.h"

#include <cmath>

#include "init.h"

namespace ember::nn {

namespace {
// PyTorch's default for Linear and Conv2d: weight kaiming-uniform with a = sqrt(5), which
// bounds it by 1/sqrt(fan_in), and bias uniform within the same bound.
void reset_affine(Tensor& weight, Tensor& bias) {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const int64_t fan_in = init::fans(weight).first;
    const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
    init::uniform_(bias, -bound, bound);
  }
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias) {
  EMBER_CHECK(in_features > 0 && out_features > 0, "Linear", "features must be positive, got in ",
              in_features, " and out ", out_features);
  weight = register_parameter("weight", empty({out_features, in_features}));
  if (with_bias) bias = register_parameter("bias", empty({out_features}));
  reset_affine(weight, bias);
}

Tensor Linear::forward(const Tensor& input) {
  check_input_matches(input, "weight", weight);
  return linear(input, weight, bias);
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions opts)
    : options(opts) {
  EMBER_CHECK(in_channels > 0 && out_channels > 0 && options.groups > 0, "Conv2d",
              "channels and groups must be positive, got in ", in_channels, ", out ", out_channels,
              ", groups ", options.groups);
  EMBER_CHECK(in_channels % options.groups == 0 && out_channels % options.groups == 0, "Conv2d",
              "channels (in ", in_channels, ", out ", out_channels,
              ") must be divisible by groups ", options.groups);
  EMBER_CHECK(kernel_size[0] > 0 && kernel_size[1] > 0, "Conv2d",
              "kernel size must be positive, got (", kernel_size[0], ", ", kernel_size[1], ")");
  weight = register_parameter("weight", empty({out_channels, in_channels / options.groups,
                                               kernel_size[0], kernel_size[1]}));
  if (options.bias) bias = register_parameter("bias", empty({out_channels}));
  reset_affine(weight, bias);
}

Tensor Conv2d::forward(const Tensor& input) {
  check_input_matches(input, "weight", weight);
  return conv2d(input, weight, bias, options.stride, options.padding, options.dilation,
                options.groups);
}

BatchNorm::BatchNorm(int64_t num_features, int64_t input_dims_min, int64_t input_dims_max,
                     double eps, double momentum, bool affine, bool track_running_stats)
    : num_features_(num_features),
      dims_min_(input_dims_min),
      dims_max_(input_dims_max),
      eps_(eps),
      momentum_(momentum) {
  EMBER_CHECK(num_features > 0, "BatchNorm", "num_features must be positive, got ", num_features);
  EMBER_CHECK(eps > 0, "BatchNorm", "eps must be positive, got ", eps);
  if (affine) {
    weight = register_parameter("weight", ones({num_features}));
    bias = register_parameter("bias", zeros({num_features}));
  }
  if (track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({num_features}));
    running_var = register_buffer("running_var", ones({num_features}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kI64));
  }
}

void BatchNorm::check_input(const Tensor& input) const {
  EMBER_CHECK(input.dim() >= dims_min_ && input.dim() <= dims_max_, name(), "expected ",
              dims_min_ == dims_max_ ? detail::str_cat(dims_min_, "-d")
                                     : detail::str_cat(dims_min_, "-d or ", dims_max_, "-d"),
              " input, got shape ", shape_str(input.sizes()));
  EMBER_CHECK(input.size(1) == num_features_, name(), "input has ", input.size(1),
              " channels but the layer has ", num_features_, " (input ", shape_str(input.sizes()),
              ")");
  // f16/bf16 inputs may meet f32 parameters and statistics, as in PyTorch's mixed precision.
  if (input.dtype() != kF16 && input.dtype() != kBF16) {
    check_input_matches(input, "weight", weight);
    check_input_matches(input, "running_mean", running_mean);
  }
}

double BatchNorm::effective_momentum() {
  if (!is_training() || !num_batches_tracked.defined()) return momentum_ < 0 ? 0.0 : momentum_;
  {
    NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  if (momentum_ >= 0) return momentum_;
  return 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>());
}

Tensor BatchNorm::forward(const Tensor& input) { return normalize(input, nullptr); }

Tensor BatchNorm::forward_relu(const Tensor& input, const Tensor& residual) {
  return normalize(input, &residual);
}

Tensor BatchNorm::normalize(const Tensor& input, const Tensor* relu_residual) {
  check_input(input);
  const double momentum = effective_momentum();
  // Without running statistics the batch statistics are used in eval mode too (as PyTorch).
  const bool use_batch_stats = is_training() || !running_mean.defined();
  const Tensor rm = use_batch_stats && !is_training() ? Tensor() : running_mean;
  const Tensor rv = use_batch_stats && !is_training() ? Tensor() : running_var;
  if (relu_residual == nullptr)
    return batch_norm(input, weight, bias, rm, rv, use_batch_stats, momentum, eps_);
  if (!relu_residual->defined())
    return batch_norm_relu(input, weight, bias, rm, rv, use_batch_stats, momentum, eps_);
  return batch_norm_add_relu(input, *relu_residual, weight, bias, rm, rv, use_batch_stats, momentum,
                             eps_);
}

Dropout::Dropout(double p, Generator* gen) : p_(p), gen_(gen) {
  EMBER_CHECK(p >= 0.0 && p <= 1.0, "Dropout", "probability must be in [0, 1], got ", p);
}

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(named_children().size()), std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& [n, m] : named_children()) x = (*m)(x);
  return x;
}

// ---- GPT layers ------------------------------------------------------------------------

LayerNorm::LayerNorm(Shape normalized_shape, LayerNormOptions options)
    : normalized_shape_(std::move(normalized_shape)), eps_(options.eps) {
  EMBER_CHECK(!normalized_shape_.empty(), "LayerNorm", "normalized_shape must have a dim");
  for (int64_t s : normalized_shape_)
    EMBER_CHECK(s > 0, "LayerNorm", "normalized_shape must be positive, got ",
                shape_str(normalized_shape_));
  if (options.elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape_));
    if (options.bias) bias = register_parameter("bias", zeros(normalized_shape_));
  }
}

Tensor LayerNorm::forward(const Tensor& input) {
  check_input_matches(input, "weight", weight);
  return layer_norm(input, normalized_shape_, weight, bias, eps_);
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim,
                     std::optional<int64_t> padding_idx) {
  EMBER_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding",
              "num_embeddings and embedding_dim must be positive, got ", num_embeddings, " and ",
              embedding_dim);
  if (padding_idx) {
    EMBER_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings, "Embedding",
                "padding_idx ", *padding_idx, " is out of range for num_embeddings ",
                num_embeddings);
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  Tensor w = empty({num_embeddings, embedding_dim});
  init::normal_(w, 0.0, 1.0);
  if (padding_idx_) w.select(0, *padding_idx_).zero_();
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& indices) {
  EMBER_CHECK(indices.device() == weight.device(), name(), "indices are on ",
              indices.device().str(), " but the weight is on ", weight.device().str());
  return embedding(indices, weight, padding_idx_);
}

}  // namespace ember::nn
