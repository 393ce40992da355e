#include "clip_grad.h"

#include <algorithm>
#include <cmath>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/multi_tensor.h>
#include <ember/tensor/ops.h>

namespace ember::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       std::optional<bool> foreach) {
  EMBER_CHECK(norm_type > 0.0, "clip_grad_norm_", "norm_type must be > 0, got ", norm_type);
  EMBER_CHECK(max_norm >= 0.0, "clip_grad_norm_", "max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  // Gradients of one device and dtype that the multi-tensor pass takes, and the rest.
  struct Bucket {
    std::vector<Tensor> grads;
  };
  std::vector<Bucket> buckets;
  std::vector<Tensor> single;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    const Tensor& g = p.grad();
    const bool multi = foreach.value_or(g.device().is_cuda()) && is_flat(g);
    if (!multi) {
      single.push_back(g);
      continue;
    }
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.grads.front().device() == g.device() && b.grads.front().dtype() == g.dtype();
    });
    if (it == buckets.end()) it = buckets.insert(it, Bucket{});
    it->grads.push_back(g);
  }
  if (buckets.empty() && single.empty()) return scalar_tensor(0.0, kF32);

  const Tensor& first = buckets.empty() ? single.front() : buckets.front().grads.front();
  const Device device = first.device();
  const DType dtype = first.dtype();
  std::vector<Tensor> norms;
  for (const Bucket& b : buckets)
    norms.push_back(multi_tensor_norm(b.grads, norm_type).to(device, dtype));
  for (const Tensor& g : single) norms.push_back(norm(g, norm_type).to(device, dtype));
  const Tensor total = norms.size() == 1 ? norms.front() : norm(stack(norms), norm_type);

  const Tensor coef = clamp(max_norm / add(total, 1e-6), {}, 1.0);
  for (const Bucket& b : buckets)
    multi_tensor_mul_(b.grads, coef.to(b.grads.front().device(), b.grads.front().dtype()));
  for (Tensor& g : single) g.mul_(coef.to(g.device(), g.dtype()));
  return total;
}

}  // namespace ember::optim
