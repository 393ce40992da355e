// tensor/cuda/amp.cu (the GradScaler's inf/NaN check and unscale through multi_tensor_apply,
// the scale's update) emulated on the CPU (tensor/cuda/emulated/emulate.h) against the CPU
// kernels: tensors of every floating dtype, empty ones, non-finite values, a scale of 1 that
// must leave the bits alone; the update's growth, backoff and interval; a planted bug fails.
#include <ember/tensor/cuda/amp.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_amp_kernels>();
}

KernelRun unscale_run(bool with_inf, float inv) {
  return [=](const detail::KernelTable& k) {
    std::vector<Tensor> tensors = {random_input({1000}, kF32, 1), random_input({0}, kF32, 2),
                                   random_input({37}, kF16, 3), random_input({600}, kBF16, 4),
                                   random_input({5}, kF64, 5)};
    if (with_inf) tensors[3].view({-1}).slice(0, 599, 600).fill_(INFINITY);
    const Tensor found = zeros({1}, kF32), inv_scale = full({1}, inv, kF32);
    k.amp_non_finite_check_and_unscale(tensors, found, inv_scale);
    tensors.push_back(found);
    return tensors;
  };
}

TEST(EmulatedAmp, CheckAndUnscaleMatchesCpu) {
  for (bool with_inf : {false, true}) {
    for (float inv : {0.25f, 1.0f}) {
      SCOPED_TRACE(::testing::Message() << (with_inf ? "inf " : "") << "inv " << inv);
      expect_parity(kernels(), unscale_run(with_inf, inv));
    }
  }
}

TEST(EmulatedAmp, UpdateScaleMatchesCpu) {
  for (float found : {0.0f, 1.0f}) {
    for (int tracker : {0, 1}) {
      SCOPED_TRACE(::testing::Message() << "found " << found << " tracker " << tracker);
      expect_parity(kernels(), [=](const detail::KernelTable& k) {
        const Tensor scale = full({1}, 1024.0, kF32), growth = full({1}, tracker, kI32),
                     found_inf = full({1}, found, kF32);
        k.amp_update_scale(scale, growth, found_inf, 2.0, 0.5, 2);
        return Outputs{scale, growth};
      });
    }
  }
}

TEST(EmulatedAmp, PlantedTailBugFails) {
  // The lost thread is the last of the last block: the f64 tensor's block, whose 5 elements
  // its first threads take, so lose the f32 tensor's tail instead with a lone f32 tensor.
  expect_planted_bug_fails(
      kernels(),
      [](const detail::KernelTable& k) {
        const Tensor t = random_input({512}, kF32, 9), found = zeros({1}, kF32),
                     inv_scale = full({1}, 0.5, kF32);
        k.amp_non_finite_check_and_unscale({t}, found, inv_scale);
        return Outputs{t, found};
      },
      cuda_emu::Bug::kLostTailThread);
}

}  // namespace
}  // namespace ember::testing
