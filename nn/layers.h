// The standard layers, with PyTorch's constructor arguments and default initialisation.
#pragma once

#include <initializer_list>
#include <optional>

#include <ember/tensor/layer_ops.h>

#include "module.h"

namespace ember::nn {

// y = x W^T + b; weight [out, in] kaiming-uniform(a = sqrt(5)), bias U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Linear"; }
  Tensor weight, bias;
};

struct Conv2dOptions {
  Pair stride{1, 1};
  Pair padding{0, 0};
  Pair dilation{1, 1};
  int64_t groups = 1;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Pair kernel_size, Conv2dOptions opts = {});
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions opts = {})
      : Conv2d(in_channels, out_channels, Pair{kernel_size, kernel_size}, opts) {}
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Conv2d"; }
  Tensor weight, bias;
  Conv2dOptions options;
};

// Batch normalisation over dim 1 (BatchNorm1d: [N, C] or [N, C, L]; BatchNorm2d: [N, C, H, W]).
// Buffers running_mean, running_var and num_batches_tracked as in PyTorch; momentum < 0
// means a cumulative average (PyTorch's momentum=None).
class BatchNorm : public Module {
 public:
  BatchNorm(int64_t num_features, int64_t input_dims_min, int64_t input_dims_max, double eps = 1e-5,
            double momentum = 0.1, bool affine = true, bool track_running_stats = true);
  Tensor forward(const Tensor& input) override;
  // relu(forward(input) + residual) (residual undefined: relu(forward(input))) as one fused
  // op (batch_norm_relu / batch_norm_add_relu), for the models' conv-BN-ReLU blocks. A
  // subclass that overrides forward (SyncBatchNorm) is not fused by its callers.
  Tensor forward_relu(const Tensor& input, const Tensor& residual = {});
  int64_t num_features() const { return num_features_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  // The momentum this step uses (cumulative averaging counts batches).
  double effective_momentum();
  void check_input(const Tensor& input) const;

 private:
  // batch_norm (relu_residual null), or its fused ReLU form adding *relu_residual if defined.
  Tensor normalize(const Tensor& input, const Tensor* relu_residual);
  int64_t num_features_;
  int64_t dims_min_, dims_max_;
  double eps_, momentum_;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, 2, 3, eps, momentum, affine, track_running_stats) {}
  std::string name() const override { return "BatchNorm1d"; }
};

class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1,
                       bool affine = true, bool track_running_stats = true)
      : BatchNorm(num_features, 4, 4, eps, momentum, affine, track_running_stats) {}
  std::string name() const override { return "BatchNorm2d"; }
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return relu(input); }
  std::string name() const override { return "ReLU"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& input) override { return tanh(input); }
  std::string name() const override { return "Tanh"; }
};

class Sigmoid : public Module {
 public:
  Tensor forward(const Tensor& input) override { return sigmoid(input); }
  std::string name() const override { return "Sigmoid"; }
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                     Pair dilation = {1, 1}, bool ceil_mode = false)
      : kernel_(kernel),
        stride_(stride),
        padding_(padding),
        dilation_(dilation),
        ceil_mode_(ceil_mode) {}
  Tensor forward(const Tensor& input) override {
    return max_pool2d(input, kernel_, stride_, padding_, dilation_, ceil_mode_);
  }
  std::string name() const override { return "MaxPool2d"; }

 private:
  Pair kernel_, stride_, padding_, dilation_;
  bool ceil_mode_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                     bool ceil_mode = false, bool count_include_pad = true)
      : kernel_(kernel),
        stride_(stride),
        padding_(padding),
        ceil_mode_(ceil_mode),
        count_include_pad_(count_include_pad) {}
  Tensor forward(const Tensor& input) override {
    return avg_pool2d(input, kernel_, stride_, padding_, ceil_mode_, count_include_pad_);
  }
  std::string name() const override { return "AvgPool2d"; }

 private:
  Pair kernel_, stride_, padding_;
  bool ceil_mode_, count_include_pad_;
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(Pair output_size) : output_size_(output_size) {}
  Tensor forward(const Tensor& input) override { return adaptive_avg_pool2d(input, output_size_); }
  std::string name() const override { return "AdaptiveAvgPool2d"; }

 private:
  Pair output_size_;
};

// Active in training mode only; draws from `gen` (the default generator when null).
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& input) override { return dropout(input, p_, is_training(), gen_); }
  std::string name() const override { return "Dropout"; }

 private:
  double p_;
  Generator* gen_;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& input) override { return input.flatten(start_, end_); }
  std::string name() const override { return "Flatten"; }

 private:
  int64_t start_, end_;
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& input) override { return input; }
  std::string name() const override { return "Identity"; }
};

// Runs its submodules in order; they are registered as "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "Sequential"; }
  size_t size() const { return named_children().size(); }
};

// ---- GPT layers ------------------------------------------------------------------------

// gelu(x), exact (erf) or with PyTorch's tanh approximation (nn.GELU(approximate="tanh")).
class GELU : public Module {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::kNone) : approximate_(approximate) {}
  Tensor forward(const Tensor& input) override { return gelu(input, approximate_); }
  std::string name() const override { return "GELU"; }

 private:
  GeluApproximate approximate_;
};

// silu(x) = x * sigmoid(x) (nn.SiLU), the activation of LLaMA-style MLPs.
class SiLU : public Module {
 public:
  Tensor forward(const Tensor& input) override { return silu(input); }
  std::string name() const override { return "SiLU"; }
};

struct LayerNormOptions {
  double eps = 1e-5;
  bool elementwise_affine = true;  // learnable weight (ones) and, with `bias`, bias (zeros)
  bool bias = true;
};

// Layer normalisation over the trailing dims normalized_shape, as nn.LayerNorm.
class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, LayerNormOptions options = {});
  explicit LayerNorm(int64_t normalized_size, LayerNormOptions options = {})
      : LayerNorm(Shape{normalized_size}, options) {}
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "LayerNorm"; }
  Tensor weight, bias;  // undefined without elementwise_affine (bias: or without bias)
  const Shape& normalized_shape() const { return normalized_shape_; }

 private:
  Shape normalized_shape_;
  double eps_;
};

// A lookup table of num_embeddings vectors of embedding_dim, as nn.Embedding: weight N(0, 1)
// with the padding_idx row zeroed; that row gets no gradient.
//
// Weight tying (a GPT's token embedding and its output head) shares one tensor between the
// modules, registered under both names as in PyTorch; named_parameters() and parameters()
// list it once, so optimizers and DDP update and reduce it once:
//   head->weight = head->parameter("weight") = embedding->weight;
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim,
            std::optional<int64_t> padding_idx = std::nullopt);
  Tensor forward(const Tensor& indices) override;
  std::string name() const override { return "Embedding"; }
  Tensor weight;
  // The padding row (wrapped to [0, num_embeddings)), if any.
  std::optional<int64_t> padding_idx() const { return padding_idx_; }

 private:
  std::optional<int64_t> padding_idx_;
};

}  // namespace ember::nn
