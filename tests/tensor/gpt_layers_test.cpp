// The GPT layer ops (layer_ops.h): gelu (exact and tanh), layer_norm, embedding and silu against
// PyTorch 1.13 (golden/gpt_layers_golden.json, written by golden/make_gpt_layers_golden.py),
// finite-difference gradients in f64, bf16 and autocast behaviour, the errors bad arguments
// raise, and dropout's reproducibility rule.
#include <cmath>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ember/tensor/detail/kernel_table.h>
#include <ember/tensor/detail/layer_backward.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;
using testing::expect_close;

const json& golden_cases() {
  static const json data = [] {
    std::ifstream in(EMBER_GPT_LAYERS_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_GPT_LAYERS_GOLDEN;
    return json::parse(in);
  }();
  return data.at("cases");
}

DType golden_dtype(const std::string& name) {
  return name == "f64" ? kF64 : name == "bf16" ? kBF16 : kF32;
}

// A golden {"shape", "values"} entry as a tensor of `dtype` (the values are exact in it).
Tensor golden_tensor(const json& entry, DType dtype) {
  const Shape shape = entry.at("shape").get<Shape>();
  const auto values = entry.at("values").get<std::vector<double>>();
  if (dtype == kI64)
    return from_vector(std::vector<int64_t>(values.begin(), values.end())).view(shape);
  return from_vector(values).view(shape).to(dtype);
}

Tensor golden_leaf(const json& c, const char* name, DType dtype) {
  if (!c.contains(name)) return {};
  Tensor t = golden_tensor(c.at(name), dtype);
  t.requires_grad_();
  return t;
}

// Forward output and gradients within these bounds of PyTorch's.
struct Bounds {
  double rtol, atol;
};
Bounds golden_bounds(DType dtype) {
  if (dtype == kF64) return {1e-10, 1e-12};
  if (dtype == kBF16) return {1.6e-2, 1.6e-2};  // two bf16 ulps: float math rounded once
  return {2e-5, 2e-6};
}

void expect_golden(const Tensor& actual, const json& c, const char* name, DType dtype) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(actual.defined());
  const Bounds b = golden_bounds(dtype);
  expect_close(actual, golden_tensor(c.at(name), dtype), b.rtol, b.atol);
}

int count_cases(const char* op) {
  int n = 0;
  for (const json& c : golden_cases()) n += c.at("op") == op;
  return n;
}

TEST(GptLayersGolden, GeluMatchesPyTorch) {
  ASSERT_GT(count_cases("gelu"), 0);
  for (const json& c : golden_cases()) {
    if (c.at("op") != "gelu") continue;
    const DType dtype = golden_dtype(c.at("dtype"));
    const bool tanh_form = c.at("approximate") == "tanh";
    SCOPED_TRACE(::testing::Message() << c.at("dtype") << " " << c.at("approximate") << " "
                                      << c.at("input").at("shape"));
    const Tensor x = golden_leaf(c, "input", dtype);
    const Tensor y = gelu(x, tanh_form ? GeluApproximate::kTanh : GeluApproximate::kNone);
    y.backward(golden_tensor(c.at("grad_output"), dtype));
    expect_golden(y, c, "output", dtype);
    expect_golden(x.grad(), c, "grad_input", dtype);
  }
}

TEST(GptLayersGolden, SiluMatchesPyTorch) {
  ASSERT_GT(count_cases("silu"), 0);
  for (const json& c : golden_cases()) {
    if (c.at("op") != "silu") continue;
    const DType dtype = golden_dtype(c.at("dtype"));
    SCOPED_TRACE(::testing::Message() << c.at("dtype") << " " << c.at("input").at("shape"));
    const Tensor x = golden_leaf(c, "input", dtype);
    const Tensor y = silu(x);
    EXPECT_EQ(y.grad_fn()->name(), "SiluBackward");
    y.backward(golden_tensor(c.at("grad_output"), dtype));
    expect_golden(y, c, "output", dtype);
    expect_golden(x.grad(), c, "grad_input", dtype);
  }
}

