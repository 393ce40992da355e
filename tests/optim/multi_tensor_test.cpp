// The multi-tensor (foreach / fused) optimizer updates against the per-parameter path: bit
// for bit on CPU in f32 and f64, within rounding in bf16 and on CUDA; state dicts moving
// between the two; the options that are refused. GradScaler's fused path (unscale and skip
// inside the pass) and capturable optimizers (lr and step counts on the device) against the
// per-parameter path.
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include <ember/optim/adam.h>
#include <ember/optim/clip_grad.h>
#include <ember/optim/grad_scaler.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/multi_tensor.h>
#include <ember/optim/sgd.h>
#include <ember/tensor/cuda_graph.h>
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

// The case's per-parameter optimizer on CPU parameters and another (`foreach`) on a copy.
struct TwoRuns {
  std::vector<Tensor> reference, other;
  std::unique_ptr<Optimizer> per_param, multi;

  TwoRuns(const Case& c, DType dtype, std::optional<bool> foreach)
      : reference(make_params(param_shapes(false), dtype, kCPU, 7)),
        other(clone_params(reference, kCPU)),
        per_param(c.make(two_groups(reference), false)),
        multi(c.make(two_groups(other), foreach)) {}
};

void check_bit_identical(DType dtype) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    TwoRuns runs(c, dtype, true);
    auto& [reference, fused, per_param, multi] = runs;
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

// The gradients of set_grads times `scale`, with +inf in one element of parameter 3 when
// `inject`.
void set_scaled_grads(std::vector<Tensor>& a, std::vector<Tensor>& b, int step, double scale,
                      bool inject) {
  set_grads(a, b, step);
  NoGradGuard no_grad;
  for (size_t k = 0; k < a.size(); ++k) {
    if (!a[k].grad().defined()) continue;
    Tensor g = a[k].grad() * scale;
    if (inject && k == 3)
      g.view({-1}).narrow(0, 5, 1).fill_(std::numeric_limits<double>::infinity());
    a[k].set_grad(g);
    b[k].set_grad(g.clone());
  }
}

// GradScaler on a multi-tensor optimizer takes the fused path (a read-only inf check, then
// the pass unscales each gradient as it reads it and skips on the device) wherever the state
// exists; on the per-parameter one it unscales and reads the flag. Over 20 steps, three of
// them with an inf that must change nothing (parameters, buffers, step counts) and back the
// scale off, both end bit for bit alike in f32 and f64 (both multiply each gradient by the
// same f32 1 / scale in the compute type). With `clip`, unscale_ and clip_grad_norm_ come
// first (the same foreach clip on both sides), and the fused step skips on the device alone.
void check_fused_scaling(DType dtype, bool clip) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    TwoRuns runs(c, dtype, true);
    auto& [reference, fused, per_param, multi] = runs;
    const GradScalerOptions options{.init_scale = 1024.0, .growth_interval = 4};
    GradScaler scaler_a(options), scaler_b(options);
    int on_device = 0;
    for (int step = 0; step < 20; ++step) {
      SCOPED_TRACE(step);
      const bool inject = step == 5 || step == 6 || step == 13;
      scaler_a.scale(scalar_tensor(1.0));  // creates the scale; its value is get_scale()
      scaler_b.scale(scalar_tensor(1.0));
      ASSERT_EQ(scaler_a.get_scale(), scaler_b.get_scale());
      set_scaled_grads(reference, fused, step, scaler_a.get_scale(), inject);
      const StateDict before = multi->state_dict();  // its tensors alias the live state
      std::map<std::string, std::vector<double>> buffers_before;
      for (const auto& [key, t] : before.tensors) buffers_before[key] = t.to_vector<double>();
      std::vector<Tensor> params_before = clone_params(fused, kCPU);
      if (clip) {
        for (auto [scaler, opt, params] : {std::tuple{&scaler_a, per_param.get(), &reference},
                                           std::tuple{&scaler_b, multi.get(), &fused}}) {
          scaler->unscale_(*opt);
          clip_grad_norm_(*params, 5.0, 2.0, true);
        }
      }
      const ScaledStep ran_a = scaler_a.step(*per_param);
      const ScaledStep ran_b = scaler_b.step(*multi);
      EXPECT_TRUE(ran_a.decided());  // the per-parameter path reads the flag
      on_device += ran_b.decided() ? 0 : 1;
      EXPECT_EQ(ran_a.ran(), !inject);
      EXPECT_EQ(ran_b.ran(), !inject);
      if (inject) {
        expect_bit_identical(fused, params_before);
        const StateDict after = multi->state_dict();
        EXPECT_EQ(after.scalars, before.scalars);  // step counts included
        for (const auto& [key, values] : buffers_before)
          EXPECT_EQ(after.tensors.at(key).to_vector<double>(), values) << key;
      }
      scaler_a.update();
      scaler_b.update();
      EXPECT_EQ(scaler_b.get_scale(), scaler_a.get_scale());
      EXPECT_EQ(scaler_b.get_growth_tracker(), scaler_a.get_growth_tracker());
    }
    EXPECT_GE(on_device, 15) << "the fused path was not taken";
    expect_bit_identical(reference, fused);
    expect_same_state(*per_param, *multi);
  }
}

