// tensor/cuda/conv.cu's own kernels (the bias add and the bias gradient; the convolutions are
// cuDNN's, GPU-only) emulated on the CPU (tensor/cuda/emulated/emulate.h) through their host
// launchers, against the CPU: NCHW and channels_last, more channels than the emulated grid
// covers, every floating dtype; planted bugs fail.
#include <ember/tensor/cuda/conv.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

MemoryFormat format(bool channels_last) {
  return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

// out + bias and the sums of grad_out per channel: emulated, or by CPU ops.
Outputs bias_run(const Tensor& y, const Tensor& bias, const Tensor& gy, bool cl, bool emulated) {
  const Tensor out = y.clone().contiguous(format(cl));
  const Tensor grad_bias = poisoned({bias.numel()}, bias.dtype());
  if (emulated) {
    detail::emulated::add_bias(out, bias, cl, nullptr);
    detail::emulated::bias_grad(grad_bias, gy, cl, nullptr);
    return {out, grad_bias};
  }
  return {add(y.to(kF64), bias.to(kF64).view({1, -1, 1, 1})).to(y.dtype()),
          sum(gy.to(kF64), {0, 2, 3}).to(y.dtype())};
}

TEST(EmulatedConv, BiasAddAndGradientMatchCpu) {
  uint64_t seed = 1;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (bool cl : {false, true}) {
      SCOPED_TRACE(::testing::Message() << dtype << (cl ? " channels_last" : ""));
      const Tensor y = random_input({2, 7, 5, 9}, dtype, seed++).contiguous(format(cl)),
                   gy = random_input({2, 7, 5, 9}, dtype, seed++).contiguous(format(cl)),
                   bias = random_input({7}, dtype, seed++);
      const Outputs want = bias_run(y, bias, gy, cl, false);
      for (const Outputs& got : in_both_orders([&] { return bias_run(y, bias, gy, cl, true); })) {
        for (size_t i = 0; i < got.size(); ++i) {
          const auto m = mismatch(got[i].contiguous(), want[i], tolerance(dtype), tolerance(dtype));
          EXPECT_FALSE(m.has_value()) << "output " << i << ": " << *m;
        }
      }
    }
  }
}

TEST(EmulatedConv, PlantedBugsFail) {
  const Tensor y = random_input({2, 7, 5, 9}, kF32, 1), gy = random_input({2, 7, 5, 9}, kF32, 2),
               bias = random_input({7}, kF32, 3);
  const Outputs want = bias_run(y, bias, gy, false, false);
  for (const auto bug : {cuda_emu::Bug::kMissingBarrier, cuda_emu::Bug::kLostTailThread}) {
    SCOPED_TRACE(::testing::Message() << "bug " << static_cast<int>(bug));
    const cuda_emu::PlantedBug planted(bug, 0);
    bool failed = false;
    try {
      for (const Outputs& got :
           in_both_orders([&] { return bias_run(y, bias, gy, false, true); })) {
        for (size_t i = 0; i < got.size(); ++i) {
          failed = failed || mismatch(got[i], want[i], 1e-5, 1e-5).has_value();
        }
      }
    } catch (const Error&) {
      failed = true;  // (a thread lost before a barrier: the emulation reports it)
    }
    EXPECT_GT(planted.hits(), 0);
    EXPECT_TRUE(failed);
  }
}

}  // namespace
}  // namespace ember::testing
