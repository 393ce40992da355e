// One element of a random fill, shared by the CPU (tensor/cpu/random.cpp) and CUDA
// (tensor/cuda/random.cu) kernels, so both draw the same bits for the same (seed, offset, i).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernel_table.h"
#include "philox.h"

namespace ember::detail {

// Element `index` of the draw (seed, offset) of `kind` as T, through `cast` (the device's
// element conversion): randint's integers in [low, low + range), uniform's [a, b) and normal's
// mean a, stddev b, in double for f64 and in float for every other T.
template <typename T, typename Cast>
EMBER_HOST_DEVICE inline T random_element(RandomKind kind, uint64_t seed, uint64_t offset,
                                          uint64_t index, double a, double b, int64_t low,
                                          uint64_t range, Cast cast) {
  if (kind == RandomKind::kRandint) return cast(random_int(seed, offset, index, low, range));
  if constexpr (std::is_same_v<T, double>) {
    return kind == RandomKind::kUniform ? random_uniform_double(seed, offset, index, a, b)
                                        : random_normal_double(seed, offset, index, a, b);
  } else {
    const float fa = static_cast<float>(a), fb = static_cast<float>(b);
    return cast(kind == RandomKind::kUniform ? random_uniform_float(seed, offset, index, fa, fb)
                                             : random_normal_float(seed, offset, index, fa, fb));
  }
}

}  // namespace ember::detail
