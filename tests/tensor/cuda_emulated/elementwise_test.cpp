// tensor/cuda/elementwise.cu and launch.cuh's grid-stride launcher, emulated on the CPU
// (tensor/cuda/emulated/emulate.h), against the CPU kernels: fill, copy (casts), unary,
// binary, compare and where over sizes around the block and the (emulated) grid cap,
// non-contiguous and broadcast operands, every dtype.
#include <ember/tensor/cuda/elementwise.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

using detail::BinaryOp;
using detail::UnaryOp;

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_elementwise_kernels>();
}

// 0 and 1 elements, a warp, a block and one past, the emulated grid cap (3 blocks of 256) and
// past it (grid-stride loops).
const int64_t kSizes[] = {0, 1, 31, 257, 768, 1000};
const DType kAllTypes[] = {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool};

TEST(EmulatedElementwise, FillEveryDtypeAndSize) {
  for (DType dtype : kAllTypes) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(::testing::Message() << dtype << " n " << n);
      expect_parity(kernels(), [&](const detail::KernelTable& k) {
        const Tensor out = poisoned({n}, dtype);
        k.fill(out, Scalar(1.5));
        return Outputs{out};
      });
    }
  }
  // Strided: every other column of a [5, 66] tensor.
  expect_parity(kernels(), [&](const detail::KernelTable& k) {
    const Tensor base = poisoned({5, 66}, kF32);
    k.fill(base.slice(1, 0, 66, 2), Scalar(-2.0));
    return Outputs{base};
  });
}

TEST(EmulatedElementwise, CopyCastsBetweenDtypes) {
  uint64_t seed = 1;
  for (DType to : kAllTypes) {
    for (DType from : kAllTypes) {
      SCOPED_TRACE(::testing::Message() << from << " -> " << to);
      const Tensor in = random_input({3, 111}, from, seed++);
      expect_parity(kernels(), [&](const detail::KernelTable& k) {
        const Tensor out = poisoned({3, 111}, to);
        k.copy(out, in);
        return Outputs{out};
      });
    }
  }
  // Transposed source, broadcast (stride 0) source, same dtype contiguous (memcpy path).
  const Tensor in = random_input({37, 29}, kF32, 99);
  expect_parity(kernels(), [&](const detail::KernelTable& k) {
    const Tensor t = poisoned({29, 37}, kF32), b = poisoned({29, 37}, kBF16),
                 c = poisoned({37, 29}, kF32);
    k.copy(t, in.transpose(0, 1));
    k.copy(b, in.slice(1, 0, 1).reshape({37}).expand({29, 37}));
    k.copy(c, in);
    return Outputs{t, b, c};
  });
}

TEST(EmulatedElementwise, UnaryEveryOpAndFloatingDtype) {
  const UnaryOp ops[] = {UnaryOp::kNeg,  UnaryOp::kAbs,       UnaryOp::kExp,   UnaryOp::kLog,
                         UnaryOp::kSqrt, UnaryOp::kRsqrt,     UnaryOp::kRelu,  UnaryOp::kSigmoid,
                         UnaryOp::kTanh, UnaryOp::kPowScalar, UnaryOp::kClamp, UnaryOp::kGelu};
  uint64_t seed = 10;
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    for (UnaryOp op : ops) {
      // gelu in both forms: its a is the GeluApproximate.
      const std::vector<double> params =
          op == UnaryOp::kPowScalar ? std::vector<double>{1.7}
          : op == UnaryOp::kGelu ? std::vector<double>{static_cast<double>(GeluApproximate::kNone),
                                                       static_cast<double>(GeluApproximate::kTanh)}
                                 : std::vector<double>{-0.5};
      for (const double a : params) {
        for (int64_t n : {int64_t{1}, int64_t{257}, int64_t{1000}}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype << " op " << static_cast<int>(op) << " a " << a << " n " << n);
          const Tensor in = random_input({n}, dtype, seed++);
          // Same formulas, different libm: a few ulps of the compute type.
          const double tol = dtype == kF64 ? 1e-14 : 1e-6;
          expect_parity(
              kernels(),
              [&](const detail::KernelTable& k) {
                const Tensor out = poisoned({n}, dtype);
                k.unary(op, out, in, a, 0.5);
                return Outputs{out};
              },
              tol, tol);
        }
      }
    }
  }
}

