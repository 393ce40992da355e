// Reductions against plain loops over std::vector: sum, mean, max/min, argmax/argmin,
// var/std and norm, over dims, on views, empty tensors and every dtype each accepts.
#include <algorithm>
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

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A tensor of `shape` and `dtype` holding `values` in row-major order.
Tensor tensor_of(const Values& values, const Shape& shape, DType dtype = kF64) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape).to(dtype);
}

// Small integers and halves: exact in every floating dtype.
Values random_values(int64_t n, unsigned seed, int low = -8, int high = 8) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(low * 2, high * 2);
  Values v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen) / 2.0;
  return v;
}

// The elements of a row-major tensor grouped by their coordinates outside `dims` (empty =
// all dims), each group in row-major order, and the shape of the reduced result.
struct Groups {
  Shape shape;
  std::vector<Values> groups;
};

Groups group_by(const Values& x, const Shape& shape, Shape dims, bool keepdim) {
  const auto ndim = static_cast<int64_t>(shape.size());
  std::vector<bool> reduced(shape.size(), dims.empty());
  for (int64_t d : dims) reduced[static_cast<size_t>(d < 0 ? d + ndim : d)] = true;
  Groups g;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d])
      g.shape.push_back(shape[d]);
    else if (keepdim)
      g.shape.push_back(1);
  }
  int64_t groups = 1;
  for (size_t d = 0; d < shape.size(); ++d) groups *= reduced[d] ? 1 : shape[d];
  g.groups.resize(static_cast<size_t>(groups));
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    int64_t rest = i, key = 0, scale = 1;
    for (int64_t d = ndim - 1; d >= 0; --d) {
      const int64_t c = rest % shape[static_cast<size_t>(d)];
      rest /= shape[static_cast<size_t>(d)];
      if (!reduced[static_cast<size_t>(d)]) {
        key += c * scale;
        scale *= shape[static_cast<size_t>(d)];
      }
    }
    g.groups[static_cast<size_t>(key)].push_back(x[static_cast<size_t>(i)]);
  }
  return g;
}

Tensor reference(const Groups& g, const std::function<double(const Values&)>& f, DType dtype) {
  Values out;
  for (const auto& group : g.groups) out.push_back(f(group));
  return tensor_of(out, g.shape, dtype);
}

double ref_sum(const Values& v) { return std::accumulate(v.begin(), v.end(), 0.0); }
double ref_mean(const Values& v) { return ref_sum(v) / static_cast<double>(v.size()); }
double ref_var(const Values& v, int64_t correction) {
  const double m = ref_mean(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return ss /
         std::max<double>(0.0, static_cast<double>(v.size()) - static_cast<double>(correction));
}
double ref_norm(const Values& v, double p) {
  double acc = 0;
  for (double x : v)
    acc = std::isinf(p) ? std::max(acc, std::abs(x)) : acc + std::pow(std::abs(x), p);
  return std::isinf(p) ? acc : std::pow(acc, 1.0 / p);
}
// Index of the first maximum (or minimum); a NaN wins.
int64_t ref_arg(const Values& v, bool is_max) {
  size_t best = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) return static_cast<int64_t>(i);
    if (is_max ? v[i] > v[best] : v[i] < v[best]) best = i;
  }
  return static_cast<int64_t>(best);
}

const Shape kShape{3, 4, 5};
const std::vector<Shape> kDimLists{{}, {0}, {1}, {-1}, {0, 2}, {-1, -3}, {0, 1, 2}, {2, 0}};

TEST(ReduceSum, OverDimsMatchesReference) {
  const Values x = random_values(60, 1);
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    const Tensor t = tensor_of(x, kShape, dtype);
    for (const Shape& dims : kDimLists) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " dims " << shape_str(dims) << " keepdim " << keepdim);
        expect_close(sum(t, dims, keepdim),
                     reference(group_by(x, kShape, dims, keepdim), ref_sum, dtype));
        expect_close(t.sum(dims, keepdim),
                     reference(group_by(x, kShape, dims, keepdim), ref_sum, dtype));
      }
    }
  }
}

