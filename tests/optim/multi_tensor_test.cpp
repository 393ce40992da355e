// The multi-tensor (foreach / fused) optimizer updates against the per-parameter path: bit
// for bit on CPU in f32 and f64, within rounding in bf16 and on CUDA; state dicts moving
// between the two; the options that are refused.
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>

#include <ember/optim/adam.h>
#include <ember/optim/clip_grad.h>
#include <ember/optim/multi_tensor.h>
#include <ember/optim/sgd.h>
#include <ember/tensor/multi_tensor.h>

#include "test_util.h"

namespace ember::optim {
namespace {

// Sizes that cover a 0-d tensor, an empty one, several chunks of the CPU loop (16384, and
// enough elements for its OpenMP split); on CUDA, several chunks of the kernel (65536) and
// enough tensors to need several launches, one tensor split across two.
std::vector<Shape> param_shapes(bool cuda) {
  std::vector<Shape> shapes = {{7, 5}, {}, {0, 3}, {2, 17000}, {64, 3, 3, 3}};
  if (cuda) {
    shapes.push_back({65536 * 2 + 3});
    for (int i = 0; i < 80; ++i) shapes.push_back({i % 9 + 1, 13});
    shapes.push_back({65536 * 330});
  }
  return shapes;
}

std::vector<Tensor> make_params(const std::vector<Shape>& shapes, DType dtype, Device device,
                                uint64_t seed) {
  Generator gen(seed);
  std::vector<Tensor> params;
  for (const Shape& shape : shapes) {
    Tensor p = randn(shape, TensorOptions(kF64), &gen).to(device, dtype);
    p.requires_grad_();
    params.push_back(p);
  }
  return params;
}

std::vector<Tensor> clone_params(const std::vector<Tensor>& params, Device device) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor c = p.detach().to(device).clone();
    c.requires_grad_();
    out.push_back(c);
  }
  return out;
}

// The same pseudo-random gradients for both sets; parameter k has none on steps where
// (step + k) % 5 == 0, so parameters are skipped and their step counts drift apart.
void set_grads(std::vector<Tensor>& a, std::vector<Tensor>& b, int step) {
  Generator gen(1000 + static_cast<uint64_t>(step));
  for (size_t k = 0; k < a.size(); ++k) {
    const Tensor g = randn(a[k].sizes(), TensorOptions(kF64, a[k].device()), &gen);
    if ((static_cast<size_t>(step) + k) % 5 == 0) {
      a[k].set_grad(Tensor());
      b[k].set_grad(Tensor());
    } else {
      a[k].set_grad(g.to(a[k].device(), a[k].dtype()));
      b[k].set_grad(g.to(b[k].device(), b[k].dtype()));
    }
  }
}

using Factory =
    std::function<std::unique_ptr<Optimizer>(std::vector<ParamGroup>, std::optional<bool> foreach)>;

// Two groups with different lr and weight decay: the first half and the second half.
std::vector<ParamGroup> two_groups(const std::vector<Tensor>& params) {
  const auto half = static_cast<std::ptrdiff_t>(params.size() / 2);
  return {
      ParamGroup({params.begin(), params.begin() + half}),
      ParamGroup({params.begin() + half, params.end()}, {{"lr", 0.003}, {"weight_decay", 0.2}})};
}

struct Case {
  const char* name;
  Factory make;
};

