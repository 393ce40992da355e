// Stochastic gradient descent with momentum, dampening, Nesterov momentum and L2 weight
// decay, step for step as torch.optim.SGD:
//
//   g = grad + weight_decay * p
//   b = g                                  on the first step (no dampening)
//   b = momentum * b + (1 - dampening) * g afterwards
//   g = g + momentum * b  (nesterov)  or  g = b
//   p = p - lr * g
//
// `foreach` / `fused` pick the multi-tensor update (all parameters of a group in one pass;
// torch.optim.SGD(..., foreach=True)): see optim/multi_tensor.h. Unset, it is used for CUDA
// parameters only, as PyTorch does; on CPU its results are bit-identical to the
// per-parameter path in f32 and f64, also when it unscales the gradients inside the pass
// (step(StepScaling)) or reads lr on the device (capturable): see optim/optimizer.h.
#pragma once

#include <optional>

#include "multi_tensor.h"
#include "optimizer.h"

namespace ember::optim {

struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
  // Execution only, not options: they are not in param groups or state dicts.
  std::optional<bool> foreach = std::nullopt;  // unset: multi-tensor on CUDA, per-parameter on CPU
  bool fused = false;       // the same multi-tensor update; not with foreach = true
  bool capturable = false;  // lr read on the device (CUDA graphs); the multi-tensor update

  Options to_options() const;
};

class SGD : public detail::MultiTensorOptimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options = {});
  // Groups with their own options; what a group leaves out comes from `defaults`.
  SGD(std::vector<ParamGroup> groups, SGDOptions defaults = {});

 protected:
  void check_options(const Options& options) const override;
  void step_group(ParamGroup& group, std::vector<ParamState>& state,
                  const DeviceInputs& device) override;
  std::string device_refusal(const ParamGroup& group,
                             const std::vector<ParamState>& state) const override;
};

}  // namespace ember::optim
