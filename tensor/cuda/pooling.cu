// CUDA kernels for max, average and adaptive-average pooling, forward and backward, in NCHW
// and in channels_last (each kernel is instantiated for both; kCL picks how a linear index
// maps to (n, c, h, w), so a channels_last thread block reads neighbouring channels).
// Semantics match tensor/cpu/pooling.cpp.
//
// Backward gathers: each input element sums the outputs whose window covers it, so no
// atomics are needed and results do not depend on timing.
#include <cmath>

#include "../detail/dispatch.h"
#include "../detail/op_utils.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

template <typename A>
__device__ __forceinline__ bool is_nan(A x) {
  return x != x;
}

struct PoolGeometry {
  int64_t c, h, w, ho, wo;
};

PoolGeometry pool_geometry(const Tensor& input_like, const Tensor& output_like) {
  return {input_like.size(1), input_like.size(2), input_like.size(3), output_like.size(2),
          output_like.size(3)};
}

// (n, c, h, w) of element `i` of a dense [N, C, H, W] tensor in NCHW or (kCL) NHWC order,
// and back.
struct Coord {
  int64_t n, c, h, w;
};

template <bool kCL>
__device__ __forceinline__ Coord coord_of(int64_t i, int64_t c, int64_t h, int64_t w) {
  if constexpr (kCL) {
    return {i / (c * w * h), i % c, (i / (c * w)) % h, (i / c) % w};
  } else {
    return {i / (w * h * c), (i / (w * h)) % c, (i / w) % h, i % w};
  }
}

template <bool kCL>
__device__ __forceinline__ int64_t offset_of(int64_t n, int64_t ch, int64_t y, int64_t x, int64_t c,
                                             int64_t h, int64_t w) {
  if constexpr (kCL) {
    return ((n * h + y) * w + x) * c + ch;
  } else {
    return ((n * c + ch) * h + y) * w + x;
  }
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
// Floor of a / b for b > 0 and any a.
__device__ __forceinline__ int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

template <typename T, bool kCL>
__global__ void max_pool_forward_kernel(T* out, int64_t* indices, const T* input, int64_t total,
                                        PoolGeometry g, Pool2dParams p) {
  using A = acc_t<T>;
  for (int64_t o = global_thread(); o < total; o += grid_stride()) {
    const Coord at = coord_of<kCL>(o, g.c, g.ho, g.wo);
    // NaN wins, the first maximum wins ties; a window missing the input gives -inf, index -1.
    int64_t best = -1;
    A best_value = static_cast<A>(-INFINITY);
    bool found_nan = false;
    for (int64_t i = 0; i < p.kernel[0] && !found_nan; ++i) {
      const int64_t ih = at.h * p.stride[0] - p.padding[0] + i * p.dilation[0];
      if (ih < 0 || ih >= g.h) continue;
      for (int64_t j = 0; j < p.kernel[1]; ++j) {
        const int64_t iw = at.w * p.stride[1] - p.padding[1] + j * p.dilation[1];
        if (iw < 0 || iw >= g.w) continue;
        const A v = cast_to<A>(input[offset_of<kCL>(at.n, at.c, ih, iw, g.c, g.h, g.w)]);
        if (best < 0 || v > best_value || is_nan(v)) {
          best = ih * g.w + iw;
          best_value = v;
          if (is_nan(v)) {
            found_nan = true;
            break;
          }
        }
      }
    }
    out[o] = cast_to<T>(best_value);
    indices[o] = best;
  }
}

template <typename T, bool kCL>
__global__ void max_pool_backward_kernel(T* grad_input, const T* grad_out, const int64_t* indices,
                                         int64_t total, PoolGeometry g, Pool2dParams p) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const Coord in = coord_of<kCL>(i, g.c, g.h, g.w);
    const int64_t at = in.h * g.w + in.w;
    A sum = 0;
    // Each output window holds this element at most once: tap a fixes oh, tap b fixes ow.
    for (int64_t a = 0; a < p.kernel[0]; ++a) {
      const int64_t th = in.h + p.padding[0] - a * p.dilation[0];
      if (th < 0 || th % p.stride[0] != 0 || th / p.stride[0] >= g.ho) continue;
      const int64_t oh = th / p.stride[0];
      for (int64_t b = 0; b < p.kernel[1]; ++b) {
        const int64_t tw = in.w + p.padding[1] - b * p.dilation[1];
        if (tw < 0 || tw % p.stride[1] != 0 || tw / p.stride[1] >= g.wo) continue;
        const int64_t o = offset_of<kCL>(in.n, in.c, oh, tw / p.stride[1], g.c, g.ho, g.wo);
        if (indices[o] == at) sum += cast_to<A>(grad_out[o]);
      }
    }
    grad_input[i] = cast_to<T>(sum);
  }
}

