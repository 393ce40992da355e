// The losses (layer_ops.h) and their modules (nn/loss.h) against PyTorch 1.13: forward and
// input gradient for every option in f32 and f64 (golden/loss_golden.json, written by
// golden/make_loss_golden.py), finite-difference gradients in f64, and the errors bad
// arguments raise.
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;
using testing::expect_close;

const json& golden() {
  static const json data = [] {
    std::ifstream in(EMBER_LOSS_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_LOSS_GOLDEN;
    return json::parse(in);
  }();
  return data;
}

DType dtype_named(const std::string& name) {
  if (name == "f32") return kF32;
  if (name == "f64") return kF64;
  if (name == "i64") return kI64;
  throw std::runtime_error("unknown dtype " + name);
}

// {"shape": [...], "values": [...]} as a tensor of `dtype`.
Tensor tensor_from(const json& j, DType dtype) {
  const Shape shape = j.at("shape").get<Shape>();
  if (dtype == kI64) {
    std::vector<int64_t> v;
    for (const double x : j.at("values").get<std::vector<double>>()) {
      v.push_back(static_cast<int64_t>(x));
    }
    return from_vector(v).reshape(shape);
  }
  // reshape: from_vector reads an empty shape as 1-d.
  return from_vector(j.at("values").get<std::vector<double>>()).reshape(shape).to(dtype);
}

Reduction reduction_named(const std::string& name) {
  if (name == "none") return Reduction::kNone;
  if (name == "sum") return Reduction::kSum;
  return Reduction::kMean;
}

// The loss a golden case describes, called as a user would: functional form with options.
Tensor run_case(const json& c, const Tensor& x, const Tensor& t, DType dtype) {
  const json& o = c.at("options");
  const std::string op = c.at("op");
  const Reduction reduction = reduction_named(o.at("reduction"));
  const Tensor weight = o.contains("weight") ? tensor_from(o.at("weight"), dtype) : Tensor();
  if (op == "cross_entropy") {
    return cross_entropy(x, t,
                         {.weight = weight,
                          .ignore_index = o.value("ignore_index", int64_t{-100}),
                          .reduction = reduction,
                          .label_smoothing = o.value("label_smoothing", 0.0)});
  }
  if (op == "nll_loss") {
    return nll_loss(x, t,
                    {.weight = weight,
                     .ignore_index = o.at("ignore_index").get<int64_t>(),
                     .reduction = reduction});
  }
  if (op == "mse_loss") return mse_loss(x, t, {.reduction = reduction});
  if (op == "l1_loss") return l1_loss(x, t, {.reduction = reduction});
  if (op == "smooth_l1_loss") {
    return smooth_l1_loss(x, t, {.reduction = reduction, .beta = o.at("beta").get<double>()});
  }
  if (op == "binary_cross_entropy_with_logits") {
    const Tensor pos_weight =
        o.contains("pos_weight") ? tensor_from(o.at("pos_weight"), dtype) : Tensor();
    return binary_cross_entropy_with_logits(
        x, t, {.weight = weight, .reduction = reduction, .pos_weight = pos_weight});
  }
  throw std::runtime_error("unknown op " + op);
}

void check_golden(const std::string& op_prefix) {
  int checked = 0;
  for (const json& c : golden().at("cases")) {
    const std::string op = c.at("op");
    if (op.rfind(op_prefix, 0) != 0) continue;
    SCOPED_TRACE(c.at("name").get<std::string>() + " " + c.at("dtype").get<std::string>());
    const DType dtype = dtype_named(c.at("dtype"));
    // f64 must agree with PyTorch to rounding; f32 ember accumulates some sums in double.
    const double rtol = dtype == kF64 ? 1e-12 : 2e-5, atol = dtype == kF64 ? 1e-14 : 2e-6;
    Tensor x = tensor_from(c.at("input"), dtype);
    x.requires_grad_();
    const Tensor t = tensor_from(c.at("target"), dtype_named(c.at("target").at("dtype")));
    const Tensor loss = run_case(c, x, t, dtype);
    expect_close(loss, tensor_from(c.at("loss"), dtype), rtol, atol);
    if (c.contains("grad_output")) {
      loss.backward(tensor_from(c.at("grad_output"), dtype));
    } else {
      loss.backward();
    }
    ASSERT_TRUE(x.grad().defined());
    expect_close(x.grad(), tensor_from(c.at("grad"), dtype), rtol, atol);
    ++checked;
  }
  EXPECT_GT(checked, 0) << "no golden cases for " << op_prefix;
}

TEST(LossGolden, CrossEntropy) { check_golden("cross_entropy"); }
TEST(LossGolden, NllLoss) { check_golden("nll_loss"); }
TEST(LossGolden, MseLoss) { check_golden("mse_loss"); }
TEST(LossGolden, L1Loss) { check_golden("l1_loss"); }
TEST(LossGolden, SmoothL1Loss) { check_golden("smooth_l1_loss"); }
TEST(LossGolden, BinaryCrossEntropyWithLogits) { check_golden("binary_cross_entropy_with_logits"); }

// ---------------------------------------------------------------------------------------
// Behaviour a PyTorch user relies on, beyond the golden cases.

Tensor leaf(const Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Generator g(seed);
  Tensor t = uniform(shape, lo, hi, kF64, &g);
  t.requires_grad_();
  return t;
}

TEST(Losses, ModulesTakeKeywordOptions) {
  const Tensor x = leaf({4, 3}, 1), t = from_vector<int64_t>({0, 2, 1, 2});
  const Tensor w = from_vector<double>({0.5, 1.0, 2.0});
  nn::CrossEntropyLoss smoothed({.label_smoothing = 0.05});
  expect_close(smoothed(x, t), cross_entropy(x, t, {.label_smoothing = 0.05}), 0, 0);
  nn::CrossEntropyLoss weighted({.weight = w, .reduction = Reduction::kSum});
  expect_close(weighted.forward(x, t),
               cross_entropy(x, t, {.weight = w, .reduction = Reduction::kSum}), 0, 0);
  EXPECT_EQ(weighted.options().reduction, Reduction::kSum);
  nn::NLLLoss nll({.ignore_index = 2});
  expect_close(nll(log_softmax(x, 1), t), cross_entropy(x, t, {.ignore_index = 2}), 1e-15, 0);
  const Tensor y = leaf({4, 3}, 2);
  expect_close(nn::MSELoss()(x, y), mean((x - y) * (x - y)), 1e-15, 0);
  expect_close(nn::L1Loss({.reduction = Reduction::kSum})(x, y), sum(abs(x - y)), 1e-15, 0);
  expect_close(nn::SmoothL1Loss({.beta = 0.0})(x, y), nn::L1Loss()(x, y), 0, 0);
  const Tensor p = from_vector<double>({1.0, 2.0, 3.0});
  const Tensor probs = sigmoid(y);
  nn::BCEWithLogitsLoss bce({.pos_weight = p});
  expect_close(bce(x, probs), binary_cross_entropy_with_logits(x, probs, {.pos_weight = p}), 0, 0);
}

TEST(Losses, WeightedMeanDividesBySummedTargetWeights) {
  // PyTorch: mean = sum(w[t] * nll) / sum(w[t]) over the targets not ignored.
  const Tensor x = from_vector<double>({1.0, 2.0, 0.5, -1.0, 0.0, 3.0}, {2, 3});
  const Tensor t = from_vector<int64_t>({2, 0});
  const Tensor w = from_vector<double>({0.25, 1.0, 3.0});
  const Tensor logp = log_softmax(x, 1);
  const double l0 = -logp.to_vector<double>()[2], l1 = -logp.to_vector<double>()[3];
  EXPECT_NEAR(cross_entropy(x, t, {.weight = w}).item<double>(),
              (3.0 * l0 + 0.25 * l1) / (3.0 + 0.25), 1e-15);
  EXPECT_NEAR(nll_loss(logp, t, {.weight = w, .reduction = Reduction::kSum}).item<double>(),
              3.0 * l0 + 0.25 * l1, 1e-15);
}

TEST(Losses, AllTargetsIgnoredGiveNaNMean) {
  const Tensor x = leaf({2, 3}, 3), t = from_vector<int64_t>({-100, -100});
  EXPECT_TRUE(std::isnan(cross_entropy(x, t).item<double>()));
  EXPECT_TRUE(std::isnan(cross_entropy(x, t, {.label_smoothing = 0.1}).item<double>()));
  EXPECT_EQ(cross_entropy(x, t, {.reduction = Reduction::kSum}).item<double>(), 0.0);
  EXPECT_TRUE(
      std::isnan(nll_loss(x, t, {.weight = from_vector<double>({1.0, 2.0, 3.0})}).item<double>()));
}

TEST(Losses, UnbatchedInputGivesZeroDimLoss) {
  const Tensor x = from_vector<double>({0.1, 2.0, -1.0}, {3});
  const Tensor t = scalar_tensor(1, kI64);
  const Tensor loss = cross_entropy(x, t, {.reduction = Reduction::kNone});
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_NEAR(loss.item<double>(), -log_softmax(x, 0).to_vector<double>()[1], 1e-15);
}

TEST(Losses, ProbabilityTargetsPromoteLikePyTorch) {
  // f32 logits with f64 probabilities: PyTorch computes the loss in f64.
  const Tensor x = leaf({3, 4}, 4).to(kF32).detach();
  const Tensor p = softmax(leaf({3, 4}, 5).detach(), 1);
  const Tensor loss = cross_entropy(x, p);
  EXPECT_EQ(loss.dtype(), kF64);
  EXPECT_NEAR(loss.item<double>(), -sum(log_softmax(x.to(kF64), 1) * p).item<double>() / 3.0, 1e-6);
  // Likewise the regression losses; the input's gradient keeps the input's dtype.
  Tensor y = x.clone();
  y.requires_grad_();
  const Tensor mse = mse_loss(y, p);
  EXPECT_EQ(mse.dtype(), kF64);
  mse.backward();
  EXPECT_EQ(y.grad().dtype(), kF32);
}

// Whether the backward graph of `loss` holds a node named `name`.
bool graph_has(const Tensor& loss, const std::string& name) {
  std::vector<std::shared_ptr<autograd::Node>> todo = {loss.grad_fn()};
  while (!todo.empty()) {
    const auto node = todo.back();
    todo.pop_back();
    if (!node) continue;
    if (node->name() == name) return true;
    for (const auto& edge : node->next_edges()) todo.push_back(edge.node);
  }
  return false;
}

TEST(Losses, ClassIndicesWithoutWeightsUseTheFusedKernel) {
  const Tensor x = leaf({2, 4, 3}, 9), t = from_vector<int64_t>({0, 3, 1, 2, 2, 3}, {2, 3});
  EXPECT_TRUE(graph_has(cross_entropy(x, t, {.label_smoothing = 0.1}), "CrossEntropyBackward"));
  EXPECT_TRUE(graph_has(cross_entropy(x.select(2, 0), t.select(1, 0)), "CrossEntropyBackward"));
  const Tensor w = from_vector<double>({1.0, 2.0, 3.0, 4.0});
  EXPECT_FALSE(graph_has(cross_entropy(x, t, {.weight = w}), "CrossEntropyBackward"));
}

// The fused kernel's gradient with and without create_graph: recorded ops then (PyTorch's
// log_softmax and nll_loss gradients), the fused kernel's values to rounding; unrecorded and
// from the kernel without. Second derivatives equal those of the composite path (a class
// weight of ones), for every option the fused kernel takes.
TEST(Losses, FusedCrossEntropyIsTwiceDifferentiable) {
  const Tensor t2 = from_vector<int64_t>({2, 0, 3, 1}, {4});
  const Tensor t4 = from_vector<int64_t>({0, 2, 1, -100, 2, 0, 1, 1}, {2, 2, 2});
  struct Case {
    const char* name;
    Shape shape;
    Tensor target;
    CrossEntropyOptions options;
  };
  const std::vector<Case> cases = {
      {"mean", {4, 4}, t2, {}},
      {"sum smoothed ignoring",
       {4, 4},
       t2,
       {.ignore_index = 3, .reduction = Reduction::kSum, .label_smoothing = 0.2}},
      {"none [N, C, d1, d2]",
       {2, 3, 2, 2},
       t4,
       {.reduction = Reduction::kNone, .label_smoothing = 0.1}},
      {"mean [N, C, d1, d2] ignoring -100", {2, 3, 2, 2}, t4, {}},
      {"unbatched", {4}, from_vector<int64_t>({1}).view({}), {.label_smoothing = 0.3}},
  };
  uint64_t seed = 30;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor values = leaf(c.shape, seed++).detach();
    // sum(loss * w) with a random w, so a per-sample loss gets an output gradient of its own.
    const Tensor w = leaf(c.target.sizes(), seed++).detach();
    CrossEntropyOptions composite = c.options;
    composite.weight = ones({c.shape[c.shape.size() == 1 ? 0 : 1]}, kF64);
    const auto weighted = [&](const Tensor& x, const CrossEntropyOptions& o) {
      const Tensor loss = cross_entropy(x, c.target, o);
      return sum(loss * (o.reduction == Reduction::kNone ? w : ones({}, kF64)));
    };
    const Tensor fused = values.clone().requires_grad_(), plain = values.clone().requires_grad_(),
                 reference = values.clone().requires_grad_();
    ASSERT_TRUE(graph_has(weighted(fused, c.options), "CrossEntropyBackward"));
    weighted(fused, c.options).backward({}, false, true);
    weighted(plain, c.options).backward();
    weighted(reference, composite).backward({}, false, true);
    EXPECT_FALSE(plain.grad().requires_grad());
    const Tensor first = fused.grad(), reference_first = reference.grad();
    ASSERT_TRUE(first.requires_grad());
    expect_close(first.detach(), plain.grad(), 1e-14, 1e-16);
    expect_close(first.detach(), reference_first.detach(), 1e-14, 1e-16);
    const Tensor v = leaf(c.shape, seed++).detach();
    fused.set_grad(Tensor());
    reference.set_grad(Tensor());
    sum(first * v).backward();
    sum(reference_first * v).backward();
    expect_close(fused.grad(), reference.grad(), 1e-13, 1e-15);
  }
}

