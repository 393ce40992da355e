// The two tensor ops behind loss scaling (optim::GradScaler), as PyTorch's
// torch._amp_foreach_non_finite_check_and_unscale_ and torch._amp_update_scale_. They keep
// the scale and the inf flag in tensors on the gradients' device, so checking and unscaling
// need no host round trip.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor.h"

namespace ember {

// For every element of every tensor: found_inf = 1 where one is inf or NaN, and each element
// is multiplied by inv_scale (in float; f64 tensors in double) unless inv_scale is exactly 1.
// All tensors sit on found_inf's device and are floating (mixed dtypes are fine); found_inf
// and inv_scale are 1-element f32 tensors. One pass over all tensors: on CUDA a
// multi-tensor kernel per dtype among them (a few launches for all gradients, never one per
// tensor; found_inf and inv_scale stay on the device, so the pass can be graph-captured).
// found_inf is only ever set, never cleared.
void amp_foreach_non_finite_check_and_unscale_(const std::vector<Tensor>& tensors,
                                               const Tensor& found_inf, const Tensor& inv_scale);

// One dynamic-loss-scale update in place: with found_inf != 0, scale *= backoff_factor and
// growth_tracker = 0; otherwise growth_tracker += 1, and when it reaches growth_interval,
// scale *= growth_factor (kept only if the product is finite, in f32) and growth_tracker = 0.
// scale and found_inf are 1-element f32, growth_tracker 1-element i32, all on one device.
// Decided where the values lie (one thread of one kernel on CUDA): nothing is read back, so
// the update never waits for the GPU and can be graph-captured.
void amp_update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                       double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace ember
