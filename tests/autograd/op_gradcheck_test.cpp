// Every differentiable tensor op against finite differences (f64): its gradient (gradcheck)
// and, through a create_graph backward, its gradient's gradient (gradgradcheck).
#include <functional>

#include "test_util.h"

namespace ember {
namespace {

using autograd::gradcheck;
using autograd::gradgradcheck;
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
  const auto second = gradgradcheck(f, inputs, options);
  EXPECT_TRUE(second.ok) << second.message;
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

TEST(OpGradcheck, Reductions) {
  const Tensor x = input({3, 4, 2}, 8);
  check("sum all", [](const auto& v) { return sum(v[0]); }, {x});
  check("sum dims", [](const auto& v) { return sum(v[0], {0, -1}); }, {x});
  check("sum keepdim", [](const auto& v) { return v[0].sum({1}, true) * v[0]; }, {x});
  check("mean", [](const auto& v) { return mean(v[0], {1}); }, {x});
  check("mean all", [](const auto& v) { return v[0].mean(); }, {x});
  check("max all", [](const auto& v) { return max(v[0]); }, {x});
  check("min all", [](const auto& v) { return min(v[0]); }, {x});
  check("max dim", [](const auto& v) { return std::get<0>(max(v[0], 1)); }, {x});
  check("min dim keepdim", [](const auto& v) { return std::get<0>(min(v[0], 0, true)); }, {x});
  check("var", [](const auto& v) { return var(v[0], {1}); }, {x});
  check("var all, no correction", [](const auto& v) { return var(v[0], {}, 0); }, {x});
  check("std", [](const auto& v) { return ember::std(v[0], {0, 2}, 1, true); }, {x});
  for (double p : {1.0, 2.0, 3.0, static_cast<double>(INFINITY)}) {
    check("norm", [p](const auto& v) { return norm(v[0], p, {2}); }, {x});
  }
  check("norm all", [](const auto& v) { return norm(v[0]); }, {x});
}

TEST(OpGradcheck, LinearAlgebra) {
  const Tensor a = input({3, 4}, 9), b = input({4, 5}, 10), bias = input({5}, 11);
  const Tensor ba = input({2, 3, 4}, 12), bb = input({2, 4, 2}, 13);
  check("mm", [](const auto& v) { return mm(v[0], v[1]); }, {a, b});
  check("mm transposed", [](const auto& v) { return mm(v[1].t(), v[0].t()); }, {a, b});
  check("bmm", [](const auto& v) { return bmm(v[0], v[1]); }, {ba, bb});
  check("addmm", [](const auto& v) { return addmm(v[2], v[0], v[1], 0.5, 2.0); }, {a, b, bias});
  check("matmul vector", [](const auto& v) { return matmul(v[0], v[1].select(1, 0)); }, {a, b});
  check("matmul broadcast", [](const auto& v) { return matmul(v[0], v[1]); }, {ba, b});
  check("matmul batched broadcast", [](const auto& v) { return matmul(v[0].unsqueeze(0), v[1]); },
        {input({3, 4}, 14), input({2, 4, 3}, 15)});
  check("linear", [](const auto& v) { return linear(v[0], v[1].t(), v[2]); }, {a, b, bias});
  check("linear 3-d", [](const auto& v) { return linear(v[0], v[1], Tensor()); },
        {ba, input({5, 4}, 16)});
}

TEST(OpGradcheck, SoftmaxAndIndexing) {
  const Tensor x = input({3, 5}, 17);
  const Tensor index = from_vector<int64_t>({4, 0, 2, 2});
  const Tensor gather_index = from_vector<int64_t>({0, 4, 1, 3, 2, 2}, {3, 2});
  check("softmax", [](const auto& v) { return softmax(v[0], 1); }, {x});
  check("softmax dim 0", [](const auto& v) { return softmax(v[0], 0); }, {x});
  check("log_softmax", [](const auto& v) { return log_softmax(v[0], -1); }, {x});
  check("cat",
        [](const auto& v) {
          return cat({v[0], v[1] * 2, v[0]}, 0);
        },
        {x, input({2, 5}, 18)});
  check("cat dim 1", [](const auto& v) { return cat({v[0], v[1]}, 1); }, {x, input({3, 2}, 19)});
  check("stack", [](const auto& v) { return stack({v[0], v[1]}, 1); }, {x, input({3, 5}, 20)});
  check("index_select", [index](const auto& v) { return index_select(v[0], 1, index); }, {x});
  check("index_select dim 0",
        [](const auto& v) {
          return index_select(v[0], 0, from_vector<int64_t>({2, 2, 0}));
        },
        {x});
  check("gather", [gather_index](const auto& v) { return gather(v[0], 1, gather_index); }, {x});
  check("scatter_add",
        [gather_index](const auto& v) { return scatter_add(v[0], 1, gather_index, v[1]); },
        {x, input({3, 2}, 21)});
  check("masked_fill", [](const auto& v) { return masked_fill(v[0], gt(v[0], 0.0), 3.0); }, {x});
}

TEST(OpGradcheck, LossesAndDropout) {
  const Tensor logits = input({4, 3}, 22), target = from_vector<int64_t>({2, 0, 1, 2});
  check("cross_entropy", [target](const auto& v) { return cross_entropy(v[0], target); }, {logits});
  check("cross_entropy smoothed, ignoring",
        [target](const auto& v) {
          return cross_entropy(
              v[0], target,
              {.ignore_index = 0, .reduction = Reduction::kSum, .label_smoothing = 0.2});
        },
        {logits});
  check("nll_loss", [target](const auto& v) { return nll_loss(log_softmax(v[0], 1), target); },
        {logits});
  check("mse_loss", [](const auto& v) { return mse_loss(v[0], v[1]); },
        {logits, input({4, 3}, 23)});
  // The same generator state each call gives the same mask.
  check("dropout",
        [](const auto& v) {
          Generator g(3);
          return dropout(v[0], 0.4, true, &g);
        },
        {logits});
}

}  // namespace
}  // namespace ember
