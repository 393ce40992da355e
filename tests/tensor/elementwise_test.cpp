// Elementwise ops: values against plain loops, broadcasting, type promotion, in-place forms,
// non-contiguous operands, zero-size tensors and bad input.
#include <cmath>
#include <functional>

#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;

const std::vector<double> kValues{-2.5, -1.0, -0.25, 0.0, 0.5, 1.0, 2.0, 3.75};

std::vector<double> apply(const std::vector<double>& in, const std::function<double(double)>& f) {
  std::vector<double> out;
  for (double v : in) out.push_back(f(v));
  return out;
}

TEST(Elementwise, UnaryOpsMatchLibm) {
  const std::vector<double> positive{0.25, 0.5, 1.0, 2.0, 9.0};
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    std::function<double(double)> ref;
    bool positive_only;
  };
  const std::vector<Case> cases{
      {"neg", [](const Tensor& t) { return neg(t); }, [](double x) { return -x; }, false},
      {"abs", [](const Tensor& t) { return abs(t); }, [](double x) { return std::abs(x); }, false},
      {"exp", [](const Tensor& t) { return exp(t); }, [](double x) { return std::exp(x); }, false},
      {"log", [](const Tensor& t) { return log(t); }, [](double x) { return std::log(x); }, true},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }, [](double x) { return std::sqrt(x); },
       true},
      {"rsqrt", [](const Tensor& t) { return rsqrt(t); }, [](double x) { return 1 / std::sqrt(x); },
       true},
      {"relu", [](const Tensor& t) { return relu(t); }, [](double x) { return x > 0 ? x : 0; },
       false},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); },
       [](double x) { return 1 / (1 + std::exp(-x)); }, false},
      {"tanh", [](const Tensor& t) { return tanh(t); }, [](double x) { return std::tanh(x); },
       false},
      {"pow3", [](const Tensor& t) { return pow(t, 3); }, [](double x) { return x * x * x; },
       false},
      {"pow2", [](const Tensor& t) { return t.pow(2); }, [](double x) { return x * x; }, false},
      {"pow-1.5", [](const Tensor& t) { return pow(t, -1.5); },
       [](double x) { return std::pow(x, -1.5); }, true},
      {"clamp", [](const Tensor& t) { return clamp(t, -1.0, 2.0); },
       [](double x) { return std::clamp(x, -1.0, 2.0); }, false},
      {"clamp_min", [](const Tensor& t) { return t.clamp(0.5, std::nullopt); },
       [](double x) { return std::max(x, 0.5); }, false},
  };
  for (const Case& c : cases) {
    const std::vector<double>& in = c.positive_only ? positive : kValues;
    for (DType dtype : {kF32, kF64, kF16, kBF16}) {
      SCOPED_TRACE(std::string(c.name) + " " + std::string(dtype_name(dtype)));
      const double tol = dtype == kF32 ? 1e-6 : dtype == kF64 ? 1e-12 : 1e-2;
      const Tensor x = from_vector<double>(in).to(dtype);
      const Tensor y = c.op(x);
      EXPECT_EQ(y.dtype(), dtype);
      expect_close(y, from_vector<double>(apply(in, c.ref)).to(dtype), tol, tol);
    }
  }
}

TEST(Elementwise, UnaryOpsOnIntegersAndBool) {
  const Tensor i = from_vector<int32_t>({-3, 0, 4});
  EXPECT_EQ(neg(i).to_vector<int32_t>(), (std::vector<int32_t>{3, 0, -4}));
  EXPECT_EQ(abs(i).to_vector<int32_t>(), (std::vector<int32_t>{3, 0, 4}));
  EXPECT_EQ(relu(i).dtype(), kI32);
  EXPECT_EQ(pow(i, 2).to_vector<int32_t>(), (std::vector<int32_t>{9, 0, 16}));
  EXPECT_EQ(clamp(i, -1, 2).to_vector<int32_t>(), (std::vector<int32_t>{-1, 0, 2}));
  // Float math on integers promotes to f32, as in PyTorch.
  EXPECT_EQ(exp(i).dtype(), kF32);
  EXPECT_EQ(sqrt(from_vector<int64_t>({4, 9})).to_vector<float>(), (std::vector<float>{2, 3}));
  EXPECT_EQ(clamp(i, 0.5, std::nullopt).dtype(), kF32);
  EXPECT_EQ(pow(i, 0.5).dtype(), kF32);
  EXPECT_EMBER_ERROR(neg(from_vector<bool>({true})), "neg: not supported for bool tensors");
  EXPECT_EMBER_ERROR(pow(i, -1), "pow: integers to negative integer powers are not allowed");
  EXPECT_EMBER_ERROR(clamp(i, std::nullopt, std::nullopt), "clamp: at least one of min and max");
}

