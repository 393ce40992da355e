// Every differentiable tensor op against finite differences (f64).
#include <functional>

#include "test_util.h"

namespace ember {
namespace {

using autograd::gradcheck;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// A leaf of the given shape with values in [lo, hi), away from kinks where asked.
Tensor input(const Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Generator g(seed);
  Tensor t = uniform(shape, lo, hi, kF64, &g);
  t.requires_grad_();
  return t;
}

void check(const char* name, const Fn& f, const std::vector<Tensor>& inputs,
           const autograd::GradcheckOptions& options = {}) {
  SCOPED_TRACE(name);
  const auto result = gradcheck(f, inputs, options);
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(OpGradcheck, BinaryElementwiseWithBroadcasting) {
  const Tensor a = input({3, 4}, 1), b = input({4}, 2), c = input({3, 1}, 3, 0.5, 2.0);
  check("add", [](const auto& v) { return add(v[0], v[1], 2.5); }, {a, b});
  check("sub", [](const auto& v) { return sub(v[0], v[1], 0.5); }, {a, c});
  check("mul", [](const auto& v) { return v[0] * v[1]; }, {a, b});
  check("div", [](const auto& v) { return v[0] / v[1]; }, {a, c});
  check("pow", [](const auto& v) { return pow(v[1], v[0]); }, {a, c});
  check("maximum", [](const auto& v) { return maximum(v[0], v[1]); }, {a, b});
  check("minimum", [](const auto& v) { return minimum(v[0], v[1]); }, {a, b});
  check("scalar ops", [](const auto& v) { return (2.0 - v[0]) * 3.0 / 4.0 + 1.0; }, {a});
  check("where", [](const auto& v) { return where(gt(v[0], 0), v[0], v[1]); }, {a, b});
}

TEST(OpGradcheck, UnaryElementwise) {
  const Tensor x = input({2, 5}, 4);
  const Tensor pos = input({2, 5}, 5, 0.5, 3.0);
  check("neg", [](const auto& v) { return neg(v[0]); }, {x});
  check("abs", [](const auto& v) { return abs(v[0]); }, {x});
  check("exp", [](const auto& v) { return exp(v[0]); }, {x});
  check("log", [](const auto& v) { return log(v[0]); }, {pos});
  check("sqrt", [](const auto& v) { return sqrt(v[0]); }, {pos});
  check("rsqrt", [](const auto& v) { return rsqrt(v[0]); }, {pos});
  check("relu", [](const auto& v) { return relu(v[0]); }, {x});
  check("sigmoid", [](const auto& v) { return sigmoid(v[0]); }, {x});
  check("tanh", [](const auto& v) { return tanh(v[0]); }, {x});
  check("pow scalar", [](const auto& v) { return pow(v[0], 3); }, {x});
  check("pow fractional", [](const auto& v) { return pow(v[0], 1.7); }, {pos});
  check("clamp", [](const auto& v) { return clamp(v[0], -1.0, 1.0); }, {x});
}

TEST(OpGradcheck, ViewsAndCopies) {
  const Tensor x = input({2, 3, 4}, 6);
  check("view", [](const auto& v) { return v[0].view({6, 4}) * 2; }, {x});
  check("reshape", [](const auto& v) { return v[0].transpose(0, 2).reshape({-1}); }, {x});
  check("permute",
        [](const auto& v) {
          return v[0].permute({2, 0, 1}) * v[0].permute({2, 0, 1});
        },
        {x});
  check("narrow", [](const auto& v) { return v[0].narrow(2, 1, 2); }, {x});
  check("slice", [](const auto& v) { return v[0].slice(1, 0, 3, 2); }, {x});
  check("select", [](const auto& v) { return v[0].select(1, -1); }, {x});
  check("expand", [](const auto& v) { return v[0].unsqueeze(0).expand({3, 2, 3, 4}); }, {x});
  check("squeeze", [](const auto& v) { return v[0].narrow(0, 0, 1).squeeze().unsqueeze(1); }, {x});
  check("flatten", [](const auto& v) { return v[0].flatten(1); }, {x});
  check("contiguous", [](const auto& v) { return v[0].t().contiguous(); }, {input({3, 2}, 7)});
  check("clone", [](const auto& v) { return v[0].clone() * v[0]; }, {x});
  // Through f32 the finite differences need a coarser step.
  check("cast", [](const auto& v) { return v[0].to(kF32).to(kF64); }, {x}, {1e-2, 1e-4, 1e-3, 0});
  check("masked_fill", [](const auto& v) { return masked_fill(v[0], gt(v[0], 0.5), 0.0); }, {x});
}

}  // namespace
}  // namespace ember
