// CPU random fills from Philox: element i of a draw is a pure function of (seed, offset, i),
// computed by the same function (detail/random_element.h) as the CUDA kernel
// (tensor/cuda/random.cu).
#include <type_traits>

#include "../detail/dispatch.h"
#include "../detail/random_element.h"
#include "convert.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

void random_cpu(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a,
                double b) {
  const int64_t n = out.numel();
  dispatch_all(out.dtype(), "random", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* data = static_cast<T*>(out.data_ptr());
    const auto low = static_cast<int64_t>(a);
    const auto range = static_cast<uint64_t>(static_cast<int64_t>(b) - low);
    const auto cast = [](auto v) { return convert<T>(v); };
#pragma omp parallel for if (n >= kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      data[i] =
          random_element<T>(kind, seed, offset, static_cast<uint64_t>(i), a, b, low, range, cast);
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(random) { table.random = random_cpu; }

}  // namespace ember::detail
