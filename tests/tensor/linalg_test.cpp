// matmul, mm, bmm and addmm against a plain triple loop, for every rank combination,
// broadcast batch dims, transposed and strided views, zero sizes and bad input.
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "test_util.h"

namespace ember {
namespace {

using ember::testing::expect_close;
using Values = std::vector<double>;

int64_t numel_of(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

Tensor tensor_of(const Values& values, const Shape& shape, DType dtype = kF64) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape).to(dtype);
}

Tensor random_tensor(const Shape& shape, unsigned seed, DType dtype = kF64) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Values v(static_cast<size_t>(numel_of(shape)));
  for (auto& x : v) x = dist(gen);
  return tensor_of(v, shape, dtype);
}

// torch.matmul by loops: 1-d arguments gain a dim (then lose it), batch dims broadcast.
Tensor ref_matmul(const Tensor& a, const Tensor& b) {
  Shape sa = a.sizes(), sb = b.sizes();
  const bool vec_a = sa.size() == 1, vec_b = sb.size() == 1;
  if (vec_a) sa.insert(sa.begin(), 1);
  if (vec_b) sb.push_back(1);
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    const int64_t x = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())];
    const int64_t y = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    batch[i] = std::max(x, y);
  }
  // Offset of the matrix at batch coordinates `c` in a row-major tensor with batch dims bs.
  const auto matrix_offset = [&](const Shape& bs, const Shape& c, int64_t matrix_size) {
    int64_t off = 0;
    for (size_t i = 0; i < bs.size(); ++i) {
      const int64_t ci = c[i + (nb - bs.size())];
      off = off * bs[i] + (bs[i] == 1 ? 0 : ci);
    }
    return off * matrix_size;
  };
  const Values va = a.contiguous().to_vector<double>(), vb = b.contiguous().to_vector<double>();
  const int64_t batches = numel_of(batch);
  Values out(static_cast<size_t>(batches * m * n), 0.0);
  for (int64_t bi = 0; bi < batches; ++bi) {
    Shape c(nb);
    for (int64_t rest = bi, d = static_cast<int64_t>(nb) - 1; d >= 0; --d) {
      c[static_cast<size_t>(d)] = rest % batch[static_cast<size_t>(d)];
      rest /= batch[static_cast<size_t>(d)];
    }
    const int64_t oa = matrix_offset(ba, c, m * k), ob = matrix_offset(bb, c, k * n);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += va[static_cast<size_t>(oa + i * k + p)] * vb[static_cast<size_t>(ob + p * n + j)];
        out[static_cast<size_t>((bi * m + i) * n + j)] = acc;
      }
    }
  }
  Shape shape = batch;
  if (!vec_a) shape.push_back(m);
  if (!vec_b) shape.push_back(n);
  return tensor_of(out, shape, a.dtype());
}

double tol(DType dtype) { return dtype == kF32 ? 1e-5 : 1e-12; }

TEST(LinalgMatmul, EveryRankCombination) {
  const std::vector<std::pair<Shape, Shape>> cases{
      {{4}, {4}},                    // dot
      {{3, 4}, {4}},                 // matrix @ vector
      {{4}, {4, 5}},                 // vector @ matrix
      {{3, 4}, {4, 5}},              // mm
      {{2, 3, 4}, {4, 5}},           // batch @ matrix (folded into one gemm)
      {{2, 3, 4}, {4}},              // batch @ vector
      {{4}, {2, 4, 5}},              // vector @ batch
      {{3, 4}, {2, 4, 5}},           // matrix @ batch
      {{2, 3, 4}, {2, 4, 5}},        // bmm
      {{2, 1, 3, 4}, {3, 4, 5}},     // batch dims broadcast both ways
      {{1, 3, 4}, {6, 4, 5}},        // size-1 batch broadcast
      {{2, 2, 3, 4}, {2, 1, 4, 5}},  // 4-d
      {{1, 4}, {4, 1}},
      {{1}, {1, 7}},
  };
  for (DType dtype : {kF32, kF64}) {
    unsigned seed = 0;
    for (const auto& [sa, sb] : cases) {
      SCOPED_TRACE(::testing::Message() << dtype << " " << shape_str(sa) << " @ " << shape_str(sb));
      const Tensor a = random_tensor(sa, ++seed, dtype), b = random_tensor(sb, ++seed, dtype);
      const Tensor expected = ref_matmul(a, b);
      expect_close(matmul(a, b), expected, tol(dtype), tol(dtype));
      expect_close(a.matmul(b), expected, tol(dtype), tol(dtype));
    }
  }
  EXPECT_EQ(matmul(zeros({4}), zeros({4})).dim(), 0);
}