TEST(GptLayersGolden, LayerNormMatchesPyTorch) {
  ASSERT_GT(count_cases("layer_norm"), 0);
  for (const json& c : golden_cases()) {
    if (c.at("op") != "layer_norm") continue;
    const DType dtype = golden_dtype(c.at("dtype"));
    const Shape normalized = c.at("normalized_shape").get<Shape>();
    SCOPED_TRACE(::testing::Message()
                 << c.at("dtype") << " input " << c.at("input").at("shape") << " normalized "
                 << shape_str(normalized) << " eps " << c.at("eps") << " weight "
                 << c.contains("weight") << " bias " << c.contains("bias"));
    const Tensor x = golden_leaf(c, "input", dtype), w = golden_leaf(c, "weight", dtype),
                 b = golden_leaf(c, "bias", dtype);
    const Tensor y = layer_norm(x, normalized, w, b, c.at("eps").get<double>());
    y.backward(golden_tensor(c.at("grad_output"), dtype));
    expect_golden(y, c, "output", dtype);
    expect_golden(x.grad(), c, "grad_input", dtype);
    if (w.defined()) expect_golden(w.grad(), c, "grad_weight", dtype);
    if (b.defined()) expect_golden(b.grad(), c, "grad_bias", dtype);
  }
}

TEST(GptLayersGolden, EmbeddingMatchesPyTorch) {
  ASSERT_GT(count_cases("embedding"), 0);
  for (const json& c : golden_cases()) {
    if (c.at("op") != "embedding") continue;
    const DType dtype = golden_dtype(c.at("dtype"));
    std::optional<int64_t> padding;
    if (!c.at("padding_idx").is_null()) padding = c.at("padding_idx").get<int64_t>();
    SCOPED_TRACE(::testing::Message() << c.at("dtype") << " indices " << c.at("indices").at("shape")
                                      << " padding_idx " << c.at("padding_idx"));
    const Tensor indices = golden_tensor(c.at("indices"), kI64);
    const Tensor w = golden_leaf(c, "weight", dtype);
    const Tensor y = embedding(indices, w, padding);
    y.backward(golden_tensor(c.at("grad_output"), dtype));
    expect_golden(y, c, "output", dtype);
    expect_golden(w.grad(), c, "grad_weight", dtype);
  }
}

// ---------------------------------------------------------------------------------------
// Finite differences (f64).

Tensor leaf(const Shape& shape, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Generator g(seed);
  Tensor t = uniform(shape, lo, hi, kF64, &g);
  t.requires_grad_();
  return t;
}

void expect_gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                      const std::vector<Tensor>& inputs) {
  const auto result = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(result.ok) << result.message;
}
void expect_gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs) {
  const auto result = autograd::gradgradcheck(f, inputs);
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(GptLayersGradcheck, GeluExactAndTanh) {
  const Tensor x = leaf({4, 5}, 1, -4.0, 4.0);
  for (GeluApproximate form : {GeluApproximate::kNone, GeluApproximate::kTanh}) {
    SCOPED_TRACE(form == GeluApproximate::kTanh ? "tanh" : "exact");
    expect_gradcheck([form](const auto& v) { return gelu(v[0], form); }, {x});
    expect_gradgradcheck([form](const auto& v) { return gelu(v[0], form); }, {x});
  }
}

// x's gradient of sum(f(x) * u) taken with create_graph, as a function of x and u (the
// function gradgradcheck checks); x's grad is left as it was.
Tensor first_gradient(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                      const Tensor& u) {
  const Tensor held = x.grad();
  x.set_grad(Tensor());
  autograd::backward({f(x)}, {u}, false, true);
  const Tensor g = x.grad();
  x.set_grad(held);
  return g;
}

// gelu_backward's own gradient is recorded too: gelu's third derivatives.
TEST(GptLayersGradcheck, GeluIsThreeTimesDifferentiable) {
  const Tensor x = leaf({3, 4}, 5, -3.0, 3.0), u = leaf({3, 4}, 6);
  for (GeluApproximate form : {GeluApproximate::kNone, GeluApproximate::kTanh}) {
    SCOPED_TRACE(form == GeluApproximate::kTanh ? "tanh" : "exact");
    expect_gradgradcheck(
        [form](const auto& v) {
          return first_gradient([form](const Tensor& t) { return gelu(t, form); }, v[0], v[1]);
        },
        {x, u});
  }
}

// gelu's and embedding's second derivatives on CUDA (recorded ops there too) equal the CPU's.
TEST(GptLayersGradcheck, SecondDerivativesOnCudaMatchTheCpu) {
  EMBER_REQUIRE_CUDA();
  const Tensor indices = from_vector<int64_t>({2, 0, 2, 1, 3});
  using Layer = std::function<Tensor(const Tensor&, const Tensor&)>;  // (input, indices)
  const std::vector<std::pair<const char*, Layer>> layers = {
      {"gelu", [](const Tensor& x, const Tensor&) { return gelu(x); }},
      {"gelu tanh", [](const Tensor& x, const Tensor&) { return gelu(x, GeluApproximate::kTanh); }},
      {"embedding", [](const Tensor& w, const Tensor& i) { return embedding(i, w, 1); }},
  };
  for (const auto& [name, layer] : layers) {
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message() << name << " " << dtype);
      const double tol = dtype == kF64 ? 1e-12 : 1e-5;
      const Tensor x = leaf({4, 3}, 17, -4.0, 4.0).detach().to(dtype);
      const Tensor out = layer(x, indices);
      const Tensor u = leaf(out.sizes(), 18).detach().to(dtype);
      const Tensor v = leaf(x.sizes(), 19).detach().to(dtype);
      std::vector<Tensor> grads;
      for (Device device : {kCPU, cuda_device()}) {
        const Tensor xd = x.to(device).requires_grad_(), ud = u.to(device).requires_grad_();
        const Tensor first =
            first_gradient([&](const Tensor& t) { return layer(t, indices.to(device)); }, xd, ud);
        autograd::backward({first}, {v.to(device)});
        grads.push_back(first.detach().cpu());
        grads.push_back(xd.grad().defined() ? xd.grad().cpu() : zeros_like(x));
        grads.push_back(ud.grad().cpu());
      }
      for (size_t i = 0; i < 3; ++i) expect_close(grads[i + 3], grads[i], tol, tol);
    }
  }
}

