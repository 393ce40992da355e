// CPU kernels for max, average and adaptive-average pooling, forward and backward, in NCHW
// (planes of H x W, split across threads by plane) and in channels_last (rows of C channels
// per pixel, split by image, the channel loop innermost). Both layouts visit each output's
// taps in the same order and accumulate alike, so their values are bitwise equal.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../detail/dispatch.h"
#include "../detail/op_utils.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

struct PoolGeometry {
  int64_t n, c, h, w, ho, wo;
  bool cl;  // every tensor of the call is channels_last (else NCHW)
};

PoolGeometry pool_geometry(const Tensor& input_like, const Tensor& output_like) {
  return {input_like.size(0),
          input_like.size(1),
          input_like.size(2),
          input_like.size(3),
          output_like.size(2),
          output_like.size(3),
          pooling_channels_last({&input_like, &output_like})};
}

// The window of output (oh, ow) in average pooling: rows [h0, h1), columns [w0, w1) inside
// the input, and the divisor PyTorch uses.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};

AvgWindow avg_window(const Pool2dParams& p, int64_t h, int64_t w, int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = std::min(h0 + p.kernel[0], h + p.padding[0]);
  int64_t w1 = std::min(w0 + p.kernel[1], w + p.padding[1]);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, h);
  w1 = std::min(w1, w);
  const int64_t divisor = p.count_include_pad ? padded : (h1 - h0) * (w1 - w0);
  return {h0, h1, w0, w1, divisor};
}

// Adaptive windows: [floor(i * in / out), ceil((i + 1) * in / out)).
AvgWindow adaptive_window(const PoolGeometry& g, int64_t oh, int64_t ow) {
  const int64_t h0 = (oh * g.h) / g.ho, h1 = ((oh + 1) * g.h + g.ho - 1) / g.ho;
  const int64_t w0 = (ow * g.w) / g.wo, w1 = ((ow + 1) * g.w + g.wo - 1) / g.wo;
  return {h0, h1, w0, w1, (h1 - h0) * (w1 - w0)};
}

// ---------------------------------------------------------------------------------------
// Max pooling. NaN wins (as PyTorch); ties keep the first position; a window whose taps all
// miss the input (large dilation) gives -inf and index -1. Indices are h * W + w in the plane.

// Calls tap(ih, iw) for the taps of output (oh, ow)'s window that fall inside the input, rows
// first, until it returns false.
template <typename Tap>
void for_each_tap(const Pool2dParams& p, const PoolGeometry& g, int64_t oh, int64_t ow, Tap&& tap) {
  for (int64_t i = 0; i < p.kernel[0]; ++i) {
    const int64_t ih = oh * p.stride[0] - p.padding[0] + i * p.dilation[0];
    if (ih < 0 || ih >= g.h) continue;
    for (int64_t j = 0; j < p.kernel[1]; ++j) {
      const int64_t iw = ow * p.stride[1] - p.padding[1] + j * p.dilation[1];
      if (iw >= 0 && iw < g.w && !tap(ih, iw)) return;
    }
  }
}

// Channels-last forward: row(r, n, oh, ow, scratch) for each output pixel r (its C channels
// at y + r * C), pixels split across threads, each thread with a scratch row of C values.
template <typename A, typename Row>
void for_each_output_pixel(const PoolGeometry& g, bool parallel, Row&& row) {
#pragma omp parallel if (parallel)
  {
    std::vector<A> scratch(static_cast<size_t>(g.c));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < g.n * g.ho * g.wo; ++r)
      row(r, r / (g.wo * g.ho), (r / g.wo) % g.ho, r % g.wo, scratch);
  }
}