TEST(FusedGradScaling, EqualsUnscaleThenPerParameterStepF32) { check_fused_scaling(kF32, false); }
TEST(FusedGradScaling, EqualsUnscaleThenPerParameterStepF64) { check_fused_scaling(kF64, false); }
TEST(FusedGradScaling, AfterUnscaleAndClipEqualsPerParameterStep) {
  check_fused_scaling(kF32, true);
}

// The optimizer's own refusals: step(scaling) needs the multi-tensor pass and the state the
// first step creates; the scaling tensors and the pass's device inputs are checked by name.
TEST(FusedGradScaling, BadInputIsRefusedByName) {
  std::vector<Tensor> params = make_params({{3}, {2, 2}}, kF32, kCPU, 2);
  for (Tensor& p : params) p.set_grad(ones_like(p));
  const StepScaling ok{full({}, 0.5f), zeros({})};
  SGD per_param(params, {.lr = 0.1, .foreach = false});
  EXPECT_EMBER_ERROR(per_param.step(ok),
                     "SGD::step(scaling): group 0: parameter 0 takes the per-parameter update "
                     "(foreach = false)");
  SGD defaults(params, {.lr = 0.1});  // foreach unset: the CPU takes the per-parameter path
  EXPECT_EMBER_ERROR(defaults.step(ok), "(foreach unset on the CPU)");
  SGD momentum(params, {.lr = 0.1, .momentum = 0.9, .foreach = true});
  EXPECT_EMBER_ERROR(momentum.step(ok), "parameter 0 has no momentum_buffer yet");
  momentum.step();
  momentum.step(ok);  // the buffers exist now
  EXPECT_EMBER_ERROR(momentum.step({full({}, 0.5, kF64), zeros({})}),
                     "SGD::step(scaling): inv_scale must be a 1-element f32 tensor, got f64");
  EXPECT_EMBER_ERROR(momentum.step({full({}, 0.5f), Tensor()}),
                     "found_inf must be a 1-element f32 tensor, got an undefined tensor");
  EXPECT_EMBER_ERROR(momentum.step({full({}, 0.5f), zeros({2})}), "got f32 of shape [2]");
  EXPECT_EMBER_ERROR(SGD(params, {.foreach = false, .capturable = true}),
                     "SGD: capturable = true needs the multi-tensor update");
  EXPECT_EMBER_ERROR(AdamW(params, {.foreach = false, .capturable = true}), "AdamW: capturable");

  const std::vector<Tensor> grads = {ones({3}), ones({2, 2})};
  MultiTensorDeviceArgs lr_f32, inv_i32, f32_steps, both_steps;
  lr_f32.lr = full({}, 0.1f);
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(params, grads, {}, {}, {.lr = 0.1}, lr_f32),
                     "multi_tensor_sgd_: lr must be a 0-d f64 tensor, got f32");
  inv_i32.inv_scale = ones({}, kI32);
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(params, grads, {}, {}, {.lr = 0.1}, inv_i32),
                     "multi_tensor_sgd_: inv_scale must be a 1-element f32 tensor, got i32");
  const std::vector<Tensor> f32_counts = {zeros({}), zeros({})};
  const std::vector<Tensor> exp_avgs = {zeros({3}), zeros({2, 2})};
  f32_steps.steps = f32_counts;
  EXPECT_EMBER_ERROR(
      multi_tensor_adam_(params, grads, exp_avgs, exp_avgs, {}, {}, {.lr = 0.1}, f32_steps),
      "multi_tensor_adam_: device steps[0] must be a 0-d i64 tensor");
  const std::vector<int64_t> host_steps = {1, 1};
  const std::vector<Tensor> i64_counts = {zeros({}, kI64), zeros({}, kI64)};
  both_steps.steps = i64_counts;
  EXPECT_EMBER_ERROR(multi_tensor_adam_(params, grads, exp_avgs, exp_avgs, {}, host_steps,
                                        {.lr = 0.1}, both_steps),
                     "one list, one count per parameter");
}

