// What the CPU normalisation kernels share (batch norm in layers.cpp, layer norm in
// layer_norm.cpp): per-channel values as doubles, sums in double over independent lanes, and
// column sums over blocks of rows combined in a fixed order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../detail/dispatch.h"
#include "../tensor.h"
#include "cpu_kernels.h"

namespace ember::detail {

// The values of a small per-channel tensor (any floating dtype) as doubles; `fallback`
// when undefined.
inline std::vector<double> to_doubles(const Tensor& t, int64_t n, double fallback) {
  if (!t.defined()) return std::vector<double>(static_cast<size_t>(n), fallback);
  EMBER_ASSERT(t.numel() == n && t.is_contiguous());
  return t.to_vector<double>();
}

// Writes doubles into a contiguous floating tensor of `values.size()` elements.
inline void store_doubles(const Tensor& t, const std::vector<double>& values) {
  EMBER_ASSERT(t.is_contiguous() && t.numel() == static_cast<int64_t>(values.size()));
  dispatch_floating(t.dtype(), "store_doubles", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data_ptr<T>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<T>(values[i]);
  });
}

// NOTE: the statistics accumulate in double over four independent lanes: one running
// sum is a chain of dependent adds that cannot vectorise, and batch norm's reductions are a
// large share of a CPU training step.
template <typename T>
double lane_sum(const T* p, int64_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a0 += static_cast<double>(p[i]);
    a1 += static_cast<double>(p[i + 1]);
    a2 += static_cast<double>(p[i + 2]);
    a3 += static_cast<double>(p[i + 3]);
  }
  for (; i < n; ++i) a0 += static_cast<double>(p[i]);
  return (a0 + a1) + (a2 + a3);
}

// sum((p - m)^2)
template <typename T>
double lane_sum_sq_dev(const T* p, int64_t n, double m) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const double d0 = static_cast<double>(p[i]) - m, d1 = static_cast<double>(p[i + 1]) - m;
    const double d2 = static_cast<double>(p[i + 2]) - m, d3 = static_cast<double>(p[i + 3]) - m;
    a0 += d0 * d0;
    a1 += d1 * d1;
    a2 += d2 * d2;
    a3 += d3 * d3;
  }
  for (; i < n; ++i) {
    const double d = static_cast<double>(p[i]) - m;
    a0 += d * d;
  }
  return (a0 + a1) + (a2 + a3);
}

// Column sums accumulate per block of kRowBlock rows and the blocks combine in order, so the
// result does not depend on the thread count (channels-last batch norm sees [N, C, S] with
// strides {S * C, 1, C}: N * S rows of C channels; layer norm's parameter gradients sum rows).
inline constexpr int64_t kRowBlock = 256;

// sums[j] over rows r of what add_row(r, acc) adds to acc[j], j < width.
template <typename AddRow>
std::vector<double> column_sums(int64_t rows, int64_t width, AddRow&& add_row) {
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<double> partial(static_cast<size_t>(blocks * width), 0.0);
#pragma omp parallel for schedule(static) if (rows * width >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    double* acc = partial.data() + b * width;
    const int64_t end = std::min(rows, (b + 1) * kRowBlock);
    for (int64_t r = b * kRowBlock; r < end; ++r) add_row(r, acc);
  }
  std::vector<double> sums(static_cast<size_t>(width), 0.0);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t j = 0; j < width; ++j) sums[j] += partial[b * width + j];
  }
  return sums;
}

}  // namespace ember::detail
