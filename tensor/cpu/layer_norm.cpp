// CPU kernels of layer norm over rows [rows, n] (GPT layers; CUDA: tensor/cuda/layer_norm.cu).
#include <cmath>
#include <type_traits>
#include <vector>

#include "../detail/dispatch.h"
#include "row_stats.h"

namespace ember::detail {
namespace {

// Each row's statistics accumulate in double over
// lanes, rows split across threads; the weight and bias gradients are column sums over blocks
// of rows combined in order (column_sums), so results do not depend on the thread count.

// The values of a parameter vector in the compute type A (`fallback` when undefined).
template <typename A>
std::vector<A> param_values(const Tensor& t, int64_t n, double fallback) {
  const std::vector<double> v = to_doubles(t, n, fallback);
  return std::vector<A>(v.begin(), v.end());
}

template <typename T>
void layer_norm_forward_typed(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                              const Tensor& input, const Tensor& weight, const Tensor& bias,
                              double eps) {
  using A = acc_t<T>;  // also the saved mean and rstd's element type
  const int64_t rows = input.size(0), n = input.size(1);
  const T* x = input.data_ptr<T>();
  T* y = out.data_ptr<T>();
  A* mean_out = mean.data_ptr<A>();
  A* rstd_out = rstd.data_ptr<A>();
  const std::vector<A> w = param_values<A>(weight, n, 1.0), b = param_values<A>(bias, n, 0.0);
  const bool affine = weight.defined() || bias.defined();
#pragma omp parallel for schedule(static) if (rows * n >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* p = x + r * n;
    T* q = y + r * n;
    const double m = lane_sum(p, n) / static_cast<double>(n);
    const double var = lane_sum_sq_dev(p, n, m) / static_cast<double>(n);
    mean_out[r] = static_cast<A>(m);
    rstd_out[r] = static_cast<A>(1.0 / std::sqrt(var + eps));
    const A mr = static_cast<A>(mean_out[r]), rr = static_cast<A>(rstd_out[r]);
    if (affine) {
      for (int64_t j = 0; j < n; ++j)
        q[j] = static_cast<T>((static_cast<A>(p[j]) - mr) * rr * w[j] + b[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) q[j] = static_cast<T>((static_cast<A>(p[j]) - mr) * rr);
    }
  }
}

void layer_norm_forward_cpu(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                            const Tensor& input, const Tensor& weight, const Tensor& bias,
                            double eps) {
  EMBER_ASSERT(input.dim() == 2 && input.is_contiguous() && out.is_contiguous());
  dispatch_floating(input.dtype(), "layer_norm", [&](auto tag) {
    layer_norm_forward_typed<typename decltype(tag)::type>(out, mean, rstd, input, weight, bias,
                                                           eps);
  });
}

template <typename T>
void layer_norm_backward_typed(const Tensor& grad_input, const Tensor& grad_weight,
                               const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  using A = acc_t<T>;  // also the saved mean and rstd's element type
  const int64_t rows = input.size(0), n = input.size(1);
  const T* x = input.data_ptr<T>();
  const T* gy = grad_out.data_ptr<T>();
  const A* mean_in = mean.data_ptr<A>();
  const A* rstd_in = rstd.data_ptr<A>();
  const std::vector<A> w = param_values<A>(weight, n, 1.0);
  if (grad_input.defined()) {
    T* gx = grad_input.data_ptr<T>();
#pragma omp parallel for schedule(static) if (rows * n >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* p = x + r * n;
      const T* g = gy + r * n;
      const A m = static_cast<A>(mean_in[r]), rs = static_cast<A>(rstd_in[r]);
      double sum_g = 0, sum_gx = 0;  // sum(g * w) and sum(g * w * xhat)
      for (int64_t j = 0; j < n; ++j) {
        const A gw = static_cast<A>(g[j]) * w[j];
        sum_g += static_cast<double>(gw);
        sum_gx += static_cast<double>(gw * (static_cast<A>(p[j]) - m) * rs);
      }
      const A c1 = static_cast<A>(sum_g / static_cast<double>(n));
      const A c2 = static_cast<A>(sum_gx / static_cast<double>(n));
      T* q = gx + r * n;
      for (int64_t j = 0; j < n; ++j) {
        const A xhat = (static_cast<A>(p[j]) - m) * rs;
        q[j] = static_cast<T>(rs * (static_cast<A>(g[j]) * w[j] - c1 - xhat * c2));
      }
    }
  }
  if (!grad_weight.defined() && !grad_bias.defined()) return;
  // Columns [0, n): sum(g * xhat); [n, 2n): sum(g).
  const std::vector<double> sums = column_sums(rows, 2 * n, [&](int64_t r, double* acc) {
    const T* p = x + r * n;
    const T* g = gy + r * n;
    const double m = static_cast<double>(mean_in[r]), rs = static_cast<double>(rstd_in[r]);
    for (int64_t j = 0; j < n; ++j) {
      const double gj = static_cast<double>(g[j]);
      acc[j] += gj * (static_cast<double>(p[j]) - m) * rs;
      acc[n + j] += gj;
    }
  });
  if (grad_weight.defined())
    store_doubles(grad_weight, std::vector<double>(sums.begin(), sums.begin() + n));
  if (grad_bias.defined())
    store_doubles(grad_bias, std::vector<double>(sums.begin() + n, sums.end()));
}

void layer_norm_backward_cpu(const Tensor& grad_input, const Tensor& grad_weight,
                             const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                             const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  EMBER_ASSERT(input.dim() == 2 && input.is_contiguous() && grad_out.is_contiguous());
  dispatch_floating(input.dtype(), "layer_norm", [&](auto tag) {
    layer_norm_backward_typed<typename decltype(tag)::type>(grad_input, grad_weight, grad_bias,
                                                            grad_out, input, weight, mean, rstd);
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(layer_norm) {
  table.layer_norm_forward = &layer_norm_forward_cpu;
  table.layer_norm_backward = &layer_norm_backward_cpu;
}

}  // namespace ember::detail
