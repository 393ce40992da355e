// Plain numbers mixed into tensor ops, by PyTorch's rule: the number takes part in the op's
// own dtype at full precision (f64 math sees 0.9, not 0.89999997615814209), and promotes only
// by category (an integer tensor times 2.5 is f32; an f32 tensor times a double stays f32).
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <ember/autograd/autograd.h>
#include <ember/tensor/ops.h>

#include "test_util.h"

namespace ember {
namespace {

// Values with no exact float32 form, so a scalar rounded through f32 shows in the result.
const std::vector<double> kValues = {0.1,    -1.7, 3.141592653589793, 1e-3, 123.456, -0.0,
                                     2.5e10, -7.25};
const std::vector<double> kScalars = {0.9, 0.1, 1e-8, 1.0 / 3.0, 0.999, -2.7, 1e-6};

Tensor f64(const std::vector<double>& values) { return from_vector(values); }

// Every element of t equals f(the matching value) exactly.
void expect_exact(const Tensor& t, const std::vector<double>& values,
                  const std::function<double(double)>& f, const std::string& what) {
  ASSERT_EQ(t.dtype(), kF64) << what;
  const auto got = t.to_vector<double>();
  ASSERT_EQ(got.size(), values.size()) << what;
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(got[i], f(values[i])) << what << " at " << values[i];
  }
}

TEST(Scalar, F64ArithmeticUsesTheExactScalar) {
  const Tensor x = f64(kValues);
  const Tensor y = f64({2.0, -0.3, 0.7, 5.5, -1e-4, 9.0, 0.125, 1.1});
  const auto yv = y.to_vector<double>();
  for (double s : kScalars) {
    const std::string at = std::to_string(s);
    expect_exact(
        mul(x, s), kValues, [s](double v) { return v * s; }, "mul " + at);
    expect_exact(
        x * s, kValues, [s](double v) { return v * s; }, "x * s " + at);
    expect_exact(
        s * x, kValues, [s](double v) { return s * v; }, "s * x " + at);
    expect_exact(
        div(x, s), kValues, [s](double v) { return v / s; }, "div " + at);
    expect_exact(
        s / x, kValues, [s](double v) { return s / v; }, "s / x " + at);
    expect_exact(
        add(x, s), kValues, [s](double v) { return v + s; }, "add " + at);
    expect_exact(
        s + x, kValues, [s](double v) { return s + v; }, "s + x " + at);
    expect_exact(
        sub(x, s), kValues, [s](double v) { return v - s; }, "sub " + at);
    expect_exact(
        s - x, kValues, [s](double v) { return s - v; }, "s - x " + at);
    // add's and sub's alpha.
    const Tensor a = add(x, y, s), b = sub(x, y, s);
    for (size_t i = 0; i < kValues.size(); ++i) {
      EXPECT_EQ(a.to_vector<double>()[i], kValues[i] + s * yv[i]) << "add alpha " << at;
      EXPECT_EQ(b.to_vector<double>()[i], kValues[i] - s * yv[i]) << "sub alpha " << at;
    }
    // In place, by method and by operator.
    Tensor m = x.clone();
    m.mul_(s);
    expect_exact(
        m, kValues, [s](double v) { return v * s; }, "mul_ " + at);
    m = x.clone();
    m *= s;
    expect_exact(
        m, kValues, [s](double v) { return v * s; }, "*= " + at);
    m = x.clone();
    m.div_(s);
    expect_exact(
        m, kValues, [s](double v) { return v / s; }, "div_ " + at);
    m = x.clone();
    m.add_(s);
    expect_exact(
        m, kValues, [s](double v) { return v + s; }, "add_ " + at);
    m = x.clone();
    m.sub_(s);
    expect_exact(
        m, kValues, [s](double v) { return v - s; }, "sub_ " + at);
    m = x.clone();
    m.add_(y, s);
    for (size_t i = 0; i < kValues.size(); ++i)
      EXPECT_EQ(m.to_vector<double>()[i], kValues[i] + s * yv[i]) << "add_ alpha " << at;
  }
}

TEST(Scalar, F64PowClampAndFactoriesUseTheExactScalar) {
  const std::vector<double> positive = {0.1, 1.7, 3.141592653589793, 1e-3, 123.456, 2.5e10};
  const Tensor x = f64(positive);
  for (double e : {0.3, 1.7, -0.7, 1.0 / 3.0}) {
    expect_exact(
        pow(x, e), positive, [e](double v) { return std::pow(v, e); }, "pow " + std::to_string(e));
    Tensor m = x.clone();
    m.pow_(e);
    expect_exact(
        m, positive, [e](double v) { return std::pow(v, e); }, "pow_ " + std::to_string(e));
  }
  // Values a float32 bound would misplace: just inside and just outside [0.1, 0.9].
  const std::vector<double> near = {0.1 - 1e-12, 0.1 + 1e-12, 0.9 - 1e-12, 0.9 + 1e-12};
  const auto clamped = [](double v) { return v < 0.1 ? 0.1 : v > 0.9 ? 0.9 : v; };
  expect_exact(clamp(f64(near), 0.1, 0.9), near, clamped, "clamp");
  Tensor c = f64(near);
  c.clamp_(0.1, 0.9);
  expect_exact(c, near, clamped, "clamp_");

  EXPECT_EQ(full({2}, 0.1, kF64).to_vector<double>(), (std::vector<double>{0.1, 0.1}));
  EXPECT_EQ(full_like(x, 0.9).to_vector<double>()[0], 0.9);
  EXPECT_EQ(scalar_tensor(0.1, kF64).item<double>(), 0.1);
  const Tensor mask = from_vector<bool>({true, false, true, false, false, true});
  EXPECT_EQ(masked_fill(x, mask, 0.1).to_vector<double>()[0], 0.1);
  Tensor filled = x.clone();
  filled.masked_fill_(mask, 0.9);
  EXPECT_EQ(filled.to_vector<double>()[2], 0.9);
  EXPECT_EQ(where(mask, x, 0.1).to_vector<double>()[1], 0.1);
  EXPECT_EQ(where(mask, 0.9, x).to_vector<double>()[0], 0.9);
  EXPECT_EQ(where(mask, x, 0.1).dtype(), kF64);
}

TEST(Scalar, F64ComparisonsUseTheExactScalar) {
  // 0.1 and its float32 rounding are different doubles.
  const double rounded = static_cast<double>(0.1f);
  const Tensor x = f64({0.1, rounded, 0.05});
  const auto bools = [](const Tensor& t) { return t.to(kI64).to_vector<int64_t>(); };
  EXPECT_EQ(bools(eq(x, 0.1)), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(bools(ne(x, 0.1)), (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(bools(gt(x, 0.1)), (std::vector<int64_t>{0, 1, 0}));  // 0.1f > 0.1
  EXPECT_EQ(bools(ge(x, 0.1)), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(bools(lt(x, 0.1)), (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(bools(le(x, 0.1)), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(bools(eq(x, rounded)), (std::vector<int64_t>{0, 1, 0}));
}

TEST(Scalar, F64LinearAlgebraScalesExactly) {
  const Tensor input = f64({1.0, 2.0, 3.0, 4.0}).reshape({2, 2});
  const Tensor a = f64({1.0, 0.0, 0.0, 1.0}).reshape({2, 2});
  // With a = I the product is b; beta * input + alpha * b, each rounded once.
  const Tensor b = f64({0.5, -1.5, 2.25, 8.0}).reshape({2, 2});
  const double beta = 0.1, alpha = 0.7;
  const auto got = addmm(input, a, b, beta, alpha).to_vector<double>();
  const auto iv = input.to_vector<double>(), bv = b.to_vector<double>();
  for (size_t i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(got[i], beta * iv[i] + alpha * bv[i]);
}

TEST(Scalar, F64GradientsUseTheExactScalar) {
  const std::vector<double> positive = {0.1, 1.7, 3.141592653589793, 123.456};
  const auto grad_of = [&](const std::function<Tensor(const Tensor&)>& f) {
    Tensor x = f64(positive);
    x.requires_grad_();
    f(x).sum().backward();
    return x.grad();
  };
  const Tensor eye = f64({1.0, 0.0, 0.0, 1.0}).reshape({2, 2});
  for (double s : {0.9, 0.1, 1.0 / 3.0}) {
    const std::string at = std::to_string(s);
    expect_exact(
        grad_of([s](const Tensor& x) { return mul(x, s); }), positive, [s](double) { return s; },
        "d(x * s) " + at);
    expect_exact(
        grad_of([s](const Tensor& x) { return s * x; }), positive, [s](double) { return s; },
        "d(s * x) " + at);
    expect_exact(
        grad_of([s](const Tensor& x) { return div(x, s); }), positive,
        [s](double) { return 1.0 / s; }, "d(x / s) " + at);
    expect_exact(
        grad_of([s](const Tensor& x) { return add(zeros_like(x), x, s); }), positive,
        [s](double) { return s; }, "d(0 + s x) " + at);
    expect_exact(
        grad_of([s](const Tensor& x) { return sub(zeros_like(x), x, s); }), positive,
        [s](double) { return -s; }, "d(0 - s x) " + at);
    expect_exact(
        grad_of([s](const Tensor& x) { return pow(x, s); }), positive,
        [s](double v) { return std::pow(v, s - 1.0) * s; }, "d(x ** s) " + at);
    // addmm's beta scales the input's gradient.
    expect_exact(
        grad_of([&](const Tensor& x) {
          return addmm(x.reshape({2, 2}), eye, eye, s, 1.0);
        }),
        positive, [s](double) { return s; }, "d addmm / d input " + at);
  }
}

TEST(Scalar, ResultDtypesFollowPyTorch) {
  const Tensor f32 = from_vector<float>({1.5f, -2.0f});
  const Tensor i64 = from_vector<int64_t>({1, 2, 3});
  const Tensor i32 = from_vector<int32_t>({2, 3});
  const Tensor u8 = from_vector<uint8_t>({1, 250});
  const Tensor b = from_vector<bool>({true, false});
  // A floating scalar never promotes a floating tensor, whatever its precision.
  EXPECT_EQ((f32 * 0.1).dtype(), kF32);
  EXPECT_EQ(mul(f32, 0.1).to_vector<float>(),
            (std::vector<float>{1.5f * 0.1f, -2.0f * 0.1f}));  // the scalar rounded to f32
  EXPECT_EQ((f64({1.0}) * 0.1).dtype(), kF64);
  EXPECT_EQ((from_vector<Half>({Half(1.0f)}) * 2.0).dtype(), kF16);
  EXPECT_EQ((from_vector<BFloat16>({BFloat16(1.0f)}) + 1).dtype(), kBF16);
  // Integer and bool tensors with a floating scalar give the default float dtype, f32.
  EXPECT_EQ((i64 * 2.5).dtype(), kF32);
  EXPECT_EQ((i64 * 2.5).to_vector<float>(), (std::vector<float>{2.5f, 5.0f, 7.5f}));
  EXPECT_EQ((i64 * 0.1).to_vector<float>()[2], 3.0f * 0.1f);  // 0.30000001192092896
  EXPECT_EQ((b * 2.5).dtype(), kF32);
  EXPECT_EQ((i64 / 2).dtype(), kF32);
  EXPECT_EQ(pow(i64, 2.5).dtype(), kF32);
  EXPECT_EQ(clamp(i64, 0.5, {}).dtype(), kF32);
  EXPECT_EQ(where(b, from_vector<int64_t>({1, 2}), 2.5).dtype(), kF32);
  EXPECT_EQ(result_type(i64, 2.5), kF32);
  EXPECT_EQ(eq(i64, 2.5).dtype(), kBool);
  // Integer scalars keep the tensor's integer dtype (and wrap as it does).
  EXPECT_EQ((i32 + 2).dtype(), kI32);
  EXPECT_EQ((u8 + 300).dtype(), kU8);
  EXPECT_EQ((u8 + 300).to_vector<uint8_t>()[0], 45);
  EXPECT_EQ(pow(i64, 2).dtype(), kI64);
  EXPECT_EQ(pow(i64, 2).to_vector<int64_t>(), (std::vector<int64_t>{1, 4, 9}));
  EXPECT_EQ((f64({1.5}) + 1).dtype(), kF64);
  // Bool tensors: a bool scalar keeps bool, an integer one gives i64.
  EXPECT_EQ((b + true).dtype(), kBool);
  EXPECT_EQ((b + 1).dtype(), kI64);
  // A 0-d tensor and a scalar: the tensor's dtype, unless the scalar's category is higher.
  EXPECT_EQ((scalar_tensor(2.0, kF64) * 0.1).dtype(), kF64);
  EXPECT_EQ((scalar_tensor(2.0, kF64) * 0.1).item<double>(), 2.0 * 0.1);
  EXPECT_EQ((scalar_tensor(2, kI64) * 0.5).dtype(), kF32);
  EXPECT_EQ((scalar_tensor(2, kI32) + 1).dtype(), kI32);
}

// The 16-bit floats as PyTorch computes them (its CPU kernels for x * s, x / s, x + s and
// pow): multiplication reads the scalar in float and division multiplies by its float
// reciprocal; addition, subtraction, comparisons and pow's exponent round it to the tensor's
// own dtype first. Each check also shows the other reading gives different answers here.
template <typename T>
void check_reduced_float(DType dtype) {
  std::vector<T> values;
  for (int i = -40; i <= 40; ++i) values.push_back(T(static_cast<float>(i) * 0.37f + 0.011f));
  for (float v : {0.1f, -0.1f, 0.2f, 0.05f, 0.3f}) values.push_back(T(v));  // near the scalars
  const Tensor x = from_vector(values);
  ASSERT_EQ(x.dtype(), dtype);
  const auto narrowed = [](double s) { return static_cast<float>(T(static_cast<float>(s))); };
  const auto check = [&](const Tensor& got, const std::function<float(float)>& expected,
                         const std::function<float(float)>& other, const std::string& what) {
    ASSERT_EQ(got.dtype(), dtype) << what;
    const auto g = got.to(kF32).to_vector<float>();
    bool differs = false;
    for (size_t i = 0; i < values.size(); ++i) {
      const float v = static_cast<float>(values[i]);
      EXPECT_EQ(g[i], static_cast<float>(T(expected(v)))) << what << " at " << v;
      if (static_cast<float>(T(other(v))) != static_cast<float>(T(expected(v)))) differs = true;
    }
    EXPECT_TRUE(differs) << what << ": no case tells the two readings of the scalar apart";
  };
  const double s = 0.3;
  const float sf = static_cast<float>(s), sn = narrowed(s);
  check(
      mul(x, s), [&](float v) { return v * sf; }, [&](float v) { return v * sn; }, "x * 0.3");
  check(
      s * x, [&](float v) { return v * sf; }, [&](float v) { return v * sn; }, "0.3 * x");
  Tensor m = x.clone();
  m.mul_(s);
  check(
      m, [&](float v) { return v * sf; }, [&](float v) { return v * sn; }, "x.mul_(0.3)");
  check(
      div(x, s), [&](float v) { return v * (1.0f / sf); }, [&](float v) { return v / sn; },
      "x / 0.3");
  m = x.clone();
  m.div_(s);
  check(
      m, [&](float v) { return v * (1.0f / sf); }, [&](float v) { return v / sn; }, "x.div_(0.3)");
  // A 0-d tensor as the second operand counts as the scalar too.
  check(
      mul(x, scalar_tensor(s, kF64)), [&](float v) { return v * sf; },
      [&](float v) { return v * sn; }, "x * tensor(0.3)");
  const double t = 0.1;  // not a 16-bit float in either format
  const float tf = static_cast<float>(t), tn = narrowed(t);
  check(
      add(x, t), [&](float v) { return v + tn; }, [&](float v) { return v + tf; }, "x + 0.1");
  check(
      sub(x, t), [&](float v) { return v - tn; }, [&](float v) { return v - tf; }, "x - 0.1");
  // Comparisons: the scalar rounded to the dtype equals the tensor holding that rounding.
  const Tensor held = from_vector<T>({T(static_cast<float>(t))});
  EXPECT_EQ(eq(held, t).to(kI64).item<int64_t>(), 1);
  EXPECT_EQ(lt(held, t).to(kI64).item<int64_t>(), 0);
  // pow's exponent in the tensor's precision.
  std::vector<T> positive;
  for (int i = 1; i <= 60; ++i) positive.push_back(T(static_cast<float>(i) * 0.73f));
  const Tensor p = from_vector(positive);
  const double e = 0.1;
  const auto pg = pow(p, e).to(kF32).to_vector<float>();
  bool differs = false;
  for (size_t i = 0; i < positive.size(); ++i) {
    const float v = static_cast<float>(positive[i]);
    EXPECT_EQ(pg[i], static_cast<float>(T(std::pow(v, narrowed(e))))) << "pow at " << v;
    if (static_cast<float>(T(std::pow(v, narrowed(e)))) !=
        static_cast<float>(T(std::pow(v, static_cast<float>(e)))))
      differs = true;
  }
  EXPECT_TRUE(differs) << "pow: no case tells the two exponents apart";
}

TEST(Scalar, Float16FollowsPyTorch) { check_reduced_float<Half>(kF16); }
TEST(Scalar, BFloat16FollowsPyTorch) { check_reduced_float<BFloat16>(kBF16); }

}  // namespace
}  // namespace ember
