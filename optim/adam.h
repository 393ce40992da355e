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
//
// `foreach` / `fused` pick the multi-tensor update (all parameters of a group in one pass;
// torch.optim.AdamW(..., fused=True)): see optim/multi_tensor.h. Unset, it is used for CUDA
// parameters only, as PyTorch does; on CPU its results are bit-identical to the
// per-parameter path in f32 and f64, also when it unscales the gradients inside the pass
// (step(StepScaling)) or reads lr and the step counts on the device (capturable): see
// optim/optimizer.h. Those keep the step counts on the device (ParamState::device_step); a
// parameter that leaves the pass for the per-parameter path reads its count back once.
#pragma once

#include <optional>
#include <utility>

#include "multi_tensor.h"
#include "optimizer.h"

namespace ember::optim {

struct AdamOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};  // each in [0, 1)
  double eps = 1e-8;                               // > 0
  double weight_decay = 0.0;
  bool amsgrad = false;
  // Execution only, not options: they are not in param groups or state dicts.
  std::optional<bool> foreach = std::nullopt;  // unset: multi-tensor on CUDA, per-parameter on CPU
  bool fused = false;       // the same multi-tensor update; not with foreach = true
  bool capturable = false;  // lr and step counts on the device (CUDA graphs); multi-tensor

  Options to_options() const;
};

// AdamW's options: the same as Adam's but with PyTorch's default weight_decay of 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  std::pair<double, double> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  // Execution only, not options: they are not in param groups or state dicts.
  std::optional<bool> foreach = std::nullopt;  // unset: multi-tensor on CUDA, per-parameter on CPU
  bool fused = false;       // the same multi-tensor update; not with foreach = true
  bool capturable = false;  // lr and step counts on the device (CUDA graphs); multi-tensor

  Options to_options() const;
};

class Adam : public detail::MultiTensorOptimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  // Groups with their own options ("lr", "beta1", "beta2", "eps", "weight_decay",
  // "amsgrad"); what a group leaves out comes from `defaults`.
  Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {});

 protected:
  Adam(const char* name, std::vector<ParamGroup> groups, Options defaults, bool decoupled,
       std::optional<bool> foreach, bool fused, bool capturable);
  void check_options(const Options& options) const override;
  void step_group(ParamGroup& group, std::vector<ParamState>& state,
                  const DeviceInputs& device) override;
  std::string device_refusal(const ParamGroup& group,
                             const std::vector<ParamState>& state) const override;

 private:
  bool decoupled_weight_decay_;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults = {});
};

}  // namespace ember::optim
