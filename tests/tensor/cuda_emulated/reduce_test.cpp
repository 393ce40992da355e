// tensor/cuda/reduce.cu (row reductions, arg max/min, softmax over rows and columns) and
// block_sum.cuh, emulated on the CPU (tensor/cuda/emulated/emulate.h), against the CPU
// kernels: rows short (a warp each) and long (a block each), tails, more rows than the
// emulated grid covers, every dtype; planted missing barriers and shuffle masks fail.
#include <ember/tensor/cuda/block_sum.cuh>
#include <ember/tensor/cuda/reduce.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

using detail::ReduceOp;

const detail::KernelTable& kernels() {
  return emulated_table<detail::emulated::register_cuda_reduce_kernels>();
}

struct Rows {
  int64_t outer, r;
};
// Short rows (one warp each, 8 per block; 30 rows pass the emulated grid cap of 3 blocks),
// a row of 1, and long rows (one block of 512 each) with a tail.
const Rows kRows[] = {{1, 1}, {30, 33}, {5, 1024}, {3, 1500}, {0, 4}};

testing::KernelRun reduce_run(ReduceOp op, const Tensor& in, int64_t outer, int64_t r,
                              double p = 2.0, int64_t correction = 1) {
  return [=](const detail::KernelTable& k) {
    const Tensor out = poisoned({outer}, in.dtype());
    k.reduce(op, out, in, outer, r, p, correction);
    return Outputs{out};
  };
}

TEST(EmulatedReduce, EveryOpDtypeAndRowLength) {
  uint64_t seed = 1;
  for (DType dtype : {kF32, kF64, kBF16, kF16, kI64, kI32}) {
    for (const Rows& rows : kRows) {
      const Tensor in = random_input({rows.outer, rows.r}, dtype, seed++);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin,
                          ReduceOp::kVar, ReduceOp::kNorm}) {
        if (!is_floating(dtype) && op != ReduceOp::kSum && op != ReduceOp::kMax &&
            op != ReduceOp::kMin) {
          continue;  // mean, var and norm of integers reach no kernel
        }
        SCOPED_TRACE(::testing::Message() << dtype << " op " << static_cast<int>(op) << " ["
                                          << rows.outer << ", " << rows.r << "]");
        // Sums in another order: a few ulps of the row's magnitude.
        const double tol = tolerance(dtype);
        expect_parity(kernels(), reduce_run(op, in, rows.outer, rows.r), tol, tol);
      }
      if (is_floating(dtype)) {
        for (double p : {1.0, 3.0, double{INFINITY}}) {  // the front end takes p > 0 only
          SCOPED_TRACE(::testing::Message() << "p " << p);
          expect_parity(kernels(), reduce_run(ReduceOp::kNorm, in, rows.outer, rows.r, p),
                        tolerance(dtype), tolerance(dtype));
        }
      }
    }
  }
}

TEST(EmulatedReduce, ArgMaxMinWithNanAndTies) {
  for (DType dtype : {kF32, kBF16, kI64}) {
    for (const Rows& rows : kRows) {
      Tensor in = random_input({rows.outer, rows.r}, dtype, 40);
      if (is_floating(dtype) && rows.outer * rows.r > 10) {
        in.view({-1}).slice(0, 7, 8).fill_(NAN);
      }
      for (bool is_max : {true, false}) {
        SCOPED_TRACE(::testing::Message() << dtype << (is_max ? " max [" : " min [") << rows.outer
                                          << ", " << rows.r << "]");
        expect_parity(kernels(), [&](const detail::KernelTable& k) {
          const Tensor values = poisoned({rows.outer}, dtype),
                       indices = poisoned({rows.outer}, kI64);
          k.arg_reduce(is_max, values, indices, in, rows.outer, rows.r);
          return Outputs{values, indices};
        });
      }
    }
  }
}

TEST(EmulatedReduce, SoftmaxRowsAndColumns) {
  struct Case {
    int64_t outer, n, inner;
  };
  const Case cases[] = {{1, 1, 1}, {20, 37, 1}, {2, 1300, 1}, {3, 5, 7}, {1, 9, 800}};
  uint64_t seed = 70;
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (const Case& c : cases) {
      const Tensor in = random_input({c.outer, c.n, c.inner}, dtype, seed++);
      for (bool log : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype << (log ? " log" : "") << " [" << c.outer << ", "
                                          << c.n << ", " << c.inner << "]");
        const double tol = tolerance(dtype);
        expect_parity(
            kernels(),
            [&](const detail::KernelTable& k) {
              const Tensor out = poisoned({c.outer, c.n, c.inner}, dtype);
              k.softmax(out, in, c.outer, c.n, c.inner, log);
              return Outputs{out};
            },
            tol, tol);
      }
    }
  }
}

TEST(EmulatedReduce, PlantedBugsFail) {
  const Tensor long_rows = random_input({3, 1500}, kF32, 5);
  const Tensor short_rows = random_input({30, 33}, kF32, 6);
  // The block-wide combine without its barrier before reading the warps' partials.
  expect_planted_bug_fails(kernels(), reduce_run(ReduceOp::kSum, long_rows, 3, 1500),
                           cuda_emu::Bug::kMissingBarrier, 1, 1e-5, 1e-5);
  expect_planted_bug_fails(kernels(), reduce_run(ReduceOp::kSum, short_rows, 30, 33),
                           cuda_emu::Bug::kWrongShuffleMask, 0, 1e-5, 1e-5);
  expect_planted_bug_fails(kernels(), reduce_run(ReduceOp::kMax, short_rows, 30, 33),
                           cuda_emu::Bug::kLostTailThread);
}

// block_sum on its own: one block of 256 sums 256 values, every thread gets the total.
__global__ void block_sum_kernel(float* out, const float* in) {
  EMBER_DYNAMIC_SHARED(float, shared);  // (poisoned per block, unlike static shared memory)
  out[threadIdx.x] = detail::emulated::block_sum<256>(in[threadIdx.x], shared);
}

Outputs block_sum_run(const Tensor& in) {
  const Tensor out = poisoned({256}, kF32);
  float* o = out.data_ptr<float>();
  const float* i = in.data_ptr<float>();
  EMBER_LAUNCH(1, 256, 256 * sizeof(float), nullptr, block_sum_kernel)(o, i);
  return Outputs{out};
}

TEST(EmulatedReduce, BlockSumIsTheFixedOrderTotal) {
  const Tensor in = random_input({256}, kF32, 9);
  const Outputs got = block_sum_run(in);
  // The fixed tree order: pairs at distance 128, 64, ... 1.
  std::vector<float> v = in.to_vector<float>();
  for (int half = 128; half > 0; half /= 2) {
    for (int t = 0; t < half; ++t) v[t] += v[t + half];
  }
  for (float x : got[0].to_vector<float>()) EXPECT_EQ(x, v[0]);
  for (int which = 0; which < 3; ++which) {  // the store's barrier, the first and second fold's
    const cuda_emu::PlantedBug bug(cuda_emu::Bug::kMissingBarrier, which);
    bool failed = false;
    for (const Outputs& bad : in_both_orders([&] { return block_sum_run(in); })) {
      failed = failed || !(bad[0].to_vector<float>()[0] == v[0]);
    }
    EXPECT_GT(bug.hits(), 0);
    EXPECT_TRUE(failed) << "missing barrier " << which;
  }
}

}  // namespace
}  // namespace ember::testing
