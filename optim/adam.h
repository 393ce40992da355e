// Adam and AdamW, step for step as torch.optim.Adam / AdamW (single-tensor path):
//
//   t += 1
//   g = grad + weight_decay * p          (Adam: L2 penalty in the gradient)
//   p = p * (1 - lr * weight_decay)      (AdamW: decoupled decay, g = grad)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   v_max = max(v_max, v)                (amsgrad; v_max replaces v below)
//   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// State per parameter: step, "exp_avg", "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq".
#pragma once

#include <utility>

#include "optimizer.h"

namespace ember::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;                               // > 0
  double weight_decay = 0.0;
  bool amsgrad = false;

  Options to_options() const;
};

// AdamW's options: the same as Adam's but with PyTorch's default weight_decay of 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;

  Options to_options() const;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  // Groups with their own options ("lr", "beta1", "beta2", "eps", "weight_decay",
  // "amsgrad"); what a group leaves out comes from `defaults`.
  Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {});

 protected:
  Adam(const char* name, std::vector<ParamGroup> groups, Options defaults, bool decoupled);
  void check_options(const Options& options) const override;
  void step_group(ParamGroup& group, std::vector<ParamState>& state) override;

 private:
  bool decoupled_weight_decay_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});
};

}  // namespace ember::optim