std::vector<Case> all_cases() {
  auto sgd = [](SGDOptions o) {
    return [o](std::vector<ParamGroup> g, std::optional<bool> foreach) mutable {
      o.foreach = foreach;
      return std::unique_ptr<Optimizer>(std::make_unique<SGD>(std::move(g), o));
    };
  };
  auto adam = [](AdamOptions o) {
    return [o](std::vector<ParamGroup> g, std::optional<bool> foreach) mutable {
      o.foreach = foreach;
      return std::unique_ptr<Optimizer>(std::make_unique<Adam>(std::move(g), o));
    };
  };
  auto adamw = [](AdamWOptions o) {
    return [o](std::vector<ParamGroup> g, std::optional<bool> foreach) mutable {
      o.foreach = foreach;
      return std::unique_ptr<Optimizer>(std::make_unique<AdamW>(std::move(g), o));
    };
  };
  return {
      {"SGD", sgd({.lr = 0.1})},
      {"SGD weight decay", sgd({.lr = 0.1, .weight_decay = 0.01})},
      {"SGD momentum", sgd({.lr = 0.1, .momentum = 0.9})},
      {"SGD momentum dampening wd",
       sgd({.lr = 0.05, .momentum = 0.8, .dampening = 0.3, .weight_decay = 1e-3})},
      {"SGD nesterov", sgd({.lr = 0.1, .momentum = 0.9, .nesterov = true})},
      {"SGD nesterov wd",
       sgd({.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true})},
      {"Adam", adam({.lr = 0.01})},
      {"Adam weight decay", adam({.lr = 0.01, .betas = {0.8, 0.99}, .weight_decay = 0.1})},
      {"Adam amsgrad", adam({.lr = 0.01, .weight_decay = 0.01, .amsgrad = true})},
      {"AdamW", adamw({.lr = 0.01})},
      {"AdamW amsgrad", adamw({.lr = 0.02, .eps = 1e-6, .weight_decay = 0.05, .amsgrad = true})},
  };
}

// Runs `steps` updates of both parameter sets.
void run_steps(Optimizer& a, std::vector<Tensor>& pa, Optimizer& b, std::vector<Tensor>& pb,
               int first_step, int steps) {
  for (int s = first_step; s < first_step + steps; ++s) {
    set_grads(pa, pb, s);
    a.step();
    b.step();
  }
}

void expect_bit_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  for (size_t k = 0; k < a.size(); ++k)
    EXPECT_EQ(a[k].to_vector<double>(), b[k].to_vector<double>()) << "param " << k;
}

void expect_same_state(const Optimizer& a, const Optimizer& b) {
  const StateDict sa = a.state_dict(), sb = b.state_dict();
  EXPECT_EQ(sa.scalars, sb.scalars);
  ASSERT_EQ(sa.tensors.size(), sb.tensors.size());
  for (const auto& [key, t] : sa.tensors) {
    ASSERT_EQ(sb.tensors.count(key), 1u) << key;
    EXPECT_EQ(t.to_vector<double>(), sb.tensors.at(key).to_vector<double>()) << key;
  }
}

void check_bit_identical(DType dtype) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> reference = make_params(param_shapes(false), dtype, kCPU, 7);
    std::vector<Tensor> fused = clone_params(reference, kCPU);
    auto per_param = c.make(two_groups(reference), false);
    auto multi = c.make(two_groups(fused), true);
    run_steps(*per_param, reference, *multi, fused, 0, 20);
    expect_bit_identical(reference, fused);
    expect_same_state(*per_param, *multi);
  }
}

TEST(MultiTensorOptimizer, BitIdenticalToPerParameterOnCpuF32) { check_bit_identical(kF32); }
TEST(MultiTensorOptimizer, BitIdenticalToPerParameterOnCpuF64) { check_bit_identical(kF64); }

// Largest |a - b| over the parameters, in f64.
double max_abs_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0.0;
  for (size_t k = 0; k < a.size(); ++k) {
    const auto va = a[k].to_vector<double>(), vb = b[k].to_vector<double>();
    for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::abs(va[i] - vb[i]));
  }
  return worst;
}