TEST(ReduceSum, IntegersAndBoolPromoteToI64) {
  const Values x = random_values(60, 2, 0, 100);
  Values whole(x.size());
  std::transform(x.begin(), x.end(), whole.begin(), [](double v) { return std::floor(v); });
  for (DType dtype : {kI64, kI32, kU8}) {
    const Tensor t = tensor_of(whole, kShape, dtype);
    for (const Shape& dims : kDimLists) {
      SCOPED_TRACE(::testing::Message() << dtype << " dims " << shape_str(dims));
      const Tensor s = sum(t, dims);
      EXPECT_EQ(s.dtype(), kI64);
      expect_close(s, reference(group_by(whole, kShape, dims, false), ref_sum, kI64), 0, 0);
    }
  }
  // u8 values would wrap at 256; the i64 sum does not.
  EXPECT_EQ(sum(full({10}, 200, kU8)).item<int64_t>(), 2000);
  const Tensor flags = tensor_of({1, 0, 1, 1, 0, 1}, {2, 3}, kBool);
  EXPECT_EQ(sum(flags).dtype(), kI64);
  EXPECT_EQ(sum(flags).item<int64_t>(), 4);
  expect_close(sum(flags, {0}), tensor_of({2, 0, 2}, {3}, kI64), 0, 0);
}

TEST(ReduceSum, SixteenBitFloatsAccumulateWide) {
  // A half-precision running sum would stall at 2048 (where the spacing of f16 reaches 2).
  EXPECT_EQ(sum(ones({3000}, kF16)).item<double>(), 3000.0);
  // bf16 stalls at 256 the same way; 300 is exact in bf16.
  EXPECT_EQ(sum(ones({300}, kBF16)).item<double>(), 300.0);
  EXPECT_EQ(sum(ones({3000}, kF16)).dtype(), kF16);
}

TEST(ReduceSum, NonContiguousInputs) {
  const Values x = random_values(60, 3);
  const Tensor base = tensor_of(x, kShape, kF32);
  // Transposed: [5, 4, 3].
  const Tensor tr = base.transpose(0, 2);
  const Values tr_values = tr.contiguous().to_vector<double>();
  for (const Shape& dims : kDimLists) {
    expect_close(sum(tr, dims, true),
                 reference(group_by(tr_values, {5, 4, 3}, dims, true), ref_sum, kF32));
  }
  // Sliced with a step: [3, 4, 3].
  const Tensor sl = base.slice(2, 0, 5, 2);
  const Values sl_values = sl.contiguous().to_vector<double>();
  for (const Shape& dims : kDimLists) {
    expect_close(sum(sl, dims),
                 reference(group_by(sl_values, {3, 4, 3}, dims, false), ref_sum, kF32));
  }
  // Expanded (stride 0): each column repeats 6 times.
  const Tensor ex = tensor_of({1, 2, 3, 4}, {1, 4}, kF32).expand({6, 4});
  expect_close(sum(ex, {0}), tensor_of({6, 12, 18, 24}, {4}, kF32));
  expect_close(sum(ex, {1}), tensor_of(Values(6, 10.0), {6}, kF32));
  EXPECT_EQ(sum(ex).item<double>(), 60.0);
}

TEST(ReduceSum, ZeroSizeAndZeroDim) {
  const Tensor e = zeros({0, 3});
  EXPECT_EQ(sum(e).item<double>(), 0.0);
  EXPECT_EQ(sum(e).dim(), 0);
  expect_close(sum(e, {0}), zeros({3}));
  EXPECT_EQ(sum(e, {1}).sizes(), Shape{0});
  EXPECT_EQ(sum(e, {1}, true).sizes(), (Shape{0, 1}));
  EXPECT_EQ(sum(zeros({0}, kI32)).item<int64_t>(), 0);
  EXPECT_TRUE(std::isnan(mean(e).item<double>()));

  const Tensor s = scalar_tensor(2.5, kF64);
  EXPECT_EQ(sum(s).item<double>(), 2.5);
  EXPECT_EQ(sum(s, {0}).dim(), 0);
  EXPECT_EQ(sum(s, {-1}, true).dim(), 0);
  EXPECT_EQ(mean(s).item<double>(), 2.5);
}

TEST(ReduceSum, LargeTensorsSplitAcrossThreads) {
  // Long rows take the chunked path, many rows the parallel-rows path.
  const int64_t n = 1 << 20;
  Values x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[static_cast<size_t>(i)] = static_cast<double>(i % 1000) * 0.25 - 100.0;
  const Tensor t = tensor_of(x, {n}, kF32);
  EXPECT_NEAR(sum(t).item<double>(), ref_sum(x), 1e-6 * std::abs(ref_sum(x)) + 1e-3);
  const Shape rows_shape{256, n / 256};
  const Tensor rows = t.view(rows_shape);
  expect_close(sum(rows, {1}), reference(group_by(x, rows_shape, {1}, false), ref_sum, kF32), 1e-6,
               1e-3);
  expect_close(sum(rows, {0}), reference(group_by(x, rows_shape, {0}, false), ref_sum, kF32), 1e-6,
               1e-3);
  const Shape two_rows{2, n / 2};
  expect_close(mean(t.view(two_rows), {1}),
               reference(group_by(x, two_rows, {1}, false), ref_mean, kF32), 1e-6, 1e-6);
  expect_close(
      var(t.view(two_rows), {1}),
      reference(
          group_by(x, two_rows, {1}, false), [](const Values& v) { return ref_var(v, 1); }, kF32),
      1e-5);
}

