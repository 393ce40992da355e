// tensor/cuda/layers.cu's own kernels (not cuDNN's) emulated on the CPU
// (tensor/cuda/emulated/emulate.h) against the CPU kernels: the fused batch norm + ReLU
// (+ residual) forward and backward, training and eval, NCHW with S > 1 and S = 1 and
// channels_last, every floating dtype; eval batch norm's statistics and backward;
// cross-entropy forward and backward with ignored samples and label smoothing; planted bugs
// fail.
#include <ember/tensor/cuda/layers.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_layers_kernels>();
}

DType stat_type(DType dtype) { return dtype == kF64 ? kF64 : kF32; }

// [N, C, S] with each row's channels together (a channels-last tensor's rows, as the table
// takes them) when channels_last, else dense NCHW.
Tensor rows(const Shape& shape, DType dtype, bool channels_last, uint64_t seed) {
  if (!channels_last) return random_input(shape, dtype, seed);
  return random_input({shape[0], shape[2], shape[1]}, dtype, seed).transpose(1, 2);
}
bool is_rows(const Tensor& x) { return detail::is_channels_last_rows(x); }

// A poisoned tensor laid out as x.
Tensor like(const Tensor& x) {
  if (!is_rows(x)) return poisoned(x.sizes(), x.dtype());
  return poisoned({x.size(0), x.size(2), x.size(1)}, x.dtype()).transpose(1, 2);
}

KernelRun fused_bn_run(const Tensor& x, bool training, bool residual, uint64_t seed) {
  return [=](const detail::KernelTable& k) {
    const int64_t c = x.size(1);
    const DType p = stat_type(x.dtype());
    const Tensor res = residual ? rows(x.sizes(), x.dtype(), is_rows(x), seed) : Tensor();
    const Tensor w = random_input({c}, x.dtype(), seed + 1),
                 b = random_input({c}, x.dtype(), seed + 2);
    const Tensor rm = random_input({c}, p, seed + 3),
                 rv = add(random_input({c}, p, seed + 4).abs(), Scalar(0.5));
    const Tensor out = like(x), mean = poisoned({c}, p), invstd = poisoned({c}, p);
    k.batch_norm_relu_forward(out, mean, invstd, x, res, w, b, rm, rv, training, 0.1, 1e-5);
    const Tensor gy = rows(x.sizes(), x.dtype(), is_rows(x), seed + 5);
    const Tensor gx = like(x), gres = residual ? like(x) : Tensor(), gw = poisoned({c}, x.dtype()),
                 gb = poisoned({c}, x.dtype());
    k.batch_norm_relu_backward(gx, gres, gw, gb, gy, out, x, w, mean, invstd, training);
    Outputs o = {out, mean, invstd, rm, rv, gx, gw, gb};
    if (residual) o.push_back(gres);
    return o;
  };
}

TEST(EmulatedLayers, FusedBatchNormReluMatchesCpu) {
  uint64_t seed = 1;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    const Tensor inputs[] = {rows({3, 5, 70}, dtype, false, seed),    // S > 1
                             rows({300, 40, 1}, dtype, false, seed),  // S = 1: 32-channel tiles
                             rows({2, 6, 35}, dtype, true, seed)};    // channels-last rows
    for (const Tensor& x : inputs) {
      for (bool training : {true, false}) {
        for (bool residual : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype << " " << shape_str(x.sizes()) << (training ? " training" : " eval")
                       << (residual ? " residual" : ""));
          expect_parity(kernels(), fused_bn_run(x, training, residual, seed += 10),
                        4 * tolerance(dtype), 4 * tolerance(dtype));
        }
      }
    }
  }
}