// bf16/f16: the multi-tensor update rounds once per stored value, the per-parameter path
// after every op, so over 20 steps it stays at least as close to the f64 trajectory.
void check_low_precision_against_f64(Device device) {
  for (const DType dtype : {kBF16, kF16})
    for (const Case& c : all_cases()) {
      SCOPED_TRACE(c.name);
      std::vector<Tensor> exact = make_params({{5, 9}, {300}}, kF64, kCPU, 3);
      std::vector<Tensor> per_param = make_params({{5, 9}, {300}}, dtype, device, 3);
      std::vector<Tensor> fused = clone_params(per_param, device);
      std::vector<Tensor> exact_start = clone_params(per_param, kCPU);
      {
        NoGradGuard no_grad;  // the f64 run starts from the same (bf16-rounded) values
        for (size_t k = 0; k < exact.size(); ++k) exact[k].copy_(exact_start[k]);
      }
      auto a = c.make({ParamGroup(exact)}, false);
      auto b = c.make({ParamGroup(per_param)}, false);
      auto m = c.make({ParamGroup(fused)}, true);
      std::vector<Tensor> unused = clone_params(exact, kCPU);
      auto ignored = c.make({ParamGroup(unused)}, false);
      run_steps(*b, per_param, *m, fused, 1, 20);
      run_steps(*a, exact, *ignored, unused, 1, 20);
      const double per_param_error = max_abs_diff(per_param, exact);
      const double fused_error = max_abs_diff(fused, exact);
      EXPECT_LE(fused_error, 1.25 * per_param_error + 4e-3)
          << "per-parameter error " << per_param_error;
    }
}

TEST(MultiTensorOptimizer, LowPrecisionAtLeastAsCloseToFloat64AsPerParameter) {
  check_low_precision_against_f64(kCPU);
}

TEST(MultiTensorOptimizer, ParamsWithoutGradsAreLeftAlone) {
  std::vector<Tensor> params = make_params({{4}, {3}}, kF32, kCPU, 1);
  const auto before = params[1].to_vector<float>();
  AdamW adamw(params, {.lr = 0.1, .foreach = true});
  params[0].set_grad(ones_like(params[0]));
  adamw.step();
  EXPECT_EQ(params[1].to_vector<float>(), before);  // no decay either
  EXPECT_TRUE(adamw.state(0, 1).empty());
  EXPECT_EQ(adamw.state(0, 0).step, 1);
  EXPECT_NE(params[0].to_vector<float>(), std::vector<float>(4, 0.0f));
}

// max(|a - b| - rtol * |b|) <= atol over every element, computed on a's device.
void expect_close_on_device(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol,
                            double atol) {
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].numel() == 0) continue;
    const Tensor excess = sub(abs(sub(a[k], b[k])), mul(abs(b[k]), rtol));
    EXPECT_LE(max(excess).item().to_double(), atol) << "param " << k;
  }
}

// clip_grad_norm_ with foreach: the same total within rounding (exactly for the infinity
// norm), mixed dtypes and a non-contiguous gradient included.
TEST(MultiTensorClipGradNorm, MatchesPerGradientPath) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const double norm_type : {2.0, 1.0, 3.0, inf}) {
    SCOPED_TRACE(norm_type);
    std::vector<Tensor> a = make_params({{7, 5}, {2, 17000}, {}, {0}}, kF32, kCPU, 4);
    std::vector<Tensor> extra = make_params({{300}}, kF64, kCPU, 5);
    a.push_back(extra[0]);
    Tensor transposed = randn({6, 4}).t().detach();
    transposed.requires_grad_();
    a.push_back(transposed);
    std::vector<Tensor> b = clone_params(a, kCPU);
    for (size_t k = 0; k < a.size(); ++k) {
      Tensor g = randn(a[k].sizes(), TensorOptions(a[k].dtype())).mul_(3.0);
      if (k + 1 == a.size()) g = randn({6, 4}).t();  // non-contiguous
      a[k].set_grad(g);
      b[k].set_grad(g.clone());
    }
    const Tensor per_gradient = clip_grad_norm_(a, 1.5, norm_type, false);
    const Tensor foreach = clip_grad_norm_(b, 1.5, norm_type, true);
    EXPECT_EQ(foreach.dtype(), kF32);
    if (std::isinf(norm_type)) {
      EXPECT_EQ(foreach.item().to_double(), per_gradient.item().to_double());
    } else {
      EXPECT_NEAR(foreach.item().to_double(), per_gradient.item().to_double(),
                  2e-6 * per_gradient.item().to_double());
    }
    for (size_t k = 0; k < a.size(); ++k)
      testing::expect_close(b[k].grad(), a[k].grad(), 2e-6, 1e-9);
  }
}

