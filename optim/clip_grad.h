// Gradient-norm clipping, as torch.nn.utils.clip_grad_norm_ and its two halves
// get_total_norm and clip_grads_with_norm_ (for callers that combine norms across processes,
// like dist::ZeroRedundancyOptimizer::clip_grad_norm_).
#pragma once

#include <optional>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::optim {

// Scales the gradients of `params` in place so that their joint norm (the norm_type-norm of
// the per-tensor norms; norm_type may be infinity, the largest |g|) is at most max_norm:
// every gradient is multiplied by min(1, max_norm / (total + 1e-6)). Parameters without a
// gradient are skipped. Returns the total norm before clipping as a 0-d tensor on the first
// gradient's device, so no device-to-host copy is forced; 0 when no parameter has a gradient.
//
// foreach (torch's foreach=): true computes the norm of all gradients of one device and dtype
// in one multi-tensor pass and scales them in another (tensor/multi_tensor.h), false takes
// one norm and one multiply per gradient; unset, as PyTorch: multi-tensor for CUDA gradients,
// per-gradient on CPU. The scaled gradients are the same products either way; the norm
// agrees within rounding (it is summed in another order).
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       std::optional<bool> foreach = std::nullopt);

// The norm_type-norm of the per-tensor norms of `tensors` (undefined ones skipped), as
// torch.nn.utils.get_total_norm: clip_grad_norm_'s total, on the first tensor's device in its
// dtype; 0 for no tensor. foreach as above.
Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type = 2.0,
                      std::optional<bool> foreach = std::nullopt);

// Multiplies the gradients of `params` by min(1, max_norm / (total_norm + 1e-6)), as
// torch.nn.utils.clip_grads_with_norm_ (clip_grad_norm_'s second half).
void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm,
                           const Tensor& total_norm, std::optional<bool> foreach = std::nullopt);

}  // namespace ember::optim