TEST(ReduceSum, BadDims) {
  const Tensor t = zeros({2, 3});
  EXPECT_EMBER_ERROR(sum(t, {2}), "sum: dim 2 is out of range");
  EXPECT_EMBER_ERROR(sum(t, {-3}), "sum: dim -3 is out of range");
  EXPECT_EMBER_ERROR(sum(t, {0, -2}), "appears more than once");
  EXPECT_EMBER_ERROR(sum(scalar_tensor(1.0), {1}), "sum: dim 1 is out of range");
  EXPECT_EMBER_ERROR(sum(Tensor()), "sum: argument 'input' is an undefined tensor");
}

TEST(ReduceMean, MatchesReferenceAndRejectsIntegers) {
  const Values x = random_values(60, 4);
  for (DType dtype : {kF32, kF64, kF16, kBF16}) {
    const Tensor t = tensor_of(x, kShape, dtype);
    const double tol = dtype == kF32 || dtype == kF64 ? 1e-6 : 1e-2;
    for (const Shape& dims : kDimLists) {
      SCOPED_TRACE(::testing::Message() << dtype << " dims " << shape_str(dims));
      expect_close(mean(t, dims, true), reference(group_by(x, kShape, dims, true), ref_mean, dtype),
                   tol, tol);
      expect_close(t.mean(dims), reference(group_by(x, kShape, dims, false), ref_mean, dtype), tol,
                   tol);
    }
  }
  EXPECT_EMBER_ERROR(mean(zeros({2}, kI64)), "mean: expected a floating dtype, got i64");
  EXPECT_EMBER_ERROR(mean(zeros({2}, kBool)), "mean: expected a floating dtype, got bool");
}

TEST(ReduceMax, AllElementsEveryDType) {
  const Values x = random_values(60, 5, 0, 50);
  Values whole(x.size());
  std::transform(x.begin(), x.end(), whole.begin(), [](double v) { return std::floor(v); });
  const double hi = *std::max_element(whole.begin(), whole.end());
  const double lo = *std::min_element(whole.begin(), whole.end());
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor t = tensor_of(whole, kShape, dtype);
    EXPECT_EQ(max(t).dtype(), dtype);
    EXPECT_EQ(max(t).dim(), 0);
    EXPECT_EQ(max(t).item<double>(), hi);
    EXPECT_EQ(min(t).item<double>(), lo);
    EXPECT_EQ(t.max().item<double>(), hi);
    EXPECT_EQ(t.min().item<double>(), lo);
  }
  const Tensor flags = tensor_of({0, 1, 0}, {3}, kBool);
  EXPECT_TRUE(max(flags).item<bool>());
  EXPECT_FALSE(min(flags).item<bool>());
  EXPECT_EQ(max(tensor_of({-5, -2, -9}, {3}, kI32)).item<int64_t>(), -2);
}

TEST(ReduceMax, NaNPropagates) {
  const Tensor t = tensor_of({1, kNaN, 3, -kInf}, {4});
  EXPECT_TRUE(std::isnan(max(t).item<double>()));
  EXPECT_TRUE(std::isnan(min(t).item<double>()));
  EXPECT_EQ(min(tensor_of({1, 3, -kInf}, {3})).item<double>(), -kInf);
  const auto [values, indices] = max(tensor_of({1, 5, kNaN, kNaN, 2, 3}, {2, 3}), 1);
  EXPECT_TRUE(std::isnan(values.to_vector<double>()[0]));
  EXPECT_TRUE(std::isnan(values.to_vector<double>()[1]));
  EXPECT_EQ(indices.to_vector<int64_t>(), (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(argmin(tensor_of({1, 5, kNaN, 0}, {4})).item<int64_t>(), 2);
  // A NaN far into a long row, past the first chunk.
  Values long_row(100000, 1.0);
  long_row[70000] = kNaN;
  EXPECT_TRUE(std::isnan(max(tensor_of(long_row, {100000}, kF32)).item<double>()));
  EXPECT_EQ(argmax(tensor_of(long_row, {100000}, kF32)).item<int64_t>(), 70000);
}

TEST(ReduceMax, AlongDimWithIndices) {
  const Values x = random_values(60, 6, -3, 3);  // many ties: the first extreme must win
  for (DType dtype : {kF32, kF64, kF16, kI64, kI32}) {
    const Tensor t = tensor_of(x, kShape, dtype);
    const Values held = t.to_vector<double>();  // integer dtypes truncate the halves
    for (int64_t dim : {0, 1, 2, -1, -2}) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim << " keepdim " << keepdim);
        const Groups g = group_by(held, kShape, {dim}, keepdim);
        for (bool is_max : {true, false}) {
          const auto [values, indices] = is_max ? max(t, dim, keepdim) : min(t, dim, keepdim);
          const auto extreme = [&](const Values& v) {
            return v[static_cast<size_t>(ref_arg(v, is_max))];
          };
          const auto index = [&](const Values& v) {
            return static_cast<double>(ref_arg(v, is_max));
          };
          expect_close(values, reference(g, extreme, dtype), 0, 0);
          expect_close(indices, reference(g, index, kI64), 0, 0);
          expect_close(is_max ? argmax(t, dim, keepdim) : argmin(t, dim, keepdim),
                       reference(g, index, kI64), 0, 0);
        }
      }
    }
  }
}