TEST(LinalgMatmul, TransposedAndStridedViews) {
  for (DType dtype : {kF32, kF64}) {
    const Tensor a = random_tensor({5, 3}, 1, dtype);  // used as a.t(): [3, 5]
    const Tensor b = random_tensor({7, 5}, 2, dtype);  // used as b.t(): [5, 7]
    const Tensor ac = a.t().contiguous(), bc = b.t().contiguous();
    const Tensor expected = ref_matmul(ac, bc);
    expect_close(mm(a.t(), bc), expected, tol(dtype), tol(dtype));
    expect_close(mm(ac, b.t()), expected, tol(dtype), tol(dtype));
    expect_close(mm(a.t(), b.t()), expected, tol(dtype), tol(dtype));
    expect_close(matmul(a.t(), b.t()), expected, tol(dtype), tol(dtype));
    // Row-major views with a leading dim larger than the row: a column slice.
    const Tensor wide = random_tensor({3, 9}, 3, dtype);
    const Tensor cols = wide.narrow(1, 2, 5);
    expect_close(mm(cols, bc), ref_matmul(cols.contiguous(), bc), tol(dtype), tol(dtype));
    // Strides BLAS cannot take (a step in both dims) are copied first.
    const Tensor stepped = random_tensor({6, 10}, 4, dtype).slice(0, 0, 6, 2).slice(1, 0, 10, 2);
    expect_close(mm(stepped, bc), ref_matmul(stepped.contiguous(), bc), tol(dtype), tol(dtype));
    // Broadcast rows (stride 0).
    const Tensor row = random_tensor({1, 5}, 5, dtype).expand({4, 5});
    expect_close(mm(row, bc), ref_matmul(row.contiguous(), bc), tol(dtype), tol(dtype));
    // k == 1, with a single-row operand that is a transposed view (strides (1, 1)).
    const Tensor row_view = random_tensor({5, 1}, 6, dtype).t();
    const Tensor lhs = random_tensor({2, 1}, 7, dtype);
    expect_close(mm(lhs, row_view), ref_matmul(lhs, row_view.contiguous()), tol(dtype), tol(dtype));
  }
}

TEST(LinalgBmm, BatchedViews) {
  const Tensor a = random_tensor({4, 3, 5}, 1);
  const Tensor b = random_tensor({4, 6, 5}, 2);
  const Tensor bt = b.transpose(1, 2);  // [4, 5, 6], each matrix transposed
  const Tensor expected = ref_matmul(a, bt.contiguous());
  expect_close(bmm(a, bt), expected, 1e-12, 1e-12);
  expect_close(matmul(a, bt), expected, 1e-12, 1e-12);
  // The batch dim in the middle of memory: [3, 4, 5] permuted to [4, 3, 5].
  const Tensor middle = random_tensor({3, 4, 5}, 3).permute({1, 0, 2});
  expect_close(bmm(middle, bt), ref_matmul(middle.contiguous(), bt.contiguous()), 1e-12, 1e-12);
  // Every matrix transposed and the batch permuted.
  const Tensor scrambled = random_tensor({5, 4, 3}, 4).permute({1, 2, 0});
  expect_close(bmm(scrambled, bt), ref_matmul(scrambled.contiguous(), bt.contiguous()), 1e-12,
               1e-12);
  // A broadcast batch (stride 0) whose matrix needs a copy.
  const Tensor shared = random_tensor({6, 10}, 5).slice(1, 0, 10, 2).unsqueeze(0).expand({4, 6, 5});
  expect_close(matmul(a, shared.transpose(1, 2)),
               ref_matmul(a, shared.transpose(1, 2).contiguous()), 1e-12, 1e-12);
  // Batch dims that cannot be flattened to one stride.
  const Tensor odd = random_tensor({2, 5, 3, 4}, 6).slice(1, 0, 5, 2);  // [2, 3, 3, 4]
  const Tensor rhs = random_tensor({3, 4, 2}, 7);
  expect_close(matmul(odd, rhs), ref_matmul(odd.contiguous(), rhs), 1e-12, 1e-12);
}

