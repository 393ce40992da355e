// Multi-tensor optimizer updates: every parameter of a list updated in one pass (one OpenMP
// loop on CPU, a few multi-tensor kernel launches on CUDA) instead of a handful of ops per
// parameter. The engines behind optim's `foreach` / `fused` options (torch.optim's
// foreach=True / fused=True); optimizers call these, users rarely do.
//
// Arithmetic follows the per-parameter ops step for step in the parameters' compute type
// (float for f32/f16/bf16, double for f64), so on CPU f32 and f64 results are bit-identical
// to the per-parameter path; on CUDA they agree within rounding (the compiler fuses
// multiply-adds). f16/bf16 parameters and their state are rounded once per update instead of
// after every op (as PyTorch's fused kernels do), so they are slightly more accurate than the
// per-parameter path.
//
// Every list runs parallel to `params`: same count, each tensor shaped like its parameter and
// laid out like it (same_flat_order), on one device and of one floating dtype. The passes walk
// each tensor's memory as one flat run, so a parameter may be contiguous or channels_last
// (is_flat). Inputs that break this throw ember::Error naming the function, the list and the
// index.
//
// MultiTensorDeviceArgs hands a pass the values it would otherwise take from the host (the
// grad_scale / found_inf of torch's fused optimizers, the lr and step tensors of capturable
// ones): the pass reads them on the device, so it never waits for the GPU and a CUDA graph
// that captured it replays with whatever they hold at replay time.
#pragma once

#include <cstdint>
#include <span>

#include "tensor.h"

namespace ember {

// True when t's elements fill numel() consecutive slots from data_ptr(): contiguous, or
// channels_last (as conv weights are under model->to(MemoryFormat::ChannelsLast)).
bool is_flat(const Tensor& t);
// True when a and b have one shape, are flat, and element i of a's run is element i of b's.
bool same_flat_order(const Tensor& a, const Tensor& b);

// Optional device-side inputs of multi_tensor_sgd_ / multi_tensor_adam_; each defined tensor
// sits on the parameters' device.
struct MultiTensorDeviceArgs {
  Tensor lr;         // 0-d f64: the learning rate, in place of the update's lr
  Tensor inv_scale;  // 1-element f32: every gradient is multiplied by it as it is read
                     // (GradScaler's 1 / scale, in the compute type: as unscale_ would write it)
  Tensor found_inf;  // 1-element f32: nonzero leaves parameters, buffers and steps untouched
  // Adam only: per-parameter 0-d i64 step counts before this update, in place of the host
  // `steps` (pass those empty); each is incremented unless found_inf is set.
  std::span<const Tensor> steps;
};

struct SGDUpdate {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

// torch.optim.SGD's update of every params[i] with grads[i]:
//   d = grad + weight_decay * p;  b = momentum * b + (1 - dampening) * d (b = d where
//   new_buffer[i]);  d = nesterov ? d + momentum * b : b;  p = p - lr * d.
// momentum_buffers and new_buffer are empty when momentum == 0; a new buffer only needs to be
// allocated (its contents are overwritten). grads may be non-contiguous (they are read only).
void multi_tensor_sgd_(std::span<const Tensor> params, std::span<const Tensor> grads,
                       std::span<const Tensor> momentum_buffers,
                       std::span<const uint8_t> new_buffer, const SGDUpdate& update,
                       const MultiTensorDeviceArgs& device = {});

struct AdamUpdate {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW
  bool amsgrad = false;
};

// torch.optim.Adam's / AdamW's update of every params[i], whose step count after this update
// is steps[i] (>= 1; it sets the bias corrections), or device.steps[i] + 1: see optim/adam.h
// for the formulas. max_exp_avg_sqs is empty unless amsgrad.
void multi_tensor_adam_(std::span<const Tensor> params, std::span<const Tensor> grads,
                        std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                        std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                        const AdamUpdate& update, const MultiTensorDeviceArgs& device = {});

// The p-norm of all elements of all tensors together, (sum |x|^p)^(1/p) (p = infinity: the
// largest |x|; NaN anywhere gives NaN), as a 0-d tensor of their dtype on their device, with
// no device-to-host copy (torch.nn.utils.clip_grad_norm_(..., foreach=True)'s total norm).
// One pass: partial sums per chunk (in double on CPU, in float, or double for f64, on CUDA),
// added in a fixed order, so the result is deterministic; it agrees with the per-tensor
// norm() path within rounding. p > 0; 0 for no tensors is the caller's business.
Tensor multi_tensor_norm(std::span<const Tensor> tensors, double p);

// tensors[i] *= scale for every tensor, scale a 0-d tensor of their dtype on their device
// (read there, no device-to-host copy); the same products as tensors[i].mul_(scale).
void multi_tensor_mul_(std::span<const Tensor> tensors, const Tensor& scale);

}  // namespace ember