TEST(ReduceArgmax, FlattenedAndOnViews) {
  const Values x = random_values(60, 7);
  const Tensor t = tensor_of(x, kShape, kF32);
  EXPECT_EQ(argmax(t).item<int64_t>(), ref_arg(x, true));
  EXPECT_EQ(argmin(t).item<int64_t>(), ref_arg(x, false));
  EXPECT_EQ(t.argmax().dim(), 0);
  EXPECT_EQ(argmax(t, std::nullopt, true).sizes(), (Shape{1, 1, 1}));
  EXPECT_EQ(t.argmax(1).sizes(), (Shape{3, 5}));
  // Indices count in the view's own order, not the storage's.
  const Tensor tr = t.transpose(0, 2);
  EXPECT_EQ(argmax(tr).item<int64_t>(), ref_arg(tr.contiguous().to_vector<double>(), true));
  const Tensor ex = tensor_of({3, 9, 1}, {3, 1}, kF32).expand({3, 4});
  expect_close(argmax(ex, 0), tensor_of({1, 1, 1, 1}, {4}, kI64), 0, 0);
  // The first of equal maxima wins, also across chunks of a long row.
  Values ties(200000, 0.0);
  ties[150000] = 7;
  ties[40000] = 7;
  EXPECT_EQ(argmax(tensor_of(ties, {200000})).item<int64_t>(), 40000);
  EXPECT_EQ(argmin(tensor_of(ties, {200000})).item<int64_t>(), 0);
  // Many rows at once (the parallel-rows path).
  const Shape rows{512, 300};
  const Values y = random_values(512 * 300, 8, -100, 100);
  expect_close(argmax(tensor_of(y, rows, kF32), 1),
               reference(
                   group_by(y, rows, {1}, false),
                   [](const Values& v) { return static_cast<double>(ref_arg(v, true)); }, kI64),
               0, 0);
}

TEST(ReduceMax, EmptyInputsAreErrors) {
  EXPECT_EMBER_ERROR(max(zeros({0, 3})), "max: cannot reduce an empty tensor of shape [0, 3]");
  EXPECT_EMBER_ERROR(min(zeros({0})), "min: cannot reduce an empty tensor of shape [0]");
  EXPECT_EMBER_ERROR(max(zeros({3, 0}), 1), "max: cannot reduce dim 1 of size 0 (shape [3, 0])");
  EXPECT_EMBER_ERROR(argmax(zeros({2, 0})),
                     "argmax: cannot reduce an empty tensor of shape [2, 0]");
  EXPECT_EMBER_ERROR(argmin(zeros({3, 0}), -1), "argmin: cannot reduce dim -1 of size 0");
  EXPECT_EMBER_ERROR(max(zeros({3, 4}), 2), "max: dim 2 is out of range");
  // Reducing a non-empty dim of an empty tensor gives an empty result, as in PyTorch.
  const auto [values, indices] = max(zeros({0, 4}), 1);
  EXPECT_EQ(values.sizes(), Shape{0});
  EXPECT_EQ(indices.sizes(), Shape{0});
  EXPECT_EQ(std::get<0>(min(zeros({4, 0}), 0, true)).sizes(), (Shape{1, 0}));
}

TEST(ReduceMax, ZeroDim) {
  const Tensor s = scalar_tensor(4.0, kF32);
  EXPECT_EQ(max(s).item<double>(), 4.0);
  const auto [values, indices] = max(s, 0);
  EXPECT_EQ(values.dim(), 0);
  EXPECT_EQ(values.item<double>(), 4.0);
  EXPECT_EQ(indices.item<int64_t>(), 0);
  EXPECT_EQ(argmin(s, -1).item<int64_t>(), 0);
}