TEST(EmulatedLayers, EvalBatchNormStatisticsAndBackwardMatchCpu) {
  for (DType dtype : {kF32, kF64, kF16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const DType p = stat_type(dtype);
    const Tensor rm = random_input({37}, p, 1), rv = random_input({37}, p, 2).abs();
    const Tensor mean = poisoned({37}, p), invstd = poisoned({37}, p);
    in_both_orders([&] {
      detail::emulated::bn_eval_stats(mean, invstd, rm, rv, 1e-3, nullptr);
      return Outputs{};
    });
    const Tensor want_invstd = rsqrt(add(rv.to(kF64), Scalar(1e-3))).to(p);
    EXPECT_FALSE(mismatch(mean, rm, 0.0, 0.0).has_value());
    EXPECT_FALSE(mismatch(invstd, want_invstd, 0.0, 0.0).has_value());

    const Tensor x = random_input({4, 37, 30}, dtype, 3), gy = random_input({4, 37, 30}, dtype, 4),
                 w = random_input({37}, dtype, 5);
    const auto backward = [&](bool emulated) {
      const Tensor gx = like(x), gw = poisoned({37}, dtype), gb = poisoned({37}, dtype);
      if (emulated) {
        detail::emulated::batch_norm_eval_backward(gx, gw, gb, gy, x, w, rm, invstd);
      } else {
        cpu_table().batch_norm_backward(gx, gw, gb, gy, x, w, rm, invstd, false);
      }
      return Outputs{gx, gw, gb};
    };
    const Outputs want = backward(false);
    for (const Outputs& got : in_both_orders([&] { return backward(true); })) {
      for (size_t i = 0; i < got.size(); ++i) {
        const auto m = mismatch(got[i], want[i], 4 * tolerance(dtype), 4 * tolerance(dtype));
        EXPECT_FALSE(m.has_value()) << "output " << i << ": " << *m;
      }
    }
  }
}

KernelRun cross_entropy_run(const Tensor& logits, const Tensor& target, double smoothing,
                            uint64_t seed) {
  return [=](const detail::KernelTable& k) {
    const int64_t n = logits.size(0);
    const Tensor loss = poisoned({n}, logits.dtype()), lse = poisoned({n}, logits.dtype());
    k.cross_entropy_forward(loss, lse, logits, target, -100, smoothing);
    const Tensor gl = random_input({n}, logits.dtype(), seed), glogits = like(logits);
    k.cross_entropy_backward(glogits, gl, logits, lse, target, -100, smoothing);
    return Outputs{loss, lse, glogits};
  };
}

TEST(EmulatedLayers, CrossEntropyMatchesCpu) {
  uint64_t seed = 100;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (int64_t c : {1, 10, 1000}) {
      for (double smoothing : {0.0, 0.1}) {
        SCOPED_TRACE(::testing::Message() << dtype << " C " << c << " smoothing " << smoothing);
        const int64_t n = 45;  // past the emulated grid cap of rows
        const Tensor logits = random_input({n, c}, dtype, seed++);
        Generator gen(seed++);
        Tensor target = randint(0, c, {n}, kI64, &gen);
        target.slice(0, 3, 4).fill_(-100);  // an ignored sample
        expect_parity(kernels(), cross_entropy_run(logits, target, smoothing, seed++),
                      4 * tolerance(dtype), 4 * tolerance(dtype));
      }
    }
  }
}

TEST(EmulatedLayers, PlantedBugsFail) {
  const Tensor x = random_input({3, 5, 70}, kF32, 7);
  expect_planted_bug_fails(kernels(), fused_bn_run(x, true, false, 8),
                           cuda_emu::Bug::kMissingBarrier, 0, 1e-4, 1e-4);
  expect_planted_bug_fails(kernels(), fused_bn_run(x, true, false, 8),
                           cuda_emu::Bug::kLostTailThread, 0, 1e-4, 1e-4);
  const Tensor logits = random_input({45, 300}, kF32, 9);
  Generator gen(10);
  const Tensor target = randint(0, 300, {45}, kI64, &gen);
  expect_planted_bug_fails(kernels(), cross_entropy_run(logits, target, 0.0, 11),
                           cuda_emu::Bug::kWrongShuffleMask, 0, 1e-4, 1e-4);
}

}  // namespace
}  // namespace ember::testing
