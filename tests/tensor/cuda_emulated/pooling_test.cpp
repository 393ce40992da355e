// tensor/cuda/pooling.cu emulated on the CPU (tensor/cuda/emulated/emulate.h) against the CPU
// kernels: max, average (with and without the padding counted) and adaptive average pooling,
// forward and backward, NCHW and channels_last, windows with stride, padding and dilation,
// every floating dtype; a planted bug fails.
#include <ember/tensor/cuda/pooling.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_pooling_kernels>();
}

// A poisoned tensor in the layout the op computes in.
Tensor poisoned_as(const Shape& shape, DType dtype, bool channels_last) {
  const Tensor t = poisoned(shape, dtype);
  return channels_last ? t.contiguous(MemoryFormat::ChannelsLast) : t;
}

int64_t pooled(int64_t size, const detail::Pool2dParams& p, int d) {
  return (size + 2 * p.padding[d] - p.dilation[d] * (p.kernel[d] - 1) - 1) / p.stride[d] + 1;
}

KernelRun pooling_run(const Tensor& x, const detail::Pool2dParams& p, uint64_t seed) {
  return [=](const detail::KernelTable& k) {
    const bool cl = p.channels_last;
    const Shape out_shape = {x.size(0), x.size(1), pooled(x.size(2), p, 0),
                             pooled(x.size(3), p, 1)};
    const Tensor gy = random_input(out_shape, x.dtype(), seed)
                          .contiguous(cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
    const Tensor max_out = poisoned_as(out_shape, x.dtype(), cl),
                 indices = poisoned_as(out_shape, kI64, cl),
                 max_grad = poisoned_as(x.sizes(), x.dtype(), cl),
                 avg_out = poisoned_as(out_shape, x.dtype(), cl),
                 avg_grad = poisoned_as(x.sizes(), x.dtype(), cl);
    k.max_pool2d_forward(max_out, indices, x, p);
    k.max_pool2d_backward(max_grad, gy, indices, p);
    detail::Pool2dParams avg = p;
    avg.dilation[0] = avg.dilation[1] = 1;
    const Shape avg_shape = {x.size(0), x.size(1), pooled(x.size(2), avg, 0),
                             pooled(x.size(3), avg, 1)};
    const Tensor avg_o = poisoned_as(avg_shape, x.dtype(), cl);
    const Tensor avg_gy =
        random_input(avg_shape, x.dtype(), seed + 1)
            .contiguous(cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
    k.avg_pool2d_forward(avg_o, x, avg);
    k.avg_pool2d_backward(avg_grad, avg_gy, avg);
    const Shape adaptive_shape = {x.size(0), x.size(1), 3, 2};
    const Tensor adaptive = poisoned_as(adaptive_shape, x.dtype(), cl),
                 adaptive_grad = poisoned_as(x.sizes(), x.dtype(), cl);
    k.adaptive_avg_pool2d_forward(adaptive, x);
    k.adaptive_avg_pool2d_backward(
        adaptive_grad, random_input(adaptive_shape, x.dtype(), seed + 2)
                           .contiguous(cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous));
    (void)avg_out;
    return Outputs{max_out, indices, max_grad, avg_o, avg_grad, adaptive, adaptive_grad};
  };
}

TEST(EmulatedPooling, EveryKindLayoutAndDtype) {
  uint64_t seed = 1;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (bool cl : {false, true}) {
      for (bool include_pad : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype << (cl ? " channels_last" : "")
                                          << (include_pad ? " count_include_pad" : ""));
        detail::Pool2dParams p;
        p.kernel[0] = 3;
        p.kernel[1] = 2;
        p.stride[0] = 2;
        p.stride[1] = 1;
        p.padding[0] = 1;
        p.padding[1] = 1;
        p.dilation[1] = 2;
        p.count_include_pad = include_pad;
        p.channels_last = cl;
        const Tensor x =
            random_input({2, 3, 11, 9}, dtype, seed++)
                .contiguous(cl ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous);
        expect_parity(kernels(), pooling_run(x, p, seed++), tolerance(dtype), tolerance(dtype));
      }
    }
  }
}

TEST(EmulatedPooling, PlantedTailBugFails) {
  detail::Pool2dParams p;
  p.kernel[0] = p.kernel[1] = 2;
  p.stride[0] = p.stride[1] = 2;
  const Tensor x = random_input({2, 3, 20, 20}, kF32, 3);
  expect_planted_bug_fails(kernels(), pooling_run(x, p, 4), cuda_emu::Bug::kLostTailThread, 0, 1e-5,
                           1e-5);
}

}  // namespace
}  // namespace ember::testing