// PyTorch 1.13's second derivatives of gelu (f64): with gx = autograd.grad(gelu(x), x, g,
// create_graph=True), (gx * v).sum().backward() gives x.grad and g.grad. f32 follows them to
// its own rounding (PyTorch's f32 tanh form loses the digits of gx and d2g at -6).
TEST(GptLayersGolden, GeluDoubleBackwardMatchesPyTorch) {
  const std::vector<double> x = {-6.0, -2.5, -1.0, -0.25, 0.0, 0.5, 1.5, 3.0, 7.0};
  const std::vector<double> g = {0.5, -1.0, 2.0, 0.75, -0.5, 1.25, -2.0, 1.0, 0.3};
  const std::vector<double> v = {1.0, 0.5, -0.25, 2.0, 1.5, -1.0, 0.75, -0.5, 2.0};
  struct Expected {
    GeluApproximate form;
    std::vector<double> gx, d2x, d2g;
  };
  const std::vector<Expected> expected = {
      {GeluApproximate::kNone,
       {-1.7734354727013195e-08, 0.03761108590814519, -0.1666309411753727, 0.22846998383727302,
        -0.25, 1.0843689058202035, -2.254938384459959, 1.011945647204184, 0.30000000001879895},
       {-1.0329000844699587e-07, 0.037247638548833145, -0.12098536225957168, 1.1237542144582806,
        -0.5984134206021491, -0.7701429022969052, 0.048569098374709435, 0.015511469441783027,
        -2.5759911551588154e-10},
       {-3.546870945402639e-08, -0.018805542954072597, 0.020828867646921587, 0.609253290232728,
        0.75, -0.8674951246561629, 0.8456018941724847, -0.505972823602092, 2.0000000001253264}},
      {GeluApproximate::kTanh,
       {-3.8549880064181646e-10, 0.03795157621266618, -0.16592816769156515, 0.22848442863670465,
        -0.25, 1.084212379418303, -2.255421586302866, 1.0115841666309695, 0.3000000000000083},
       {-3.4121235724741154e-09, 0.03812269603680647, -0.12107409899188651, 1.1234229213354756,
        -0.5984134206021491, -0.7693836188949812, 0.04577729472633729, 0.01588382944303746,
        -1.938734859489514e-13},
       {-7.709976012836329e-10, -0.01897578810633309, 0.020741020961445644, 0.6092918096978791,
        0.75, -0.8673699035346424, 0.8457830948635747, -0.5057920833154848, 2.0000000000000555}},
  };
  for (const Expected& e : expected) {
    for (DType dtype : {kF64, kF32}) {
      SCOPED_TRACE(::testing::Message()
                   << (e.form == GeluApproximate::kTanh ? "tanh " : "exact ") << dtype);
      const double rtol = dtype == kF64 ? 1e-12 : 2e-5, atol = dtype == kF64 ? 1e-15 : 1e-6;
      const Tensor xt = from_vector(x).to(dtype).requires_grad_(),
                   gt = from_vector(g).to(dtype).requires_grad_();
      autograd::backward({gelu(xt, e.form)}, {gt}, false, true);
      const Tensor gx = xt.grad();
      xt.set_grad(Tensor());
      autograd::backward({gx}, {from_vector(v).to(dtype)});
      expect_close(gx.detach(), from_vector(e.gx).to(dtype), rtol, atol);
      expect_close(xt.grad(), from_vector(e.d2x).to(dtype), rtol, atol);
      expect_close(gt.grad(), from_vector(e.d2g).to(dtype), rtol, atol);
    }
  }
}

