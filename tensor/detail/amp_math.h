// The dynamic loss scale's update (amp_update_scale_), shared by the CPU kernel and the
// one-thread CUDA kernel so both decide alike. As PyTorch's kernel: f32 arithmetic (the
// scale's dtype), a grown scale kept only while finite.
#pragma once

#include <cfloat>
#include <cstdint>

#include "../dtype.h"

namespace ember::detail {

EMBER_HOST_DEVICE inline void amp_update_scale_value(float& scale, int32_t& tracker,
                                                     float found_inf, double growth_factor,
                                                     double backoff_factor,
                                                     int64_t growth_interval) {
  if (found_inf != 0.f) {
    scale *= static_cast<float>(backoff_factor);
    tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(tracker) + 1;
  if (successful == growth_interval) {
    const float grown = scale * static_cast<float>(growth_factor);
    if (grown <= FLT_MAX && grown >= -FLT_MAX) scale = grown;  // neither inf nor NaN
    tracker = 0;
  } else {
    tracker = static_cast<int32_t>(successful);
  }
}

}  // namespace ember::detail
