// Front ends of the loss-scaling ops: argument checks, then the device's kernel.
#include "ops_amp.h"

#include <cstdint>

#include "detail/op_utils.h"
#include "grad_mode.h"
#include "ops.h"

namespace ember {
namespace {

void check_one_f32(const Tensor& t, const char* op, const char* arg, DType dtype = kF32) {
  detail::check_defined(t, op, arg);
  EMBER_CHECK(t.numel() == 1 && t.dtype() == dtype, op, arg, " must be a 1-element ", dtype,
              " tensor, got ", t.dtype(), " with ", t.numel(), " elements");
}

}  // namespace

void amp_foreach_non_finite_check_and_unscale_(const std::vector<Tensor>& tensors,
                                               const Tensor& found_inf, const Tensor& inv_scale) {
  constexpr const char* op = "_amp_foreach_non_finite_check_and_unscale_";
  check_one_f32(found_inf, op, "found_inf");
  check_one_f32(inv_scale, op, "inv_scale");
  EMBER_CHECK(inv_scale.device() == found_inf.device(), op, "inv_scale is on ",
              inv_scale.device().str(), " but found_inf on ", found_inf.device().str());
  EMBER_CHECK(found_inf.is_contiguous() && inv_scale.is_contiguous(), op,
              "found_inf and inv_scale must be contiguous");
  NoGradGuard no_grad;
  // Kernels take contiguous tensors; a strided one is processed as a copy and written back.
  std::vector<Tensor> work;
  std::vector<std::pair<size_t, size_t>> write_back;  // (tensors index, work index)
  work.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::check_defined(t, op, "tensors");
    EMBER_CHECK(t.is_floating_point(), op, "tensor ", i, " has dtype ", t.dtype(),
                "; only floating tensors can be checked and unscaled");
    EMBER_CHECK(t.device() == found_inf.device(), op, "tensor ", i, " is on ", t.device().str(),
                " but found_inf on ", found_inf.device().str());
    if (t.is_contiguous()) {
      work.push_back(t);
    } else {
      write_back.emplace_back(i, work.size());
      work.push_back(t.contiguous());
    }
  }
  const auto& table = detail::kernels_for(found_inf.device(), op);
  detail::require_kernel(table.amp_non_finite_check_and_unscale, found_inf.device(), op)(
      work, found_inf, inv_scale);
  for (const auto& [from, to] : write_back) {
    Tensor target = tensors[from];
    target.copy_(work[to]);
  }
}

void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval) {
  constexpr const char* op = "_amp_update_scale_";
  check_one_f32(scale, op, "scale");
  check_one_f32(growth_tracker, op, "growth_tracker", kI32);
  check_one_f32(found_inf, op, "found_inf");
  EMBER_CHECK(growth_tracker.device() == scale.device() && found_inf.device() == scale.device(), op,
              "scale (", scale.device().str(), "), growth_tracker (", growth_tracker.device().str(),
              ") and found_inf (", found_inf.device().str(), ") must share a device");
  EMBER_CHECK(growth_interval > 0, op, "growth_interval must be positive, got ", growth_interval);
  EMBER_CHECK(growth_interval <= INT32_MAX, op, "growth_interval ", growth_interval,
              " does not fit growth_tracker's i32");
  EMBER_CHECK(scale.is_contiguous() && growth_tracker.is_contiguous() && found_inf.is_contiguous(),
              op, "scale, growth_tracker and found_inf must be contiguous");
  const auto& table = detail::kernels_for(scale.device(), op);
  detail::require_kernel(table.amp_update_scale, scale.device(), op)(
      scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval);
}

}  // namespace ember