TEST(GptLayersGradcheck, Silu) {
  const Tensor x = leaf({4, 5}, 2, -6.0, 6.0);
  expect_gradcheck([](const auto& v) { return silu(v[0]); }, {x});
  const auto second = autograd::gradgradcheck([](const auto& v) { return silu(v[0]); }, {x});
  EXPECT_TRUE(second.ok) << second.message;
}

// As PyTorch's silu, a channels_last input gives a channels_last output (and gradient), with
// the values of the contiguous computation.
TEST(GptLayersGradcheck, SiluKeepsChannelsLast) {
  const Tensor x = leaf({2, 3, 4, 5}, 4, -6.0, 6.0);
  const Tensor xl = x.detach().contiguous(MemoryFormat::ChannelsLast).requires_grad_(true);
  const Tensor y = silu(x), yl = silu(xl);
  EXPECT_TRUE(yl.is_contiguous(MemoryFormat::ChannelsLast));
  expect_close(yl, y, 0.0, 0.0);
  autograd::backward({silu(x).sum()});
  autograd::backward({silu(xl).sum()});
  EXPECT_TRUE(xl.grad().is_contiguous(MemoryFormat::ChannelsLast));
  expect_close(xl.grad(), x.grad(), 0.0, 0.0);
}

// With create_graph the gradient is itself recorded (silu's formula in differentiable ops), with
// the fused kernel's values.
TEST(GptLayersGradcheck, SiluBackwardIsRecordedUnderCreateGraph) {
  const Tensor x = leaf({4, 5}, 3, -6.0, 6.0), y = leaf({4, 5}, 3, -6.0, 6.0);
  autograd::backward({silu(x).sum()}, {}, false, true);
  autograd::backward({silu(y).sum()});
  ASSERT_TRUE(x.grad().requires_grad());
  EXPECT_FALSE(y.grad().requires_grad());
  expect_close(x.grad().detach(), y.grad(), 1e-12, 1e-14);
}

// With create_graph gelu's gradient is the op gelu_backward, run by the same fused kernel as
// without: the same bits, in f32 and bf16 as in f64.
TEST(GptLayersGradcheck, GeluBackwardIsRecordedUnderCreateGraph) {
  for (GeluApproximate form : {GeluApproximate::kNone, GeluApproximate::kTanh}) {
    for (DType dtype : {kF64, kF32, kBF16}) {
      SCOPED_TRACE(::testing::Message()
                   << (form == GeluApproximate::kTanh ? "tanh " : "exact ") << dtype);
      const Tensor values = leaf({4, 5}, 3, -6.0, 6.0).detach().to(dtype);
      const Tensor x = values.clone().requires_grad_(), y = values.clone().requires_grad_();
      autograd::backward({gelu(x, form).sum()}, {}, false, true);
      autograd::backward({gelu(y, form).sum()});
      ASSERT_TRUE(x.grad().requires_grad());
      EXPECT_FALSE(y.grad().requires_grad());
      expect_close(x.grad().detach(), y.grad(), 0.0, 0.0);
    }
  }
}

