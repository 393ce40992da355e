// cat, stack, index_select, gather, scatter_add, one_hot and masked_fill against plain loops.
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "test_util.h"

namespace ember {
namespace {

using ember::testing::expect_close;
using Values = std::vector<double>;

const std::vector<DType> kAllDTypes{kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool};

int64_t numel_of(const Shape& shape) {
  return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
}

Tensor tensor_of(const Values& values, const Shape& shape, DType dtype = kF64) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape).to(dtype);
}

Tensor index_of(const std::vector<int64_t>& values, const Shape& shape, DType dtype = kI64) {
  return from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape).to(dtype);
}

// Small non-negative integers: exact in every dtype (0/1 once cast to bool).
Values random_values(int64_t n, unsigned seed, int high = 9) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, high);
  Values v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

std::vector<int64_t> random_indices(int64_t n, int64_t size, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, size - 1);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Row-major coordinates <-> flat positions.
Shape coords_of(int64_t flat, const Shape& shape) {
  Shape c(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    c[d] = flat % shape[d];
    flat /= shape[d];
  }
  return c;
}
int64_t flat_of(const Shape& c, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + c[d];
  return flat;
}

// ---- cat / stack -------------------------------------------------------------------------

// cat by loops: output coordinate c comes from the piece whose range along dim holds c[dim].
Values ref_cat(const std::vector<Values>& pieces, const std::vector<Shape>& shapes, int64_t dim,
               Shape* out_shape) {
  Shape shape = shapes[0];
  shape[static_cast<size_t>(dim)] = 0;
  for (const Shape& s : shapes) shape[static_cast<size_t>(dim)] += s[static_cast<size_t>(dim)];
  Values out(static_cast<size_t>(numel_of(shape)));
  for (int64_t i = 0; i < numel_of(shape); ++i) {
    Shape c = coords_of(i, shape);
    size_t piece = 0;
    while (c[static_cast<size_t>(dim)] >= shapes[piece][static_cast<size_t>(dim)]) {
      c[static_cast<size_t>(dim)] -= shapes[piece][static_cast<size_t>(dim)];
      ++piece;
    }
    out[static_cast<size_t>(i)] = pieces[piece][static_cast<size_t>(flat_of(c, shapes[piece]))];
  }
  *out_shape = shape;
  return out;
}

TEST(IndexCat, AlongEveryDimAndEveryDType) {
  const std::vector<Shape> base{{2, 3, 4}, {2, 3, 4}, {2, 3, 4}};
  for (int64_t dim : {0, 1, 2, -1, -2, -3}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Shape> shapes = base;
    shapes[1][static_cast<size_t>(d)] = 1;
    shapes[2][static_cast<size_t>(d)] = 5;
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim);
      std::vector<Values> pieces;
      std::vector<Tensor> tensors;
      for (size_t i = 0; i < shapes.size(); ++i) {
        Values v = random_values(numel_of(shapes[i]), static_cast<unsigned>(i + 1),
                                 dtype == kBool ? 1 : 9);
        tensors.push_back(tensor_of(v, shapes[i], dtype));
        pieces.push_back(std::move(v));
      }
      Shape out_shape;
      const Values expected = ref_cat(pieces, shapes, d, &out_shape);
      expect_close(cat(tensors, dim), tensor_of(expected, out_shape, dtype), 0, 0);
    }
  }
}