TEST(MultiTensorClipGradNorm, ZeroGradientsAndNaN) {
  std::vector<Tensor> params = make_params({{3}, {2}}, kF32, kCPU, 1);
  params[0].set_grad(zeros({3}));
  params[1].set_grad(zeros({2}));
  EXPECT_EQ(clip_grad_norm_(params, 1.0, 2.0, true).item().to_double(), 0.0);
  EXPECT_EQ(params[0].grad().to_vector<float>(), std::vector<float>(3, 0.0f));
  params[1].set_grad(from_vector<float>({1.0f, std::nanf("")}));
  EXPECT_TRUE(std::isnan(clip_grad_norm_(params, 1.0, 2.0, true).item().to_double()));
  params[1].set_grad(from_vector<float>({std::nanf(""), 1.0f}));
  EXPECT_TRUE(std::isnan(clip_grad_norm_(params, 1.0, std::numeric_limits<double>::infinity(), true)
                             .item()
                             .to_double()));
}

TEST(MultiTensorClipGradNorm, NormOfAllTensorsTogether) {
  const std::vector<Tensor> t = {from_vector<double>({3.0}), from_vector<double>({-4.0, 0.0}),
                                 zeros({0}, TensorOptions(kF64))};
  EXPECT_EQ(multi_tensor_norm(t, 2.0).item().to_double(), 5.0);
  EXPECT_EQ(multi_tensor_norm(t, 1.0).item().to_double(), 7.0);
  EXPECT_EQ(multi_tensor_norm(t, std::numeric_limits<double>::infinity()).item().to_double(), 4.0);
  EXPECT_DOUBLE_EQ(multi_tensor_norm(t, 3.0).item().to_double(), std::cbrt(91.0));
  EXPECT_EQ(multi_tensor_norm(t, 2.0).dim(), 0);
  multi_tensor_mul_(t, scalar_tensor(-0.5, kF64));
  EXPECT_EQ(t[0].to_vector<double>(), std::vector<double>{-1.5});
  EXPECT_EQ(t[1].to_vector<double>(), (std::vector<double>{2.0, -0.0}));
}

TEST(MultiTensorClipGradNorm, NormAndMulRejectBadInput) {
  std::vector<Tensor> mixed = {zeros({2}), zeros({2}, TensorOptions(kF64))};
  EXPECT_EMBER_ERROR(multi_tensor_norm(mixed, 2.0), "multi_tensor_norm: tensors[1] is f64");
  EXPECT_EMBER_ERROR(multi_tensor_norm({}, 2.0), "got no tensors");
  std::vector<Tensor> one = {zeros({2})};
  EXPECT_EMBER_ERROR(multi_tensor_norm(one, 0.0), "p must be > 0");
  EXPECT_EMBER_ERROR(multi_tensor_mul_(one, scalar_tensor(2.0, kF64)),
                     "multi_tensor_mul_: scale must be a 0-d tensor of dtype");
}

// The multi-tensor norm and scaling on the GPU against the CPU's.
TEST(MultiTensorClipGradNorm, CudaMatchesCpu) {
  EMBER_REQUIRE_CUDA();
  for (const double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    std::vector<Tensor> a = make_params(param_shapes(true), kF32, cuda_device(0), 4);
    std::vector<Tensor> b = clone_params(a, kCPU);
    for (size_t k = 0; k < a.size(); ++k) {
      const Tensor g = randn(a[k].sizes(), TensorOptions(kF32, a[k].device()));
      a[k].set_grad(g);
      b[k].set_grad(g.to(kCPU));
    }
    const Tensor on_cuda = clip_grad_norm_(a, 1.5, norm_type);  // the CUDA default: foreach
    const Tensor on_cpu = clip_grad_norm_(b, 1.5, norm_type, false);
    EXPECT_TRUE(on_cuda.device().is_cuda());
    EXPECT_NEAR(on_cuda.item().to_double(), on_cpu.item().to_double(),
                1e-5 * on_cpu.item().to_double());
    std::vector<Tensor> cuda_grads, cpu_grads;
    for (size_t k = 0; k < a.size(); ++k) {
      cuda_grads.push_back(a[k].grad().to(kCPU));
      cpu_grads.push_back(b[k].grad());
    }
    expect_close_on_device(cuda_grads, cpu_grads, 1e-5, 1e-7);
  }
}