template <typename T>
void max_pool_forward_typed(const Tensor& out, const Tensor& indices, const Tensor& input,
                            const Pool2dParams& p) {
  const PoolGeometry g = pool_geometry(input, out);
  const T* x = input.data_ptr<T>();
  T* y = out.data_ptr<T>();
  int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t taps = p.kernel[0] * p.kernel[1];
  using A = acc_t<T>;
  if (g.cl) {
    for_each_output_pixel<A>(
        g, out.numel() * taps >= kParallelGrain,
        [&](int64_t r, int64_t n, int64_t oh, int64_t ow, std::vector<A>& best_value) {
          int64_t* best = idx + r * g.c;
          std::fill(best, best + g.c, int64_t{-1});
          std::fill(best_value.begin(), best_value.end(), -std::numeric_limits<A>::infinity());
          bool first = true;
          for_each_tap(p, g, oh, ow, [&](int64_t ih, int64_t iw) {
            const T* px = x + ((n * g.h + ih) * g.w + iw) * g.c;
            const int64_t at = ih * g.w + iw;
            A* bv = best_value.data();
            if (first) {  // the first tap inside the input starts the search, -inf included
              for (int64_t c = 0; c < g.c; ++c) bv[c] = static_cast<A>(px[c]);
              std::fill(best, best + g.c, at);
              first = false;
              return true;
            }
            // Branch-free, so the channel loop vectorises: a larger value, or the first NaN.
            for (int64_t c = 0; c < g.c; ++c) {
              const auto v = static_cast<A>(px[c]);
              const bool take = v > bv[c] || (v != v && bv[c] == bv[c]);
              bv[c] = take ? v : bv[c];
              best[c] = take ? at : best[c];
            }
            return true;
          });
          T* py = y + r * g.c;
          for (int64_t c = 0; c < g.c; ++c)
            py[c] = static_cast<T>(best_value[static_cast<size_t>(c)]);
        });
    return;
  }
#pragma omp parallel for schedule(static) if (out.numel() * taps >= kParallelGrain)
  for (int64_t pl = 0; pl < g.n * g.c; ++pl) {
    const T* plane = x + pl * g.h * g.w;
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        int64_t best = -1;
        A best_value = -std::numeric_limits<A>::infinity();
        for_each_tap(p, g, oh, ow, [&](int64_t ih, int64_t iw) {
          const auto v = static_cast<A>(plane[ih * g.w + iw]);
          if (best < 0 || v > best_value || std::isnan(v)) {
            best = ih * g.w + iw;
            best_value = v;
          }
          return !std::isnan(v);  // the first NaN wins
        });
        const int64_t o = (pl * g.ho + oh) * g.wo + ow;
        y[o] = static_cast<T>(best_value);
        idx[o] = best;
      }
    }
  }
}