// PyTorch 1.13's second derivatives of cross_entropy (f64): with gx = autograd.grad(loss, x,
// grad_output, create_graph=True), (gx * u).sum().backward() gives x.grad (and grad_output's).
TEST(LossGolden, CrossEntropyDoubleBackward) {
  const Tensor logits =
      from_vector<double>({0.3,  -1.2, 2.0, 0.5,  -0.4, 1.1, 0.0, -0.7, 0.9, 0.2,
                           -2.0, 1.5,  0.3, -0.1, 0.8,  0.6, 0.6, -1.3, 2.2, -0.9},
                          {4, 5});
  const Tensor target = from_vector<int64_t>({2, 1, 4, 0});
  const Tensor u = from_vector<double>({0.5,  -1.0, 0.25, 1.5,  -0.75, 1.0, 2.0,  -0.5, 0.0, 0.3,
                                        -1.2, 0.4,  0.9,  -0.3, 1.1,   0.7, -0.6, 0.2,  1.3, -1.5},
                                       {4, 5});
  for (DType dtype : {kF64, kF32}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const double rtol = dtype == kF64 ? 1e-12 : 2e-5, atol = dtype == kF64 ? 1e-15 : 2e-6;
    const auto expect = [&](const Tensor& actual, const std::vector<double>& values) {
      expect_close(actual, from_vector(values).view(actual.sizes()).to(dtype), rtol, atol);
    };
    {  // F.cross_entropy(x, target, ignore_index=1, label_smoothing=0.1)
      const Tensor x = logits.to(dtype).clone().requires_grad_();
      cross_entropy(x, target, {.ignore_index = 1, .label_smoothing = 0.1})
          .backward({}, false, true);
      const Tensor gx = x.grad();
      x.set_grad(Tensor());
      sum(gx * u.to(dtype)).backward();
      expect(gx.detach(), {0.032944828790435525,
                           0.002171852658395342,
                           -0.0898354244268483,
                           0.04171492313948698,
                           0.01300381983853046,
                           0.0,
                           0.0,
                           0.0,
                           0.0,
                           0.0,
                           -0.0017078380080872155,
                           0.1575471855479079,
                           0.04279359513616894,
                           0.026487538301944866,
                           -0.22512048097793452,
                           -0.26116495167581827,
                           0.0388350483241817,
                           0.00013896201677639965,
                           0.21870480304859055,
                           0.0034861382862695412});
      expect(x.grad(), {0.00518975250782722,
                        -0.01209978867939081,
                        -0.02579937835602408,
                        0.05472036783338247,
                        -0.0220109533057948,
                        0.0,
                        0.0,
                        0.0,
                        0.0,
                        0.0,
                        -0.008687923223032277,
                        -0.024962340569813488,
                        0.017211618406008843,
                        -0.02824775312007014,
                        0.04468639850690704,
                        -0.00687053151458718,
                        -0.06602276100269006,
                        -0.0044304302536839375,
                        0.10119291646457555,
                        -0.02386919369361433});
    }
    {  // F.cross_entropy(x, target, reduction="none", label_smoothing=0.2), grad_output g
      const Tensor x = logits.to(dtype).clone().requires_grad_();
      const Tensor g = from_vector<double>({0.5, -2.0, 1.5, 0.75}).to(dtype).requires_grad_();
      autograd::backward(
          {cross_entropy(x, target, {.reduction = Reduction::kNone, .label_smoothing = 0.2})}, {g},
          false, true);
      const Tensor gx = x.grad();
      x.set_grad(Tensor());
      sum(gx * u.to(dtype)).backward();
      expect(x.grad(), {0.007784628761740832,  -0.018149683019086215, -0.03869906753403612,
                        0.08208055175007371,   -0.0330164299586922,   -0.27460342926898895,
                        -0.33585380755991595,  0.13669099368496637,   0.37641452508188566,
                        0.09735171806205276,   -0.039095654503645265, -0.11233053256416078,
                        0.0774522828270398,    -0.1271148890403157,   0.2010887932810818,
                        -0.015458695907821176, -0.1485512122560527,   -0.009968468070788866,
                        0.22768406204529512,   -0.053705685810632266});
      expect(g.grad(),
             {0.14898367638132887, -1.0859371535808278, -0.36398882534467464, 0.2869950013086109});
    }
  }
}

