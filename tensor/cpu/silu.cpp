// CPU kernels of silu (tensor/detail/silu.h): one pass over contiguous elements.
#include "../detail/silu.h"
#include "../detail/dispatch.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

template <typename T>
void silu_forward_typed(const Tensor& out, const Tensor& in) {
  using A = acc_t<T>;
  const T* x = in.data_ptr<T>();
  T* y = out.data_ptr<T>();
  const int64_t n = out.numel();
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i) y[i] = T(silu_value<A>(static_cast<A>(x[i])));
}

template <typename T>
void silu_backward_typed(const Tensor& grad_in, const Tensor& grad_out, const Tensor& in) {
  using A = acc_t<T>;
  const T* x = in.data_ptr<T>();
  const T* dy = grad_out.data_ptr<T>();
  T* dx = grad_in.data_ptr<T>();
  const int64_t n = grad_in.numel();
#pragma omp parallel for if (n >= kParallelGrain)
  for (int64_t i = 0; i < n; ++i)
    dx[i] = T(silu_grad<A>(static_cast<A>(dy[i]), static_cast<A>(x[i])));
}

void silu_forward_cpu(const Tensor& out, const Tensor& in) {
  dispatch_floating(out.dtype(), "silu",
                    [&](auto tag) { silu_forward_typed<typename decltype(tag)::type>(out, in); });
}

void silu_backward_cpu(const Tensor& grad_in, const Tensor& grad_out, const Tensor& in) {
  dispatch_floating(grad_in.dtype(), "silu_backward", [&](auto tag) {
    silu_backward_typed<typename decltype(tag)::type>(grad_in, grad_out, in);
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNEL(silu_forward_kernels, silu_forward_cpu);
EMBER_REGISTER_CPU_KERNEL(silu_backward_kernels, silu_backward_cpu);

}  // namespace ember::detail
