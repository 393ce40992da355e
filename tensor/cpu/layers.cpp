// CPU kernels for batch norm and cross-entropy (layer norm: layer_norm.cpp; pooling: pooling.cpp).
// Statistics and sums accumulate in double; planes and channels split across OpenMP threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "../detail/dispatch.h"
#include "../detail/op_utils.h"
#include "../ops.h"
#include "row_stats.h"

namespace ember::detail {
namespace {

// ---------------------------------------------------------------------------------------
// Batch norm over [N, C, S].

// sum(g) and sum(g * (p - m))
template <typename T>
void lane_sum_grad(const T* g, const T* p, int64_t n, double m, double& sum_g, double& sum_gx) {
  double s0 = 0, s1 = 0, x0 = 0, x1 = 0;
  int64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const double g0 = static_cast<double>(g[i]), g1 = static_cast<double>(g[i + 1]);
    s0 += g0;
    s1 += g1;
    x0 += g0 * (static_cast<double>(p[i]) - m);
    x1 += g1 * (static_cast<double>(p[i + 1]) - m);
  }
  for (; i < n; ++i) {
    const double g0 = static_cast<double>(g[i]);
    s0 += g0;
    x0 += g0 * (static_cast<double>(p[i]) - m);
  }
  sum_g += s0 + s1;
  sum_gx += x0 + x1;
}

// running = (1 - momentum) * running + momentum * batch (the variance unbiased).
void update_running_stats(const Tensor& running_mean, const Tensor& running_var,
                          const std::vector<double>& mean, const std::vector<double>& var,
                          int64_t count, double momentum) {
  const int64_t C = static_cast<int64_t>(mean.size());
  if (running_mean.defined()) {
    std::vector<double> rm = to_doubles(running_mean, C, 0.0);
    for (int64_t c = 0; c < C; ++c) rm[c] = (1 - momentum) * rm[c] + momentum * mean[c];
    store_doubles(running_mean, rm);
  }
  if (running_var.defined()) {
    std::vector<double> rv = to_doubles(running_var, C, 1.0);
    const double unbias = count > 1 ? static_cast<double>(count) / static_cast<double>(count - 1)
                                    : std::numeric_limits<double>::quiet_NaN();
    for (int64_t c = 0; c < C; ++c) rv[c] = (1 - momentum) * rv[c] + momentum * var[c] * unbias;
    store_doubles(running_var, rv);
  }
}

// Both NCHW-contiguous or both channels-last rows (the layouts the kernels walk).
bool same_layout(const Tensor& a, const Tensor& b) {
  return !b.defined() || (a.is_contiguous() && b.is_contiguous()) ||
         (is_channels_last_rows(a) && is_channels_last_rows(b));
}

// Channel means and biased variances of channels-last rows x [rows, C].
template <typename T>
void channels_last_stats(const T* x, int64_t rows, int64_t C, std::vector<double>& mean,
                         std::vector<double>& var) {
  const double count = static_cast<double>(rows);
  mean = column_sums(rows, C, [&](int64_t r, double* acc) {
    const T* p = x + r * C;
    for (int64_t c = 0; c < C; ++c) acc[c] += static_cast<double>(p[c]);
  });
  for (double& m : mean) m = rows > 0 ? m / count : 0.0;
  var = column_sums(rows, C, [&](int64_t r, double* acc) {  // second pass, as the NCHW loop
    const T* p = x + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(p[c]) - mean[c];
      acc[c] += d * d;
    }
  });
  for (double& v : var) v = rows > 0 ? v / count : 0.0;
}

// The output of a batch-norm element: the affine value v (in A), then, fused with a ReLU,
// rounded to T as the unfused batch_norm's output is, plus the residual, and clamped at 0
// (the same comparison as relu: NaN passes through). So the fused ops round exactly as the
// unfused composition does, 16-bit types included.
template <bool kRelu, typename T, typename A>
inline T bn_output(A v, const T* residual, int64_t i) {
  if constexpr (kRelu) {
    if (residual != nullptr) v = static_cast<A>(static_cast<T>(v)) + static_cast<A>(residual[i]);
    return static_cast<T>(v < A(0) ? A(0) : v);
  } else {
    return static_cast<T>(v);
  }
}

