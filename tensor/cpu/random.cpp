// CPU random fills from Philox: element i of a draw is a pure function of (seed, offset, i),
// computed by the same functions (detail/philox.h) as the CUDA kernel (tensor/cuda/random.cu).
#include <type_traits>

#include "../detail/dispatch.h"
#include "../detail/philox.h"
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
    const auto range = static_cast<uint64_t>(static_cast<int64_t>(b) - static_cast<int64_t>(a));
#pragma omp parallel for if (n >= kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const auto idx = static_cast<uint64_t>(i);
      if (kind == RandomKind::kRandint) {
        data[i] = convert<T>(random_int(seed, offset, idx, static_cast<int64_t>(a), range));
      } else if constexpr (std::is_same_v<T, double>) {
        data[i] = kind == RandomKind::kUniform ? random_uniform_double(seed, offset, idx, a, b)
                                               : random_normal_double(seed, offset, idx, a, b);
      } else {
        const float fa = static_cast<float>(a), fb = static_cast<float>(b);
        data[i] = convert<T>(kind == RandomKind::kUniform
                                 ? random_uniform_float(seed, offset, idx, fa, fb)
                                 : random_normal_float(seed, offset, idx, fa, fb));
      }
    }
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(random) { table.random = random_cpu; }

}  // namespace ember::detail