// The passes read lr, 1 / scale and Adam's counts from the tensors (not the host numbers
// beside them), increment the counts, and change nothing where found_inf is set.
TEST(FusedGradScaling, DeviceInputsReplaceTheHostValues) {
  for (const DType dtype : {kF32, kF64}) {
    SCOPED_TRACE(dtype);
    std::vector<Tensor> host = make_params({{7}, {3, 4}}, dtype, kCPU, 9);
    std::vector<Tensor> device = clone_params(host, kCPU);
    std::vector<Tensor> grads, scaled, m1, v1, m2, v2;
    for (const Tensor& p : host) {
      grads.push_back(randn(p.sizes(), TensorOptions(dtype)));
      scaled.push_back(grads.back() * 4.0);
      for (auto* list : {&m1, &v1, &m2, &v2}) list->push_back(zeros_like(p));
    }
    MultiTensorDeviceArgs args;
    args.lr = scalar_tensor(0.3, kF64);
    args.inv_scale = full({}, 0.25f);
    args.found_inf = zeros({});
    multi_tensor_sgd_(host, grads, {}, {}, {.lr = 0.3});
    multi_tensor_sgd_(device, scaled, {}, {}, {.lr = 99.0}, args);
    expect_bit_identical(host, device);

    const std::vector<int64_t> fifth = {5, 5};
    const std::vector<Tensor> counts = {full({}, 4, kI64), full({}, 4, kI64)};
    args.steps = counts;
    multi_tensor_adam_(host, grads, m1, v1, {}, fifth, {.lr = 0.3, .weight_decay = 0.1});
    multi_tensor_adam_(device, scaled, m2, v2, {}, {}, {.lr = 99.0, .weight_decay = 0.1}, args);
    expect_bit_identical(host, device);
    expect_bit_identical(m1, m2);
    EXPECT_EQ(counts[0].item<int64_t>(), 5);

    args.found_inf.fill_(1.0);
    const std::vector<Tensor> before = clone_params(device, kCPU);
    multi_tensor_adam_(device, scaled, m2, v2, {}, {}, {.lr = 0.3}, args);
    args.steps = {};
    multi_tensor_sgd_(device, scaled, {}, {}, {.lr = 0.3}, args);
    expect_bit_identical(device, before);
    expect_bit_identical(m1, m2);
    EXPECT_EQ(counts[1].item<int64_t>(), 5);
  }
}

TEST(FusedGradScaling, DeviceInputsOnAnotherDeviceAreRefused) {
  EMBER_REQUIRE_CUDA();
  std::vector<Tensor> params = make_params({{3}}, kF32, kCPU, 2);
  const std::vector<Tensor> grads = {ones({3})};
  MultiTensorDeviceArgs elsewhere;
  elsewhere.found_inf = zeros({}, TensorOptions(kF32, cuda_device(0)));
  EXPECT_EMBER_ERROR(multi_tensor_sgd_(params, grads, {}, {}, {.lr = 0.1}, elsewhere),
                     "multi_tensor_sgd_: found_inf is on cuda:0 but the parameters are on cpu");
}

// Capturable (lr and Adam's step counts on the device) against the per-parameter path under a
// schedule that changes lr every step: bit for bit on the CPU in f32 and f64, the state dict
// holding the same keys and counts, and a capturable optimizer restored from it goes on alike.
void check_capturable(DType dtype) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    TwoRuns runs(c, dtype, std::nullopt);
    auto& [reference, captured, per_param, capturable] = runs;
    capturable->set_capturable(true);  // the multi-tensor pass on the CPU too
    StepLR schedule_a(*per_param, 1, 0.9), schedule_b(*capturable, 1, 0.9);
    for (int step = 0; step < 20; ++step) {
      set_grads(reference, captured, step);
      per_param->step();
      capturable->step();
      schedule_a.step();
      schedule_b.step();
    }
    expect_bit_identical(reference, captured);
    expect_same_state(*per_param, *capturable);
    if (capturable->name() != "SGD") {
      EXPECT_TRUE(capturable->state(0, 0).device_step.defined());
      EXPECT_EQ(capturable->state(0, 0).step_count(), per_param->state(0, 0).step);
    }

    std::vector<Tensor> resumed = clone_params(captured, kCPU);
    auto restored = c.make(two_groups(resumed), std::nullopt);
    restored->set_capturable(true);
    restored->load_state_dict(capturable->state_dict());
    StepLR schedule_c(*restored, 1, 0.9);
    for (int step = 20; step < 25; ++step) {
      set_grads(captured, resumed, step);
      capturable->step();
      restored->step();
      schedule_b.step();
      schedule_c.step();
      for (size_t g = 0; g < 2; ++g)  // the schedule restarts from the restored lr
        restored->param_groups()[g].set_lr(capturable->param_groups()[g].lr());
    }
    expect_bit_identical(captured, resumed);
    expect_same_state(*capturable, *restored);
  }
}