// First and (through a create_graph backward) second derivatives.
TEST(GptLayersGradcheck, LayerNormInputWeightBias) {
  using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
  const std::vector<std::pair<Fn, std::vector<Tensor>>> cases = {
      {[](const auto& v) { return layer_norm(v[0], {6}, v[1], v[2]); },
       {leaf({3, 6}, 2), leaf({6}, 3), leaf({6}, 4)}},
      {[](const auto& v) {
         return layer_norm(v[0], {3, 4}, v[1], v[2], 1e-3);
       },
       {leaf({2, 3, 4}, 5), leaf({3, 4}, 6), leaf({3, 4}, 7)}},
      {[](const auto& v) { return layer_norm(v[0], {5}); }, {leaf({2, 2, 5}, 8)}},
      {[](const auto& v) { return layer_norm(v[0], {5}, {}, v[1]); },
       {leaf({4, 5}, 9), leaf({5}, 10)}},
      // No leading dims: the weight's gradient sums over none.
      {[](const auto& v) {
         return layer_norm(v[0], {2, 5}, v[1]);
       },
       {leaf({2, 5}, 13), leaf({2, 5}, 14)}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "case " << i);
    const auto& [f, inputs] = cases[i];
    expect_gradcheck(f, inputs);
    const auto second = autograd::gradgradcheck(f, inputs);
    EXPECT_TRUE(second.ok) << second.message;
  }
}

// Without create_graph the gradients are the fused kernel's own, bit for bit, with no history;
// with create_graph they are recorded ops that agree within rounding, in the same dtypes.
TEST(GptLayersGradcheck, LayerNormFirstOrderIsTheKernelAndCreateGraphAgrees) {
  for (DType dtype : {kF32, kBF16}) {
    SCOPED_TRACE(::testing::Message() << dtype);
    Generator gen(15);
    const Tensor x = uniform({3, 4, 8}, -2.0, 2.0, kF32, &gen).to(dtype).requires_grad_();
    const Tensor w = uniform({8}, -2.0, 2.0, kF32, &gen).to(dtype).requires_grad_();
    const Tensor b = uniform({8}, -2.0, 2.0, kF32, &gen).to(dtype).requires_grad_();
    const Tensor g = uniform({3, 4, 8}, -2.0, 2.0, kF32, &gen).to(dtype);
    const Tensor mean = empty({12}), rstd = empty({12});
    detail::kernel_table(DeviceType::kCPU)
        .layer_norm_forward(empty({12, 8}, dtype), mean, rstd, x.detach().view({12, 8}), w.detach(),
                            b.detach(), 1e-5);
    const auto want =
        detail::layer_norm_backward(g, x.detach(), w.detach(), mean, rstd, {8}, {true, true, true});
    for (bool create_graph : {false, true}) {
      SCOPED_TRACE(create_graph ? "create_graph" : "first order");
      for (const Tensor* t : {&x, &w, &b}) t->set_grad(Tensor());
      autograd::backward({layer_norm(x, {8}, w, b)}, {g}, false, create_graph);
      const double tol = create_graph ? (dtype == kBF16 ? 2e-2 : 1e-4) : 0.0;
      const Tensor got[] = {x.grad(), w.grad(), b.grad()};
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(got[i].defined());
        EXPECT_EQ(got[i].requires_grad(), create_graph && i < 2);  // the bias's is sum(g)
        EXPECT_EQ(got[i].dtype(), dtype);
        expect_close(got[i].detach(), want[i], tol, tol);
      }
    }
  }
}

TEST(GptLayersGradcheck, EmbeddingWeight) {
  const Tensor indices = from_vector<int64_t>({0, 3, 3, 1, 4, 0}, {2, 3});
  expect_gradcheck([&](const auto& v) { return embedding(indices, v[0]); }, {leaf({5, 4}, 11)});
  expect_gradgradcheck([&](const auto& v) { return embedding(indices, v[0]); }, {leaf({5, 4}, 11)});
  // The padding row's gradient is 0 by definition (not the finite difference): a padding_idx
  // that is not looked up leaves the other rows' gradients exact.
  const Tensor no_padding_row = from_vector<int64_t>({0, 2, 2, 1, 4, 0}, {2, 3});
  expect_gradcheck([&](const auto& v) { return embedding(no_padding_row, v[0], 3); },
                   {leaf({5, 4}, 12)});
  expect_gradgradcheck([&](const auto& v) { return embedding(no_padding_row, v[0], 3); },
                       {leaf({5, 4}, 12)});
  // The gradient itself (zero in the padding row) is linear in the output's gradient, so its
  // own gradient is exact with the padding row looked up too.
  expect_gradgradcheck([&](const auto& v) { return embedding(indices, v[0], 3); },
                       {leaf({5, 4}, 13)});
}

