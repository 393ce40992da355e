// Random fills from Philox: element i of a draw is a pure function of (seed, offset, i),
// computed by the same function (detail/random_element.h) as the CPU kernel.
//
// NOTE: this file is compiled with -fmad=false (tensor/CMakeLists.txt). A fused multiply-add
// rounds once where the CPU rounds twice, so `low + (high - low) * u` would differ from the
// CPU's bits in the last place; without contraction uniform and randint draws are
// bit-identical on both devices. Normal draws also go through logf/cosf, whose CUDA and
// glibc versions may differ by an ulp.
#include "../detail/dispatch.h"
#include "../detail/random_element.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

template <typename T>
__global__ void random_kernel(RandomKind kind, T* data, int64_t n, uint64_t seed, uint64_t offset,
                              double a, double b, int64_t low, uint64_t range) {
  const auto cast = [](auto v) { return cast_to<T>(v); };
  for (int64_t i = global_thread(); i < n; i += grid_stride())
    data[i] =
        random_element<T>(kind, seed, offset, static_cast<uint64_t>(i), a, b, low, range, cast);
}

void random_cuda(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a,
                 double b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  KernelContext ctx(out);
  const auto low = static_cast<int64_t>(a);
  const auto range = static_cast<uint64_t>(static_cast<int64_t>(b) - low);
  dispatch_all(out.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(n), kBlockSize, 0, ctx.stream, random_kernel<T>)
    (kind, static_cast<T*>(out.data_ptr()), n, seed, offset, a, b, low, range);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(random) { table.random = random_cuda; }

EMBER_KERNELS_END  // namespace ember::detail