TEST(Losses, BCEWithLogitsStaysFiniteForLargeLogits) {
  const Tensor x = from_vector<double>({800.0, -800.0, 0.0}, {3});
  const Tensor y = from_vector<double>({0.0, 1.0, 0.5});
  expect_close(binary_cross_entropy_with_logits(x, y, {.reduction = Reduction::kNone}),
               from_vector<double>({800.0, 800.0, std::log(2.0)}, {3}), 1e-15, 0);
}

TEST(Losses, CudaMatchesCpu) {
  EMBER_REQUIRE_CUDA();
  const Tensor x = leaf({2, 4, 3}, 6), t = from_vector<int64_t>({0, 3, 1, -100, 2, 3}, {2, 3});
  const Tensor w = from_vector<double>({0.5, 1.0, 2.0, 0.25});
  const Tensor probs = softmax(leaf({2, 4, 3}, 7).detach(), 1);
  const Tensor y = leaf({2, 4, 3}, 8).detach();
  using Fn = std::function<Tensor(const Tensor&, bool)>;
  const std::vector<std::pair<const char*, Fn>> losses = {
      {"ce fused",
       [&](const Tensor& v, bool g) {
         return cross_entropy(v, g ? t.cuda() : t, {.label_smoothing = 0.1});
       }},
      {"ce weighted",
       [&](const Tensor& v, bool g) {
         return cross_entropy(v, g ? t.cuda() : t,
                              {.weight = g ? w.cuda() : w, .label_smoothing = 0.1});
       }},
      {"ce probs",
       [&](const Tensor& v, bool g) {
         return cross_entropy(v, g ? probs.cuda() : probs, {.weight = g ? w.cuda() : w});
       }},
      {"smooth_l1",
       [&](const Tensor& v, bool g) { return smooth_l1_loss(v, g ? y.cuda() : y, {.beta = 0.5}); }},
      {"bce",
       [&](const Tensor& v, bool g) {
         return binary_cross_entropy_with_logits(v, g ? sigmoid(y).cuda() : sigmoid(y));
       }},
  };
  for (const auto& [name, fn] : losses) {
    SCOPED_TRACE(name);
    Tensor xc = x.detach().clone().requires_grad_();
    Tensor xg = x.detach().cuda().requires_grad_();
    const Tensor lc = fn(xc, false), lg = fn(xg, true);
    expect_close(lg.cpu(), lc, 1e-12, 1e-14);
    lc.backward();
    lg.backward();
    expect_close(xg.grad().cpu(), xc.grad(), 1e-12, 1e-14);
    // Second derivatives: the gradient taken with create_graph, then its own gradient.
    const Tensor v = leaf({2, 4, 3}, 9).detach();
    std::vector<Tensor> second;
    for (const bool on_cuda : {false, true}) {
      const Tensor xd = (on_cuda ? x.detach().cuda() : x.detach().clone()).requires_grad_();
      fn(xd, on_cuda).backward({}, false, true);
      const Tensor first = xd.grad();
      xd.set_grad(Tensor());
      sum(first * (on_cuda ? v.cuda() : v)).backward();
      second.push_back(xd.grad().cpu());
    }
    expect_close(second[1], second[0], 1e-12, 1e-14);
  }
}

