// tensor/cuda/linalg.cu's own kernels (the GEMMs are cuBLAS's, GPU-only) emulated on the CPU
// (tensor/cuda/emulated/emulate.h) against the CPU: the empty product's C = beta C and the
// bias rows of an empty addmm, strided and batched C, and the fused linear's bias + ReLU
// epilogue, every floating dtype; a planted bug fails.
#include <ember/tensor/cuda/linalg.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_linalg_kernels>();
}

// C [batch, m, n] inside a wider buffer (ldc > n), as the empty (k == 0) GEMM sees it.
Outputs empty_gemm_run(DType dtype, double beta, bool with_bias, bool emulated) {
  const Tensor buffer = random_input({3, 5, 40}, dtype, 1), bias = random_input({33}, dtype, 2);
  detail::GemmArgs g;
  g.dtype = dtype;
  g.device = kCPU;
  g.batch = 3;
  g.m = 5;
  g.n = 33;
  g.k = 0;
  g.c = buffer.data_ptr();
  g.ldc = 40;
  g.stride_c = 200;
  g.beta = with_bias ? 0.0 : beta;
  g.bias = with_bias ? bias.data_ptr() : nullptr;
  if (emulated) {
    if (with_bias) {
      detail::emulated::fill_rows_with_bias(g, nullptr);
    } else {
      detail::emulated::scale_empty_product(g, nullptr);
    }
  } else {
    cpu_table().gemm(g);
  }
  return {buffer};
}

TEST(EmulatedBlas, EmptyProductMatchesCpu) {
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (double beta : {0.0, 0.5}) {
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " beta " << beta << (with_bias ? " bias" : ""));
        const Outputs want = empty_gemm_run(dtype, beta, with_bias, false);
        for (const Outputs& got :
             in_both_orders([&] { return empty_gemm_run(dtype, beta, with_bias, true); })) {
          const auto m = mismatch(got[0], want[0], 0.0, 0.0);
          EXPECT_FALSE(m.has_value()) << *m;
        }
      }
    }
  }
}

KernelRun bias_relu_run(const Tensor& in, const Tensor& bias) {
  return [=](const detail::KernelTable& k) {
    const Tensor out = poisoned(in.sizes(), in.dtype());
    k.bias_activation(Activation::kRelu, out, in, bias);
    return Outputs{out};
  };
}

TEST(EmulatedBlas, BiasReluEpilogueMatchesCpu) {
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype << (with_bias ? " bias" : ""));
      const Tensor in = random_input({9, 130}, dtype, 3);
      expect_parity(kernels(),
                    bias_relu_run(in, with_bias ? random_input({130}, dtype, 4) : Tensor()));
    }
  }
}

TEST(EmulatedBlas, PlantedTailBugFails) {
  expect_planted_bug_fails(kernels(), bias_relu_run(random_input({9, 130}, kF32, 5), Tensor()),
                           cuda_emu::Bug::kLostTailThread);
}

}  // namespace
}  // namespace ember::testing