TEST(CapturableOptimizer, EqualsPerParameterUnderAnLrScheduleF32) { check_capturable(kF32); }
TEST(CapturableOptimizer, EqualsPerParameterUnderAnLrScheduleF64) { check_capturable(kF64); }

// Adam's counts leave the device when a parameter leaves the pass (foreach = false after a
// capturable run is not possible, but a state dict of device counts loads into the
// per-parameter path and counts on from there).
TEST(CapturableOptimizer, DeviceCountsLoadIntoThePerParameterPath) {
  std::vector<Tensor> pa = make_params({{4}, {3}}, kF32, kCPU, 3);
  std::vector<Tensor> pb = clone_params(pa, kCPU);
  AdamW capturable(pa, {.lr = 0.01, .capturable = true});
  AdamW plain(pb, {.lr = 0.01, .foreach = false});
  for (int step = 0; step < 3; ++step) {
    set_grads(pa, pb, step);
    capturable.step();
    plain.step();
  }
  AdamW reloaded(clone_params(pa, kCPU), {.lr = 0.01, .foreach = false});
  reloaded.load_state_dict(capturable.state_dict());
  expect_same_state(reloaded, plain);
  EXPECT_FALSE(reloaded.state(0, 0).device_step.defined());
  EXPECT_EQ(reloaded.state(0, 0).step, plain.state(0, 0).step);
}

// On a GPU: a capturable AdamW's and SGD's step captured once in a CUDA graph and replayed 20
// times, the lr changing before every replay (prepare_capturable), a step with an inf
// gradient skipped on the device, against eager per-parameter steps.
TEST(CapturableOptimizer, CudaGraphReplayEqualsEagerSteps) {
  EMBER_REQUIRE_CUDA();
  const Device gpu = cuda_device(0);
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> reference = make_params(param_shapes(true), kF32, gpu, 7);
    std::vector<Tensor> captured = clone_params(reference, gpu);
    auto eager = c.make(two_groups(reference), false);
    auto graphed = c.make(two_groups(captured), std::nullopt);
    graphed->set_capturable(true);
    // Static gradients and scaling inputs: each replay reads what they hold.
    std::vector<Tensor> grads;
    for (Tensor& p : captured) {
      grads.push_back(zeros_like(p));
      p.set_grad(grads.back());
    }
    const Tensor inv_scale = full({}, 0.25f, TensorOptions(kF32, gpu));
    Tensor found_inf = zeros({}, TensorOptions(kF32, gpu));
    // Step `step`'s gradients (the graphed ones times grad_factor) and lr.
    auto set_step = [&](int step, double grad_factor) {
      Generator gen(2000 + static_cast<uint64_t>(step));
      for (size_t k = 0; k < reference.size(); ++k) {
        const Tensor g = randn(reference[k].sizes(), TensorOptions(kF32, gpu), &gen);
        reference[k].set_grad(g.clone());
        grads[k].copy_(g * grad_factor);
      }
      for (size_t g = 0; g < 2; ++g) {
        const double lr = 0.01 * (1.0 + 0.1 * step) * static_cast<double>(g + 1);
        eager->param_groups()[g].set_lr(lr);
        graphed->param_groups()[g].set_lr(lr);
      }
    };
    set_step(0, 1.0);
    eager->step();
    graphed->step();  // warm-up: the state exists before the capture
    cuda::CUDAGraph graph;
    graphed->prepare_capturable();
    cuda::capture(graph, [&] { graphed->step({inv_scale, found_inf}); });
    for (int step = 1; step < 20; ++step) {
      set_step(step, 4.0);  // scaled by 1 / inv_scale
      const bool bad = step == 7;
      found_inf.fill_(bad ? 1.0 : 0.0);
      if (!bad) eager->step();
      graphed->prepare_capturable();
      graph.replay();
    }
    expect_close_on_device(captured, reference, 1e-5, 1e-6);
  }
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