// y[r, c] = x[r, c] * scale[c] + shift[c] over channels-last rows (then the fused epilogue).
template <bool kRelu, typename T, typename A>
void channels_last_affine(T* y, const T* x, const T* residual, int64_t rows, int64_t C,
                          const std::vector<A>& scale, const std::vector<A>& shift) {
#pragma omp parallel for schedule(static) if (rows * C >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* p = x + r * C;
    T* q = y + r * C;
    const T* res = residual != nullptr ? residual + r * C : nullptr;
    for (int64_t c = 0; c < C; ++c)
      q[c] = bn_output<kRelu>(static_cast<A>(p[c]) * scale[c] + shift[c], res, c);
  }
}

// Batch norm, or (kRelu) relu(batch norm + residual) with residual possibly null.
template <typename T, bool kRelu>
void batch_norm_forward_typed(const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd,
                              const Tensor& input, const Tensor& residual_t, const Tensor& weight,
                              const Tensor& bias, const Tensor& running_mean,
                              const Tensor& running_var, bool training, double momentum,
                              double eps) {
  const int64_t N = input.size(0), C = input.size(1),
                S = input.numel() / std::max<int64_t>(1, N * C);
  const T* x = input.data_ptr<T>();
  const T* residual = residual_t.defined() ? residual_t.data_ptr<T>() : nullptr;
  T* y = out.data_ptr<T>();
  const std::vector<double> w = to_doubles(weight, C, 1.0), b = to_doubles(bias, C, 0.0);
  std::vector<double> mean(static_cast<size_t>(C)), invstd(static_cast<size_t>(C));
  const int64_t count = N * S;
  const bool cl = is_channels_last_rows(input);
  if (training && cl) {
    std::vector<double> var;
    channels_last_stats(x, count, C, mean, var);
    for (int64_t c = 0; c < C; ++c) invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    update_running_stats(running_mean, running_var, mean, var, count, momentum);
  } else if (training) {
    std::vector<double> var(static_cast<size_t>(C));
#pragma omp parallel for schedule(static) if (input.numel() >= kParallelGrain)
    for (int64_t c = 0; c < C; ++c) {
      double sum = 0;
      for (int64_t n = 0; n < N; ++n) sum += lane_sum(x + (n * C + c) * S, S);
      const double m = count > 0 ? sum / static_cast<double>(count) : 0.0;
      double sq = 0;  // second pass: no cancellation for large means
      for (int64_t n = 0; n < N; ++n) sq += lane_sum_sq_dev(x + (n * C + c) * S, S, m);
      mean[c] = m;
      var[c] = count > 0 ? sq / static_cast<double>(count) : 0.0;
      invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    }
    update_running_stats(running_mean, running_var, mean, var, count, momentum);
  } else {
    mean = to_doubles(running_mean, C, 0.0);
    const std::vector<double> rv = to_doubles(running_var, C, 1.0);
    for (int64_t c = 0; c < C; ++c) invstd[c] = 1.0 / std::sqrt(rv[c] + eps);
  }
  store_doubles(save_mean, mean);
  store_doubles(save_invstd, invstd);
  using A = acc_t<T>;
  if (cl) {
    std::vector<A> scale(static_cast<size_t>(C)), shift(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      scale[c] = static_cast<A>(w[c] * invstd[c]);
      shift[c] = static_cast<A>(b[c] - mean[c] * w[c] * invstd[c]);
    }
    channels_last_affine<kRelu>(y, x, residual, count, C, scale, shift);
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (input.numel() >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const A scale = static_cast<A>(w[c] * invstd[c]);
      const A shift = static_cast<A>(b[c] - mean[c] * w[c] * invstd[c]);
      const T* p = x + (n * C + c) * S;
      T* q = y + (n * C + c) * S;
      const T* res = residual != nullptr ? residual + (n * C + c) * S : nullptr;
      for (int64_t i = 0; i < S; ++i)
        q[i] = bn_output<kRelu>(static_cast<A>(p[i]) * scale + shift, res, i);
    }
  }
}

void batch_norm_forward_cpu(const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd,
                            const Tensor& input, const Tensor& weight, const Tensor& bias,
                            const Tensor& running_mean, const Tensor& running_var, bool training,
                            double momentum, double eps) {
  EMBER_ASSERT(input.dim() >= 2 && same_layout(input, input) && same_layout(input, out));
  dispatch_floating(input.dtype(), "batch_norm", [&](auto tag) {
    batch_norm_forward_typed<typename decltype(tag)::type, false>(
        out, save_mean, save_invstd, input, Tensor(), weight, bias, running_mean, running_var,
        training, momentum, eps);
  });
}