// ---------------------------------------------------------------------------------------
// Finite differences (f64).

// The gradient (gradcheck) and, through a create_graph backward, its gradient (gradgradcheck).
void check_grad(const char* name, const std::function<Tensor(const std::vector<Tensor>&)>& f,
                const std::vector<Tensor>& inputs) {
  SCOPED_TRACE(name);
  const auto result = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(result.ok) << result.message;
  const auto second = autograd::gradgradcheck(f, inputs);
  EXPECT_TRUE(second.ok) << second.message;
}

TEST(LossGradcheck, EveryLoss) {
  const Tensor t2 = from_vector<int64_t>({2, 0, 3, 1}, {4});
  const Tensor t4 = from_vector<int64_t>({0, 2, 1, -100, 2, 0, 1, 1}, {2, 2, 2});
  const Tensor w = from_vector<double>({0.5, 1.5, 2.0, 0.75});
  const Tensor w3 = from_vector<double>({0.5, 1.5, 2.0});
  check_grad("cross_entropy weighted smoothed",
             [&](const auto& v) {
               return cross_entropy(v[0], t2,
                                    {.weight = w, .ignore_index = 3, .label_smoothing = 0.2});
             },
             {leaf({4, 4}, 10)});
  check_grad("cross_entropy [N, C, d1, d2]",
             [&](const auto& v) { return cross_entropy(v[0], t4, {.label_smoothing = 0.1}); },
             {leaf({2, 3, 2, 2}, 11)});
  check_grad("cross_entropy [N, C, d1, d2] weighted none",
             [&](const auto& v) {
               return cross_entropy(v[0], t4, {.weight = w3, .reduction = Reduction::kNone});
             },
             {leaf({2, 3, 2, 2}, 12)});
  check_grad("cross_entropy probabilities",
             [&](const auto& v) {
               return cross_entropy(v[0], softmax(v[1], 1), {.weight = w, .label_smoothing = 0.1});
             },
             {leaf({3, 4}, 13), leaf({3, 4}, 14)});
  check_grad("nll_loss weighted [N, C, d1, d2]",
             [&](const auto& v) { return nll_loss(v[0], t4, {.weight = w3}); },
             {leaf({2, 3, 2, 2}, 15)});
  // Away from the kinks of |x - y| and of smooth_l1's branch change at beta.
  const Tensor a = from_vector<double>({-2.0, -0.7, -0.2, 0.3, 0.9, 2.5}, {2, 3});
  const Tensor b = from_vector<double>({0.1, 0.4, 0.15, -0.6, 0.2, 0.0}, {2, 3});
  check_grad("l1_loss", [&](const auto& v) { return l1_loss(v[0], v[1]); },
             {a.clone().requires_grad_(), b.clone().requires_grad_()});
  check_grad("smooth_l1_loss",
             [&](const auto& v) {
               return smooth_l1_loss(v[0], v[1], {.reduction = Reduction::kSum, .beta = 0.5});
             },
             {a.clone().requires_grad_(), b.clone().requires_grad_()});
  check_grad("mse_loss",
             [&](const auto& v) { return mse_loss(v[0], v[1], {.reduction = Reduction::kNone}); },
             {leaf({2, 3}, 16), leaf({2, 3}, 17)});
  check_grad("binary_cross_entropy_with_logits",
             [&](const auto& v) {
               return binary_cross_entropy_with_logits(
                   v[0], v[1],
                   {.weight = from_vector<double>({0.5, 2.0, 1.0}), .pos_weight = v[2]});
             },
             {leaf({4, 3}, 18, -5.0, 5.0), leaf({4, 3}, 19, 0.0, 1.0), leaf({3}, 20, 0.5, 3.0)});
}