// The window of output (oh, ow) in average pooling, clipped to the input, and PyTorch's divisor.
struct AvgWindow {
  int64_t h0, h1, w0, w1, divisor;
};

__device__ __forceinline__ AvgWindow avg_window(const Pool2dParams& p, const PoolGeometry& g,
                                                int64_t oh, int64_t ow) {
  int64_t h0 = oh * p.stride[0] - p.padding[0], w0 = ow * p.stride[1] - p.padding[1];
  int64_t h1 = imin(h0 + p.kernel[0], g.h + p.padding[0]);
  int64_t w1 = imin(w0 + p.kernel[1], g.w + p.padding[1]);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = imax(h0, 0);
  w0 = imax(w0, 0);
  h1 = imin(h1, g.h);
  w1 = imin(w1, g.w);
  return {h0, h1, w0, w1, p.count_include_pad ? padded : (h1 - h0) * (w1 - w0)};
}

template <typename T, bool kCL>
__global__ void avg_pool_forward_kernel(T* out, const T* input, int64_t total, PoolGeometry g,
                                        Pool2dParams p) {
  using A = acc_t<T>;
  for (int64_t o = global_thread(); o < total; o += grid_stride()) {
    const Coord at = coord_of<kCL>(o, g.c, g.ho, g.wo);
    const AvgWindow win = avg_window(p, g, at.h, at.w);
    A sum = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw)
        sum += cast_to<A>(input[offset_of<kCL>(at.n, at.c, ih, iw, g.c, g.h, g.w)]);
    }
    out[o] = cast_to<T>(win.divisor > 0 ? sum / static_cast<A>(win.divisor) : A(0));
  }
}

template <typename T, bool kCL>
__global__ void avg_pool_backward_kernel(T* grad_input, const T* grad_out, int64_t total,
                                         PoolGeometry g, Pool2dParams p) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const Coord in = coord_of<kCL>(i, g.c, g.h, g.w);
    // Windows start at o * stride - padding and span `kernel`: those that can hold (ih, iw).
    const int64_t oh0 = imax(0, floor_div(in.h + p.padding[0] - p.kernel[0], p.stride[0]) + 1);
    const int64_t oh1 = imin(g.ho - 1, floor_div(in.h + p.padding[0], p.stride[0]));
    const int64_t ow0 = imax(0, floor_div(in.w + p.padding[1] - p.kernel[1], p.stride[1]) + 1);
    const int64_t ow1 = imin(g.wo - 1, floor_div(in.w + p.padding[1], p.stride[1]));
    A sum = 0;
    for (int64_t oh = oh0; oh <= oh1; ++oh) {
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        const AvgWindow win = avg_window(p, g, oh, ow);
        if (win.divisor <= 0 || in.h < win.h0 || in.h >= win.h1 || in.w < win.w0 ||
            in.w >= win.w1) {
          continue;
        }
        sum += cast_to<A>(grad_out[offset_of<kCL>(in.n, in.c, oh, ow, g.c, g.ho, g.wo)]) /
               static_cast<A>(win.divisor);
      }
    }
    grad_input[i] = cast_to<T>(sum);
  }
}