void batch_norm_relu_forward_cpu(const Tensor& out, const Tensor& save_mean,
                                 const Tensor& save_invstd, const Tensor& input,
                                 const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                 const Tensor& running_mean, const Tensor& running_var,
                                 bool training, double momentum, double eps) {
  EMBER_ASSERT(input.dim() >= 2 && same_layout(input, out) && same_layout(input, residual) &&
               (!residual.defined() || residual.dtype() == input.dtype()));
  dispatch_floating(input.dtype(), "batch_norm_relu", [&](auto tag) {
    batch_norm_forward_typed<typename decltype(tag)::type, true>(
        out, save_mean, save_invstd, input, residual, weight, bias, running_mean, running_var,
        training, momentum, eps);
  });
}

template <typename T>
void batch_norm_backward_typed(const Tensor& grad_input, const Tensor& grad_weight,
                               const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                               const Tensor& weight, const Tensor& save_mean,
                               const Tensor& save_invstd, bool training) {
  const int64_t N = input.size(0), C = input.size(1),
                S = input.numel() / std::max<int64_t>(1, N * C);
  const T* x = input.data_ptr<T>();
  const T* gy = grad_out.data_ptr<T>();
  const std::vector<double> w = to_doubles(weight, C, 1.0);
  const std::vector<double> mean = to_doubles(save_mean, C, 0.0);
  const std::vector<double> invstd = to_doubles(save_invstd, C, 1.0);
  // Per channel: sum(gy) and sum(gy * xhat).
  std::vector<double> sum_gy(static_cast<size_t>(C)), sum_gy_xhat(static_cast<size_t>(C));
  const bool cl = is_channels_last_rows(input);
  const int64_t rows = N * S;
  if (cl) {
    const std::vector<double> sums = column_sums(rows, 2 * C, [&](int64_t r, double* acc) {
      const T* p = x + r * C;
      const T* g = gy + r * C;
      for (int64_t c = 0; c < C; ++c) {
        const double g0 = static_cast<double>(g[c]);
        acc[c] += g0;
        acc[C + c] += g0 * (static_cast<double>(p[c]) - mean[c]);
      }
    });
    for (int64_t c = 0; c < C; ++c) {
      sum_gy[c] = sums[c];
      sum_gy_xhat[c] = sums[C + c] * invstd[c];
    }
  }
#pragma omp parallel for schedule(static) if (!cl && input.numel() >= kParallelGrain)
  for (int64_t c = 0; c < (cl ? 0 : C); ++c) {
    double s = 0, sx = 0;
    for (int64_t n = 0; n < N; ++n) {
      lane_sum_grad(gy + (n * C + c) * S, x + (n * C + c) * S, S, mean[c], s, sx);
    }
    sum_gy[c] = s;
    sum_gy_xhat[c] = sx * invstd[c];
  }
  if (grad_weight.defined()) store_doubles(grad_weight, sum_gy_xhat);
  if (grad_bias.defined()) store_doubles(grad_bias, sum_gy);
  if (!grad_input.defined()) return;
  T* gx = grad_input.data_ptr<T>();
  const double count = static_cast<double>(N * S);
  using A = acc_t<T>;
  if (cl) {
    // gx = a * gy + bx * x + d per channel, as below; eval mode leaves bx = d = 0.
    std::vector<A> a(static_cast<size_t>(C)), bx(static_cast<size_t>(C)), d(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double k = w[c] * invstd[c];
      const double mg = sum_gy[c] / count, mgx = sum_gy_xhat[c] / count;
      const double kb = training ? -k * mgx * invstd[c] : 0.0;
      a[c] = static_cast<A>(k);
      bx[c] = static_cast<A>(kb);
      d[c] = static_cast<A>(training ? -k * mg - kb * mean[c] : 0.0);
    }
#pragma omp parallel for schedule(static) if (input.numel() >= kParallelGrain)
    for (int64_t r = 0; r < rows; ++r) {
      const T* p = x + r * C;
      const T* g = gy + r * C;
      T* q = gx + r * C;
      for (int64_t c = 0; c < C; ++c) {
        q[c] = static_cast<T>(a[c] * static_cast<A>(g[c]) + bx[c] * static_cast<A>(p[c]) + d[c]);
      }
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (input.numel() >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      const T* p = x + (n * C + c) * S;
      const T* g = gy + (n * C + c) * S;
      T* q = gx + (n * C + c) * S;
      const double k = w[c] * invstd[c];
      if (!training) {
        const A scale = static_cast<A>(k);
        for (int64_t i = 0; i < S; ++i) q[i] = static_cast<T>(static_cast<A>(g[i]) * scale);
        continue;
      }
      // gx = k * (gy - mean(gy) - xhat * mean(gy * xhat)), xhat = (x - mean) * invstd,
      // folded into gx = a * gy + b * x + d.
      const double mg = sum_gy[c] / count, mgx = sum_gy_xhat[c] / count;
      const double bx = -k * mgx * invstd[c];
      const A a = static_cast<A>(k), bb = static_cast<A>(bx),
              d = static_cast<A>(-k * mg - bx * mean[c]);
      for (int64_t i = 0; i < S; ++i) {
        q[i] = static_cast<T>(a * static_cast<A>(g[i]) + bb * static_cast<A>(p[i]) + d);
      }
    }
  }
}

// The fused backward: gm = output > 0 ? grad_out : 0 in one pass (into grad_residual, or a
// buffer of its own when the residual needs none), then batch norm's backward of gm.
template <typename T>
void batch_norm_relu_backward_typed(const Tensor& grad_input, const Tensor& grad_residual,
                                    const Tensor& grad_weight, const Tensor& grad_bias,
                                    const Tensor& grad_out, const Tensor& output,
                                    const Tensor& input, const Tensor& weight,
                                    const Tensor& save_mean, const Tensor& save_invstd,
                                    bool training) {
  const Tensor gm = grad_residual.defined()
                        ? grad_residual
                        : empty({grad_out.numel()}, grad_out.options())
                              .as_strided(grad_out.sizes(), grad_out.strides(), 0);
  const T* g = grad_out.data_ptr<T>();
  const T* y = output.data_ptr<T>();
  T* m = gm.data_ptr<T>();
  const int64_t total = grad_out.numel();
#pragma omp parallel for schedule(static) if (total >= kParallelGrain)
  for (int64_t i = 0; i < total; ++i) {
    // Both values loaded unconditionally: a select, not a branch on the (random) sign.
    const acc_t<T> gv = static_cast<acc_t<T>>(g[i]), yv = static_cast<acc_t<T>>(y[i]);
    m[i] = static_cast<T>(yv > 0 ? gv : acc_t<T>(0));
  }
  if (grad_input.defined() || grad_weight.defined() || grad_bias.defined()) {
    batch_norm_backward_typed<T>(grad_input, grad_weight, grad_bias, gm, input, weight, save_mean,
                                 save_invstd, training);
  }
}

void batch_norm_relu_backward_cpu(const Tensor& grad_input, const Tensor& grad_residual,
                                  const Tensor& grad_weight, const Tensor& grad_bias,
                                  const Tensor& grad_out, const Tensor& output, const Tensor& input,
                                  const Tensor& weight, const Tensor& save_mean,
                                  const Tensor& save_invstd, bool training) {
  // Every activation-shaped tensor is dense in the input's layout, so one flat walk pairs
  // their elements.
  EMBER_ASSERT(input.dim() >= 2 && same_layout(input, grad_out) && same_layout(input, output) &&
               same_layout(input, grad_input) && same_layout(input, grad_residual));
  dispatch_floating(input.dtype(), "batch_norm_relu_backward", [&](auto tag) {
    batch_norm_relu_backward_typed<typename decltype(tag)::type>(
        grad_input, grad_residual, grad_weight, grad_bias, grad_out, output, input, weight,
        save_mean, save_invstd, training);
  });
}

void batch_norm_backward_cpu(const Tensor& grad_input, const Tensor& grad_weight,
                             const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                             const Tensor& weight, const Tensor& save_mean,
                             const Tensor& save_invstd, bool training) {
  EMBER_ASSERT(input.dim() >= 2 && same_layout(input, input) && same_layout(input, grad_out) &&
               same_layout(input, grad_input));
  dispatch_floating(input.dtype(), "batch_norm_backward", [&](auto tag) {
    batch_norm_backward_typed<typename decltype(tag)::type>(grad_input, grad_weight, grad_bias,
                                                            grad_out, input, weight, save_mean,
                                                            save_invstd, training);
  });
}

// ---------------------------------------------------------------------------------------
// Cross-entropy over logits [N, C].

template <typename T>
void cross_entropy_forward_typed(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                 const Tensor& target, int64_t ignore_index, double smoothing) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const T* x = logits.data_ptr<T>();
  const int64_t* t = target.data_ptr<int64_t>();
  T* l = loss.data_ptr<T>();
  T* s = lse.data_ptr<T>();
  for (int64_t n = 0; n < N; ++n) {
    EMBER_ASSERT(t[n] == ignore_index || (t[n] >= 0 && t[n] < C), "cross_entropy target ", t[n]);
  }
#pragma omp parallel for schedule(static) if (logits.numel() >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* row = x + n * C;
    double m = -std::numeric_limits<double>::infinity(), total = 0;
    for (int64_t c = 0; c < C; ++c) {
      m = std::max(m, static_cast<double>(row[c]));
      total += static_cast<double>(row[c]);
    }
    double e = 0;
    if (std::isinf(m)) {
      e = 1;  // all -inf (lse -inf) or some +inf (lse +inf): exp(x - m) would give NaN
    } else {
      for (int64_t c = 0; c < C; ++c) e += std::exp(static_cast<double>(row[c]) - m);
    }
    const double logsumexp = m + std::log(e);
    s[n] = static_cast<T>(logsumexp);
    if (t[n] == ignore_index) {
      l[n] = T(0);
      continue;
    }
    double value = logsumexp - (1.0 - smoothing) * static_cast<double>(row[t[n]]);
    if (smoothing != 0.0) value -= smoothing / static_cast<double>(C) * total;
    l[n] = static_cast<T>(value);
  }
}