TEST(IndexCat, PromotesDTypesAndTakesViews) {
  const Tensor i32 = tensor_of({1, 2, 3, 4}, {2, 2}, kI32);
  const Tensor f32 = tensor_of({0.5, 1.5}, {2, 1}, kF32);
  expect_close(cat({i32, f32}, 1), tensor_of({1, 2, 0.5, 3, 4, 1.5}, {2, 3}, kF32), 0, 0);
  const Tensor flags = tensor_of({1, 0}, {1, 2}, kBool);
  expect_close(cat({flags, i32.to(kI64)}, 0), tensor_of({1, 0, 1, 2, 3, 4}, {3, 2}, kI64), 0, 0);
  expect_close(cat({tensor_of({1}, {1}, kF16), tensor_of({2}, {1}, kBF16)}),
               tensor_of({1, 2}, {2}, kF32), 0, 0);
  expect_close(cat({tensor_of({1}, {1}, kU8), tensor_of({-2}, {1}, kI32)}),
               index_of({1, -2}, {2}, kI32), 0, 0);
  // Transposed, stepped and expanded inputs.
  const Tensor t = tensor_of({1, 2, 3, 4, 5, 6}, {2, 3}).t();  // [[1, 4], [2, 5], [3, 6]]
  const Tensor stepped =
      tensor_of({7, 8, 9, 10, 11, 12}, {3, 2}).slice(0, 0, 3, 2);  // [[7, 8], [11, 12]]
  const Tensor expanded = tensor_of({0, 1}, {1, 2}).expand({2, 2});
  expect_close(cat({t, stepped, expanded}, 0),
               tensor_of({1, 4, 2, 5, 3, 6, 7, 8, 11, 12, 0, 1, 0, 1}, {7, 2}), 0, 0);
  // A single tensor, empty pieces, and the legacy 1-d empty tensor that joins any shape.
  expect_close(cat({t}, 1), t.contiguous(), 0, 0);
  expect_close(cat({zeros({2, 0}, kF64), t.t(), zeros({2, 0}, kF64)}, 1), t.t().contiguous(), 0, 0);
  expect_close(cat({zeros({0}, kF64), t, zeros({0}, kF64)}, 0), t.contiguous(), 0, 0);
  EXPECT_EQ(cat({zeros({0}), zeros({0})}).sizes(), Shape{0});
  EXPECT_EQ(cat({zeros({0, 3}), zeros({0, 3})}, 0).sizes(), (Shape{0, 3}));
}

TEST(IndexCat, BadInput) {
  EXPECT_EMBER_ERROR(cat({}), "cat: expected a non-empty list of tensors");
  EXPECT_EMBER_ERROR(cat({zeros({2, 3}), zeros({2, 4})}, 0),
                     "cat: sizes must match except in dim 0, but tensor 1 has shape [2, 4] and "
                     "tensor 0 has [2, 3]");
  EXPECT_EMBER_ERROR(cat({zeros({2, 3}), zeros({2, 3, 1})}, 0),
                     "cat: tensor 1 has 3 dims but tensor 0 has 2");
  EXPECT_EMBER_ERROR(cat({zeros({2}), zeros({})}),
                     "cat: zero-dimensional tensor (at position 1) cannot be concatenated");
  EXPECT_EMBER_ERROR(cat({zeros({2}), zeros({3})}, 1), "cat: dim 1 is out of range");
  EXPECT_EMBER_ERROR(cat({zeros({2}), Tensor()}), "cat: argument 'tensor' is an undefined tensor");
}

TEST(IndexCat, DevicesMustMatch) {
  EMBER_REQUIRE_CUDA();
  EXPECT_EMBER_ERROR(cat({zeros({2}), zeros({2}).cuda()}),
                     "cat: tensor 1 is on cuda:0 but tensor 0 is on cpu");
}