// A NaN gradient reaches the parameter, the moments and max_exp_avg_sq on both paths alike.
TEST(MultiTensorOptimizer, NaNGradientPropagatesAsPerParameter) {
  for (const bool foreach : {false, true}) {
    std::vector<Tensor> params = {from_vector<float>({1.0f, 2.0f, 3.0f})};
    params[0].requires_grad_();
    AdamW adamw(params, {.lr = 0.1, .amsgrad = true, .foreach = foreach});
    params[0].set_grad(from_vector<float>({0.5f, std::nanf(""), -0.5f}));
    adamw.step();
    const auto p = params[0].to_vector<float>();
    const auto v_max = adamw.state(0, 0).buffers.at("max_exp_avg_sq").to_vector<float>();
    EXPECT_FALSE(std::isnan(p[0]));
    EXPECT_TRUE(std::isnan(p[1])) << "foreach " << foreach;
    EXPECT_TRUE(std::isnan(v_max[1])) << "foreach " << foreach;
    EXPECT_FALSE(std::isnan(v_max[2]));
  }
}

// A transposed parameter cannot be walked flat: it takes the per-parameter path in the same
// step, with the same result.
TEST(MultiTensorOptimizer, NonContiguousParameterFallsBack) {
  Generator gen(5);
  Tensor base = randn({6, 4}, {}, &gen);
  Tensor a = base.t().detach(), b = base.clone().t().detach();
  ASSERT_FALSE(b.is_contiguous());
  a.requires_grad_();
  b.requires_grad_();
  std::vector<Tensor> pa = {a}, pb = {b};
  SGD reference(pa, {.lr = 0.1, .momentum = 0.9, .foreach = false});
  SGD fused(pb, {.lr = 0.1, .momentum = 0.9, .foreach = true});
  run_steps(reference, pa, fused, pb, 0, 4);
  expect_bit_identical(pa, pb);
}

// Conv weights in channels_last (model->to(MemoryFormat::ChannelsLast), ember-train's default on
// CUDA) take the multi-tensor pass too, with their NCHW gradients brought into their layout,
// and end bit for bit where the per-parameter path does.
TEST(MultiTensorOptimizer, ChannelsLastParametersTakeThePass) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> pa = make_params({{16, 3, 3, 3}, {8, 16, 1, 1}, {5, 7}}, kF32, kCPU, 12);
    std::vector<Tensor> pb;
    for (const Tensor& p : pa) {
      Tensor q = p.dim() == 4 ? p.detach().clone(MemoryFormat::ChannelsLast) : p.detach().clone();
      pb.push_back(q.requires_grad_());
    }
    ASSERT_TRUE(pb[0].is_contiguous(MemoryFormat::ChannelsLast) && !pb[0].is_contiguous());
    auto a = c.make(two_groups(pa), false);
    auto b = c.make(two_groups(pb), true);
    run_steps(*a, pa, *b, pb, 1, 8);
    expect_bit_identical(pa, pb);
    EXPECT_TRUE(pb[0].is_contiguous(MemoryFormat::ChannelsLast));
    set_grads(pa, pb, 1);
    const ParamGroup& first = b->param_groups()[0];
    std::vector<ParamState> state;
    for (size_t i = 0; i < first.params.size(); ++i) state.push_back(b->state(0, i));
    const auto split = detail::split_params(first, state, detail::MultiTensorMode::kOn,
                                            {"momentum_buffer", "exp_avg", "exp_avg_sq"});
    EXPECT_TRUE(split.single.empty()) << "a channels_last parameter left the pass";
  }
}