TEST(LinalgAddmm, BetaAlphaAndBroadcastInput) {
  const Tensor a = random_tensor({3, 4}, 1), b = random_tensor({4, 5}, 2);
  const Values ab = ref_matmul(a, b).to_vector<double>();
  const Tensor bias = random_tensor({5}, 3);
  const Values vb = bias.to_vector<double>();
  Values expected(15);
  for (size_t i = 0; i < 15; ++i) expected[i] = 0.5 * vb[i % 5] + 2.0 * ab[i];
  expect_close(addmm(bias, a, b, 0.5, 2.0), tensor_of(expected, {3, 5}), 1e-12, 1e-12);
  const Tensor col = random_tensor({3, 1}, 4);
  const Values vc = col.to_vector<double>();
  for (size_t i = 0; i < 15; ++i) expected[i] = vc[i / 5] + ab[i];
  expect_close(addmm(col, a, b), tensor_of(expected, {3, 5}), 1e-12, 1e-12);
  // Transposed operands and a full-size input.
  const Tensor full_input = random_tensor({5, 3}, 5).t();
  const Values vf = full_input.contiguous().to_vector<double>();
  for (size_t i = 0; i < 15; ++i) expected[i] = -vf[i] + ab[i];
  expect_close(addmm(full_input, a.t().contiguous().t(), b, -1), tensor_of(expected, {3, 5}), 1e-12,
               1e-12);
  // beta == 0 ignores the input, NaNs included.
  const Tensor nan_input = full({3, 5}, std::numeric_limits<double>::quiet_NaN(), kF64);
  expect_close(addmm(nan_input, a, b, 0, 1), tensor_of(ab, {3, 5}), 1e-12, 1e-12);
  // f32 too.
  for (size_t i = 0; i < 15; ++i) expected[i] = vb[i % 5] + ab[i];
  expect_close(addmm(bias.to(kF32), a.to(kF32), b.to(kF32)), tensor_of(expected, {3, 5}, kF32),
               1e-5, 1e-5);
}

TEST(LinalgMatmul, ZeroSizes) {
  EXPECT_EQ(mm(zeros({0, 3}), zeros({3, 4})).sizes(), (Shape{0, 4}));
  EXPECT_EQ(mm(zeros({2, 3}), zeros({3, 0})).sizes(), (Shape{2, 0}));
  // k == 0: an empty sum, so zeros (even where the output memory held garbage).
  expect_close(mm(ones({2, 0}), ones({0, 3})), zeros({2, 3}), 0, 0);
  expect_close(matmul(ones({0}), ones({0})), zeros({}), 0, 0);
  expect_close(addmm(full({3}, 2.0), ones({2, 0}), ones({0, 3}), 3, 1), full({2, 3}, 6.0), 0, 0);
  EXPECT_EQ(bmm(zeros({0, 2, 3}), zeros({0, 3, 4})).sizes(), (Shape{0, 2, 4}));
  EXPECT_EQ(matmul(zeros({2, 0, 3}), zeros({3, 4})).sizes(), (Shape{2, 0, 4}));
  expect_close(matmul(ones({2, 3, 0}), ones({2, 0, 4})), zeros({2, 3, 4}), 0, 0);
}