template <typename T>
void cross_entropy_backward_typed(const Tensor& grad_logits, const Tensor& grad_loss,
                                  const Tensor& logits, const Tensor& lse, const Tensor& target,
                                  int64_t ignore_index, double smoothing) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const T* x = logits.data_ptr<T>();
  const T* gl = grad_loss.data_ptr<T>();
  const T* s = lse.data_ptr<T>();
  const int64_t* t = target.data_ptr<int64_t>();
  T* gx = grad_logits.data_ptr<T>();
  // grad_loss may be one value broadcast over N (stride 0).
  const int64_t gl_stride = grad_loss.numel() == 1 ? 0 : grad_loss.stride(0);
  const double off = smoothing / static_cast<double>(C);
#pragma omp parallel for schedule(static) if (logits.numel() >= kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    T* out = gx + n * C;
    if (t[n] == ignore_index) {
      std::fill(out, out + C, T(0));
      continue;
    }
    const T* row = x + n * C;
    const double g = static_cast<double>(gl[n * gl_stride]), l = static_cast<double>(s[n]);
    for (int64_t c = 0; c < C; ++c) {
      double v = std::exp(static_cast<double>(row[c]) - l) - off;
      if (c == t[n]) v -= 1.0 - smoothing;
      out[c] = static_cast<T>(g * v);
    }
  }
}