// The state layout is the same: a checkpoint of either path resumes on the other.
TEST(MultiTensorOptimizer, StateDictMovesBetweenPaths) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    for (const bool save_fused : {false, true}) {
      std::vector<Tensor> pa = make_params(param_shapes(false), kF32, kCPU, 11);
      std::vector<Tensor> pb = clone_params(pa, kCPU);
      auto a = c.make(two_groups(pa), save_fused);
      auto b = c.make(two_groups(pb), !save_fused);
      std::vector<Tensor> unused = clone_params(pa, kCPU);
      auto ignored = c.make(two_groups(unused), save_fused);
      // a trains 8 steps; b, fresh, takes a's parameters and state and both go on.
      run_steps(*a, pa, *ignored, unused, 0, 8);
      {
        NoGradGuard no_grad;
        for (size_t k = 0; k < pa.size(); ++k) pb[k].copy_(pa[k]);
      }
      b->load_state_dict(a->state_dict());
      expect_same_state(*a, *b);
      run_steps(*a, pa, *b, pb, 8, 8);
      expect_bit_identical(pa, pb);
      expect_same_state(*a, *b);
    }
  }
}

TEST(MultiTensorOptimizer, ForeachDoesNotEnterStateDict) {
  std::vector<Tensor> params = make_params({{3}}, kF32, kCPU, 2);
  SGD sgd(params, {.lr = 0.1, .foreach = true});
  for (const auto& [key, value] : sgd.state_dict().scalars)
    EXPECT_EQ(key.find("foreach"), std::string::npos) << key;
}

TEST(MultiTensorOptimizer, RejectsForeachWithFused) {
  std::vector<Tensor> params = make_params({{3}}, kF32, kCPU, 2);
  EXPECT_EMBER_ERROR(SGD(params, {.foreach = true, .fused = true}),
                     "SGD: fused = true and foreach");
  EXPECT_EMBER_ERROR(Adam(params, {.foreach = true, .fused = true}), "Adam: fused");
  EXPECT_EMBER_ERROR(AdamW(params, {.foreach = true, .fused = true}), "AdamW: fused");
  // fused alone, or fused with foreach = false, is accepted (as torch.optim accepts it).
  AdamW fused(params, {.foreach = false, .fused = true});
  params[0].set_grad(ones_like(params[0]));
  fused.step();
  EXPECT_EQ(fused.state(0, 0).step, 1);
}

// What the passes take: tensors that are flat (contiguous or channels_last), with every list
// laid out like its parameter; a state buffer in another layout is refused by name.
TEST(MultiTensorOptimizer, FlatLayouts) {
  const Tensor nchw = zeros({2, 3, 4, 5});
  const Tensor nhwc = nchw.contiguous(MemoryFormat::ChannelsLast);
  const Tensor both = zeros({2, 3, 1, 1});  // contiguous and channels_last at once
  EXPECT_TRUE(is_flat(nchw) && is_flat(nhwc) && is_flat(both));
  EXPECT_FALSE(is_flat(zeros({4, 5}).t()));
  EXPECT_TRUE(same_flat_order(nhwc, nhwc.clone(MemoryFormat::ChannelsLast)));
  EXPECT_FALSE(same_flat_order(nchw, nhwc));
  EXPECT_TRUE(same_flat_order(both, both.contiguous(MemoryFormat::ChannelsLast)));
  EXPECT_FALSE(same_flat_order(nchw, zeros({2, 3, 5, 4})));

  std::vector<Tensor> params = {nhwc.clone(MemoryFormat::ChannelsLast)};
  const std::vector<Tensor> grads = {ones({2, 3, 4, 5})};  // NCHW: brought into the layout
  const std::vector<Tensor> buffers = {zeros({2, 3, 4, 5})};
  const std::vector<uint8_t> old = {0};
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(params, grads, buffers, old, {.lr = 0.1, .momentum = 0.9}),
                     "multi_tensor_sgd_: momentum_buffers[0] is not laid out like its parameter");
  multi_tensor_sgd_(params, grads, {}, {}, {.lr = 0.5});
  EXPECT_TRUE(params[0].is_contiguous(MemoryFormat::ChannelsLast));
  EXPECT_EQ(params[0].to_vector<float>(), full({2, 3, 4, 5}, -0.5).to_vector<float>());
}

