// Front end of the multi-tensor optimizer updates: checks the lists, then runs the kernel
// table's entry for their device (tensor/cpu/multi_tensor.cpp, tensor/cuda/multi_tensor.cu).
#include "multi_tensor.h"

#include <cmath>
#include <vector>

#include "detail/kernel_table.h"
#include "detail/op_utils.h"
#include "error.h"
#include "ops.h"

namespace ember {
namespace {

// Checks that `list` (named `what`) runs parallel to params: tensors of the parameters'
// shapes, device, dtype and (unless `any_layout`) flat order. An empty list is allowed when
// `optional`.
void check_list(const char* op, const char* what, std::span<const Tensor> params,
                std::span<const Tensor> list, bool optional, bool any_layout = false) {
  if (optional && list.empty()) return;
  EMBER_CHECK(list.size() == params.size(), op, what, " has ", list.size(), " tensors for ",
              params.size(), " parameters");
  for (size_t i = 0; i < list.size(); ++i) {
    const Tensor& t = list[i];
    const Tensor& p = params[i];
    EMBER_CHECK(t.defined(), op, what, "[", i, "] is undefined");
    EMBER_CHECK(t.sizes() == p.sizes(), op, what, "[", i, "] has shape ", shape_str(t.sizes()),
                " but its parameter has shape ", shape_str(p.sizes()));
    EMBER_CHECK(t.dtype() == p.dtype(), op, what, "[", i, "] has dtype ", t.dtype(),
                " but its parameter has dtype ", p.dtype());
    EMBER_CHECK(t.device() == p.device(), op, what, "[", i, "] is on ", t.device(),
                " but its parameter is on ", p.device());
    EMBER_CHECK(any_layout || same_flat_order(t, p), op, what, "[", i,
                "] is not laid out like its parameter (contiguous or channels_last, alike)");
  }
}

void check_params(const char* op, std::span<const Tensor> params) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    EMBER_CHECK(p.defined(), op, "params[", i, "] is undefined");
    EMBER_CHECK(is_floating(p.dtype()), op, "params[", i, "] has dtype ", p.dtype(),
                " (expected a floating dtype)");
    EMBER_CHECK(p.device() == params[0].device(), op, "params[", i, "] is on ", p.device(),
                " but params[0] is on ", params[0].device(), " (one device per call)");
    EMBER_CHECK(p.dtype() == params[0].dtype(), op, "params[", i, "] has dtype ", p.dtype(),
                " but params[0] has dtype ", params[0].dtype(), " (one dtype per call)");
    EMBER_CHECK(is_flat(p), op, "params[", i, "] is neither contiguous nor channels_last");
  }
}

// The gradients laid out like their parameters (copied only where needed).
std::vector<Tensor> grads_like_params(std::span<const Tensor> params,
                                      std::span<const Tensor> grads) {
  std::vector<Tensor> out;
  out.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor& g = grads[i];
    const MemoryFormat layout =
        params[i].is_contiguous() ? MemoryFormat::Contiguous : MemoryFormat::ChannelsLast;
    out.push_back(same_flat_order(g, params[i]) ? g : g.contiguous(layout));
  }
  return out;
}

// One device input: `elements` elements of `dtype` on the parameters' device.
void check_device_input(const char* op, const char* what, const Tensor& t, DType dtype,
                        int64_t dims, Device device) {
  if (!t.defined()) return;
  EMBER_CHECK(t.dtype() == dtype && t.numel() == 1 && (dims < 0 || t.dim() == dims), op, what,
              " must be a ", dims == 0 ? "0-d " : "1-element ", dtype, " tensor, got ", t.dtype(),
              " of shape ", shape_str(t.sizes()));
  EMBER_CHECK(t.device() == device, op, what, " is on ", t.device(), " but the parameters are on ",
              device);
}

void check_device_args(const char* op, std::span<const Tensor> params,
                       const MultiTensorDeviceArgs& device) {
  const Device on = params[0].device();
  check_device_input(op, "lr", device.lr, kF64, 0, on);
  check_device_input(op, "inv_scale", device.inv_scale, kF32, -1, on);
  check_device_input(op, "found_inf", device.found_inf, kF32, -1, on);
}

}  // namespace

bool is_flat(const Tensor& t) {
  return t.is_contiguous() || t.is_contiguous(MemoryFormat::ChannelsLast);
}

bool same_flat_order(const Tensor& a, const Tensor& b) {
  // A tensor both contiguous and channels_last (size-1 dims) has one order either way.
  return a.sizes() == b.sizes() && ((a.is_contiguous() && b.is_contiguous()) ||
                                    (a.is_contiguous(MemoryFormat::ChannelsLast) &&
                                     b.is_contiguous(MemoryFormat::ChannelsLast)));
}

