// Loss modules: callables of (input, target) with PyTorch's options.
#pragma once

#include <ember/tensor/layer_ops.h>

namespace ember::nn {

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::kMean, int64_t ignore_index = -100,
                            double label_smoothing = 0.0)
      : reduction_(reduction), ignore_index_(ignore_index), label_smoothing_(label_smoothing) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const {
    return cross_entropy(logits, target, reduction_, ignore_index_, label_smoothing_);
  }

 private:
  Reduction reduction_;
  int64_t ignore_index_;
  double label_smoothing_;
};

class NLLLoss {
 public:
  explicit NLLLoss(Reduction reduction = Reduction::kMean, int64_t ignore_index = -100)
      : reduction_(reduction), ignore_index_(ignore_index) {}
  Tensor operator()(const Tensor& log_probs, const Tensor& target) const {
    return nll_loss(log_probs, target, reduction_, ignore_index_);
  }

 private:
  Reduction reduction_;
  int64_t ignore_index_;
};

class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::kMean) : reduction_(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const {
    return mse_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

}  // namespace ember::nn