TEST(ReduceVar, CorrectionsAndStd) {
  const Values x = random_values(60, 9);
  for (DType dtype : {kF32, kF64, kBF16}) {
    const Tensor t = tensor_of(x, kShape, dtype);
    const double tol = dtype == kBF16 ? 1e-2 : 1e-5;
    for (const Shape& dims : kDimLists) {
      for (int64_t correction : {0, 1}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " dims " << shape_str(dims) << " correction " << correction);
        const Groups g = group_by(x, kShape, dims, false);
        expect_close(var(t, dims, correction),
                     reference(
                         g, [&](const Values& v) { return ref_var(v, correction); }, dtype),
                     tol, tol);
        expect_close(ember::std(t, dims, correction, true),
                     reference(
                         group_by(x, kShape, dims, true),
                         [&](const Values& v) { return std::sqrt(ref_var(v, correction)); }, dtype),
                     tol, tol);
      }
    }
  }
}

TEST(ReduceVar, EdgeCases) {
  // A constant row has zero variance, also with an offset that would spoil a one-pass formula.
  EXPECT_EQ(var(full({1000}, 1e8, kF64)).item<double>(), 0.0);
  // n - correction <= 0 divides by zero, as PyTorch does.
  EXPECT_TRUE(std::isnan(var(tensor_of({3}, {1})).item<double>()));
  EXPECT_EQ(var(tensor_of({3}, {1}), {}, 0).item<double>(), 0.0);
  EXPECT_TRUE(std::isinf(var(tensor_of({1, 3}, {2}), {}, 2).item<double>()));
  EXPECT_TRUE(std::isnan(var(zeros({0})).item<double>()));
  // Non-contiguous input.
  const Tensor t = tensor_of({1, 2, 3, 4, 5, 6}, {2, 3}).t();
  expect_close(var(t, {1}), tensor_of({4.5, 4.5, 4.5}, {3}));
  EXPECT_EMBER_ERROR(var(zeros({3}, kI64)), "var: expected a floating dtype, got i64");
  EXPECT_EMBER_ERROR(ember::std(zeros({3}, kI32)), "std: expected a floating dtype, got i32");
  EXPECT_EMBER_ERROR(var(zeros({3}), {}, -1), "var: correction must be non-negative, got -1");
}

TEST(ReduceNorm, PValuesOverDims) {
  const Values x = random_values(60, 10);
  for (DType dtype : {kF32, kF64, kF16}) {
    const Tensor t = tensor_of(x, kShape, dtype);
    const double tol = dtype == kF16 ? 2e-3 : 1e-5;
    for (double p : {1.0, 2.0, 3.0, 0.5, kInf}) {
      for (const Shape& dims : kDimLists) {
        SCOPED_TRACE(::testing::Message() << dtype << " p " << p << " dims " << shape_str(dims));
        expect_close(norm(t, p, dims),
                     reference(
                         group_by(x, kShape, dims, false),
                         [&](const Values& v) { return ref_norm(v, p); }, dtype),
                     tol, tol);
      }
    }
  }
  EXPECT_EQ(norm(tensor_of({3, -4}, {2})).item<double>(), 5.0);
  EXPECT_EQ(norm(tensor_of({3, -4}, {2}), kInf).item<double>(), 4.0);
  EXPECT_EQ(norm(tensor_of({3, -4}, {2}), 1.0).item<double>(), 7.0);
  EXPECT_EQ(norm(zeros({0})).item<double>(), 0.0);
  EXPECT_EQ(norm(zeros({2, 3}), 2.0, {1}, true).sizes(), (Shape{2, 1}));
  EXPECT_TRUE(std::isnan(norm(tensor_of({1, kNaN}, {2}), kInf).item<double>()));
  // Values whose squares overflow f32 stay finite: squares accumulate in double.
  EXPECT_NEAR(norm(full({4}, 1e30, kF32)).item<double>(), 2e30, 1e24);
}

TEST(ReduceNorm, BadArguments) {
  EXPECT_EMBER_ERROR(norm(zeros({3}), 0.0), "norm: p must be positive (or infinity), got 0");
  EXPECT_EMBER_ERROR(norm(zeros({3}), -2.0), "norm: p must be positive");
  EXPECT_EMBER_ERROR(norm(zeros({3}, kI64)), "norm: expected a floating dtype, got i64");
  EXPECT_EMBER_ERROR(norm(zeros({3}), 2.0, {1}), "norm: dim 1 is out of range");
}

}  // namespace
}  // namespace ember