// Under create_graph the weight's gradient is recorded; its gradient picks the rows of the
// output gradient's gradient at the indices, zero at padding_idx (PyTorch's
// embedding_dense_double_backward). Without create_graph it is the same values, unrecorded.
TEST(GptLayersGradcheck, EmbeddingBackwardIsRecordedUnderCreateGraph) {
  const Tensor indices = from_vector<int64_t>({2, 0, 2, 1});
  const Tensor w = leaf({3, 2}, 14), u = leaf({4, 2}, 15), v = leaf({3, 2}, 16).detach();
  autograd::backward({embedding(indices, w, 1)}, {u}, false, true);
  const Tensor gw = w.grad();
  ASSERT_TRUE(gw.requires_grad());
  const Tensor plain = w.detach().clone().requires_grad_();
  autograd::backward({embedding(indices, plain, 1)}, {u.detach()});
  EXPECT_FALSE(plain.grad().requires_grad());
  expect_close(gw.detach(), plain.grad(), 0.0, 0.0);
  autograd::backward({gw}, {v});
  const auto vv = v.to_vector<double>();
  std::vector<double> picked;
  for (int64_t i : {2, 0, 2, 1}) {
    for (int64_t j = 0; j < 2; ++j)
      picked.push_back(i == 1 ? 0.0 : vv[static_cast<size_t>(i * 2 + j)]);
  }
  expect_close(u.grad(), from_vector(picked).view({4, 2}), 0.0, 0.0);
}

// ---------------------------------------------------------------------------------------
// Behaviour beyond the golden cases.