TEST(IndexStack, NegativeDimsAndMixedDTypes) {
  const Tensor a = tensor_of({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = tensor_of({7, 8, 9, 10, 11, 12}, {2, 3}, kI32);
  expect_close(stack({a, b}), tensor_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 2, 3}), 0, 0);
  expect_close(stack({a, b}, 1), tensor_of({1, 2, 3, 7, 8, 9, 4, 5, 6, 10, 11, 12}, {2, 2, 3}), 0,
               0);
  expect_close(stack({a, b}, -1), tensor_of({1, 7, 2, 8, 3, 9, 4, 10, 5, 11, 6, 12}, {2, 3, 2}), 0,
               0);
  expect_close(stack({a, b}, -3), stack({a, b}, 0), 0, 0);
  expect_close(stack({a.t(), b.t()}, 2),
               tensor_of({1, 7, 4, 10, 2, 8, 5, 11, 3, 9, 6, 12}, {3, 2, 2}), 0, 0);
  expect_close(stack({scalar_tensor(1.0, kF64), scalar_tensor(2.0, kF64)}), tensor_of({1, 2}, {2}),
               0, 0);
  EXPECT_EMBER_ERROR(stack({a, zeros({3, 2})}),
                     "stack: tensor 1 has shape [3, 2] but tensor 0 has [2, 3]");
  EXPECT_EMBER_ERROR(stack({a, b}, 3), "stack: dim 3 is out of range");
  EXPECT_EMBER_ERROR(stack({}), "stack: expected a non-empty list of tensors");
}

// ---- index_select ------------------------------------------------------------------------

TEST(IndexSelect, MatchesReferenceForEveryDType) {
  const Shape shape{4, 5, 3};
  const Values x = random_values(60, 1);
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const std::vector<int64_t> idx =
        random_indices(7, shape[static_cast<size_t>(d)], static_cast<unsigned>(d));
    Shape out_shape = shape;
    out_shape[static_cast<size_t>(d)] = 7;
    Values expected(static_cast<size_t>(numel_of(out_shape)));
    for (int64_t i = 0; i < numel_of(out_shape); ++i) {
      Shape c = coords_of(i, out_shape);
      c[static_cast<size_t>(d)] = idx[static_cast<size_t>(c[static_cast<size_t>(d)])];
      expected[static_cast<size_t>(i)] = x[static_cast<size_t>(flat_of(c, shape))];
    }
    for (DType dtype : kAllDTypes) {
      for (DType index_dtype : {kI64, kI32}) {
        SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim << " index " << index_dtype);
        const Tensor t = tensor_of(x, shape, dtype);
        const Tensor result = index_select(t, dim, index_of(idx, {7}, index_dtype));
        expect_close(result, tensor_of(expected, out_shape, dtype), 0, 0);
      }
    }
  }
}

TEST(IndexSelect, ViewsEmptyAndZeroDim) {
  const Tensor t = tensor_of({1, 2, 3, 4, 5, 6}, {2, 3}).t();  // [[1, 4], [2, 5], [3, 6]]
  expect_close(index_select(t, 0, index_of({2, 0, 2}, {3})), tensor_of({3, 6, 1, 4, 3, 6}, {3, 2}),
               0, 0);
  expect_close(index_select(t, 1, index_of({1}, {1})), tensor_of({4, 5, 6}, {3, 1}), 0, 0);
  // A stepped index view.
  const Tensor idx = index_of({1, 9, 0, 9, 1, 9}, {6}).slice(0, 0, 6, 2);
  expect_close(index_select(t, 1, idx), tensor_of({4, 1, 4, 5, 2, 5, 6, 3, 6}, {3, 3}), 0, 0);
  EXPECT_EQ(index_select(t, 0, index_of({}, {0})).sizes(), (Shape{0, 2}));
  EXPECT_EQ(index_select(zeros({0, 2}), 1, index_of({1, 1}, {2})).sizes(), (Shape{0, 2}));
  const Tensor s = scalar_tensor(5.0, kF64);
  EXPECT_EQ(index_select(s, 0, index_of({0}, {})).dim(), 0);
  expect_close(index_select(s, 0, index_of({0, 0}, {2})), tensor_of({5, 5}, {2}), 0, 0);
  expect_close(index_select(tensor_of({1, 2, 3}, {3}), 0, index_of({2}, {})), tensor_of({3}, {1}),
               0, 0);
}