TEST(MultiTensorOptimizer, MultiTensorCallsRejectMismatchedLists) {
  std::vector<Tensor> params = make_params({{3}, {2, 2}}, kF32, kCPU, 2);
  std::vector<Tensor> grads = {zeros({3}), zeros({2, 2})};
  std::vector<Tensor> wrong_shape = {zeros({3}), zeros({4})};
  std::vector<Tensor> wrong_dtype = {zeros({3}), zeros({2, 2}, TensorOptions(kF64))};
  const std::vector<uint8_t> fresh = {1, 1};
  EXPECT_EMBER_ERROR(
      multi_tensor_sgd_(params, wrong_shape, {}, {}, {.lr = 0.1}),
      "multi_tensor_sgd_: grads[1] has shape [4] but its parameter has shape [2, 2]");
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(params, wrong_dtype, {}, {}, {.lr = 0.1}),
                     "grads[1] has dtype");
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(params, grads, {}, {}, {.lr = 0.1, .momentum = 0.9}),
                     "needs one momentum buffer");
  EXPECT_EMBER_ERROR(
      multi_tensor_sgd_(params, grads, grads, fresh,
                        {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
      "Nesterov momentum requires");
  std::vector<Tensor> mixed = {params[0], params[1].detach().to(kF64)};
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(mixed, grads, {}, {}, {.lr = 0.1}), "one dtype per call");
  const std::vector<int64_t> steps = {1, 0};
  EXPECT_EMBER_ERROR(multi_tensor_adam_(params, grads, grads, grads, {}, steps, {.lr = 0.1}),
                     "steps[1] is 0");
  const std::vector<int64_t> ok_steps = {1, 1};
  EXPECT_EMBER_ERROR(
      multi_tensor_adam_(params, grads, grads, grads, {}, ok_steps, {.lr = 0.1, .amsgrad = true}),
      "amsgrad is on but max_exp_avg_sqs has 0 tensors");
}

// CUDA: the multi-tensor kernels (86 tensors in several launches, one tensor split across
// two at the 320-block limit) against the per-parameter path on the GPU, and against the
// CPU's multi-tensor loop, within rounding (the GPU fuses multiply-adds).
TEST(MultiTensorOptimizer, CudaMatchesPerParameterWithinRounding) {
  EMBER_REQUIRE_CUDA();
  for (const DType dtype : {kF32, kF64}) {
    const double rtol = dtype == kF64 ? 1e-12 : 1e-5, atol = dtype == kF64 ? 1e-14 : 1e-6;
    for (const Case& c : all_cases()) {
      SCOPED_TRACE(c.name);
      std::vector<Tensor> reference = make_params(param_shapes(true), dtype, cuda_device(0), 7);
      std::vector<Tensor> fused = clone_params(reference, cuda_device(0));
      auto per_param = c.make(two_groups(reference), false);
      auto multi = c.make(two_groups(fused), std::nullopt);  // the default on CUDA
      run_steps(*per_param, reference, *multi, fused, 0, 20);
      expect_close_on_device(fused, reference, rtol, atol);

      std::vector<Tensor> on_cuda = make_params(param_shapes(false), dtype, cuda_device(0), 7);
      std::vector<Tensor> on_cpu = clone_params(on_cuda, kCPU);
      auto cuda_multi = c.make(two_groups(on_cuda), true);
      auto cpu_multi = c.make(two_groups(on_cpu), true);
      run_steps(*cuda_multi, on_cuda, *cpu_multi, on_cpu, 0, 20);
      for (size_t k = 0; k < on_cpu.size(); ++k)
        testing::expect_close(on_cuda[k].to(kCPU), on_cpu[k], rtol, atol);
    }
  }
}

TEST(MultiTensorOptimizer, CudaLowPrecisionAtLeastAsCloseToFloat64AsPerParameter) {
  EMBER_REQUIRE_CUDA();
  check_low_precision_against_f64(cuda_device(0));
}

}  // namespace
}  // namespace ember::optim
