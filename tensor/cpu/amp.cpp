// CPU kernels for loss scaling: the inf/NaN check and unscale of every gradient in one pass,
// and the scale's update.
#include <cmath>
#include <type_traits>
#include <vector>

#include "../detail/amp_math.h"
#include "../detail/dispatch.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

// As torch's _amp_foreach_non_finite_check_and_unscale_ on the CPU: each element is read in
// its compute type (float for f16/bf16/f32, double for f64), flagged when not finite, and
// multiplied by inv_scale unless inv_scale is 1 (so a disabled scale leaves bits untouched).
void amp_non_finite_check_and_unscale_cpu(const std::vector<Tensor>& tensors,
                                          const Tensor& found_inf, const Tensor& inv_scale) {
  float* found = found_inf.data_ptr<float>();
  const float inv = *inv_scale.data_ptr<float>();
  bool any_non_finite = false;
  for (const Tensor& t : tensors) {
    dispatch_floating(t.dtype(), "_amp_foreach_non_finite_check_and_unscale_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      using C = acc_t<T>;
      T* data = static_cast<T*>(t.data_ptr());
      const int64_t n = t.numel();
      bool local = false;
#pragma omp parallel for reduction(|| : local) if (n >= kParallelGrain)
      for (int64_t i = 0; i < n; ++i) {
        const C value = static_cast<C>(data[i]);
        if (!std::isfinite(value)) local = true;
        if (inv != 1.f) data[i] = static_cast<T>(value * static_cast<C>(inv));
      }
      any_non_finite = any_non_finite || local;
    });
  }
  if (any_non_finite) *found = 1.f;
}

void amp_update_scale_cpu(const Tensor& scale, const Tensor& growth_tracker,
                          const Tensor& found_inf, double growth_factor, double backoff_factor,
                          int64_t growth_interval) {
  amp_update_scale_value(*static_cast<float*>(scale.data_ptr()),
                         *static_cast<int32_t*>(growth_tracker.data_ptr()),
                         *static_cast<const float*>(found_inf.data_ptr()), growth_factor,
                         backoff_factor, growth_interval);
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(amp) {
  table.amp_non_finite_check_and_unscale = amp_non_finite_check_and_unscale_cpu;
  table.amp_update_scale = amp_update_scale_cpu;
}

}  // namespace ember::detail