// ---------------------------------------------------------------------------------------
// Errors.

TEST(LossErrors, NameTheOpAndTheValues) {
  const Tensor x = leaf({4, 3}, 30).detach();
  const Tensor t = from_vector<int64_t>({0, 2, 1, 2});
  EXPECT_EMBER_ERROR(cross_entropy(x, from_vector<int64_t>({0, 5, 1, 2})),
                     "cross_entropy: target 5 is out of range for 3 classes");
  EXPECT_EMBER_ERROR(cross_entropy(x, from_vector<int64_t>({0, -1, 1, 2})),
                     "target -1 is out of range");
  EXPECT_EMBER_ERROR(nll_loss(x, from_vector<int64_t>({0, 3, 1, 2})),
                     "nll_loss: target 3 is out of range for 3 classes");
  EXPECT_EMBER_ERROR(cross_entropy(x, t, {.weight = from_vector<double>({1.0, 2.0})}),
                     "cross_entropy: weight of shape [2] does not match the 3 classes");
  EXPECT_EMBER_ERROR(cross_entropy(x, t, {.weight = from_vector<float>({1.0f, 2.0f, 3.0f})}),
                     "weight has dtype f32 but input has f64");
  EXPECT_EMBER_ERROR(cross_entropy(x, from_vector<int64_t>({0, 2, 1})),
                     "target of shape [3] does not match input of shape [4, 3]");
  EXPECT_EMBER_ERROR(cross_entropy(leaf({2, 3, 5}, 31), zeros({2, 4}, kI64)),
                     "expected class indices of shape [2, 5]");
  EXPECT_EMBER_ERROR(cross_entropy(x, t.to(kI32)), "class-index target must be i64, got i32");
  EXPECT_EMBER_ERROR(cross_entropy(x, zeros({4, 3}, kI64)),
                     "class-probability target (shaped like the input) must be floating");
  EXPECT_EMBER_ERROR(cross_entropy(x, softmax(x, 1), {.ignore_index = 1}),
                     "ignore_index is not supported with class-probability targets");
  EXPECT_EMBER_ERROR(cross_entropy(x, t, {.label_smoothing = 1.5}),
                     "label_smoothing must be in [0, 1], got 1.5");
  EXPECT_EMBER_ERROR(cross_entropy(zeros({4, 3}, kI64), t), "expected a floating input");
  EXPECT_EMBER_ERROR(cross_entropy(scalar_tensor(1.0), scalar_tensor(0, kI64)), "0-dim");
  EXPECT_EMBER_ERROR(mse_loss(x, zeros({3, 4}, kF64)),
                     "mse_loss: input of shape [4, 3] and target of shape [3, 4] differ");
  EXPECT_EMBER_ERROR(l1_loss(x, zeros({4}, kF64)), "l1_loss: input of shape [4, 3]");
  EXPECT_EMBER_ERROR(smooth_l1_loss(x, x, {.beta = -1.0}),
                     "smooth_l1_loss: beta must be >= 0, got -1");
  EXPECT_EMBER_ERROR(binary_cross_entropy_with_logits(x, zeros({4, 3}, kI64)),
                     "binary_cross_entropy_with_logits: target must be floating, got i64");
  EXPECT_EMBER_ERROR(
      binary_cross_entropy_with_logits(x, x, {.pos_weight = from_vector<double>({1.0, 2.0})}),
      "pos_weight of shape [2] does not broadcast to input of shape [4, 3]");
  EXPECT_EMBER_ERROR(binary_cross_entropy_with_logits(x, x, {.weight = zeros({2, 4, 3}, kF64)}),
                     "weight of shape [2, 4, 3] does not broadcast to input of shape [4, 3]");
}

}  // namespace
}  // namespace ember