void cross_entropy_forward_cpu(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                               const Tensor& target, int64_t ignore_index, double smoothing) {
  EMBER_ASSERT(logits.is_contiguous() && target.is_contiguous() && loss.is_contiguous() &&
               lse.is_contiguous());
  dispatch_floating(logits.dtype(), "cross_entropy", [&](auto tag) {
    cross_entropy_forward_typed<typename decltype(tag)::type>(loss, lse, logits, target,
                                                              ignore_index, smoothing);
  });
}

void cross_entropy_backward_cpu(const Tensor& grad_logits, const Tensor& grad_loss,
                                const Tensor& logits, const Tensor& lse, const Tensor& target,
                                int64_t ignore_index, double smoothing) {
  EMBER_ASSERT(logits.is_contiguous() && target.is_contiguous() && grad_logits.is_contiguous() &&
               lse.is_contiguous());
  dispatch_floating(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    cross_entropy_backward_typed<typename decltype(tag)::type>(grad_logits, grad_loss, logits, lse,
                                                               target, ignore_index, smoothing);
  });
}
}  // namespace

EMBER_REGISTER_CPU_KERNELS(layers) {
  table.batch_norm_relu_forward = &batch_norm_relu_forward_cpu;
  table.batch_norm_relu_backward = &batch_norm_relu_backward_cpu;
  table.batch_norm_forward = &batch_norm_forward_cpu;
  table.batch_norm_backward = &batch_norm_backward_cpu;
  table.cross_entropy_forward = &cross_entropy_forward_cpu;
  table.cross_entropy_backward = &cross_entropy_backward_cpu;
}

}  // namespace ember::detail