TEST(Elementwise, SpecialValues) {
  const Tensor x = from_vector<float>({NAN, INFINITY, -INFINITY, 0.0f});
  const auto r = relu(x).to_vector<float>();
  EXPECT_TRUE(std::isnan(r[0]));
  EXPECT_EQ(r[1], INFINITY);
  EXPECT_EQ(r[2], 0.0f);
  EXPECT_TRUE(std::isnan(clamp(x, -1.0, 1.0).to_vector<float>()[0]));
  EXPECT_EQ(sigmoid(x).to_vector<float>()[2], 0.0f);
  EXPECT_EQ(log(from_vector<float>({0.0f})).item<float>(), -INFINITY);
  EXPECT_TRUE(std::isnan(maximum(x, zeros({4})).to_vector<float>()[0]));
  EXPECT_TRUE(std::isnan(minimum(zeros({4}), x).to_vector<float>()[0]));
}

TEST(Elementwise, BinaryOpsAndBroadcasting) {
  const Tensor a = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  const Tensor b = from_vector<float>({10, 20, 30});  // broadcasts over rows
  const Tensor c = from_vector<float>({100, 200}, {2, 1});
  EXPECT_EQ((a + b).to_vector<float>(), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ((a - c).to_vector<float>(), (std::vector<float>{-99, -98, -97, -196, -195, -194}));
  EXPECT_EQ((b * c).sizes(), (Shape{2, 3}));
  EXPECT_EQ((b * c).to_vector<float>(), (std::vector<float>{1000, 2000, 3000, 2000, 4000, 6000}));
  EXPECT_EQ(add(a, b, 2).to_vector<float>(), (std::vector<float>{21, 42, 63, 24, 45, 66}));
  EXPECT_EQ(sub(a, b, 0.5).to_vector<float>(), (std::vector<float>{-4, -8, -12, -1, -5, -9}));
  EXPECT_EQ((a / 2).to_vector<float>(), (std::vector<float>{0.5, 1, 1.5, 2, 2.5, 3}));
  EXPECT_EQ((1 - a).to_vector<float>(), (std::vector<float>{0, -1, -2, -3, -4, -5}));
  EXPECT_EQ((12 / a).to_vector<float>()[2], 4.0f);
  EXPECT_EQ(pow(b, from_vector<float>({2})).to_vector<float>(),
            (std::vector<float>{100, 400, 900}));
  EXPECT_EQ(maximum(a, full({1}, 3.5)).to_vector<float>(),
            (std::vector<float>{3.5, 3.5, 3.5, 4, 5, 6}));
  EXPECT_EQ(minimum(a, full({1}, 3.5)).to_vector<float>(),
            (std::vector<float>{1, 2, 3, 3.5, 3.5, 3.5}));
  // Broadcasting edge cases: scalars, size-1 dims on both sides, leading dims, empty dims.
  EXPECT_EQ((zeros({3, 1, 5}) + zeros({4, 1})).sizes(), (Shape{3, 4, 5}));
  EXPECT_EQ((scalar_tensor(2.0) * zeros({2, 2})).sizes(), (Shape{2, 2}));
  EXPECT_EQ((zeros({0, 3}) + zeros({3})).sizes(), (Shape{0, 3}));
  EXPECT_EQ((zeros({1, 0}) + zeros({5, 1})).sizes(), (Shape{5, 0}));
  EXPECT_EMBER_ERROR(zeros({2, 3}) + zeros({4}), "add: shapes [2, 3] and [4] cannot broadcast");
  EXPECT_EMBER_ERROR(zeros({2, 3}) * zeros({3, 2}),
                     "mul: shapes [2, 3] and [3, 2] cannot broadcast");
}

TEST(Elementwise, EveryDtypeAddsAndMultiplies) {
  for (DType dtype : {kF32, kF64, kF16, kBF16, kI64, kI32, kU8}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Tensor a = from_vector<int64_t>({1, 2, 3}).to(dtype);
    const Tensor b = from_vector<int64_t>({4, 5, 6}).to(dtype);
    EXPECT_EQ((a + b).dtype(), dtype);
    EXPECT_EQ((a + b).to_vector<double>(), (std::vector<double>{5, 7, 9}));
    EXPECT_EQ((a * b).to_vector<double>(), (std::vector<double>{4, 10, 18}));
    EXPECT_EQ((b - a).to_vector<double>(), (std::vector<double>{3, 3, 3}));
    EXPECT_EQ(maximum(a, b).to_vector<double>(), (std::vector<double>{4, 5, 6}));
    EXPECT_EQ(lt(a, b).to_vector<bool>(), (std::vector<bool>{true, true, true}));
  }
  const Tensor t = from_vector<bool>({true, false, true}),
               f = from_vector<bool>({false, false, true});
  EXPECT_EQ((t + f).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ((t * f).to_vector<bool>(), (std::vector<bool>{false, false, true}));
  EXPECT_EMBER_ERROR(t - f, "sub: subtraction of bool tensors is not supported");
}

TEST(Elementwise, TypePromotionFollowsPyTorch) {
  const Tensor i32 = ones({2}, kI32), i64 = ones({2}, kI64), u8 = ones({2}, kU8),
               f16 = ones({2}, kF16), bf16 = ones({2}, kBF16), f32 = ones({2}),
               f64 = ones({2}, kF64), b = ones({2}, kBool);
  EXPECT_EQ((i32 + i64).dtype(), kI64);
  EXPECT_EQ((u8 + i32).dtype(), kI32);
  EXPECT_EQ((b + u8).dtype(), kU8);
  EXPECT_EQ((i64 + f16).dtype(), kF16);
  EXPECT_EQ((f16 + bf16).dtype(), kF32);
  EXPECT_EQ((f32 + f64).dtype(), kF64);
  EXPECT_EQ((i32 / i32).dtype(), kF32);  // true division
  EXPECT_EQ((i32 / i32).to_vector<float>(), (std::vector<float>{1, 1}));
  // Scalars count only by category.
  EXPECT_EQ((i32 + 2).dtype(), kI32);
  EXPECT_EQ((i32 + 2.5).dtype(), kF32);
  EXPECT_EQ((f16 * 2.0).dtype(), kF16);
  EXPECT_EQ((u8 + true).dtype(), kU8);
  EXPECT_EQ((b + 1).dtype(), kI64);
  // 0-d tensors count less than dimensioned ones, unless of a higher category.
  EXPECT_EQ((f16 + scalar_tensor(1.0, kF64)).dtype(), kF16);
  EXPECT_EQ((i32 + scalar_tensor(1, kI64)).dtype(), kI32);
  EXPECT_EQ((i32 + scalar_tensor(1.0, kF64)).dtype(), kF64);
  EXPECT_EQ((scalar_tensor(1, kI32) + scalar_tensor(1, kI64)).dtype(), kI64);
  EXPECT_EQ(result_type(i32, 1.5), kF32);
  EXPECT_EQ(promote_types(kU8, kI64), kI64);
  EXPECT_EQ(promote_types(kBF16, kF16), kF32);
  EXPECT_EQ(promote_types(kBool, kBF16), kBF16);
}

TEST(Elementwise, InPlaceFormsWriteIntoSelf) {
  Tensor a = from_vector<float>({1, 2, 3});
  const void* storage = a.data_ptr();
  a.add_(from_vector<float>({1, 1, 1})).mul_(2).sub_(1).div_(from_vector<float>({1, 2, 4}));
  EXPECT_EQ(a.data_ptr(), storage);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{3, 2.5, 1.75}));
  a += 1;
  a -= from_vector<float>({1, 1, 1});
  a *= 4;
  a /= 2;
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{6, 5, 3.5}));
  a.neg_().abs_().sqrt_().pow_(2.0).clamp_(0.0, 5.5);
  expect_close(a, from_vector<float>({5.5, 5, 3.5}));
  Tensor e = zeros({2});
  e.exp_().log_();
  EXPECT_EQ(e.to_vector<float>(), (std::vector<float>{0, 0}));
  Tensor r = from_vector<float>({-1, 4});
  r.relu_().rsqrt_();
  EXPECT_TRUE(std::isinf(r.to_vector<float>()[0]));
  Tensor s = zeros({2});
  s.sigmoid_();
  s.tanh_();
  expect_close(s, full({2}, std::tanh(0.5)));
  Tensor m = from_vector<float>({1, 5});
  m.maximum_(full({2}, 3.0)).minimum_(full({2}, 4.0));
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{3, 4}));
  // Integer self with a float result cannot be written in place.
  Tensor i = ones({2}, kI64);
  EXPECT_EMBER_ERROR(i.add_(0.5),
                     "add_: result type f32 can't be cast to the in-place output's dtype i64");
  EXPECT_EMBER_ERROR(i.div_(2), "div_: result type f32 can't be cast");
  Tensor f = ones({2});
  f.add_(ones({2}, kI64));  // an int operand into a float self is fine
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{2, 2}));
  // In place never broadcasts self.
  Tensor small = ones({3});
  EXPECT_EMBER_ERROR(
      small.add_(ones({2, 3})),
      "add_: in-place output of shape [3] cannot hold the broadcast result of shape [2, 3]");
  // An operand overlapping self in another layout reads the old values.
  Tensor sq = from_vector<float>({1, 2, 3, 4}, {2, 2});
  sq.add_(sq.t());
  EXPECT_EQ(sq.to_vector<float>(), (std::vector<float>{2, 5, 5, 8}));
}

