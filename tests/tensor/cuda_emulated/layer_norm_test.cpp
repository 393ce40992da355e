// tensor/cuda/layer_norm.cu emulated on the CPU (tensor/cuda/emulated/emulate.h) against the
// CPU kernels: forward (mean, rstd, out) and backward (input, weight and bias gradients, the
// parameter sums in fixed-order chunks), rows short and long, more rows than the emulated
// grid covers and than one chunk, with and without weight/bias, every floating dtype; planted
// bugs fail.
#include <ember/tensor/cuda/layer_norm.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_layer_norm_kernels>();
}

DType stat_type(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

// Forward then backward through table k, from the same inputs.
KernelRun layer_norm_run(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& gy) {
  return [=](const detail::KernelTable& k) {
    const int64_t rows = x.size(0), n = x.size(1);
    const Tensor out = poisoned(x.sizes(), x.dtype()),
                 mean = poisoned({rows}, stat_type(x.dtype())),
                 rstd = poisoned({rows}, stat_type(x.dtype()));
    k.layer_norm_forward(out, mean, rstd, x, w, b, 1e-5);
    const Tensor gx = poisoned(x.sizes(), x.dtype()), gw = poisoned({n}, x.dtype()),
                 gb = poisoned({n}, x.dtype());
    k.layer_norm_backward(gx, gw, gb, gy, x, w, mean, rstd);
    return Outputs{out, mean, rstd, gx, gw, gb};
  };
}

TEST(EmulatedLayerNorm, ForwardAndBackwardMatchCpu) {
  struct Case {
    int64_t rows, n;
  };
  // (300 rows: three chunks of 128 for the parameter sums, past the grid cap of 3 x 8 rows.)
  const Case cases[] = {{1, 1}, {5, 33}, {40, 100}, {300, 7}, {3, 1500}};
  uint64_t seed = 1;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (const Case& c : cases) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " [" << c.rows << ", " << c.n << "]" << (affine ? " affine" : ""));
        const Tensor x = random_input({c.rows, c.n}, dtype, seed++),
                     gy = random_input({c.rows, c.n}, dtype, seed++);
        const Tensor w = affine ? random_input({c.n}, dtype, seed++) : Tensor(),
                     b = affine ? random_input({c.n}, dtype, seed++) : Tensor();
        // Column sums over up to 300 rows in another order: a few ulps more.
        expect_parity(kernels(), layer_norm_run(x, w, b, gy), 4 * tolerance(dtype),
                      4 * tolerance(dtype));
      }
    }
  }
}

TEST(EmulatedLayerNorm, PlantedBugsFail) {
  const Tensor x = random_input({300, 40}, kF32, 5), gy = random_input({300, 40}, kF32, 6);
  const KernelRun run = layer_norm_run(x, Tensor(), Tensor(), gy);
  expect_planted_bug_fails(kernels(), run, cuda_emu::Bug::kMissingBarrier, 0, 1e-4, 1e-4);
  expect_planted_bug_fails(kernels(), run, cuda_emu::Bug::kWrongShuffleMask, 0, 1e-4, 1e-4);
  expect_planted_bug_fails(kernels(), run, cuda_emu::Bug::kLostTailThread, 0, 1e-4, 1e-4);
}

}  // namespace
}  // namespace ember::testing
