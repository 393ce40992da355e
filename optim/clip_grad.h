// Gradient-norm clipping, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::optim {

// Scales the gradients of `params` in place so that their joint norm (the norm_type-norm of
// the per-tensor norms; norm_type may be infinity, the largest |g|) is at most max_norm:
// every gradient is multiplied by min(1, max_norm / (total + 1e-6)). Parameters without a
// gradient are skipped. Returns the total norm before clipping as a 0-d tensor on the first
// gradient's device, so no device-to-host copy is forced; 0 when no parameter has a gradient.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace ember::optim