TEST(IndexSelect, BadInput) {
  const Tensor t = zeros({5, 3});
  EXPECT_EMBER_ERROR(index_select(t, 0, index_of({1, 7}, {2})),
                     "index_select: index 7 is out of range for dim 0 with size 5");
  EXPECT_EMBER_ERROR(index_select(t, -1, index_of({-1}, {1})),
                     "index_select: index -1 is out of range for dim 1 with size 3");
  EXPECT_EMBER_ERROR(index_select(zeros({0, 3}), 0, index_of({0}, {1})),
                     "index_select: index 0 is out of range for dim 0 with size 0");
  EXPECT_EMBER_ERROR(index_select(t, 0, index_of({1, 2}, {1, 2})),
                     "index_select: index must be 1-d, got shape [1, 2]");
  EXPECT_EMBER_ERROR(index_select(t, 0, zeros({2})),
                     "index_select: index must be i64 or i32, got f32");
  EXPECT_EMBER_ERROR(index_select(t, 2, index_of({0}, {1})), "index_select: dim 2 is out of range");
}

TEST(IndexSelect, DevicesMustMatch) {
  EMBER_REQUIRE_CUDA();
  EXPECT_EMBER_ERROR(index_select(zeros({3}), 0, index_of({0}, {1}).cuda()),
                     "index_select: expected all tensors on one device");
  EXPECT_EMBER_ERROR(gather(zeros({3}).cuda(), 0, index_of({0}, {1})),
                     "gather: expected all tensors on one device");
}

// ---- gather / scatter_add ----------------------------------------------------------------

// out[c] = in[c with c[dim] = index[c]].
Values ref_gather(const Values& in, const Shape& in_shape, int64_t dim,
                  const std::vector<int64_t>& index, const Shape& index_shape) {
  Values out(index.size());
  for (int64_t i = 0; i < static_cast<int64_t>(index.size()); ++i) {
    Shape c = coords_of(i, index_shape);
    c[static_cast<size_t>(dim)] = index[static_cast<size_t>(i)];
    out[static_cast<size_t>(i)] = in[static_cast<size_t>(flat_of(c, in_shape))];
  }
  return out;
}

// self[c with c[dim] = index[c]] += src[c] for every c of the index.
Values ref_scatter_add(Values self, const Shape& self_shape, int64_t dim,
                       const std::vector<int64_t>& index, const Shape& index_shape,
                       const Values& src, const Shape& src_shape) {
  for (int64_t i = 0; i < static_cast<int64_t>(index.size()); ++i) {
    const Shape c = coords_of(i, index_shape);
    Shape target = c;
    target[static_cast<size_t>(dim)] = index[static_cast<size_t>(i)];
    self[static_cast<size_t>(flat_of(target, self_shape))] +=
        src[static_cast<size_t>(flat_of(c, src_shape))];
  }
  return self;
}

TEST(IndexGather, MatchesReference) {
  const Shape in_shape{4, 5, 6};
  const Values x = random_values(120, 2);
  for (int64_t dim : {0, 1, 2, -1}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    // Smaller than the input outside dim, longer than it along dim.
    const Shape index_shape{3, 4, 2};
    Shape shaped = index_shape;
    shaped[static_cast<size_t>(d)] = 7;
    const std::vector<int64_t> idx =
        random_indices(numel_of(shaped), in_shape[static_cast<size_t>(d)], 3);
    const Values expected = ref_gather(x, in_shape, d, idx, shaped);
    for (DType dtype : kAllDTypes) {
      SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim);
      const Tensor t = tensor_of(x, in_shape, dtype == kBool ? kF64 : dtype);
      const Tensor src = dtype == kBool ? ne(t, 0).to(kBool) : t;
      const Values held = src.to_vector<double>();
      expect_close(gather(src, dim, index_of(idx, shaped)),
                   tensor_of(ref_gather(held, in_shape, d, idx, shaped), shaped, dtype), 0, 0);
    }
    expect_close(gather(tensor_of(x, in_shape), dim, index_of(idx, shaped)),
                 tensor_of(expected, shaped), 0, 0);
  }
  // Non-contiguous input and index.
  const Tensor t = tensor_of({1, 2, 3, 4, 5, 6}, {2, 3}).t();   // [[1, 4], [2, 5], [3, 6]]
  const Tensor idx = index_of({1, 0, 0, 0, 1, 1}, {2, 3}).t();  // [[1, 0], [0, 1], [0, 1]]
  expect_close(gather(t, 1, idx), tensor_of({4, 1, 2, 5, 3, 6}, {3, 2}), 0, 0);
  EXPECT_EQ(gather(t, 0, index_of({}, {0, 2})).sizes(), (Shape{0, 2}));
  EXPECT_EQ(gather(scalar_tensor(3.0, kF64), 0, index_of({0}, {})).item<double>(), 3.0);
}

TEST(IndexGather, BadInput) {
  const Tensor t = zeros({3, 4});
  EXPECT_EMBER_ERROR(gather(t, 1, index_of({0, 4}, {1, 2})),
                     "gather: index 4 is out of range for dim 1 with size 4");
  EXPECT_EMBER_ERROR(gather(t, 0, index_of({-2}, {1, 1})),
                     "gather: index -2 is out of range for dim 0 with size 3");
  EXPECT_EMBER_ERROR(gather(t, 1, index_of({0, 1}, {2})),
                     "gather: index has 1 dims but input has 2");
  EXPECT_EMBER_ERROR(gather(t, 1, index_of({0, 0, 0, 0, 0}, {5, 1})),
                     "gather: index of shape [5, 1] is larger than input of shape [3, 4] in dim 0");
  EXPECT_EMBER_ERROR(gather(t, 0, zeros({1, 1}, kU8)), "gather: index must be i64 or i32, got u8");
}

TEST(IndexScatterAdd, MatchesReferenceWithDuplicates) {
  const Shape self_shape{4, 5, 3};
  const Values base = random_values(60, 4);
  for (int64_t dim : {0, 1, 2, -2}) {
    const int64_t d = dim < 0 ? dim + 3 : dim;
    const Shape src_shape{6, 6, 6};
    Shape index_shape{3, 4, 2};
    index_shape[static_cast<size_t>(d)] = 6;  // more entries than the dim: duplicates add up
    const std::vector<int64_t> idx =
        random_indices(numel_of(index_shape), self_shape[static_cast<size_t>(d)], 5);
    const Values src = random_values(numel_of(src_shape), 6);
    const Values expected = ref_scatter_add(base, self_shape, d, idx, index_shape, src, src_shape);
    for (DType dtype : {kF32, kF64, kF16, kBF16, kI64, kI32}) {
      SCOPED_TRACE(::testing::Message() << dtype << " dim " << dim);
      const Tensor self = tensor_of(base, self_shape, dtype);
      const Tensor result =
          scatter_add(self, dim, index_of(idx, index_shape), tensor_of(src, src_shape, dtype));
      expect_close(result, tensor_of(expected, self_shape, dtype), 0, 0);
      expect_close(self, tensor_of(base, self_shape, dtype), 0, 0);  // the input is untouched
    }
  }
  // u8 wraps as in PyTorch; bool adds as "or".
  expect_close(scatter_add(full({2}, 250, kU8), 0, index_of({0, 0}, {2}), full({2}, 5, kU8)),
               index_of({4, 250}, {2}, kU8), 0, 0);
  expect_close(scatter_add(tensor_of({0, 1, 0}, {3}, kBool), 0, index_of({0, 0}, {2}),
                           tensor_of({0, 1}, {2}, kBool)),
               tensor_of({1, 1, 0}, {3}, kBool), 0, 0);
}

TEST(IndexScatterAdd, InPlaceOnViewsAndRoundTrip) {
  // In place through a transposed view writes into the base tensor.
  Tensor base = zeros({3, 2}, kF64);
  Tensor view = base.t();  // [2, 3]
  const uint64_t version = base.storage().version();
  Tensor& same =
      view.scatter_add_(1, index_of({2, 2, 0, 1}, {2, 2}), tensor_of({1, 2, 3, 4}, {2, 2}));
  EXPECT_TRUE(same.is_same(view));
  expect_close(base, tensor_of({0, 3, 0, 4, 3, 0}, {3, 2}), 0, 0);
  EXPECT_GT(base.storage().version(), version);
  // In place on a contiguous tensor bumps its version.
  Tensor dense = zeros({4}, kF64);
  const uint64_t before = dense.storage().version();
  dense.scatter_add_(0, index_of({3, 3}, {2}), tensor_of({1, 1}, {2}));
  EXPECT_GT(dense.storage().version(), before);
  expect_close(dense, tensor_of({0, 0, 0, 2}, {4}), 0, 0);
  // With a permutation as the index, gather undoes scatter_add into zeros.
  const Tensor perm = index_of({2, 0, 1, 1, 2, 0, 0, 1, 2, 2, 1, 0}, {4, 3});
  const Tensor src = tensor_of(random_values(12, 7), {4, 3});
  const Tensor scattered = scatter_add(zeros({4, 3}, kF64), 1, perm, src);
  expect_close(gather(scattered, 1, perm), src, 0, 0);
  expect_close(sum(scattered, {1}), sum(src, {1}), 0, 0);
  // An empty index changes nothing.
  expect_close(scatter_add(ones({2, 2}), 0, index_of({}, {0, 2}), ones({0, 2})), ones({2, 2}), 0,
               0);
}

TEST(IndexScatterAdd, BadInput) {
  const Tensor self = zeros({3, 4});
  EXPECT_EMBER_ERROR(scatter_add(self, 0, index_of({3}, {1, 1}), ones({1, 1})),
                     "scatter_add: index 3 is out of range for dim 0 with size 3");
  EXPECT_EMBER_ERROR(scatter_add(self, 0, index_of({0}, {1, 1}), ones({1, 1}, kF64)),
                     "scatter_add: src has dtype f64 but self has f32");
  EXPECT_EMBER_ERROR(
      scatter_add(self, 0, index_of({0, 0}, {1, 2}), ones({1, 1})),
      "scatter_add: index of shape [1, 2] is larger than src of shape [1, 1] in dim 1");
  EXPECT_EMBER_ERROR(
      scatter_add(self, 0, index_of({0, 0, 0, 0, 0}, {1, 5}), ones({1, 5})),
      "scatter_add: index of shape [1, 5] is larger than input of shape [3, 4] in dim 1");
  EXPECT_EMBER_ERROR(scatter_add(self, 0, index_of({0}, {1}), ones({1})),
                     "scatter_add: index has 1 dims but input has 2");
  EXPECT_EMBER_ERROR(scatter_add(self, 2, index_of({0}, {1, 1}), ones({1, 1})),
                     "scatter_add: dim 2 is out of range");
}

// ---- one_hot / masked_fill ---------------------------------------------------------------

TEST(IndexOneHot, EncodesClasses) {
  const Tensor labels = index_of({2, 0, 1, 2}, {4});
  const Tensor encoded = one_hot(labels);
  EXPECT_EQ(encoded.dtype(), kI64);
  expect_close(encoded, index_of({0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1}, {4, 3}), 0, 0);
  expect_close(one_hot(labels, 5),
               index_of({0, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0}, {4, 5}), 0,
               0);
  expect_close(one_hot(index_of({1, 0, 0, 1}, {2, 2}, kI32), 2),
               index_of({0, 1, 1, 0, 1, 0, 0, 1}, {2, 2, 2}), 0, 0);
  expect_close(one_hot(index_of({1}, {})), index_of({0, 1}, {2}), 0, 0);
  EXPECT_EQ(one_hot(index_of({}, {0}), 4).sizes(), (Shape{0, 4}));
  // Every row has exactly one 1.
  const Tensor many = one_hot(index_of(random_indices(1000, 10, 8), {1000}), 10);
  expect_close(sum(many, {1}), ones({1000}, kI64), 0, 0);
}

TEST(IndexOneHot, BadInput) {
  EXPECT_EMBER_ERROR(one_hot(index_of({0, 3}, {2}), 3),
                     "one_hot: class value 3 is out of range for num_classes 3");
  EXPECT_EMBER_ERROR(one_hot(index_of({-1, 0}, {2})),
                     "one_hot: class values must be non-negative, got -1");
  EXPECT_EMBER_ERROR(one_hot(index_of({}, {0})),
                     "one_hot: cannot infer the number of classes from an empty index");
  EXPECT_EMBER_ERROR(one_hot(zeros({2})), "one_hot: index must be an integer tensor, got f32");
  EXPECT_EMBER_ERROR(one_hot(index_of({0}, {1}), -2),
                     "one_hot: num_classes must be -1 (infer) or non-negative, got -2");
}

TEST(IndexMaskedFill, BroadcastMaskAndInPlace) {
  const Tensor t = tensor_of({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor row_mask = tensor_of({1, 0, 1}, {1, 3}, kBool);
  expect_close(masked_fill(t, row_mask, -1.5), tensor_of({-1.5, 2, -1.5, -1.5, 5, -1.5}, {2, 3}), 0,
               0);
  const Tensor col_mask = tensor_of({0, 1}, {2, 1}, kBool);
  expect_close(masked_fill(t.to(kI32), col_mask, 9), index_of({1, 2, 3, 9, 9, 9}, {2, 3}, kI32), 0,
               0);
  // The out-of-place form broadcasts the result, as torch.masked_fill does.
  EXPECT_EQ(masked_fill(tensor_of({1, 2, 3}, {3}), tensor_of({1, 0}, {2, 1}, kBool), 0).sizes(),
            (Shape{2, 3}));
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor filled = masked_fill(zeros({2, 3}, dtype), row_mask, 1);
    EXPECT_EQ(filled.dtype(), dtype);
    expect_close(filled, tensor_of({1, 0, 1, 1, 0, 1}, {2, 3}, dtype), 0, 0);
  }
  // In place through a view writes into its base and bumps the version.
  Tensor base = zeros({3, 2}, kF64);
  const uint64_t version = base.storage().version();
  Tensor view = base.t();
  Tensor& same = view.masked_fill_(row_mask, 7.0);
  EXPECT_TRUE(same.is_same(view));
  expect_close(base, tensor_of({7, 7, 0, 0, 7, 7}, {3, 2}), 0, 0);
  EXPECT_GT(base.storage().version(), version);
}

TEST(IndexMaskedFill, BadInput) {
  const Tensor t = zeros({2, 3});
  EXPECT_EMBER_ERROR(masked_fill(t, zeros({2, 3}, kU8), 1),
                     "masked_fill: mask must be bool, got u8");
  EXPECT_EMBER_ERROR(masked_fill(t, tensor_of({1, 0}, {2}, kBool), 1),
                     "masked_fill: shapes [2, 3] and [2] cannot broadcast");
  Tensor target = zeros({3});
  EXPECT_EMBER_ERROR(target.masked_fill_(tensor_of({1, 0, 1, 1, 0, 1}, {2, 3}, kBool), 1),
                     "masked_fill_: mask of shape [2, 3] cannot broadcast to [3]");
  EXPECT_EMBER_ERROR(target.masked_fill_(zeros({3}, kF32), 1),
                     "masked_fill_: mask must be bool, got f32");
}

}  // namespace
}  // namespace ember