// Scatters each output's gradient to its recorded input position, in output order.
template <typename T>
void max_pool_backward_typed(const Tensor& grad_input, const Tensor& grad_out,
                             const Tensor& indices) {
  const PoolGeometry g = pool_geometry(grad_input, grad_out);
  T* gx = grad_input.data_ptr<T>();
  const T* gy = grad_out.data_ptr<T>();
  const int64_t* idx = indices.data_ptr<int64_t>();
  const int64_t in_plane = g.h * g.w, out_plane = g.ho * g.wo;
  auto add = [](T& dst, T v) {
    dst = static_cast<T>(static_cast<acc_t<T>>(dst) + static_cast<acc_t<T>>(v));
  };
  if (g.cl) {
#pragma omp parallel for schedule(static) if (grad_input.numel() >= kParallelGrain)
    for (int64_t n = 0; n < g.n; ++n) {
      T* dst = gx + n * in_plane * g.c;
      std::fill(dst, dst + in_plane * g.c, T(0));
      for (int64_t o = 0; o < out_plane; ++o) {
        const int64_t* at = idx + (n * out_plane + o) * g.c;
        const T* src = gy + (n * out_plane + o) * g.c;
        for (int64_t c = 0; c < g.c; ++c) {
          if (at[c] >= 0) add(dst[at[c] * g.c + c], src[c]);
        }
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) if (grad_input.numel() >= kParallelGrain)
  for (int64_t pl = 0; pl < g.n * g.c; ++pl) {
    T* dst = gx + pl * in_plane;
    std::fill(dst, dst + in_plane, T(0));
    for (int64_t o = 0; o < out_plane; ++o) {
      const int64_t at = idx[pl * out_plane + o];
      if (at >= 0) add(dst[at], gy[pl * out_plane + o]);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Average and adaptive-average pooling share one walk: `window(oh, ow)` gives the taps and
// the divisor.

template <typename T, typename Window>
void avg_forward(const Tensor& out, const Tensor& input, const PoolGeometry& g, int64_t taps,
                 Window&& window) {
  const T* x = input.data_ptr<T>();
  T* y = out.data_ptr<T>();
  using A = acc_t<T>;
  auto mean = [](A sum, int64_t divisor) {
    return static_cast<T>(divisor > 0 ? sum / static_cast<A>(divisor) : A(0));
  };
  if (g.cl) {
    for_each_output_pixel<A>(
        g, out.numel() * taps >= kParallelGrain,
        [&](int64_t r, int64_t n, int64_t oh, int64_t ow, std::vector<A>& sum) {
          const AvgWindow win = window(oh, ow);
          std::fill(sum.begin(), sum.end(), A(0));
          for (int64_t ih = win.h0; ih < win.h1; ++ih) {
            for (int64_t iw = win.w0; iw < win.w1; ++iw) {
              const T* px = x + ((n * g.h + ih) * g.w + iw) * g.c;
              for (int64_t c = 0; c < g.c; ++c)
                sum[static_cast<size_t>(c)] += static_cast<A>(px[c]);
            }
          }
          T* py = y + r * g.c;
          for (int64_t c = 0; c < g.c; ++c) py[c] = mean(sum[static_cast<size_t>(c)], win.divisor);
        });
    return;
  }
#pragma omp parallel for schedule(static) if (out.numel() * taps >= kParallelGrain)
  for (int64_t pl = 0; pl < g.n * g.c; ++pl) {
    const T* plane = x + pl * g.h * g.w;
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const AvgWindow win = window(oh, ow);
        A sum = 0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += static_cast<A>(plane[ih * g.w + iw]);
        }
        y[(pl * g.ho + oh) * g.wo + ow] = mean(sum, win.divisor);
      }
    }
  }
}

// Each output's share (gradient / divisor) is added to the inputs of its window, outputs in
// order, into an accumulator of the plane (NCHW) or of the image (channels_last).
template <typename T, typename Window>
void avg_backward(const Tensor& grad_input, const Tensor& grad_out, const PoolGeometry& g,
                  Window&& window) {
  T* gx = grad_input.data_ptr<T>();
  const T* gy = grad_out.data_ptr<T>();
  using A = acc_t<T>;
  const int64_t in_plane = g.h * g.w;
  // Channels-last: one image of C-wide rows per unit of work; NCHW: one plane (C = 1 rows).
  const int64_t units = g.cl ? g.n : g.n * g.c, width = g.cl ? g.c : 1;
#pragma omp parallel if (grad_input.numel() >= kParallelGrain)
  {
    std::vector<A> acc(static_cast<size_t>(in_plane * width)), share(static_cast<size_t>(width));
#pragma omp for schedule(static)
    for (int64_t u = 0; u < units; ++u) {
      std::fill(acc.begin(), acc.end(), A(0));
      for (int64_t oh = 0; oh < g.ho; ++oh) {
        for (int64_t ow = 0; ow < g.wo; ++ow) {
          const AvgWindow win = window(oh, ow);
          if (win.divisor <= 0) continue;
          const T* src = gy + (u * g.ho * g.wo + oh * g.wo + ow) * width;
          for (int64_t c = 0; c < width; ++c)
            share[static_cast<size_t>(c)] = static_cast<A>(src[c]) / static_cast<A>(win.divisor);
          for (int64_t ih = win.h0; ih < win.h1; ++ih) {
            for (int64_t iw = win.w0; iw < win.w1; ++iw) {
              A* dst = acc.data() + (ih * g.w + iw) * width;
              for (int64_t c = 0; c < width; ++c) dst[c] += share[static_cast<size_t>(c)];
            }
          }
        }
      }
      T* dst = gx + u * in_plane * width;
      for (int64_t i = 0; i < in_plane * width; ++i)
        dst[i] = static_cast<T>(acc[static_cast<size_t>(i)]);
    }
  }
}

// Every tensor of a pooling call dense in one layout: NCHW, or channels_last for all.
void check_layout(std::initializer_list<const Tensor*> tensors) {
  const bool cl = pooling_channels_last(tensors);
  for (const Tensor* t : tensors) {
    EMBER_ASSERT(cl ? t->is_contiguous(MemoryFormat::ChannelsLast) : t->is_contiguous(),
                 "pooling: mixed layouts");
  }
}

void max_pool2d_forward_cpu(const Tensor& out, const Tensor& indices, const Tensor& input,
                            const Pool2dParams& params) {
  check_layout({&input, &out, &indices});
  dispatch_floating(input.dtype(), "max_pool2d", [&](auto tag) {
    max_pool_forward_typed<typename decltype(tag)::type>(out, indices, input, params);
  });
}

void max_pool2d_backward_cpu(const Tensor& grad_input, const Tensor& grad_out,
                             const Tensor& indices, const Pool2dParams&) {
  check_layout({&grad_input, &grad_out, &indices});
  dispatch_floating(grad_input.dtype(), "max_pool2d_backward", [&](auto tag) {
    max_pool_backward_typed<typename decltype(tag)::type>(grad_input, grad_out, indices);
  });
}

void avg_pool2d_forward_cpu(const Tensor& out, const Tensor& input, const Pool2dParams& params) {
  check_layout({&input, &out});
  const PoolGeometry g = pool_geometry(input, out);
  dispatch_floating(input.dtype(), "avg_pool2d", [&](auto tag) {
    avg_forward<typename decltype(tag)::type>(
        out, input, g, params.kernel[0] * params.kernel[1],
        [&](int64_t oh, int64_t ow) { return avg_window(params, g.h, g.w, oh, ow); });
  });
}

void avg_pool2d_backward_cpu(const Tensor& grad_input, const Tensor& grad_out,
                             const Pool2dParams& params) {
  check_layout({&grad_input, &grad_out});
  const PoolGeometry g = pool_geometry(grad_input, grad_out);
  dispatch_floating(grad_input.dtype(), "avg_pool2d_backward", [&](auto tag) {
    avg_backward<typename decltype(tag)::type>(
        grad_input, grad_out, g,
        [&](int64_t oh, int64_t ow) { return avg_window(params, g.h, g.w, oh, ow); });
  });
}

void adaptive_avg_pool2d_forward_cpu(const Tensor& out, const Tensor& input) {
  check_layout({&input, &out});
  const PoolGeometry g = pool_geometry(input, out);
  const int64_t taps = std::max<int64_t>(1, (g.h / g.ho + 1) * (g.w / g.wo + 1));
  dispatch_floating(input.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    avg_forward<typename decltype(tag)::type>(
        out, input, g, taps, [&](int64_t oh, int64_t ow) { return adaptive_window(g, oh, ow); });
  });
}

void adaptive_avg_pool2d_backward_cpu(const Tensor& grad_input, const Tensor& grad_out) {
  check_layout({&grad_input, &grad_out});
  const PoolGeometry g = pool_geometry(grad_input, grad_out);
  dispatch_floating(grad_input.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    avg_backward<typename decltype(tag)::type>(
        grad_input, grad_out, g,
        [&](int64_t oh, int64_t ow) { return adaptive_window(g, oh, ow); });
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(pooling) {
  table.max_pool2d_forward = &max_pool2d_forward_cpu;
  table.max_pool2d_backward = &max_pool2d_backward_cpu;
  table.avg_pool2d_forward = &avg_pool2d_forward_cpu;
  table.avg_pool2d_backward = &avg_pool2d_backward_cpu;
  table.adaptive_avg_pool2d_forward = &adaptive_avg_pool2d_forward_cpu;
  table.adaptive_avg_pool2d_backward = &adaptive_avg_pool2d_backward_cpu;
}

}  // namespace ember::detail
