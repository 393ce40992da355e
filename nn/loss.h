// Loss modules: callables of (input, target) holding the options of the functional form in
// layer_ops.h, constructed as PyTorch's with keyword arguments:
//   nn::CrossEntropyLoss loss({.label_smoothing = 0.05});
//   nn::BCEWithLogitsLoss bce({.pos_weight = w});
#pragma once

#include <utility>

#include <ember/tensor/layer_ops.h>

namespace ember::nn {

namespace loss_detail {

// A loss module: `Fn` is the functional form, `Options` its options struct.
template <typename Options, Tensor (*Fn)(const Tensor&, const Tensor&, const Options&)>
class Loss {
 public:
  explicit Loss(Options options = {}) : options_(std::move(options)) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return Fn(input, target, options_);
  }
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return forward(input, target);
  }
  const Options& options() const { return options_; }
  Options& options() { return options_; }

 private:
  Options options_;
};

}  // namespace loss_detail

class CrossEntropyLoss : public loss_detail::Loss<CrossEntropyOptions, &cross_entropy> {
 public:
  using Loss::Loss;
};
class NLLLoss : public loss_detail::Loss<NLLLossOptions, &nll_loss> {
 public:
  using Loss::Loss;
};
class MSELoss : public loss_detail::Loss<LossOptions, &mse_loss> {
 public:
  using Loss::Loss;
};
class L1Loss : public loss_detail::Loss<LossOptions, &l1_loss> {
 public:
  using Loss::Loss;
};
class SmoothL1Loss : public loss_detail::Loss<SmoothL1LossOptions, &smooth_l1_loss> {
 public:
  using Loss::Loss;
};
class BCEWithLogitsLoss
    : public loss_detail::Loss<BCEWithLogitsOptions, &binary_cross_entropy_with_logits> {
 public:
  using Loss::Loss;
};

}  // namespace ember::nn