// Adaptive windows: [floor(i * in / out), ceil((i + 1) * in / out)).
__device__ __forceinline__ int64_t adaptive_start(int64_t i, int64_t in, int64_t out) {
  return (i * in) / out;
}
__device__ __forceinline__ int64_t adaptive_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

template <typename T, bool kCL>
__global__ void adaptive_avg_forward_kernel(T* out, const T* input, int64_t total, PoolGeometry g) {
  using A = acc_t<T>;
  for (int64_t o = global_thread(); o < total; o += grid_stride()) {
    const Coord at = coord_of<kCL>(o, g.c, g.ho, g.wo);
    const int64_t h0 = adaptive_start(at.h, g.h, g.ho), h1 = adaptive_end(at.h, g.h, g.ho);
    const int64_t w0 = adaptive_start(at.w, g.w, g.wo), w1 = adaptive_end(at.w, g.w, g.wo);
    A sum = 0;
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw)
        sum += cast_to<A>(input[offset_of<kCL>(at.n, at.c, ih, iw, g.c, g.h, g.w)]);
    }
    out[o] = cast_to<T>(sum / static_cast<A>((h1 - h0) * (w1 - w0)));
  }
}

template <typename T, bool kCL>
__global__ void adaptive_avg_backward_kernel(T* grad_input, const T* grad_out, int64_t total,
                                             PoolGeometry g) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const Coord in = coord_of<kCL>(i, g.c, g.h, g.w);
    // Outputs whose window holds row ih: oh in [floor(ih*Ho/H), ceil((ih+1)*Ho/H)).
    const int64_t oh0 = (in.h * g.ho) / g.h, oh1 = imin(g.ho, ((in.h + 1) * g.ho + g.h - 1) / g.h);
    const int64_t ow0 = (in.w * g.wo) / g.w, ow1 = imin(g.wo, ((in.w + 1) * g.wo + g.w - 1) / g.w);
    A sum = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      const int64_t h0 = adaptive_start(oh, g.h, g.ho), h1 = adaptive_end(oh, g.h, g.ho);
      if (in.h < h0 || in.h >= h1) continue;
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const int64_t w0 = adaptive_start(ow, g.w, g.wo), w1 = adaptive_end(ow, g.w, g.wo);
        if (in.w < w0 || in.w >= w1) continue;
        sum += cast_to<A>(grad_out[offset_of<kCL>(in.n, in.c, oh, ow, g.c, g.ho, g.wo)]) /
               static_cast<A>((h1 - h0) * (w1 - w0));
      }
    }
    grad_input[i] = cast_to<T>(sum);
  }
}

