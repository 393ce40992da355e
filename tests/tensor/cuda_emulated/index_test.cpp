// tensor/cuda/index.cu (index_select, gather, scatter_add with its atomics, byte-wide ones
// included) emulated on the CPU (tensor/cuda/emulated/emulate.h) against the CPU kernels:
// every dtype, outer/inner sizes around the block and past the emulated grid cap, repeated
// indices; planted bugs fail.
#include <ember/tensor/cuda/index.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_index_kernels>();
}

const DType kAllTypes[] = {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool};

Tensor indices(const Shape& shape, int64_t high, uint64_t seed) {
  Generator gen(seed);
  return randint(0, high, shape, kI64, &gen);
}

TEST(EmulatedIndex, IndexSelectEveryDtype) {
  for (DType dtype : kAllTypes) {
    for (int64_t inner : {1, 3, 300}) {
      SCOPED_TRACE(::testing::Message() << dtype << " inner " << inner);
      const Tensor in = random_input({4, 9, inner}, dtype, 1), index = indices({13}, 9, 2);
      expect_parity(kernels(), [&](const detail::KernelTable& k) {
        const Tensor out = poisoned({4, 13, inner}, dtype);
        k.index_select(out, in, index, 4, 9, inner);
        return Outputs{out};
      });
    }
  }
}

TEST(EmulatedIndex, GatherAndScatterAddEveryDim) {
  for (DType dtype : kAllTypes) {
    for (int64_t dim : {0, 1, 2}) {
      SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim);
      const Tensor in = random_input({5, 6, 70}, dtype, 3);
      Shape index_shape = {5, 6, 70};
      index_shape[static_cast<size_t>(dim)] = 4;
      const Tensor index = indices(index_shape, in.size(dim), 4);
      const Tensor src = random_input(index_shape, dtype, 5);
      expect_parity(
          kernels(),
          [&](const detail::KernelTable& k) {
            const Tensor out = poisoned(index_shape, dtype);
            k.gather(out, in, dim, index);
            // Repeated indices add up: the atomics (byte-wide compare-and-swap for u8 and bool).
            const Tensor self = in.clone();
            k.scatter_add(self, dim, index, src);
            return Outputs{out, self};
          },
          tolerance(dtype), tolerance(dtype));
    }
  }
}

TEST(EmulatedIndex, PlantedTailBugFails) {
  const Tensor in = random_input({4, 9, 300}, kF32, 1), index = indices({13}, 9, 2);
  expect_planted_bug_fails(
      kernels(),
      [&](const detail::KernelTable& k) {
        const Tensor out = poisoned({4, 13, 300}, kF32);
        k.index_select(out, in, index, 4, 9, 300);
        return Outputs{out};
      },
      cuda_emu::Bug::kLostTailThread);
}

}  // namespace
}  // namespace ember::testing
