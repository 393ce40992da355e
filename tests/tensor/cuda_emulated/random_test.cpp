// tensor/cuda/random.cu emulated on the CPU (tensor/cuda/emulated/emulate.h) against the CPU
// kernel: the same Philox draws, bit for bit, for uniform, normal and randint, every dtype,
// sizes around the block and past the emulated grid cap, nonzero offsets; a planted bug
// fails.
#include <ember/tensor/cuda/random.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_random_kernels>();
}

KernelRun random_run(detail::RandomKind kind, DType dtype, int64_t n, uint64_t offset) {
  return [=](const detail::KernelTable& k) {
    const Tensor out = poisoned({n}, dtype);
    const double a = kind == detail::RandomKind::kRandint ? -3.0 : 0.5;
    k.random(kind, out, 1234, offset, a, 7.0);
    return Outputs{out};
  };
}

TEST(EmulatedRandom, SameDrawsAsCpu) {
  using detail::RandomKind;
  for (RandomKind kind : {RandomKind::kUniform, RandomKind::kNormal, RandomKind::kRandint}) {
    for (DType dtype : {kF32, kF64, kF16, kBF16, kI64, kI32}) {
      if (!is_floating(dtype) && kind != RandomKind::kRandint) continue;
      for (int64_t n : {0, 1, 5, 1000}) {
        for (uint64_t offset : {uint64_t{0}, uint64_t{12}}) {
          SCOPED_TRACE(::testing::Message() << dtype << " kind " << static_cast<int>(kind) << " n "
                                            << n << " offset " << offset);
          expect_parity(kernels(), random_run(kind, dtype, n, offset));
        }
      }
    }
  }
}

TEST(EmulatedRandom, PlantedTailBugFails) {
  expect_planted_bug_fails(kernels(), random_run(detail::RandomKind::kNormal, kF32, 1000, 0),
                           cuda_emu::Bug::kLostTailThread);
}

}  // namespace
}  // namespace ember::testing
