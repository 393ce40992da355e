#include "clip_grad.h"

#include <cmath>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

namespace ember::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  EMBER_CHECK(norm_type > 0.0, "clip_grad_norm_", "norm_type must be > 0, got ", norm_type);
  EMBER_CHECK(max_norm >= 0.0, "clip_grad_norm_", "max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return scalar_tensor(0.0, kF32);

  const Device device = grads.front().device();
  const DType dtype = grads.front().dtype();
  std::vector<Tensor> norms;
  norms.reserve(grads.size());
  for (const Tensor& g : grads) norms.push_back(norm(g, norm_type).to(device, dtype));
  const Tensor total = grads.size() == 1 ? norms.front() : norm(stack(norms), norm_type);

  const Tensor coef = clamp(max_norm / add(total, 1e-6), {}, 1.0);
  for (Tensor& g : grads) g.mul_(coef.to(g.device(), g.dtype()));
  return total;
}

}  // namespace ember::optim