TEST(LinalgMatmul, LargerSizesMatchReference) {
  const Tensor a = random_tensor({67, 129}, 1, kF32), b = random_tensor({129, 45}, 2, kF32);
  expect_close(matmul(a, b), ref_matmul(a, b), 1e-4, 1e-4);
  const Tensor c = random_tensor({3, 33, 70}, 3), d = random_tensor({3, 70, 17}, 4);
  expect_close(matmul(c, d), ref_matmul(c, d), 1e-12, 1e-12);
}

TEST(LinalgMatmul, BadInput) {
  EXPECT_EMBER_ERROR(matmul(zeros({2, 3}), zeros({4, 5})),
                     "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  EXPECT_EMBER_ERROR(matmul(zeros({3}), zeros({4})),
                     "matmul: shapes [3] and [4] cannot be multiplied (3 != 4)");
  EXPECT_EMBER_ERROR(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})),
                     "matmul: shapes [2] and [3] cannot broadcast");
  EXPECT_EMBER_ERROR(matmul(zeros({}), zeros({3})),
                     "matmul: both arguments need at least 1 dimension");
  // f16 and bf16 multiply on the CPU too (f32 accumulation, one rounding: autocast_test.cpp).
  EXPECT_TRUE(equal(matmul(ones({2, 3}, kF16), ones({3, 2}, kF16)), full({2, 2}, 3.0, kF16)));
  EXPECT_TRUE(equal(matmul(ones({2, 3}, kBF16), ones({3, 2}, kBF16)), full({2, 2}, 3.0, kBF16)));
  EXPECT_EMBER_ERROR(matmul(zeros({2, 2}, kI64), zeros({2, 2}, kI64)),
                     "matmul: dtype i64 is not supported");
  EXPECT_EMBER_ERROR(matmul(zeros({2, 2}, kF32), zeros({2, 2}, kF64)),
                     "matmul: dtypes f32 and f64 differ");
  EXPECT_EMBER_ERROR(matmul(Tensor(), zeros({2})), "matmul: argument 'a' is an undefined tensor");
  EXPECT_EMBER_ERROR(mm(zeros({2, 2, 2}), zeros({2, 2})),
                     "mm: expected 2-d tensors, got shapes [2, 2, 2] and [2, 2]");
  EXPECT_EMBER_ERROR(mm(zeros({2, 3}), zeros({2, 3})),
                     "mm: shapes [2, 3] and [2, 3] cannot be multiplied (3 != 2)");
  EXPECT_EMBER_ERROR(bmm(zeros({2, 3}), zeros({2, 3, 4})), "bmm: expected 3-d tensors");
  EXPECT_EMBER_ERROR(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), "bmm: batch sizes 2 and 3 differ");
  EXPECT_EMBER_ERROR(bmm(zeros({2, 3, 4}), zeros({2, 5, 5})),
                     "bmm: shapes [2, 3, 4] and [2, 5, 5] cannot be multiplied (4 != 5)");
  EXPECT_EMBER_ERROR(addmm(zeros({4}), zeros({2, 3}), zeros({3, 5})),
                     "addmm: shapes [4] and [2, 5] cannot broadcast");
  EXPECT_EMBER_ERROR(addmm(zeros({2, 2, 5}), zeros({2, 3}), zeros({3, 5})),
                     "addmm: input of shape [2, 2, 5] cannot broadcast to [2, 5]");
  EXPECT_EMBER_ERROR(addmm(zeros({5}, kF64), zeros({2, 3}), zeros({3, 5})),
                     "addmm: input has dtype f64 but the matrices have f32");
}

TEST(LinalgMatmul, DevicesMustMatch) {
  EMBER_REQUIRE_CUDA();
  EXPECT_EMBER_ERROR(matmul(zeros({2, 2}), zeros({2, 2}).cuda()),
                     "matmul: expected all tensors on one device");
  EXPECT_EMBER_ERROR(addmm(zeros({2}).cuda(), zeros({2, 2}), zeros({2, 2})),
                     "addmm: expected all tensors on one device");
}

}  // namespace
}  // namespace ember