TEST(EmulatedElementwise, UnaryIntegersExact) {
  const UnaryOp ops[] = {UnaryOp::kNeg, UnaryOp::kAbs, UnaryOp::kRelu, UnaryOp::kPowScalar,
                         UnaryOp::kClamp};
  for (DType dtype : {kI64, kI32, kU8}) {
    for (UnaryOp op : ops) {
      SCOPED_TRACE(::testing::Message() << dtype << " op " << static_cast<int>(op));
      const Tensor in = random_input({300}, dtype, 7);
      expect_parity(kernels(), [&](const detail::KernelTable& k) {
        const Tensor out = poisoned({300}, dtype);
        k.unary(op, out, in, 2.0, 3.0);
        return Outputs{out};
      });
    }
  }
}

TEST(EmulatedElementwise, BinaryAndCompareBroadcastAndStrided) {
  // (integer division and pow reach neither kernel: the front end promotes them.)
  const BinaryOp ops[] = {BinaryOp::kAdd,     BinaryOp::kSub,     BinaryOp::kMul,
                          BinaryOp::kMaximum, BinaryOp::kMinimum, BinaryOp::kReluBackward,
                          BinaryOp::kEq,      BinaryOp::kLt,      BinaryOp::kGe,
                          BinaryOp::kNe,      BinaryOp::kLe,      BinaryOp::kGt};
  uint64_t seed = 500;
  for (DType dtype : {kF32, kF64, kBF16, kF16, kI64, kI32}) {
    for (BinaryOp op : ops) {
      SCOPED_TRACE(::testing::Message() << dtype << " op " << static_cast<int>(op));
      const Tensor a = random_input({7, 130}, dtype, seed++);
      const Tensor b = random_input({130}, dtype, seed++).expand({7, 130});     // broadcast
      const Tensor at = random_input({130, 7}, dtype, seed++).transpose(0, 1);  // strided
      const DType out_type = detail::is_comparison(op) ? kBool : dtype;
      const double tol = is_floating(dtype) ? 1e-6 : 0.0;
      expect_parity(
          kernels(),
          [&](const detail::KernelTable& k) {
            const Tensor o1 = poisoned({7, 130}, out_type), o2 = poisoned({7, 130}, out_type);
            k.binary(op, o1, a, b, Scalar(2));
            k.binary(op, o2, at, a, Scalar(1));
            if (!is_floating(dtype)) return Outputs{o1, o2};
            // Division and pow: floating only.
            const Tensor o3 = poisoned({7, 130}, dtype), o4 = poisoned({7, 130}, dtype);
            k.binary(BinaryOp::kDiv, o3, a, b, Scalar(1));
            k.binary(BinaryOp::kPow, o4, a.abs(), at, Scalar(1));
            return Outputs{o1, o2, o3, o4};
          },
          tol, tol);
    }
  }
}

TEST(EmulatedElementwise, WhereEveryDtype) {
  for (DType dtype : kAllTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor cond = random_input({9, 100}, kBool, 3);
    const Tensor a = random_input({9, 100}, dtype, 4), b = random_input({100}, dtype, 5);
    expect_parity(kernels(), [&](const detail::KernelTable& k) {
      const Tensor out = poisoned({9, 100}, dtype);
      k.where(out, cond, a, b.expand({9, 100}));
      return Outputs{out};
    });
  }
}

TEST(EmulatedElementwise, PlantedTailBugFails) {
  const Tensor in = random_input({1000}, kF32, 1);
  expect_planted_bug_fails(
      kernels(),
      [&](const detail::KernelTable& k) {
        const Tensor out = poisoned({1000}, kF32);
        k.unary(UnaryOp::kNeg, out, in, 0, 0);
        return Outputs{out};
      },
      cuda_emu::Bug::kLostTailThread);
}

}  // namespace
}  // namespace ember::testing