void multi_tensor_sgd_(std::span<const Tensor> params, std::span<const Tensor> grads,
                       std::span<const Tensor> momentum_buffers,
                       std::span<const uint8_t> new_buffer, const SGDUpdate& update,
                       const MultiTensorDeviceArgs& device) {
  constexpr const char* op = "multi_tensor_sgd_";
  if (params.empty()) return;
  check_params(op, params);
  check_device_args(op, params, device);
  EMBER_CHECK(device.steps.empty(), op, "SGD keeps no step counts, got ", device.steps.size());
  check_list(op, "grads", params, grads, false, true);
  const bool momentum = update.momentum != 0.0;
  EMBER_CHECK(
      !momentum || (momentum_buffers.size() == params.size() && new_buffer.size() == params.size()),
      op, "momentum ", update.momentum,
      " needs one momentum buffer and one new_buffer flag "
      "per parameter (got ",
      momentum_buffers.size(), " and ", new_buffer.size(), " for ", params.size(), " parameters)");
  if (momentum) check_list(op, "momentum_buffers", params, momentum_buffers, false);
  EMBER_CHECK(!update.nesterov || (momentum && update.dampening == 0.0), op,
              "Nesterov momentum requires momentum > 0 and dampening == 0 (momentum ",
              update.momentum, ", dampening ", update.dampening, ")");
  const std::vector<Tensor> g = grads_like_params(params, grads);
  const std::span<const Tensor> buffers = momentum ? momentum_buffers : std::span<const Tensor>{};
  const std::span<const uint8_t> fresh = momentum ? new_buffer : std::span<const uint8_t>{};
  detail::kernels_for(params[0].device(), op)
      .multi_tensor_sgd(params, g, buffers, fresh, update, device);
}

void multi_tensor_adam_(std::span<const Tensor> params, std::span<const Tensor> grads,
                        std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                        std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                        const AdamUpdate& update, const MultiTensorDeviceArgs& device) {
  constexpr const char* op = "multi_tensor_adam_";
  if (params.empty()) return;
  check_params(op, params);
  check_device_args(op, params, device);
  check_list(op, "grads", params, grads, false, true);
  check_list(op, "exp_avgs", params, exp_avgs, false);
  check_list(op, "exp_avg_sqs", params, exp_avg_sqs, false);
  EMBER_CHECK(update.amsgrad == (max_exp_avg_sqs.size() == params.size()), op, "amsgrad is ",
              update.amsgrad ? "on" : "off", " but max_exp_avg_sqs has ", max_exp_avg_sqs.size(),
              " tensors for ", params.size(), " parameters");
  check_list(op, "max_exp_avg_sqs", params, max_exp_avg_sqs, true);
  if (device.steps.empty()) {
    EMBER_CHECK(steps.size() == params.size(), op, "steps has ", steps.size(), " counts for ",
                params.size(), " parameters");
    for (size_t i = 0; i < steps.size(); ++i)
      EMBER_CHECK(steps[i] >= 1, op, "steps[", i, "] is ", steps[i], " (must be >= 1)");
  } else {
    EMBER_CHECK(steps.empty() && device.steps.size() == params.size(), op, "device steps has ",
                device.steps.size(), " counts and steps ", steps.size(), " for ", params.size(),
                " parameters (one list, one count per parameter)");
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& t = device.steps[i];
      EMBER_CHECK(t.defined() && t.dtype() == kI64 && t.dim() == 0, op, "device steps[", i,
                  "] must be a 0-d i64 tensor");
      EMBER_CHECK(t.device() == params[0].device(), op, "device steps[", i, "] is on ", t.device(),
                  " but the parameters are on ", params[0].device());
    }
  }
  const std::vector<Tensor> g = grads_like_params(params, grads);
  detail::kernels_for(params[0].device(), op)
      .multi_tensor_adam(params, g, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, update, device);
}

namespace {

// All tensors defined, flat, floating, on one device and of one dtype.
void check_same_kind(const char* op, std::span<const Tensor> tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    EMBER_CHECK(t.defined(), op, "tensors[", i, "] is undefined");
    EMBER_CHECK(is_floating(t.dtype()), op, "tensors[", i, "] has dtype ", t.dtype(),
                " (expected a floating dtype)");
    EMBER_CHECK(t.device() == tensors[0].device() && t.dtype() == tensors[0].dtype(), op,
                "tensors[", i, "] is ", t.dtype(), " on ", t.device(), " but tensors[0] is ",
                tensors[0].dtype(), " on ", tensors[0].device(),
                " (one device and dtype per call)");
    EMBER_CHECK(is_flat(t), op, "tensors[", i, "] is neither contiguous nor channels_last");
  }
}

}  // namespace

Tensor multi_tensor_norm(std::span<const Tensor> tensors, double p) {
  constexpr const char* op = "multi_tensor_norm";
  EMBER_CHECK(p > 0.0, op, "p must be > 0, got ", p);
  EMBER_CHECK(!tensors.empty(), op, "got no tensors");
  check_same_kind(op, tensors);
  const Tensor partials =
      detail::kernels_for(tensors[0].device(), op).multi_tensor_norm_partials(tensors, p);
  Tensor total = std::isinf(p) ? max(partials) : sum(partials);
  if (p == 2.0)
    total = sqrt(total);
  else if (!std::isinf(p) && p != 1.0)
    total = pow(total, 1.0 / p);
  return total.to(tensors[0].dtype());
}

void multi_tensor_mul_(std::span<const Tensor> tensors, const Tensor& scale) {
  constexpr const char* op = "multi_tensor_mul_";
  if (tensors.empty()) return;
  check_same_kind(op, tensors);
  EMBER_CHECK(scale.defined() && scale.dim() == 0 && scale.dtype() == tensors[0].dtype() &&
                  scale.device() == tensors[0].device(),
              op, "scale must be a 0-d tensor of dtype ", tensors[0].dtype(), " on ",
              tensors[0].device());
  detail::kernels_for(tensors[0].device(), op).multi_tensor_mul(tensors, scale);
}

}  // namespace ember
