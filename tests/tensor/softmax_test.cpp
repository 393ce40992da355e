// softmax and log_softmax against a plain (stable) reference, along every dim.
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

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t numel_of(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

Tensor tensor_of(const Values& values, const Shape& shape, DType dtype = kF64) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape).to(dtype);
}

Values random_values(int64_t n, unsigned seed, double scale = 4.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  Values v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// softmax (or log_softmax) of a row-major tensor along `dim`, by loops.
Values ref_softmax(const Values& x, const Shape& shape, int64_t dim, bool log) {
  const auto ndim = static_cast<int64_t>(shape.size());
  if (dim < 0) dim += ndim;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= shape[static_cast<size_t>(d)];
  for (int64_t d = dim + 1; d < ndim; ++d) inner *= shape[static_cast<size_t>(d)];
  const int64_t n = shape[static_cast<size_t>(dim)];
  Values y(x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const auto at = [&](int64_t j) { return static_cast<size_t>((o * n + j) * inner + i); };
      double m = -kInf;
      for (int64_t j = 0; j < n; ++j) m = std::max(m, x[at(j)]);
      double s = 0;
      for (int64_t j = 0; j < n; ++j) s += std::exp(x[at(j)] - m);
      for (int64_t j = 0; j < n; ++j)
        y[at(j)] = log ? x[at(j)] - m - std::log(s) : std::exp(x[at(j)] - m) / s;
    }
  }
  return y;
}

TEST(SoftmaxForward, EveryDimMatchesReference) {
  const Shape shape{3, 4, 5};
  const Values x = random_values(60, 1);
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    const double tol = dtype == kF64 ? 1e-12 : dtype == kF32 ? 1e-6 : dtype == kF16 ? 2e-3 : 2e-2;
    // The reference sees the values the tensor actually holds.
    const Values held = tensor_of(x, shape, dtype).to_vector<double>();
    for (int64_t dim : {0, 1, 2, -1, -2, -3}) {
      SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim);
      const Tensor t = tensor_of(x, shape, dtype);
      expect_close(softmax(t, dim), tensor_of(ref_softmax(held, shape, dim, false), shape, dtype),
                   tol, tol);
      expect_close(log_softmax(t, dim),
                   tensor_of(ref_softmax(held, shape, dim, true), shape, dtype), tol, tol);
      expect_close(t.softmax(dim), softmax(t, dim), 0, 0);
      expect_close(t.log_softmax(dim), log_softmax(t, dim), 0, 0);
    }
  }
}

TEST(SoftmaxForward, RowsSumToOne) {
  const Shape shape{6, 33};
  const Tensor p = softmax(tensor_of(random_values(6 * 33, 2, 20.0), shape, kF32), 1);
  expect_close(sum(p, {1}), ones({6}), 1e-6, 1e-6);
  const Tensor q = softmax(tensor_of(random_values(6 * 33, 3, 20.0), shape, kF32), 0);
  expect_close(sum(q, {0}), ones({33}), 1e-6, 1e-6);
  for (double v : p.to_vector<double>()) {
    EXPECT_GE(v, 0.0);
    EXPECT_LE(v, 1.0);
  }
}

TEST(SoftmaxForward, LargeValuesAreStable) {
  const Tensor big = tensor_of({1000, 1001, 1002, -1000}, {4}, kF32);
  const Values ls = log_softmax(big, 0).to_vector<double>();
  const Values expected = ref_softmax({1000, 1001, 1002, -1000}, {4}, 0, true);
  for (size_t i = 0; i < ls.size(); ++i) {
    EXPECT_TRUE(std::isfinite(ls[i])) << i;
    EXPECT_NEAR(ls[i], expected[i], 1e-4) << i;
  }
  expect_close(softmax(tensor_of({1000, 1000}, {2}, kF32), 0), full({2}, 0.5), 1e-7, 0);
  expect_close(softmax(tensor_of({-1000, -1000, -1000, -1000}, {4}, kF64), 0),
               full({4}, 0.25, kF64), 1e-12, 0);
  // -inf entries get probability 0 (and log-probability -inf).
  expect_close(softmax(tensor_of({-kInf, 0}, {2}), 0), tensor_of({0, 1}, {2}), 0, 0);
  expect_close(log_softmax(tensor_of({-kInf, 0}, {2}), 0), tensor_of({-kInf, 0}, {2}), 0, 0);
}

TEST(SoftmaxForward, ViewsAndWideInnerDims) {
  // A transposed input.
  const Values x = random_values(35, 4);
  const Tensor t = tensor_of(x, {5, 7}, kF32).t();  // [7, 5]
  const Values held = t.contiguous().to_vector<double>();
  expect_close(softmax(t, 1), tensor_of(ref_softmax(held, {7, 5}, 1, false), {7, 5}, kF32), 1e-6,
               1e-7);
  expect_close(log_softmax(t, 0), tensor_of(ref_softmax(held, {7, 5}, 0, true), {7, 5}, kF32), 1e-6,
               1e-6);
  // An inner extent over one block of columns, and enough work for several threads.
  const Shape shape{3, 9, 130};
  const Values y = random_values(numel_of(shape), 5);
  expect_close(softmax(tensor_of(y, shape), 1), tensor_of(ref_softmax(y, shape, 1, false), shape),
               1e-12, 1e-14);
  const Shape big{64, 40, 70};
  const Values z = random_values(numel_of(big), 6);
  expect_close(log_softmax(tensor_of(z, big, kF32), 1),
               tensor_of(ref_softmax(z, big, 1, true), big, kF32), 1e-5, 1e-5);
  expect_close(softmax(tensor_of(z, big, kF32), -1),
               tensor_of(ref_softmax(z, big, -1, false), big, kF32), 1e-5, 1e-7);
}

TEST(SoftmaxForward, ZeroSizeAndZeroDim) {
  EXPECT_EQ(softmax(zeros({0, 3}), 1).sizes(), (Shape{0, 3}));
  EXPECT_EQ(log_softmax(zeros({3, 0}), 1).sizes(), (Shape{3, 0}));
  EXPECT_EQ(softmax(zeros({3, 0}), 0).sizes(), (Shape{3, 0}));
  const Tensor s = scalar_tensor(7.0, kF32);
  EXPECT_EQ(softmax(s, 0).item<double>(), 1.0);
  EXPECT_EQ(softmax(s, 0).dim(), 0);
  EXPECT_EQ(log_softmax(s, -1).item<double>(), 0.0);
}

TEST(SoftmaxForward, BadInput) {
  EXPECT_EMBER_ERROR(softmax(zeros({2, 3}, kI64), 1),
                     "softmax: expected a floating dtype, got i64");
  EXPECT_EMBER_ERROR(log_softmax(zeros({2, 3}, kBool), 1),
                     "log_softmax: expected a floating dtype, got bool");
  EXPECT_EMBER_ERROR(softmax(zeros({2, 3}), 2), "softmax: dim 2 is out of range");
  EXPECT_EMBER_ERROR(log_softmax(zeros({2, 3}), -3), "log_softmax: dim -3 is out of range");
  EXPECT_EMBER_ERROR(softmax(Tensor(), 0), "softmax: argument 'input' is an undefined tensor");
}

}  // namespace
}  // namespace ember
