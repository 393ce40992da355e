// CUDA kernels of silu (tensor/detail/silu.h): one grid-stride pass over contiguous elements.
#include "../detail/dispatch.h"
#include "../detail/silu.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

template <typename T>
__global__ void silu_forward_kernel(T* y, const T* x, int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < n; i += grid_stride())
    y[i] = T(silu_value<A>(static_cast<A>(x[i])));
}

template <typename T>
__global__ void silu_backward_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < n; i += grid_stride())
    dx[i] = T(silu_grad<A>(static_cast<A>(dy[i]), static_cast<A>(x[i])));
}

void silu_forward_cuda(const Tensor& out, const Tensor& in) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KernelContext ctx(out);
  dispatch_floating(out.dtype(), "silu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(n), kBlockSize, 0, ctx.stream, silu_forward_kernel<T>)
    (out.data_ptr<T>(), in.data_ptr<T>(), n);
  });
  EMBER_CUDA_CHECK_LAUNCH();
}

void silu_backward_cuda(const Tensor& grad_in, const Tensor& grad_out, const Tensor& in) {
  const int64_t n = grad_in.numel();
  if (n == 0) return;
  KernelContext ctx(grad_in);
  dispatch_floating(grad_in.dtype(), "silu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(n), kBlockSize, 0, ctx.stream, silu_backward_kernel<T>)
    (grad_in.data_ptr<T>(), grad_out.data_ptr<T>(), in.data_ptr<T>(), n);
  });
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace

EMBER_REGISTER_CUDA_KERNEL(silu_forward_kernels, silu_forward_cuda);
EMBER_REGISTER_CUDA_KERNEL(silu_backward_kernels, silu_backward_cuda);

EMBER_KERNELS_END  // namespace ember::detail