TEST(Elementwise, NonContiguousOperands) {
  const Tensor base = arange(24, kF32).reshape({2, 3, 4});
  const Tensor t = base.permute({2, 0, 1});                 // [4, 2, 3]
  const Tensor s = base.slice(2, 0, 4, 2).transpose(1, 2);  // [2, 2, 3]
  const Tensor e = from_vector<float>({1, 2, 3}).expand({4, 2, 3});
  const auto tv = t.contiguous().to_vector<float>();
  const auto got = (t * 2 + e).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(got[i], tv[i] * 2 + static_cast<float>(i % 3 + 1));
  const auto sv = s.contiguous().to_vector<float>();
  const auto got2 = exp(s).to_vector<float>();
  for (size_t i = 0; i < sv.size(); ++i) EXPECT_FLOAT_EQ(got2[i], std::exp(sv[i]));
  // Writing through a non-contiguous output.
  Tensor out = zeros({3, 4});
  Tensor view = out.t();
  view.add_(arange(12, kF32).reshape({4, 3}));
  EXPECT_EQ(out.to_vector<float>(), (std::vector<float>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
}

TEST(Elementwise, LargeTensorsUseTheParallelPath) {
  const int64_t n = 1 << 20;
  const Tensor a = arange(n, kF32), b = full({n}, 2.0);
  const Tensor c = a * b + 1;
  const auto v = c.to_vector<float>();
  for (int64_t i = 0; i < n; i += 4099) EXPECT_EQ(v[i], static_cast<float>(i) * 2 + 1);
  const Tensor strided = arange(2 * n, kF32).reshape({n, 2}).select(1, 1);
  const auto w = (strided - 1).to_vector<float>();
  for (int64_t i = 0; i < n; i += 4099) EXPECT_EQ(w[i], static_cast<float>(2 * i));
}

TEST(Elementwise, ComparisonsAndWhere) {
  const Tensor a = from_vector<float>({1, 2, 3});
  const Tensor b = from_vector<float>({3, 2, 1});
  EXPECT_EQ(eq(a, b).to_vector<bool>(), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(ne(a, b).to_vector<bool>(), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(lt(a, b).to_vector<bool>(), (std::vector<bool>{true, false, false}));
  EXPECT_EQ(le(a, b).to_vector<bool>(), (std::vector<bool>{true, true, false}));
  EXPECT_EQ(gt(a, 1.5).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(ge(a, 2).to_vector<bool>(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(eq(a, 2).dtype(), kBool);
  EXPECT_EQ(lt(from_vector<int32_t>({1, 5}), 2.5).to_vector<bool>(),
            (std::vector<bool>{true, false}));
  EXPECT_FALSE(eq(from_vector<float>({NAN}), from_vector<float>({NAN})).item<bool>());

  const Tensor cond = from_vector<bool>({true, false, true});
  EXPECT_EQ(where(cond, a, b).to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(where(lt(a, b), a, b).to_vector<float>(), (std::vector<float>{1, 2, 1}));
  EXPECT_EQ(where(cond, a, 0).to_vector<float>(), (std::vector<float>{1, 0, 3}));
  EXPECT_EQ(where(cond, -1, from_vector<int32_t>({7, 8, 9})).to_vector<int32_t>(),
            (std::vector<int32_t>{-1, 8, -1}));
  EXPECT_EQ(where(cond.unsqueeze(1), a, b).sizes(), (Shape{3, 3}));
  EXPECT_EQ(where(cond, from_vector<int32_t>({1, 2, 3}), b).dtype(), kF32);
  EXPECT_EMBER_ERROR(where(a, a, b), "where: condition must be a bool tensor, got f32");
  EXPECT_EMBER_ERROR(where(cond, a, zeros({2})), "where: shapes [3] and [2] cannot broadcast");
}

TEST(Elementwise, AllcloseAndEqual) {
  const Tensor a = from_vector<float>({1, 2, 3});
  EXPECT_TRUE(allclose(a, a + 1e-7));
  EXPECT_FALSE(allclose(a, a + 1e-3));
  EXPECT_TRUE(allclose(a, a + 1e-3, 0, 1e-2));
  EXPECT_FALSE(allclose(a, zeros({2})));
  EXPECT_FALSE(allclose(from_vector<float>({NAN}), from_vector<float>({NAN})));
  EXPECT_TRUE(allclose(from_vector<float>({INFINITY}), from_vector<float>({INFINITY})));
  EXPECT_TRUE(equal(a, a.to(kF64)));
  EXPECT_FALSE(equal(a, a + 1));
  EXPECT_FALSE(equal(a, a.unsqueeze(0)));
}

TEST(Elementwise, ZeroSizeTensors) {
  const Tensor e = zeros({0, 4});
  EXPECT_EQ((e + 1).sizes(), (Shape{0, 4}));
  EXPECT_EQ(exp(e).numel(), 0);
  EXPECT_EQ(where(zeros({0}, kBool), zeros({0}), zeros({0})).numel(), 0);
  Tensor f = empty({0});
  f.fill_(3).add_(1);
  EXPECT_EQ(f.numel(), 0);
  EXPECT_EQ(e.clone().numel(), 0);
  EXPECT_EQ(e.t().contiguous().sizes(), (Shape{4, 0}));
}

TEST(Elementwise, ErrorsNameOpAndValues) {
  EXPECT_EMBER_ERROR(
      add(ones({2}, kI32), ones({2}, kI32), 0.5),
      "add: for integral inputs, alpha must not be a floating point number (got 0.5)");
  EXPECT_EMBER_ERROR(add(Tensor(), ones({2})), "add: argument 'self' is an undefined tensor");
  if (!cuda::is_available()) {
    EXPECT_EMBER_ERROR(zeros({2}, cuda_device()), "cuda");
  }
}

}  // namespace
}  // namespace ember
