// CUDA kernels of silu (tensor/detail/silu.h): one grid-stride pass over contiguous elements.
#include "../detail/dispatch.h"
#include "../detail/silu.h"
#include "cuda_context.h"
#include "launch.cuh"

namespace ember::detail {
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

void silu_forward(const Tensor& out, const Tensor& in) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KernelContext ctx(out);
  dispatch_floating(out.dtype(), "silu", [&](auto tag) {
    using T = typename decltype(tag)::type;
    silu_forward_kernel<T>
        <<<grid_for(n), kBlockSize, 0, ctx.stream>>>(out.data_ptr<T>(), in.data_ptr<T>(), n);
  });
  EMBER_CUDA_CHECK_LAUNCH();
}

void silu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& in) {
  const int64_t n = grad_in.numel();
  if (n == 0) return;
  KernelContext ctx(grad_in);
  dispatch_floating(grad_in.dtype(), "silu_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    silu_backward_kernel<T><<<grid_for(n), kBlockSize, 0, ctx.stream>>>(
        grad_in.data_ptr<T>(), grad_out.data_ptr<T>(), in.data_ptr<T>(), n);
  });
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace

EMBER_REGISTER_OWN_KERNEL(silu_forward_kernels, DeviceType::kCUDA, silu_forward);
EMBER_REGISTER_OWN_KERNEL(silu_backward_kernels, DeviceType::kCUDA, silu_backward);

}  // namespace ember::detail