// Runs `launch(T{}, std::bool_constant<cl>{})` for the dtype of `like` and the layout of
// `tensors` (every one dense in that layout).
template <typename Launch>
void pooling_dispatch(const Tensor& like, std::initializer_list<const Tensor*> tensors,
                      const char* op, Launch&& launch) {
  const bool cl = pooling_channels_last(tensors);
  for (const Tensor* t : tensors) {
    EMBER_ASSERT(cl ? t->is_contiguous(MemoryFormat::ChannelsLast) : t->is_contiguous(), op,
                 ": mixed layouts");
  }
  dispatch_floating(like.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (cl) {
      launch(T{}, std::true_type{});
    } else {
      launch(T{}, std::false_type{});
    }
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void max_pool2d_forward_cuda(const Tensor& out, const Tensor& indices, const Tensor& input,
                             const Pool2dParams& params) {
  if (out.numel() == 0) return;
  const KernelContext ctx(input);
  pooling_dispatch(input, {&input, &out, &indices}, "max_pool2d", [&](auto t, auto cl) {
    using T = decltype(t);
    EMBER_LAUNCH(grid_for(out.numel()), kBlockSize, 0, ctx.stream,
                 max_pool_forward_kernel<T, decltype(cl)::value>)
    (out.data_ptr<T>(), indices.data_ptr<int64_t>(), input.data_ptr<T>(), out.numel(),
     pool_geometry(input, out), params);
  });
}

void max_pool2d_backward_cuda(const Tensor& grad_input, const Tensor& grad_out,
                              const Tensor& indices, const Pool2dParams& params) {
  if (grad_input.numel() == 0) return;
  const KernelContext ctx(grad_input);
  pooling_dispatch(grad_input, {&grad_input, &grad_out, &indices}, "max_pool2d_backward",
                   [&](auto t, auto cl) {
                     using T = decltype(t);
                     EMBER_LAUNCH(grid_for(grad_input.numel()), kBlockSize, 0, ctx.stream,
                                  max_pool_backward_kernel<T, decltype(cl)::value>)
                     (grad_input.data_ptr<T>(), grad_out.data_ptr<T>(), indices.data_ptr<int64_t>(),
                      grad_input.numel(), pool_geometry(grad_input, grad_out), params);
                   });
}

void avg_pool2d_forward_cuda(const Tensor& out, const Tensor& input, const Pool2dParams& params) {
  if (out.numel() == 0) return;
  const KernelContext ctx(input);
  pooling_dispatch(input, {&input, &out}, "avg_pool2d", [&](auto t, auto cl) {
    using T = decltype(t);
    EMBER_LAUNCH(grid_for(out.numel()), kBlockSize, 0, ctx.stream,
                 avg_pool_forward_kernel<T, decltype(cl)::value>)
    (out.data_ptr<T>(), input.data_ptr<T>(), out.numel(), pool_geometry(input, out), params);
  });
}

void avg_pool2d_backward_cuda(const Tensor& grad_input, const Tensor& grad_out,
                              const Pool2dParams& params) {
  if (grad_input.numel() == 0) return;
  const KernelContext ctx(grad_input);
  pooling_dispatch(grad_input, {&grad_input, &grad_out}, "avg_pool2d_backward",
                   [&](auto t, auto cl) {
                     using T = decltype(t);
                     EMBER_LAUNCH(grid_for(grad_input.numel()), kBlockSize, 0, ctx.stream,
                                  avg_pool_backward_kernel<T, decltype(cl)::value>)
                     (grad_input.data_ptr<T>(), grad_out.data_ptr<T>(), grad_input.numel(),
                      pool_geometry(grad_input, grad_out), params);
                   });
}

void adaptive_avg_pool2d_forward_cuda(const Tensor& out, const Tensor& input) {
  if (out.numel() == 0) return;
  const KernelContext ctx(input);
  pooling_dispatch(input, {&input, &out}, "adaptive_avg_pool2d", [&](auto t, auto cl) {
    using T = decltype(t);
    EMBER_LAUNCH(grid_for(out.numel()), kBlockSize, 0, ctx.stream,
                 adaptive_avg_forward_kernel<T, decltype(cl)::value>)
    (out.data_ptr<T>(), input.data_ptr<T>(), out.numel(), pool_geometry(input, out));
  });
}

void adaptive_avg_pool2d_backward_cuda(const Tensor& grad_input, const Tensor& grad_out) {
  if (grad_input.numel() == 0) return;
  const KernelContext ctx(grad_input);
  pooling_dispatch(grad_input, {&grad_input, &grad_out}, "adaptive_avg_pool2d_backward",
                   [&](auto t, auto cl) {
                     using T = decltype(t);
                     EMBER_LAUNCH(grid_for(grad_input.numel()), kBlockSize, 0, ctx.stream,
                                  adaptive_avg_backward_kernel<T, decltype(cl)::value>)
                     (grad_input.data_ptr<T>(), grad_out.data_ptr<T>(), grad_input.numel(),
                      pool_geometry(grad_input, grad_out));
                   });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(pooling) {
  table.max_pool2d_forward = &max_pool2d_forward_cuda;
  table.max_pool2d_backward = &max_pool2d_backward_cuda;
  table.avg_pool2d_forward = &avg_pool2d_forward_cuda;
  table.avg_pool2d_backward = &avg_pool2d_backward_cuda;
  table.adaptive_avg_pool2d_forward = &adaptive_avg_pool2d_forward_cuda;
  table.adaptive_avg_pool2d_backward = &adaptive_avg_pool2d_backward_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail
