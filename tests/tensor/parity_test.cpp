// The parity suite: every op of ops.h and random.h runs on the CPU and on CUDA with the same
// inputs (contiguous and not, broadcast, several dtypes, zero-size) and the results must
// agree. Every test skips where no CUDA device is visible.
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;
using Inputs = std::vector<Tensor>;
using Op = std::function<Tensor(const Inputs&)>;

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

constexpr DType kFloatTypes[] = {kF32, kF64, kF16, kBF16};
constexpr DType kAllTypes[] = {kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool};

// How far CPU and CUDA may drift apart for elementwise math in `dtype` (libm vs CUDA math,
// fused multiply-adds): a couple of float ulps, one ulp of the 16-bit types, exact integers.
Tolerance elementwise_tolerance(DType dtype) {
  switch (dtype) {
    case kF32:
      return {1e-5, 1e-6};
    case kF64:
      return {1e-12, 1e-14};
    case kF16:
      return {2e-3, 2e-3};
    case kBF16:
      return {1.6e-2, 1.6e-2};
    default:
      return {};
  }
}

// Reductions sum in float on the GPU and in double on the CPU.
Tolerance reduce_tolerance(DType dtype) {
  switch (dtype) {
    case kF32:
      return {1e-4, 1e-4};
    case kF64:
      return {1e-10, 1e-10};
    case kF16:
      return {4e-3, 4e-2};
    case kBF16:
      return {2e-2, 2e-1};
    default:
      return {};
  }
}

// A CPU tensor of `shape` with values in [low, high): uniform for floats, integers for
// integer dtypes, coin flips for bool. The same seed always gives the same tensor.
Tensor make_input(const Shape& shape, DType dtype, uint64_t seed, double low = -2.0,
                  double high = 2.0) {
  Generator gen(seed);
  if (is_floating(dtype)) return uniform(shape, low, high, dtype, &gen);
  if (dtype == kBool) return lt(rand(shape, kF32, &gen), 0.5);
  return randint(static_cast<int64_t>(low), static_cast<int64_t>(high), shape, dtype, &gen);
}

Inputs to_cuda(const Inputs& inputs) {
  Inputs result;
  for (const Tensor& t : inputs) result.push_back(t.to(cuda_device()));
  return result;
}

// Runs `op` on the CPU inputs and on their CUDA copies, and compares the results.
void expect_parity(const Inputs& inputs, const Op& op, Tolerance tol) {
  const Tensor expected = op(inputs);
  const Tensor actual = op(to_cuda(inputs));
  ASSERT_TRUE(actual.is_cuda()) << "the CUDA run returned a tensor on " << actual.device();
  expect_close(actual, expected, tol.rtol, tol.atol);
}

std::string name_of(DType dtype) { return std::string(dtype_name(dtype)); }

// --- factories and copies -------------------------------------------------------------------

TEST(CudaParity, Factories) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device();
  for (DType t : kAllTypes) {
    SCOPED_TRACE(name_of(t));
    expect_close(zeros({3, 4}, {t, gpu}), zeros({3, 4}, t));
    expect_close(ones({5}, {t, gpu}), ones({5}, t));
    expect_close(full({2, 3}, 1, {t, gpu}), full({2, 3}, 1, t));
    expect_close(zeros({0, 3}, {t, gpu}), zeros({0, 3}, t));
    const Tensor e = empty({2, 0, 4}, {t, gpu});
    EXPECT_EQ(e.numel(), 0);
    EXPECT_TRUE(e.is_cuda());
    const Tensor base = make_input({2, 3}, t, 1, 0, 5).to(gpu);
    expect_close(zeros_like(base), zeros({2, 3}, t));
    expect_close(ones_like(base), ones({2, 3}, t));
    expect_close(full_like(base, 3), full({2, 3}, 3, t));
    EXPECT_TRUE(empty_like(base).is_cuda());
  }
  expect_close(full({4}, 2.5, {kF16, gpu}), full({4}, 2.5, kF16));
  expect_close(arange(10, {kI64, gpu}), arange(10));
  expect_close(arange(1, 10, 3, {kI32, gpu}), arange(1, 10, 3, kI32));
  expect_close(arange(0.0, 1.0, 0.125, {kF32, gpu}), arange(0.0, 1.0, 0.125, kF32));
  expect_close(linspace(-1, 1, 9, {kF64, gpu}), linspace(-1, 1, 9, kF64), 1e-15, 1e-15);
  expect_close(linspace(-1, 1, 9, {kF32, gpu}), linspace(-1, 1, 9, kF32), 1e-6, 1e-7);
  expect_close(from_vector<float>({1, 2, 3, 4}, {2, 2}, gpu),
               from_vector<float>({1, 2, 3, 4}, {2, 2}));
  expect_close(scalar_tensor(7, {kI64, gpu}), scalar_tensor(7, kI64));
  EXPECT_EQ(scalar_tensor(2.5, {kF32, gpu}).item<float>(), 2.5f);
}

TEST(CudaParity, CastsBetweenEveryPairOfDtypes) {
  EMBER_REQUIRE_CUDA();
  for (DType from : kAllTypes) {
    const Tensor src = make_input({3, 5}, from, 2, 0, 6);  // representable in every dtype
    for (DType to : kAllTypes) {
      SCOPED_TRACE(name_of(from) + " -> " + name_of(to));
      expect_parity({src}, [to](const Inputs& x) { return x[0].to(to); }, {});
      expect_parity({src}, [to](const Inputs& x) { return x[0].t().to(to); }, {});
    }
  }
}

TEST(CudaParity, ContiguousCloneAndStridedCopies) {
  EMBER_REQUIRE_CUDA();
  for (DType t : kAllTypes) {
    SCOPED_TRACE(name_of(t));
    const Tensor x = make_input({4, 6, 5}, t, 3, 0, 9);
    expect_parity({x}, [](const Inputs& v) { return v[0].permute({2, 0, 1}).contiguous(); }, {});
    expect_parity({x}, [](const Inputs& v) { return v[0].slice(1, 1, 6, 2).clone(); }, {});
    expect_parity({x}, [](const Inputs& v) { return v[0].select(2, 3).t().contiguous(); }, {});
    expect_parity({x}, [](const Inputs& v) { return v[0].narrow(0, 1, 2).reshape({-1}); }, {});
    expect_parity({x},
                  [](const Inputs& v) {
                    return v[0].slice(2, 0, 1).expand({4, 6, 7}).contiguous();
                  },
                  {});
    expect_parity({x}, [](const Inputs& v) { return v[0].slice(0, 0, 0).contiguous(); }, {});
    // copy_ into a strided destination, with a dtype change and a broadcast source.
    const Tensor row = make_input({5}, kF32, 4, 0, 9);
    expect_parity({x, row},
                  [](const Inputs& v) {
                    Tensor dst = v[0].clone();
                    dst.transpose(0, 1).select(0, 2).copy_(v[1]);
                    return dst;
                  },
                  {});
  }
}

TEST(CudaParity, CopiesAcrossDevices) {
  EMBER_REQUIRE_CUDA();
  const Tensor host = make_input({6, 7}, kF32, 5);
  Tensor on_gpu = zeros({7, 6}, {kF64, cuda_device()});
  on_gpu.copy_(host.t());  // host -> device with a transpose and a cast
  expect_close(on_gpu, host.t().to(kF64));
  Tensor back = zeros({7, 6}, kF16);
  back.copy_(on_gpu);  // device -> host with a cast
  expect_close(back, host.t().to(kF16));
  Tensor strided_host = zeros({7, 12}, kF64).slice(1, 0, 12, 2);
  strided_host.copy_(on_gpu);  // into a non-contiguous host view
  expect_close(strided_host, host.t().to(kF64));
  expect_close(host.to(cuda_device(), kBF16), host.to(kBF16));
}

// --- elementwise ---------------------------------------------------------------------------

TEST(CudaParity, UnaryOps) {
  EMBER_REQUIRE_CUDA();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> any_sign = {
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"pow 2", [](const Tensor& x) { return pow(x, 2); }},
      {"pow 3", [](const Tensor& x) { return pow(x, 3); }},
      {"clamp", [](const Tensor& x) { return clamp(x, -0.5, 0.75); }},
      {"clamp min", [](const Tensor& x) { return clamp(x, -0.5, std::nullopt); }},
      {"clamp max", [](const Tensor& x) { return clamp(x, std::nullopt, 0.25); }},
      {"operator-", [](const Tensor& x) { return -x; }},
  };
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> positive = {
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"pow 0.5", [](const Tensor& x) { return pow(x, 0.5); }},
      {"pow -1.5", [](const Tensor& x) { return pow(x, -1.5); }},
      {"pow 2.7", [](const Tensor& x) { return x.pow(2.7); }},
  };
  for (DType t : kFloatTypes) {
    const Tensor signed_input = make_input({7, 9}, t, 10, -3, 3);
    const Tensor positive_input = make_input({7, 9}, t, 11, 0.1, 3);
    for (const auto& [name, f] : any_sign) {
      SCOPED_TRACE(std::string(name) + " " + name_of(t));
      expect_parity(
          {signed_input}, [&f](const Inputs& x) { return f(x[0]); }, elementwise_tolerance(t));
      expect_parity(
          {signed_input}, [&f](const Inputs& x) { return f(x[0].t()); }, elementwise_tolerance(t));
    }
    for (const auto& [name, f] : positive) {
      SCOPED_TRACE(std::string(name) + " " + name_of(t));
      expect_parity(
          {positive_input}, [&f](const Inputs& x) { return f(x[0]); }, elementwise_tolerance(t));
      expect_parity(
          {positive_input}, [&f](const Inputs& x) { return f(x[0].slice(1, 0, 9, 2)); },
          elementwise_tolerance(t));
    }
    SCOPED_TRACE(name_of(t));
    expect_parity({make_input({0, 4}, t, 12)}, [](const Inputs& x) { return exp(x[0]); }, {});
  }
  for (DType t : {kI64, kI32, kU8}) {
    SCOPED_TRACE(name_of(t));
    const Tensor x = make_input({5, 6}, t, 13, t == kU8 ? 0 : -9, 10);
    expect_parity({x}, [](const Inputs& v) { return neg(v[0]); }, {});
    expect_parity({x}, [](const Inputs& v) { return abs(v[0].t()); }, {});
    expect_parity({x}, [](const Inputs& v) { return relu(v[0]); }, {});
    expect_parity({x}, [](const Inputs& v) { return pow(v[0], 3); }, {});
    expect_parity({x}, [](const Inputs& v) { return clamp(v[0], 2, 7); }, {});
    expect_parity(
        {x}, [](const Inputs& v) { return sqrt(v[0].abs()); }, elementwise_tolerance(kF32));
  }
}

TEST(CudaParity, InPlaceUnaryOnViews) {
  EMBER_REQUIRE_CUDA();
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name_of(t));
    const Tensor x = make_input({6, 8}, t, 14, 0.1, 2);
    const Tolerance tol = elementwise_tolerance(t);
    expect_parity(
        {x},
        [](const Inputs& v) {
          Tensor y = v[0].clone();
          y.t().slice(0, 0, 8, 3).exp_();
          return y;
        },
        tol);
    expect_parity(
        {x},
        [](const Inputs& v) {
          Tensor y = v[0].clone();
          y.neg_().abs_().sqrt_().rsqrt_().log_().sigmoid_().tanh_().relu_();
          return y;
        },
        tol);
    expect_parity(
        {x},
        [](const Inputs& v) {
          Tensor y = v[0].clone();
          y.select(1, 2).pow_(3).clamp_(0.5, 4.0);
          y.zero_();
          y.narrow(0, 1, 3).fill_(1.5);
          return y;
        },
        tol);
  }
}

TEST(CudaParity, BinaryOpsBroadcastAndPromote) {
  EMBER_REQUIRE_CUDA();
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&, const Tensor&)>>>
      ops = {
          {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
          {"add alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2); }},
          {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
          {"sub alpha", [](const Tensor& a, const Tensor& b) { return sub(a, b, 3); }},
          {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
          {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
          {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
          {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }},
          {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }},
          {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }},
          {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }},
          {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }},
          {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }},
      };
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8}) {
    // a: [4, 1, 5]; b: [3, 1] as a transposed view. Small integers keep u8 free of wraps
    // that differ only in sign conventions.
    const Tensor a = make_input({4, 1, 5}, t, 20, 0, 5);
    const Tensor b = make_input({1, 3}, t, 21, 0, 5);
    for (const auto& [name, f] : ops) {
      SCOPED_TRACE(std::string(name) + " " + name_of(t));
      expect_parity(
          {a, b}, [&f](const Inputs& x) { return f(x[0], x[1].t()); }, elementwise_tolerance(t));
      expect_parity(
          {a, b},
          [&f](const Inputs& x) {
            return f(x[0].expand({4, 3, 5}), x[0]);
          },
          elementwise_tolerance(t));
    }
  }
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name_of(t));
    const Tensor a = make_input({3, 4}, t, 22, 0.5, 3);
    const Tensor b = make_input({4}, t, 23, 0.5, 3);
    const Tolerance tol = elementwise_tolerance(t);
    expect_parity(
        {a, b}, [](const Inputs& x) { return div(x[0], x[1]); }, tol);
    expect_parity(
        {a, b}, [](const Inputs& x) { return pow(x[0], x[1]); }, tol);
    expect_parity(
        {a, b}, [](const Inputs& x) { return x[0] / x[1] + x[0] * x[1] - x[1]; }, tol);
    expect_parity(
        {a}, [](const Inputs& x) { return add(x[0], 2); }, tol);
    expect_parity(
        {a}, [](const Inputs& x) { return sub(x[0], 1.5); }, tol);
    expect_parity(
        {a}, [](const Inputs& x) { return mul(x[0], -2.5); }, tol);
    expect_parity(
        {a}, [](const Inputs& x) { return div(x[0], 4); }, tol);
    expect_parity(
        {a}, [](const Inputs& x) { return 1.0 - x[0] * 3 + 2.0 / x[0]; }, tol);
    expect_parity({a}, [](const Inputs& x) { return gt(x[0], 1.25); }, {});
    expect_parity({a}, [](const Inputs& x) { return le(x[0], 2); }, {});
    expect_parity({a}, [](const Inputs& x) { return eq(x[0], x[0].t().t()); }, {});
  }
  for (DType t : {kBool}) {
    SCOPED_TRACE(name_of(t));
    const Tensor a = make_input({5, 6}, t, 24), b = make_input({6}, t, 25);
    expect_parity({a, b}, [](const Inputs& x) { return add(x[0], x[1]); }, {});
    expect_parity({a, b}, [](const Inputs& x) { return mul(x[0], x[1]); }, {});
    expect_parity({a, b}, [](const Inputs& x) { return maximum(x[0], x[1]); }, {});
    expect_parity({a, b}, [](const Inputs& x) { return minimum(x[0], x[1]); }, {});
    expect_parity({a, b}, [](const Inputs& x) { return ne(x[0], x[1]); }, {});
  }
  // Mixed dtypes promote as in PyTorch; integer division gives floats.
  const Tensor i = make_input({4, 5}, kI32, 26, 1, 9);
  const Tensor f = make_input({5}, kF32, 27);
  const Tensor h = make_input({4, 5}, kF16, 28);
  expect_parity(
      {i, f}, [](const Inputs& x) { return add(x[0], x[1]); }, elementwise_tolerance(kF32));
  expect_parity(
      {i, f}, [](const Inputs& x) { return mul(x[0], 2.5); }, elementwise_tolerance(kF32));
  expect_parity(
      {i, f}, [](const Inputs& x) { return div(x[0], x[0].t().t() + 1); },
      elementwise_tolerance(kF32));
  expect_parity(
      {h, f}, [](const Inputs& x) { return mul(x[0], x[1]); }, elementwise_tolerance(kF32));
  expect_parity(
      {h}, [](const Inputs& x) { return mul(x[0], 2.0); }, elementwise_tolerance(kF16));
  expect_parity(
      {h, i}, [](const Inputs& x) { return sub(x[0], x[1]); }, elementwise_tolerance(kF16));
  // Zero-size operands broadcast to zero-size results.
  expect_parity({zeros({0, 5}), f}, [](const Inputs& x) { return add(x[0], x[1]); }, {});
}

TEST(CudaParity, NaNsPropagateThroughMaximumAndMinimum) {
  EMBER_REQUIRE_CUDA();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = from_vector<float>({1, nan, 3, nan, -1});
  const Tensor b = from_vector<float>({2, 0, nan, nan, -2});
  expect_parity({a, b}, [](const Inputs& x) { return maximum(x[0], x[1]); }, {});
  expect_parity({a, b}, [](const Inputs& x) { return minimum(x[0], x[1]); }, {});
  expect_parity({a, b}, [](const Inputs& x) { return clamp(x[0], 0, 2); }, {});
  expect_parity({a, b}, [](const Inputs& x) { return relu(x[0]); }, {});
  expect_parity({a, b}, [](const Inputs& x) { return eq(x[0], x[1]); }, {});
}

TEST(CudaParity, InPlaceBinaryOnViews) {
  EMBER_REQUIRE_CUDA();
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32}) {
    SCOPED_TRACE(name_of(t));
    const Tensor x = make_input({5, 6}, t, 30, 1, 6);
    const Tensor y = make_input({5}, t, 31, 1, 6);
    const Tolerance tol = elementwise_tolerance(t);
    expect_parity(
        {x, y},
        [](const Inputs& v) {
          Tensor out = v[0].clone();
          out.t().add_(v[1], 2);  // y broadcast along the transposed rows
          out.slice(0, 0, 5, 2).sub_(1);
          out.mul_(v[1].unsqueeze(1));
          out += v[0];
          out -= 1;
          out *= 2;
          out.maximum_(v[0]);
          out.minimum_(v[0] * 3);
          return out;
        },
        tol);
    if (is_floating(t)) {
      expect_parity(
          {x, y},
          [](const Inputs& v) {
            Tensor out = v[0].clone();
            out.div_(v[1].unsqueeze(1));
            out /= 2;
            out.div_(0.5);
            return out;
          },
          tol);
    }
  }
}

TEST(CudaParity, WhereAndMaskedFill) {
  EMBER_REQUIRE_CUDA();
  const Tensor cond = make_input({4, 1, 6}, kBool, 40);
  for (DType t : kAllTypes) {
    SCOPED_TRACE(name_of(t));
    const Tensor a = make_input({3, 6}, t, 41, 0, 9);
    const Tensor b = make_input({4, 3, 1}, t, 42, 0, 9);
    expect_parity({cond, a, b}, [](const Inputs& x) { return where(x[0], x[1], x[2]); }, {});
    expect_parity({cond, a}, [](const Inputs& x) { return where(x[0], x[1], 1); }, {});
    expect_parity({cond, a}, [](const Inputs& x) { return where(x[0], 0, x[1].t().t()); }, {});
    expect_parity({cond.squeeze(0).select(0, 0), a},
                  [](const Inputs& x) { return masked_fill(x[1], x[0], 5); }, {});
    expect_parity({cond.select(0, 1).expand({3, 6}), a},
                  [](const Inputs& x) {
                    Tensor y = x[1].clone();
                    y.masked_fill_(x[0], 2);
                    return y;
                  },
                  {});
  }
}

TEST(CudaParity, AllcloseAndEqual) {
  EMBER_REQUIRE_CUDA();
  const Tensor x = make_input({8, 3}, kF32, 45).cuda();
  EXPECT_TRUE(equal(x, x.clone()));
  EXPECT_TRUE(allclose(x, x + 1e-9));
  EXPECT_FALSE(allclose(x, x + 1.0));
  EXPECT_FALSE(equal(x, x.t().contiguous().t() * 2));
}

// --- reductions ------------------------------------------------------------------------------

TEST(CudaParity, SumMeanVarStdNorm) {
  EMBER_REQUIRE_CUDA();
  const std::vector<Shape> dim_sets = {{}, {0}, {1}, {-1}, {0, 2}, {1, 2}};
  for (DType t : kFloatTypes) {
    // A permuted view, reduced over every kind of dim set; rows of 5 to 240 elements.
    const Tensor x = make_input({6, 8, 5}, t, 50);
    const Tolerance tol = reduce_tolerance(t);
    for (const Shape& dims : dim_sets) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(name_of(t) + " dims " + shape_str(dims) + (keepdim ? " keepdim" : ""));
        expect_parity(
            {x},
            [&](const Inputs& v) {
              return sum(v[0].permute({2, 0, 1}), dims, keepdim);
            },
            tol);
        expect_parity(
            {x}, [&](const Inputs& v) { return mean(v[0], dims, keepdim); }, tol);
        expect_parity(
            {x}, [&](const Inputs& v) { return var(v[0].transpose(0, 2), dims, 1, keepdim); }, tol);
        expect_parity(
            {x}, [&](const Inputs& v) { return var(v[0], dims, 0, keepdim); }, tol);
        expect_parity(
            {x}, [&](const Inputs& v) { return ember::std(v[0], dims, 1, keepdim); }, tol);
        for (double p : {1.0, 2.0, 3.0, std::numeric_limits<double>::infinity()}) {
          expect_parity(
              {x}, [&](const Inputs& v) { return norm(v[0], p, dims, keepdim); }, tol);
        }
      }
    }
  }
  // Long rows take the block-per-row path; many short rows the warp-per-row path.
  const Tensor long_rows = make_input({3, 5000}, kF32, 51);
  const Tensor short_rows = make_input({3000, 3}, kF32, 52);
  for (const Tensor& x : {long_rows, short_rows}) {
    SCOPED_TRACE(shape_str(x.sizes()));
    expect_parity({x}, [](const Inputs& v) { return sum(v[0], {1}); }, {1e-4, 1e-3});
    expect_parity({x}, [](const Inputs& v) { return sum(v[0], {0}); }, {1e-4, 1e-3});
    expect_parity({x}, [](const Inputs& v) { return mean(v[0]); }, {1e-4, 1e-5});
    expect_parity({x}, [](const Inputs& v) { return var(v[0], {1}); }, {1e-4, 1e-4});
    expect_parity({x}, [](const Inputs& v) { return norm(v[0], 2.0, {1}); }, {1e-4, 1e-4});
    expect_parity({x}, [](const Inputs& v) { return norm(v[0], 1.5); }, {1e-4, 1e-4});
  }
  // Integer and bool sums are i64 and exact; reducing an empty dim gives the identity.
  for (DType t : {kI64, kI32, kU8, kBool}) {
    SCOPED_TRACE(name_of(t));
    const Tensor x = make_input({7, 300}, t, 53, 0, 100);
    expect_parity({x}, [](const Inputs& v) { return sum(v[0], {1}); }, {});
    expect_parity({x}, [](const Inputs& v) { return sum(v[0].t(), {1}, true); }, {});
    expect_parity({x}, [](const Inputs& v) { return sum(v[0]); }, {});
  }
  expect_parity({zeros({4, 0})}, [](const Inputs& v) { return sum(v[0], {1}); }, {});
  expect_parity({zeros({0, 4})}, [](const Inputs& v) { return sum(v[0], {1}); }, {});
  expect_parity({zeros({0, 4})}, [](const Inputs& v) { return sum(v[0]); }, {});
}

TEST(CudaParity, MaxMinAndArgReductions) {
  EMBER_REQUIRE_CUDA();
  for (DType t : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8}) {
    SCOPED_TRACE(name_of(t));
    // Integers drawn from a small range tie often: the first extreme must win on both.
    const Tensor x = make_input({6, 7, 40}, t, 60, 0, t == kU8 ? 20 : 50);
    expect_parity({x}, [](const Inputs& v) { return max(v[0]); }, {});
    expect_parity({x}, [](const Inputs& v) { return min(v[0].transpose(0, 2)); }, {});
    for (int64_t dim : {0, 1, 2, -1}) {
      for (bool keepdim : {false, true}) {
        expect_parity({x}, [&](const Inputs& v) { return std::get<0>(max(v[0], dim, keepdim)); },
                      {});
        expect_parity({x}, [&](const Inputs& v) { return std::get<1>(max(v[0], dim, keepdim)); },
                      {});
        expect_parity({x},
                      [&](const Inputs& v) {
                        return std::get<0>(min(v[0].permute({1, 2, 0}), dim, keepdim));
                      },
                      {});
        expect_parity({x},
                      [&](const Inputs& v) {
                        return std::get<1>(min(v[0].permute({1, 2, 0}), dim, keepdim));
                      },
                      {});
        expect_parity({x}, [&](const Inputs& v) { return argmax(v[0], dim, keepdim); }, {});
        expect_parity({x}, [&](const Inputs& v) { return argmin(v[0], dim, keepdim); }, {});
      }
    }
    expect_parity({x}, [](const Inputs& v) { return argmax(v[0]); }, {});
    expect_parity({x}, [](const Inputs& v) { return argmin(v[0]); }, {});
    expect_parity({x}, [](const Inputs& v) { return v[0].argmax(1, true); }, {});
  }
  // Rows longer than a warp's share and NaNs that must win.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor long_rows = make_input({4, 3000}, kF32, 61);
  long_rows.select(0, 1).narrow(0, 2500, 1).fill_(nan);
  long_rows.select(0, 2).narrow(0, 700, 1).fill_(nan);
  long_rows.select(0, 2).narrow(0, 1900, 1).fill_(nan);
  long_rows.select(0, 3).fill_(1.0);  // all ties: index 0
  for (bool is_max : {true, false}) {
    SCOPED_TRACE(is_max ? "max" : "min");
    expect_parity(
        {long_rows},
        [&](const Inputs& v) { return std::get<0>(is_max ? max(v[0], 1) : min(v[0], 1)); }, {});
    expect_parity(
        {long_rows},
        [&](const Inputs& v) { return std::get<1>(is_max ? max(v[0], 1) : min(v[0], 1)); }, {});
    expect_parity({long_rows}, [&](const Inputs& v) { return is_max ? max(v[0]) : min(v[0]); }, {});
  }
  expect_parity({from_vector<float>({1, 3, nan, 3, nan})},
                [](const Inputs& v) { return argmax(v[0]); }, {});
  expect_parity({from_vector<float>({1, 3, nan, 3, nan})},
                [](const Inputs& v) { return argmin(v[0]); }, {});
  expect_parity({from_vector<int64_t>({4, 9, 2, 9, 2})},
                [](const Inputs& v) { return argmax(v[0]); }, {});
  expect_parity({from_vector<int64_t>({4, 9, 2, 9, 2})},
                [](const Inputs& v) { return argmin(v[0]); }, {});
  // An empty result needs no kernel.
  expect_parity({zeros({0, 3})}, [](const Inputs& v) { return std::get<0>(max(v[0], 1)); }, {});
}

// --- linear algebra ---------------------------------------------------------------------------

TEST(CudaParity, MatmulF32AndF64) {
  EMBER_REQUIRE_CUDA();
  for (DType t : {kF32, kF64}) {
    SCOPED_TRACE(name_of(t));
    const Tolerance tol = t == kF32 ? Tolerance{1e-4, 1e-5} : Tolerance{1e-12, 1e-12};
    const Tensor a = make_input({5, 7}, t, 70), b = make_input({7, 3}, t, 71);
    const Tensor at = make_input({7, 5}, t, 72), bt = make_input({3, 7}, t, 73);
    expect_parity(
        {a, b}, [](const Inputs& x) { return mm(x[0], x[1]); }, tol);
    expect_parity(
        {at, bt}, [](const Inputs& x) { return mm(x[0].t(), x[1].t()); }, tol);
    expect_parity(
        {a, bt}, [](const Inputs& x) { return matmul(x[0], x[1].t()); }, tol);
    expect_parity(
        {at, b}, [](const Inputs& x) { return x[0].t().matmul(x[1]); }, tol);
    // Slices whose rows are strided in memory, and single rows and columns.
    const Tensor wide = make_input({9, 16}, t, 74);
    expect_parity(
        {wide, b}, [](const Inputs& x) { return mm(x[0].slice(1, 2, 9), x[1]); }, tol);
    expect_parity(
        {wide, b}, [](const Inputs& x) { return mm(x[0].slice(1, 0, 14, 2), x[1]); }, tol);
    expect_parity(
        {a, b}, [](const Inputs& x) { return mm(x[0].narrow(0, 2, 1), x[1]); }, tol);
    expect_parity(
        {a, b}, [](const Inputs& x) { return mm(x[0], x[1].narrow(1, 1, 1)); }, tol);
    // Vectors.
    const Tensor v = make_input({7}, t, 75), w = make_input({5}, t, 76);
    expect_parity(
        {v, v}, [](const Inputs& x) { return matmul(x[0], x[1] * 2); }, tol);
    expect_parity(
        {a, v}, [](const Inputs& x) { return matmul(x[0], x[1]); }, tol);
    expect_parity(
        {w, a}, [](const Inputs& x) { return matmul(x[0], x[1]); }, tol);
    // Batches, broadcast batches and bmm.
    const Tensor p = make_input({2, 1, 4, 5}, t, 77), q = make_input({3, 5, 6}, t, 78);
    expect_parity(
        {p, q}, [](const Inputs& x) { return matmul(x[0], x[1]); }, tol);
    expect_parity(
        {p, q},
        [](const Inputs& x) { return matmul(x[0].transpose(-1, -2).transpose(-1, -2), x[1]); },
        tol);
    expect_parity(
        {q, a}, [](const Inputs& x) { return matmul(x[1].t(), x[0]); }, tol);
    expect_parity(
        {q, w}, [](const Inputs& x) { return matmul(x[0].transpose(1, 2), x[1]); }, tol);
    const Tensor m1 = make_input({4, 3, 6}, t, 79), m2 = make_input({4, 6, 2}, t, 80);
    expect_parity(
        {m1, m2}, [](const Inputs& x) { return bmm(x[0], x[1]); }, tol);
    expect_parity(
        {m1, m2}, [](const Inputs& x) { return bmm(x[1].transpose(1, 2), x[0].transpose(1, 2)); },
        tol);
    // addmm with a broadcast input, alpha and beta; k = 0 leaves beta * input.
    const Tensor bias = make_input({3}, t, 81);
    expect_parity(
        {bias, a, b}, [](const Inputs& x) { return addmm(x[0], x[1], x[2]); }, tol);
    expect_parity(
        {bias, a, b}, [](const Inputs& x) { return addmm(x[0], x[1], x[2], 0.5, -2); }, tol);
    expect_parity(
        {bias, a, b}, [](const Inputs& x) { return addmm(x[0], x[1], x[2], 0, 1); }, tol);
    expect_parity({zeros({3, 0}, t), zeros({0, 4}, t)},
                  [](const Inputs& x) { return mm(x[0], x[1]); }, {});
    expect_parity(
        {bias, zeros({5, 0}, t), zeros({0, 3}, t)},
        [](const Inputs& x) { return addmm(x[0], x[1], x[2], 2, 1); }, tol);
    expect_parity({zeros({0, 4}, t), make_input({4, 3}, t, 82)},
                  [](const Inputs& x) { return mm(x[0], x[1]); }, {});
  }
  // A larger product, where blocked algorithms differ in summation order.
  expect_parity({make_input({64, 300}, kF32, 83), make_input({300, 48}, kF32, 84)},
                [](const Inputs& x) { return matmul(x[0], x[1]); }, {1e-4, 5e-4});
}

TEST(CudaParity, MatmulHalfPrecisionMatchesFloatReference) {
  EMBER_REQUIRE_CUDA();
  // The reference is the f32 product of the same values, rounded once (the CPU's own 16-bit
  // GEMM does exactly that); cuBLAS accumulates in f32 too.
  for (DType t : {kF16, kBF16}) {
    SCOPED_TRACE(name_of(t));
    const double tol = t == kF16 ? 4e-3 : 2e-2;
    const Tensor a = make_input({6, 32}, t, 90), b = make_input({32, 5}, t, 91);
    const Tensor p = make_input({3, 6, 8}, t, 92), q = make_input({3, 8, 4}, t, 93);
    expect_close(matmul(a.cuda(), b.cuda()), matmul(a.to(kF32), b.to(kF32)).to(t), tol, tol);
    expect_close(matmul(b.cuda().t(), a.cuda().t()), matmul(b.to(kF32).t(), a.to(kF32).t()).to(t),
                 tol, tol);
    expect_close(bmm(p.cuda(), q.cuda()), bmm(p.to(kF32), q.to(kF32)).to(t), tol, tol);
    expect_close(matmul(a.cuda(), b.cuda()), matmul(a, b), tol, tol);
    expect_close(addmm(b.t().select(1, 0), a, b, 0.5, 2.0),
                 addmm(b.t().select(1, 0).cuda(), a.cuda(), b.cuda(), 0.5, 2.0).cpu(), tol, tol);
  }
}

// --- softmax ---------------------------------------------------------------------------------

TEST(CudaParity, SoftmaxAndLogSoftmax) {
  EMBER_REQUIRE_CUDA();
  for (DType t : kFloatTypes) {
    const Tensor x =
        make_input({4, 5, 6}, t, 100, -20, 20);  // spread wide: max-subtraction matters
    const Tolerance tol = elementwise_tolerance(t);
    const Tolerance log_tol = {tol.rtol * 4, tol.atol * 4};
    for (int64_t dim : {0, 1, 2, -1}) {
      SCOPED_TRACE(name_of(t) + " dim " + std::to_string(dim));
      expect_parity(
          {x}, [dim](const Inputs& v) { return softmax(v[0], dim); }, tol);
      expect_parity(
          {x}, [dim](const Inputs& v) { return log_softmax(v[0], dim); }, log_tol);
      expect_parity(
          {x}, [dim](const Inputs& v) { return v[0].transpose(0, 2).softmax(dim); }, tol);
      expect_parity(
          {x},
          [dim](const Inputs& v) {
            return v[0].permute({1, 2, 0}).log_softmax(dim);
          },
          log_tol);
    }
  }
  const Tensor long_rows = make_input({3, 3000}, kF32, 101, -5, 5);
  expect_parity({long_rows}, [](const Inputs& v) { return softmax(v[0], 1); }, {1e-4, 1e-7});
  expect_parity({long_rows}, [](const Inputs& v) { return log_softmax(v[0], -1); }, {1e-4, 1e-5});
  expect_parity({long_rows}, [](const Inputs& v) { return softmax(v[0], 0); }, {1e-5, 1e-7});
  expect_parity({zeros({0, 5})}, [](const Inputs& v) { return softmax(v[0], 1); }, {});
  expect_parity({zeros({3, 0})}, [](const Inputs& v) { return log_softmax(v[0], 1); }, {});
}

// --- joining and indexing ----------------------------------------------------------------------

TEST(CudaParity, CatAndStack) {
  EMBER_REQUIRE_CUDA();
  for (DType t : {kF32, kF16, kI64, kBool}) {
    SCOPED_TRACE(name_of(t));
    const Tensor a = make_input({2, 3, 4}, t, 110, 0, 9);
    const Tensor b = make_input({2, 5, 4}, t, 111, 0, 9);
    const Tensor c = make_input({4, 3, 2}, t, 112, 0, 9);
    expect_parity({a, b}, [](const Inputs& x) { return cat({x[0], x[1]}, 1); }, {});
    expect_parity({a, c},
                  [](const Inputs& x) {
                    return cat({x[0], x[1].transpose(0, 2), x[0]}, -2);
                  },
                  {});
    expect_parity({a, b}, [](const Inputs& x) { return cat({x[0], x[1].slice(1, 0, 0)}, 1); }, {});
    expect_parity({a, c},
                  [](const Inputs& x) {
                    return stack({x[0], x[1].transpose(0, 2)}, 0);
                  },
                  {});
    expect_parity({a, c},
                  [](const Inputs& x) {
                    return stack({x[0], x[0], x[1].transpose(0, 2)}, 3);
                  },
                  {});
  }
}

TEST(CudaParity, IndexSelectGatherScatterAddOneHot) {
  EMBER_REQUIRE_CUDA();
  for (DType t : kAllTypes) {
    SCOPED_TRACE(name_of(t));
    const Tensor x = make_input({5, 6, 7}, t, 120, 0, 9);
    for (int64_t dim : {0, 1, 2, -1}) {
      const int64_t size = x.size(dim);
      // Values below 5 are in range for x and for its transpose.
      const Tensor index = make_input({9}, kI64, 121 + static_cast<uint64_t>(dim + 1), 0, 5);
      expect_parity({x, index}, [dim](const Inputs& v) { return index_select(v[0], dim, v[1]); },
                    {});
      expect_parity(
          {x, index},
          [dim](const Inputs& v) { return index_select(v[0].transpose(0, 2), dim, v[1]); }, {});
      // gather with an index smaller than the input in the other dims.
      Shape index_shape = {4, 5, 3};
      index_shape[static_cast<size_t>(dim < 0 ? dim + 3 : dim)] = 8;
      const Tensor gidx = make_input(index_shape, kI64, 130 + static_cast<uint64_t>(dim + 1), 0,
                                     static_cast<double>(size));
      expect_parity({x, gidx}, [dim](const Inputs& v) { return gather(v[0], dim, v[1]); }, {});
      // scatter_add with repeated indices: float sums may differ in order, integers may not.
      const Tensor src = make_input(index_shape, t, 140 + static_cast<uint64_t>(dim + 1), 0, 9);
      const Tolerance tol = reduce_tolerance(t);
      expect_parity(
          {x, gidx, src}, [dim](const Inputs& v) { return scatter_add(v[0], dim, v[1], v[2]); },
          tol);
      expect_parity(
          {x, gidx, src},
          [dim](const Inputs& v) {
            Tensor y = v[0].clone();
            y.scatter_add_(dim, v[1], v[2]);
            return y;
          },
          tol);
    }
    const Tensor empty_index = zeros({0}, kI64);
    expect_parity({x, empty_index}, [](const Inputs& v) { return index_select(v[0], 1, v[1]); },
                  {});
  }
  const Tensor labels = make_input({3, 4}, kI64, 150, 0, 10);
  expect_parity({labels}, [](const Inputs& v) { return one_hot(v[0]); }, {});
  expect_parity({labels}, [](const Inputs& v) { return one_hot(v[0].t(), 12); }, {});
  // Many updates to few targets: atomics must not lose any.
  const Tensor target = zeros({4}, kF32);
  const Tensor idx = make_input({20000}, kI64, 151, 0, 4);
  const Tensor ones_src = ones({20000}, kF32);
  expect_parity({target, idx, ones_src},
                [](const Inputs& v) { return scatter_add(v[0], 0, v[1], v[2]); }, {});
  expect_parity({target.to(kI64), idx, ones_src.to(kI64)},
                [](const Inputs& v) { return scatter_add(v[0], 0, v[1], v[2]); }, {});
}

// --- random ----------------------------------------------------------------------------------

// The same generator state draws the same numbers on both devices: uniform and integer draws
// bit for bit, normal draws up to the last bit of logf/cosf.
TEST(CudaParity, RandomDrawsMatchTheCpu) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device();
  const Shape shape = {37, 129};  // odd sizes: no reliance on launch shape
  for (DType t : kFloatTypes) {
    SCOPED_TRACE(name_of(t));
    Generator cpu_gen(2024), gpu_gen(2024);
    expect_close(rand(shape, {t, gpu}, &gpu_gen), rand(shape, t, &cpu_gen), 0, 0);
    expect_close(uniform(shape, -3, 5, {t, gpu}, &gpu_gen), uniform(shape, -3, 5, t, &cpu_gen), 0,
                 0);
    const Tolerance normal_tol = t == kF64 ? Tolerance{1e-12, 1e-12} : elementwise_tolerance(t);
    expect_close(randn(shape, {t, gpu}, &gpu_gen), randn(shape, t, &cpu_gen), normal_tol.rtol,
                 normal_tol.atol * 4);
    expect_close(normal(shape, 2, 0.5, {t, gpu}, &gpu_gen), normal(shape, 2, 0.5, t, &cpu_gen),
                 normal_tol.rtol, normal_tol.atol * 4);
    Tensor a = empty(shape, {t, gpu}), b = empty(shape, t);
    expect_close(uniform_(a, 1, 2, &gpu_gen), uniform_(b, 1, 2, &cpu_gen), 0, 0);
    expect_close(normal_(a, 0, 3, &gpu_gen), normal_(b, 0, 3, &cpu_gen), normal_tol.rtol,
                 normal_tol.atol * 12);
    expect_close(bernoulli(shape, 0.3, {t, gpu}, &gpu_gen), bernoulli(shape, 0.3, t, &cpu_gen), 0,
                 0);
    const Tensor p = make_input(shape, t, 160, 0, 1);
    expect_close(bernoulli(p.to(gpu), &gpu_gen), bernoulli(p, &cpu_gen), 0, 0);
    EXPECT_EQ(gpu_gen.offset(), cpu_gen.offset());
  }
  for (DType t : {kI64, kI32, kU8, kF32}) {
    SCOPED_TRACE(name_of(t));
    Generator cpu_gen(7), gpu_gen(7);
    expect_close(randint(0, 200, shape, {t, gpu}, &gpu_gen), randint(0, 200, shape, t, &cpu_gen), 0,
                 0);
    expect_close(randint(-50, 3, shape, {kI64, gpu}, &gpu_gen),
                 randint(-50, 3, shape, kI64, &cpu_gen), 0, 0);
  }
  // The default generator, seeded the same way twice.
  manual_seed(99);
  const Tensor on_gpu = rand({1000}, gpu);
  manual_seed(99);
  expect_close(on_gpu, rand({1000}), 0, 0);
  expect_close(rand({0, 3}, gpu), rand({0, 3}), 0, 0);
}

// --- tensor methods --------------------------------------------------------------------------

TEST(CudaParity, ItemToVectorAndPrinting) {
  EMBER_REQUIRE_CUDA();
  const Tensor x = from_vector<float>({1.5f, -2.0f, 3.25f}, {3});
  const Tensor g = x.cuda();
  EXPECT_EQ(g.device(), cuda_device());
  EXPECT_EQ(g.select(0, 2).item<float>(), 3.25f);
  EXPECT_EQ(g.to_vector<float>(), x.to_vector<float>());
  EXPECT_EQ(g.to_vector<int64_t>(), x.to_vector<int64_t>());
  const std::string printed = g.str();
  EXPECT_NE(printed.find("device='cuda:0'"), std::string::npos) << printed;
  EXPECT_EQ(printed.substr(0, printed.find(", device")), x.str().substr(0, x.str().size() - 1));
}

}  // namespace
}  // namespace ember