TEST(GptLayers, EmbeddingPaddingRowGetsNoGradient) {
  Tensor w = ones({4, 3});
  w.requires_grad_();
  const Tensor y = embedding(from_vector<int64_t>({1, 1, 2, 0}, {2, 2}), w, 1);
  ASSERT_EQ(y.sizes(), (Shape{2, 2, 3}));
  y.sum().backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0}));
  // Negative padding_idx counts from the end, as in PyTorch.
  Tensor v = ones({4, 3});
  v.requires_grad_();
  embedding(from_vector<int64_t>({3, 0}), v, -1).sum().backward();
  EXPECT_EQ(v.grad().to_vector<float>(), (std::vector<float>{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(GptLayers, EmbeddingTakesI32IndicesAndZeroDimIndices) {
  const Tensor w = arange(0, 12, 1, kF32).view({4, 3});
  expect_close(embedding(from_vector<int32_t>({2, 0}), w),
               from_vector<float>({6, 7, 8, 0, 1, 2}, {2, 3}));
  const Tensor scalar_index = from_vector<int64_t>({3}).view({});
  expect_close(embedding(scalar_index, w), from_vector<float>({9, 10, 11}, {3}));
}

TEST(GptLayers, GeluAtLargeMagnitudesAndNan) {
  // PyTorch 1.13's values (f32), but for the tanh form's gradient at -5 and 5 the f64 value:
  // PyTorch's f32 1 - tanh^2 loses its digits there (-2.01e-6 for -1.55e-6).
  const Tensor x = from_vector<float>({-100.0f, -20.0f, -9.0f, -5.0f, 1e-3f, 5.0f, 20.0f, 100.0f});
  for (GeluApproximate form : {GeluApproximate::kNone, GeluApproximate::kTanh}) {
    const bool tanh_form = form == GeluApproximate::kTanh;
    SCOPED_TRACE(tanh_form ? "tanh" : "exact");
    Tensor leaf = x.clone();
    leaf.requires_grad_();
    const Tensor y = gelu(leaf, form);
    y.sum().backward();
    expect_close(y,
                 from_vector<float>({0, 0, 0, tanh_form ? -2.9802322e-07f : -1.4901161e-06f,
                                     tanh_form ? 5.0039898e-04f : 5.0039892e-04f,
                                     tanh_form ? 4.9999995f : 4.9999986f, 20, 100}),
                 1e-6, 2e-7);
    expect_close(leaf.grad(),
                 from_vector<float>({0, 0, 0, tanh_form ? -1.5463620e-06f : -7.1227551e-06f,
                                     tanh_form ? 0.50079787f : 0.50079781f,
                                     tanh_form ? 1.0000015f : 1.0000072f, 1, 1}),
                 1e-6, 3e-7);
    const Tensor special = gelu(from_vector<float>({std::nanf(""), INFINITY}), form);
    EXPECT_TRUE(std::isnan(special.to_vector<float>()[0]));
    EXPECT_EQ(special.to_vector<float>()[1], INFINITY);
  }
}

TEST(GptLayers, LayerNormBf16KeepsItsStatisticsInF32) {
  // 1024 + 8k is exact in bf16, whose spacing there is 8: in bf16 the row's sum (about 9216,
  // spacing 64) and so its mean and variance would round; in f32 they are exact.
  std::vector<float> values;
  for (int k = -4; k <= 4; ++k) values.push_back(1024.0f + 8.0f * static_cast<float>(k));
  const Tensor x32 = from_vector(values, {1, 9});
  const Tensor y = layer_norm(x32.to(kBF16), {9});
  EXPECT_EQ(y.dtype(), kBF16);
  const Tensor reference = layer_norm(x32, {9}).to(kBF16);
  expect_close(y, reference, 0.0, 0.0);
  EXPECT_NEAR(y.to_vector<double>()[8], 4.0 / std::sqrt(60.0 / 9.0), 1e-2);

  // The gradients of a bf16 layer_norm are bf16, computed from f32 statistics.
  Tensor xb = x32.to(kBF16);
  xb.requires_grad_();
  Tensor wb = ones({9}, kBF16);
  wb.requires_grad_();
  layer_norm(xb, {9}, wb).backward(ones({1, 9}, kBF16));
  EXPECT_EQ(xb.grad().dtype(), kBF16);
  EXPECT_EQ(wb.grad().dtype(), kBF16);
  for (double g : xb.grad().to_vector<double>()) EXPECT_NEAR(g, 0.0, 1e-3);
  expect_close(wb.grad(), reference.view({9}), 0.0, 0.0);
}

TEST(GptLayers, AutocastRunsLayerNormInF32AndGeluInItsInputDtype) {
  const Tensor x = uniform({2, 8}, -1.0, 1.0).to(kBF16);
  const Tensor w = ones({8}), b = zeros({8});
  AutocastGuard guard(kCPU, kBF16);
  const Tensor y = layer_norm(x, {8}, w, b);
  EXPECT_EQ(y.dtype(), kF32);
  EXPECT_EQ(gelu(x).dtype(), kBF16);
  EXPECT_EQ(gelu(x.to(kF32)).dtype(), kF32);
  EXPECT_EQ(embedding(from_vector<int64_t>({1}), ones({2, 8})).dtype(), kF32);
  EXPECT_EQ(silu(x).dtype(), kBF16);  // on no autocast list, as in PyTorch
  EXPECT_EQ(silu(x.to(kF32)).dtype(), kF32);
}

TEST(GptLayers, ErrorsNameTheOpAndTheValues) {
  const Tensor x = zeros({2, 3, 4});
  EXPECT_EMBER_ERROR(layer_norm(x, {3}), "layer_norm: normalized_shape [3] does not match");
  EXPECT_EMBER_ERROR(layer_norm(x, {4}, ones({3})), "weight of shape [3] does not match");
  EXPECT_EMBER_ERROR(layer_norm(x, {4}, ones({4}, kF64)), "weight has dtype f64");
  EXPECT_EMBER_ERROR(layer_norm(x, {}), "normalized_shape must have at least one dim");
  EXPECT_EMBER_ERROR(layer_norm(zeros({2, 4}, kI64), {4}), "expected a floating input");
  EXPECT_EMBER_ERROR(gelu(zeros({2}, kI64)), "gelu: expected a floating input");
  EXPECT_EMBER_ERROR(silu(zeros({2}, kI64)), "silu: expected a floating input, got i64");
  EXPECT_EMBER_ERROR(silu(Tensor()), "silu");
  const Tensor w = zeros({10, 4});
  EXPECT_EMBER_ERROR(embedding(from_vector<int64_t>({1, 10}), w),
                     "embedding: index 10 is out of range for num_embeddings 10");
  EXPECT_EMBER_ERROR(embedding(from_vector<int64_t>({-1, 2}), w), "index -1 is out of range");
  EXPECT_EMBER_ERROR(embedding(from_vector<float>({1.0f}), w), "indices must be i64 or i32");
  EXPECT_EMBER_ERROR(embedding(from_vector<int64_t>({1}), zeros({10})), "expected a 2-d weight");
  EXPECT_EMBER_ERROR(embedding(from_vector<int64_t>({1}), w, 10),
                     "padding_idx 10 is out of range for num_embeddings 10");
}

// ---------------------------------------------------------------------------------------
// Dropout's reproducibility rule (layer_ops.h).

Tensor mask_of(const Tensor& dropped) { return ne(dropped, 0.0); }

TEST(Dropout, SameSeedSameMaskOtherSeedOtherMask) {
  const Tensor x = ones({64, 64});
  Generator a(7), b(7), c(8);
  const Tensor ya = dropout(x, 0.25, true, &a), yb = dropout(x, 0.25, true, &b);
  const Tensor yc = dropout(x, 0.25, true, &c);
  EXPECT_TRUE(equal(ya, yb));
  EXPECT_FALSE(equal(mask_of(ya), mask_of(yc)));
  // Each call advances the generator: the next mask differs from the first.
  EXPECT_FALSE(equal(mask_of(dropout(x, 0.25, true, &a)), mask_of(ya)));
  EXPECT_EQ(a.offset(), 2u);
  // Ranks seeded with seed + rank draw different masks; the default generator obeys the seed.
  manual_seed(100 + 0);
  const Tensor rank0 = dropout(x, 0.25, true);
  manual_seed(100 + 1);
  const Tensor rank1 = dropout(x, 0.25, true);
  manual_seed(100 + 0);
  EXPECT_TRUE(equal(dropout(x, 0.25, true), rank0));
  EXPECT_FALSE(equal(rank0, rank1));
}

TEST(Dropout, MaskIsTheSameForEveryDtype) {
  const Tensor x = ones({32, 33});
  Generator g32(5), g64(5), gb(5);
  const Tensor m32 = mask_of(dropout(x, 0.4, true, &g32));
  EXPECT_TRUE(equal(mask_of(dropout(x.to(kF64), 0.4, true, &g64)), m32));
  EXPECT_TRUE(equal(mask_of(dropout(x.to(kBF16), 0.4, true, &gb)), m32));
}

TEST(Dropout, ScalesKeptValuesAndDropsAboutP) {
  const Tensor x = uniform({200, 100}, 1.0, 2.0);
  Generator g(3);
  const double p = 0.3;
  const Tensor y = dropout(x, p, true, &g);
  const Tensor keep = mask_of(y);
  const double kept = sum(keep.to(kF64)).item<double>() / static_cast<double>(x.numel());
  EXPECT_NEAR(kept, 1.0 - p, 0.02);
  expect_close(y, where(keep, x / (1.0 - p), 0.0), 1e-6, 0.0);
}

TEST(Dropout, BackwardUsesTheForwardMask) {
  Tensor x = uniform({50, 40}, 1.0, 2.0);
  x.requires_grad_();
  Generator g(11);
  const double p = 0.5;
  const Tensor y = dropout(x, p, true, &g);
  y.backward(ones_like(y));
  expect_close(x.grad(), mask_of(y).to(kF32) * (1.0 / (1.0 - p)), 0.0, 0.0);
}

TEST(Dropout, EvalAndZeroProbabilityAreIdentity) {
  const Tensor x = uniform({4, 5}, -1.0, 1.0);
  Generator g(1);
  EXPECT_TRUE(dropout(x, 0.5, false, &g).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, true, &g).is_same(x));
  EXPECT_EQ(g.offset(), 0u);  // nothing drawn
  EXPECT_TRUE(equal(dropout(x, 1.0, true, &g), zeros_like(x)));
  EXPECT_EMBER_ERROR(dropout(x, 1.5, true), "dropout: probability must be in [0, 1]");
}

}  // namespace
}  // namespace ember
