// tensor/cuda/silu.cu emulated on the CPU (tensor/cuda/emulated/emulate.h) against silu's CPU
// kernels (tensor/cpu/silu.cpp), forward and backward, for every floating dtype, at sizes
// around the block and past the emulated grid cap; a lost tail thread must fail.
#include <ember/tensor/cuda/silu.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

// Forward and backward of silu through `forward` and `backward` (CPU or emulated kernels).
template <typename Forward, typename Backward>
Outputs silu_run(Forward forward, Backward backward, DType dtype, int64_t n) {
  const Tensor x = random_input({n}, dtype, 7);
  const Tensor dy = random_input({n}, dtype, 8);
  const Tensor y = poisoned({n}, dtype), dx = poisoned({n}, dtype);
  forward(y, x);
  backward(dx, dy, x);
  return {y, dx};
}

Outputs cpu_silu(DType dtype, int64_t n) {
  return silu_run(detail::silu_forward_kernels.get(DeviceType::kCPU),
                  detail::silu_backward_kernels.get(DeviceType::kCPU), dtype, n);
}
Outputs emulated_silu(DType dtype, int64_t n) {
  return silu_run(detail::emulated::silu_forward_cuda, detail::emulated::silu_backward_cuda, dtype,
                  n);
}

TEST(EmulatedSilu, ForwardAndBackwardMatchTheCpu) {
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    for (int64_t n : {0, 1, 5, 257, 1000}) {
      SCOPED_TRACE(::testing::Message() << dtype << " n " << n);
      const Outputs want = cpu_silu(dtype, n);
      for (const Outputs& got : in_both_orders([&] { return emulated_silu(dtype, n); })) {
        for (size_t i = 0; i < got.size(); ++i) {
          const auto m = mismatch(got[i], want[i], tolerance(dtype), tolerance(dtype));
          EXPECT_FALSE(m.has_value()) << "output " << i << ": " << *m;
        }
      }
    }
  }
}

TEST(EmulatedSilu, PlantedTailBugFails) {
  const Outputs want = cpu_silu(kF32, 1000);
  const cuda_emu::PlantedBug planted(cuda_emu::Bug::kLostTailThread);
  const Outputs got = emulated_silu(kF32, 1000);
  EXPECT_GT(planted.hits(), 0);
  EXPECT_TRUE(mismatch(got[0], want[0], 0, 0).has_value() ||
              mismatch(got[1], want[1], 0, 0).has_value());
}

}  // namespace
}  // namespace ember::testing
