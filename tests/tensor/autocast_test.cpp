// Autocast (torch.autocast): the op policy table, guard nesting, the weight-cast cache,
// gradients through the casts, and a ResNet block's training step under CPU bf16 autocast
// against the f32 step and against PyTorch 1.13's torch.autocast("cpu", torch.bfloat16).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ember/tensor/detail/autocast_policy.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using detail::AutocastOp;
using detail::CastPolicy;
using testing::expect_close;

constexpr DType kLowTypes[] = {kBF16, kF16};

// Unit roundoff of a dtype: half the distance from 1 to the next value.
double unit_roundoff(DType t) {
  switch (t) {
    case kBF16:
      return std::ldexp(1.0, -8);
    case kF16:
      return std::ldexp(1.0, -11);
    case kF32:
      return std::ldexp(1.0, -24);
    default:
      return std::ldexp(1.0, -53);
  }
}

// |a - b| <= tol * max|b| elementwise: the absolute error a low-precision computation leaves
// on every entry, small ones included, scales with the largest values it combined.
void expect_close_to_scale(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  ASSERT_EQ(av.size(), bv.size()) << what;
  double scale = 0;
  for (const double v : bv) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < av.size(); ++i)
    EXPECT_LE(std::abs(av[i] - bv[i]), tol * scale) << what << " at " << i;
}

Tensor input(const Shape& shape, uint64_t seed, DType dtype = kF32, double low = -1.0,
             double high = 1.0) {
  Generator gen(seed);
  return uniform(shape, low, high, kF32, &gen).to(dtype);
}

// One call of each autocast-aware op, on inputs of `dtype` (plus f32 parameters where the op
// takes them), named as in the policy table.
std::map<std::string, std::function<Tensor(DType, Device)>> op_calls() {
  std::map<std::string, std::function<Tensor(DType, Device)>> calls;
  const auto in = [](const Shape& s, uint64_t seed, DType t, Device d) {
    return input(s, seed, t).to(d);
  };
  const auto target = [](Device d) { return from_vector<int64_t>({0, 2, 1}, {3}).to(d); };
  calls["conv2d"] = [=](DType t, Device d) {
    return conv2d(in({2, 3, 5, 5}, 1, t, d), in({4, 3, 3, 3}, 2, kF32, d), in({4}, 3, kF32, d));
  };
  calls["linear"] = [=](DType t, Device d) {
    return linear(in({3, 4}, 4, t, d), in({5, 4}, 5, kF32, d), in({5}, 6, kF32, d));
  };
  calls["matmul"] = [=](DType t, Device d) {
    return matmul(in({2, 3, 4}, 7, t, d), in({4, 5}, 8, kF32, d));
  };
  calls["mm"] = [=](DType t, Device d) { return mm(in({3, 4}, 9, t, d), in({4, 2}, 10, kF32, d)); };
  calls["bmm"] = [=](DType t, Device d) {
    return bmm(in({2, 3, 4}, 11, t, d), in({2, 4, 2}, 12, kF32, d));
  };
  calls["addmm"] = [=](DType t, Device d) {
    return addmm(in({2}, 13, kF32, d), in({3, 4}, 14, t, d), in({4, 2}, 15, kF32, d));
  };
  calls["softmax"] = [=](DType t, Device d) { return softmax(in({3, 4}, 16, t, d), 1); };
  calls["log_softmax"] = [=](DType t, Device d) { return log_softmax(in({3, 4}, 17, t, d), 1); };
  calls["exp"] = [=](DType t, Device d) { return exp(in({3, 4}, 18, t, d)); };
  calls["log"] = [=](DType t, Device d) { return log(in({3, 4}, 19, t, d) + 2.0); };
  calls["pow"] = [=](DType t, Device d) { return pow(in({3, 4}, 20, t, d), 2.0); };
  calls["rsqrt"] = [=](DType t, Device d) { return rsqrt(in({3, 4}, 21, t, d) + 2.0); };
  calls["sum"] = [=](DType t, Device d) { return sum(in({3, 4}, 22, t, d)); };
  calls["norm"] = [=](DType t, Device d) { return norm(in({3, 4}, 23, t, d)); };
  calls["cross_entropy"] = [=](DType t, Device d) {
    return cross_entropy(in({3, 4}, 24, t, d), target(d));
  };
  calls["nll_loss"] = [=](DType t, Device d) { return nll_loss(in({3, 4}, 25, t, d), target(d)); };
  calls["mse_loss"] = [=](DType t, Device d) {
    return mse_loss(in({3, 4}, 26, t, d), in({3, 4}, 27, t, d));
  };
  calls["l1_loss"] = [=](DType t, Device d) {
    return l1_loss(in({3, 4}, 28, t, d), in({3, 4}, 29, t, d));
  };
  calls["smooth_l1_loss"] = [=](DType t, Device d) {
    return smooth_l1_loss(in({3, 4}, 30, t, d), in({3, 4}, 31, t, d));
  };
  calls["binary_cross_entropy_with_logits"] = [=](DType t, Device d) {
    return binary_cross_entropy_with_logits(in({3, 4}, 32, t, d), input({3, 4}, 33, t, 0, 1).to(d));
  };
  // Promote: one low-precision and one f32 input give f32.
  calls["cat"] = [=](DType t, Device d) {
    return cat({in({2, 4}, 34, t, d), in({1, 4}, 35, kF32, d)});
  };
  calls["stack"] = [=](DType t, Device d) {
    return stack({in({2, 4}, 36, t, d), in({2, 4}, 37, kF32, d)});
  };
  calls["scatter_add"] = [=](DType t, Device d) {
    return scatter_add(in({2, 4}, 38, t, d), 1, from_vector<int64_t>({0, 1, 2, 3}, {1, 4}).to(d),
                       in({1, 4}, 39, kF32, d));
  };
  // attention
  calls["scaled_dot_product_attention"] = [=](DType t, Device d) {
    return scaled_dot_product_attention(in({2, 3, 4}, 45, t, d), in({2, 5, 4}, 46, kF32, d),
                                        in({2, 5, 3}, 47, kF32, d));
  };
  // GPT layers: a low-precision input with f32 parameters runs in f32.
  calls["layer_norm"] = [=](DType t, Device d) {
    return layer_norm(in({3, 4}, 40, t, d), {4}, in({4}, 41, kF32, d), in({4}, 42, kF32, d));
  };
  return calls;
}

// PyTorch's CUDA autocast lists (torch.amp docs), which ember applies on both device types.
const std::map<std::string, CastPolicy>& pytorch_cuda_lists() {
  static const std::map<std::string, CastPolicy> lists = [] {
    std::map<std::string, CastPolicy> m;
    for (const char* op : {"conv2d", "linear", "matmul", "mm", "bmm", "addmm"})
      m[op] = CastPolicy::kLowerPrecision;
    for (const char* op :
         {"softmax", "log_softmax", "exp", "log", "pow", "rsqrt", "sum", "norm", "cross_entropy",
          "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "binary_cross_entropy_with_logits"})
      m[op] = CastPolicy::kFloat32;
    for (const char* op : {"cat", "stack", "scatter_add"}) m[op] = CastPolicy::kPromote;
    // attention (torch 2's CUDA list; the op is newer than 1.13)
    m["scaled_dot_product_attention"] = CastPolicy::kLowerPrecision;
    m["layer_norm"] = CastPolicy::kFloat32;  // GPT layers
    return m;
  }();
  return lists;
}

TEST(Autocast, TableHoldsPyTorchsLists) {
  ASSERT_EQ(detail::autocast_rules().size(), pytorch_cuda_lists().size());
  for (const detail::AutocastRule& rule : detail::autocast_rules()) {
    const auto expected = pytorch_cuda_lists().find(std::string(rule.name));
    ASSERT_NE(expected, pytorch_cuda_lists().end()) << rule.name;
    EXPECT_EQ(static_cast<int>(rule.policy), static_cast<int>(expected->second)) << rule.name;
  }
}

// Every row of the table, run under a guard for `low`: the output dtype its policy promises.
void expect_policy_table(Device device) {
  const auto calls = op_calls();
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    AutocastGuard guard(device, low);
    for (const detail::AutocastRule& rule : detail::autocast_rules()) {
      SCOPED_TRACE(std::string(rule.name));
      const auto call = calls.find(std::string(rule.name));
      ASSERT_NE(call, calls.end()) << "the test has no call for table row " << rule.name;
      switch (rule.policy) {
        case CastPolicy::kLowerPrecision:
          // f32 inputs (and parameters) run in the low dtype.
          EXPECT_EQ(call->second(kF32, device).dtype(), low);
          break;
        case CastPolicy::kFloat32:
          // Low-precision inputs run in f32.
          EXPECT_EQ(call->second(low, device).dtype(), kF32);
          break;
        case CastPolicy::kPromote:
          EXPECT_EQ(call->second(low, device).dtype(), kF32);
          break;
      }
    }
    EXPECT_EQ(calls.size(), detail::autocast_rules().size()) << "a call for an op not in the table";
  }
}

TEST(Autocast, PolicyTableOnCpu) { expect_policy_table(kCPU); }

TEST(Autocast, PolicyTableOnCuda) {
  EMBER_REQUIRE_CUDA();
  expect_policy_table(cuda_device());
}

TEST(Autocast, UnlistedOpsKeepTheirInputsDtypeAndMixedInputsPromote) {
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    AutocastGuard guard(kCPU, low);
    const Tensor h = input({2, 3, 4, 4}, 40, low), f = input({2, 3, 4, 4}, 41);
    EXPECT_EQ(relu(h).dtype(), low);
    EXPECT_EQ(mean(h).dtype(), low);  // mean is on no list (PyTorch's CUDA list neither)
    EXPECT_EQ(max_pool2d(h, {2, 2}).dtype(), low);
    EXPECT_EQ(adaptive_avg_pool2d(h, {1, 1}).dtype(), low);
    EXPECT_EQ(add(h, f).dtype(), kF32);  // ordinary type promotion
    EXPECT_EQ((h * f).dtype(), kF32);
    EXPECT_EQ(add(h, 1.5).dtype(), low);
    // batch_norm: low input, f32 parameters and statistics; output in the input's dtype.
    Tensor rm = zeros({3}), rv = ones({3});
    const Tensor bn = batch_norm(h, ones({3}), zeros({3}), rm, rv, true);
    EXPECT_EQ(bn.dtype(), low);
    EXPECT_EQ(rm.dtype(), kF32);
    EXPECT_GT(std::abs(rm.to_vector<float>()[0]), 0.0f);  // updated in place, in f32
    // f64 is never lowered (PyTorch leaves double alone).
    EXPECT_EQ(mm(input({2, 2}, 42, kF64), input({2, 2}, 43, kF64)).dtype(), kF64);
    EXPECT_EQ(exp(input({2, 2}, 44, kF64)).dtype(), kF64);
    // Integer inputs of f32 ops are not cast: exp gives f32 as it always does.
    EXPECT_EQ(sum(from_vector<int64_t>({1, 2})).dtype(), kI64);
  }
}

TEST(Autocast, OffOutsideTheGuardAndForOtherDeviceTypes) {
  const Tensor a = input({3, 4}, 50), b = input({4, 2}, 51);
  EXPECT_FALSE(is_autocast_enabled(DeviceType::kCPU));
  EXPECT_EQ(mm(a, b).dtype(), kF32);
  {
    AutocastGuard cuda_only(cuda_device(), kBF16);
    EXPECT_TRUE(is_autocast_enabled(DeviceType::kCUDA));
    EXPECT_FALSE(is_autocast_enabled(DeviceType::kCPU));
    EXPECT_EQ(mm(a, b).dtype(), kF32);  // CPU tensors: the CUDA guard does not apply
  }
  {
    AutocastGuard guard(kCPU, kBF16);
    EXPECT_EQ(mm(a, b).dtype(), kBF16);
  }
  EXPECT_FALSE(is_autocast_enabled(DeviceType::kCUDA));
  EXPECT_EQ(mm(a, b).dtype(), kF32);
}

TEST(Autocast, GuardsNestAndAnInnerDisabledGuardTurnsItOff) {
  const Tensor a = input({3, 4}, 52), b = input({4, 2}, 53);
  EXPECT_EQ(autocast_dtype(DeviceType::kCPU), kBF16);  // PyTorch's defaults
  EXPECT_EQ(autocast_dtype(DeviceType::kCUDA), kF16);
  AutocastGuard outer(kCPU, kBF16);
  EXPECT_EQ(mm(a, b).dtype(), kBF16);
  {
    AutocastGuard inner(kCPU, kF16);
    EXPECT_EQ(autocast_dtype(DeviceType::kCPU), kF16);
    EXPECT_EQ(mm(a, b).dtype(), kF16);
    {
      AutocastGuard off(kCPU, kBF16, /*enabled=*/false);  // torch.autocast(enabled=False)
      EXPECT_FALSE(is_autocast_enabled(DeviceType::kCPU));
      EXPECT_EQ(mm(a, b).dtype(), kF32);
      EXPECT_EQ(softmax(a.to(kBF16), 1).dtype(), kBF16);
    }
    EXPECT_TRUE(is_autocast_enabled(DeviceType::kCPU));
    EXPECT_EQ(mm(a, b).dtype(), kF16);
  }
  EXPECT_EQ(autocast_dtype(DeviceType::kCPU), kBF16);
  EXPECT_EQ(mm(a, b).dtype(), kBF16);
}

TEST(Autocast, RejectsDtypesOtherThanBf16AndF16) {
  EXPECT_EMBER_ERROR(AutocastGuard(kCPU, kF32), "AutocastGuard: autocast runs in bf16 or f16");
  EXPECT_EMBER_ERROR(AutocastGuard(kCPU, kI64), "got i64");
  AutocastGuard off(kCPU, kF32, /*enabled=*/false);  // a disabled guard takes any dtype
  EXPECT_FALSE(is_autocast_enabled(DeviceType::kCPU));
}

TEST(Autocast, StateIsPerThread) {
  AutocastGuard guard(kCPU, kBF16);
  bool other_thread_enabled = true;
  std::thread([&] { other_thread_enabled = is_autocast_enabled(DeviceType::kCPU); }).join();
  EXPECT_FALSE(other_thread_enabled);
  EXPECT_TRUE(is_autocast_enabled(DeviceType::kCPU));
}

TEST(Autocast, WeightCastsAreCachedUntilTheOutermostGuardExits) {
  Tensor w = input({5, 4}, 60).requires_grad_();
  const Tensor x = input({3, 4}, 61), activation = input({4, 5}, 62);
  {
    AutocastGuard outer(kCPU, kBF16);
    EXPECT_EQ(detail::autocast_cache_size(), 0u);
    const Tensor y1 = linear(x, w);
    const Tensor first = detail::autocast_cached_cast(w);
    ASSERT_TRUE(first.defined());
    EXPECT_EQ(first.dtype(), kBF16);
    const Tensor y2 = linear(x * 2.0, w);
    EXPECT_TRUE(detail::autocast_cached_cast(w).is_same(first)) << "the weight was cast twice";
    {
      AutocastGuard inner(kCPU, kBF16);  // a nested guard keeps the outer guard's cache
      linear(x, w);
      EXPECT_TRUE(detail::autocast_cached_cast(w).is_same(first));
    }
    EXPECT_EQ(detail::autocast_cache_size(), 1u);
    // Only leaves that require grad are cached: activations and non-leaves are cast per use.
    mm(x, activation);
    linear(x, w * 1.0);
    EXPECT_EQ(detail::autocast_cache_size(), 1u);
    // An in-place update of the weight (an optimizer step) invalidates its cast.
    {
      NoGradGuard no_grad;
      w.add_(1.0);
    }
    const Tensor y3 = linear(x, w);
    const Tensor recast = detail::autocast_cached_cast(w);
    EXPECT_FALSE(recast.is_same(first));
    expect_close(recast, w.detach().to(kBF16), 0, 0);
    EXPECT_EQ(detail::autocast_cache_size(), 1u);
    // New data under the same leaf (set_data, as model.to() does) recasts too.
    w.set_data(full({5, 4}, 0.5));
    linear(x, w);
    expect_close(detail::autocast_cached_cast(w), full({5, 4}, 0.5, kBF16), 0, 0);
    // A cast made under no_grad has no backward: a later use with grad on recasts.
    Tensor v = input({5, 4}, 63).requires_grad_();
    {
      NoGradGuard no_grad;
      linear(x, v);
    }
    const Tensor no_history = detail::autocast_cached_cast(v);
    const Tensor y4 = linear(x, v);
    EXPECT_FALSE(detail::autocast_cached_cast(v).is_same(no_history));
    EXPECT_TRUE(y4.requires_grad());
  }
  EXPECT_EQ(detail::autocast_cache_size(), 0u);
  EXPECT_FALSE(detail::autocast_cached_cast(w).defined());
}

TEST(Autocast, GradientsReachF32LeavesInF32ThroughCachedCasts) {
  Tensor w = input({5, 4}, 70).requires_grad_();
  Tensor b = input({5}, 71).requires_grad_();
  const Tensor x = input({3, 4}, 72);
  Tensor loss;
  {
    AutocastGuard guard(kCPU, kBF16);
    // The same weight twice: both uses share one cached cast, and both contribute.
    const Tensor y = linear(x, w, b) + linear(x * 0.5, w, b);
    EXPECT_EQ(y.dtype(), kBF16);
    loss = mse_loss(y, zeros({3, 5}));
    EXPECT_EQ(loss.dtype(), kF32);
  }
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_EQ(b.grad().dtype(), kF32);
  // The f32 reference: same formula without autocast.
  Tensor w32 = w.detach().clone().requires_grad_(), b32 = b.detach().clone().requires_grad_();
  mse_loss(linear(x, w32, b32) + linear(x * 0.5, w32, b32), zeros({3, 5})).backward();
  // Inputs, products and the output are rounded to bf16 (unit roundoff u = 2^-8); the
  // gradients inherit a few u of relative error.
  const double tol = 8 * unit_roundoff(kBF16);
  expect_close(w.grad(), w32.grad(), tol, tol);
  expect_close(b.grad(), b32.grad(), tol, tol);
}

TEST(Autocast, TrainingStepsInsideOneGuardReuseAndRefreshTheCachedCast) {
  // A loop of steps inside one guard, as `with autocast(): for ...` code does: each backward
  // reaches the weight through the cached cast, and an optimizer update recasts it.
  Tensor w = input({3, 4}, 75).requires_grad_();
  const Tensor x = input({2, 4}, 76);
  AutocastGuard guard(kCPU, kBF16);
  std::vector<Tensor> grads;
  for (int step = 0; step < 3; ++step) {
    w.set_grad(Tensor());
    sum(linear(x, w)).backward();
    ASSERT_TRUE(w.grad().defined()) << "step " << step;
    grads.push_back(w.grad().clone());
    if (step == 1) {
      NoGradGuard no_grad;
      w.sub_(w.grad(), 0.1);
    }
  }
  // d sum(x w^T) / dw = column sums of x (bf16, summed in f32 and rounded once by the bf16
  // product), whatever w is: the same each step.
  const Tensor expected = sum(x.to(kBF16).to(kF32), {0}, true).to(kBF16).to(kF32).expand({3, 4});
  for (const Tensor& g : grads) expect_close(g, expected, 1e-6, 1e-6);
  expect_close(detail::autocast_cached_cast(w), w.detach().to(kBF16), 0, 0);
}

TEST(Autocast, BackwardInsideTheGuardRunsInTheForwardsDtypes) {
  Tensor w = input({4, 4}, 73).requires_grad_();
  const Tensor x = input({2, 4}, 74);
  AutocastGuard guard(kCPU, kF16);
  const Tensor y = sum(relu(mm(x, w)));
  y.backward();
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_TRUE(is_autocast_enabled(DeviceType::kCPU));  // restored after backward
}

// |y - y32| <= k u (|a| @ |b|): the f32-accumulated product of inputs rounded to the low
// dtype, itself rounded once, against the f32 product.
TEST(Autocast, MatmulAndConvMatchF32WithinTheLowDtypesRounding) {
  const Tensor a = input({8, 64}, 80), b = input({64, 16}, 81);
  const Tensor x = input({2, 3, 6, 6}, 82), w = input({4, 3, 3, 3}, 83);
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    const double u = unit_roundoff(low);
    Tensor y, c;
    {
      AutocastGuard guard(kCPU, low);
      y = matmul(a, b);
      c = conv2d(x, w, {}, {1, 1}, {1, 1});
    }
    const auto check = [&](const Tensor& got, const Tensor& ref, const Tensor& bound) {
      const auto g = got.to_vector<double>(), r = ref.to_vector<double>(),
                 m = bound.to_vector<double>();
      for (size_t i = 0; i < g.size(); ++i)
        EXPECT_LE(std::abs(g[i] - r[i]), 3 * u * m[i] + 1e-6) << "at " << i;
    };
    check(y, matmul(a, b), matmul(abs(a), abs(b)));
    check(c, conv2d(x, w, {}, {1, 1}, {1, 1}), conv2d(abs(x), abs(w), {}, {1, 1}, {1, 1}));
  }
}

// f16 widens to f32 for sgemm: exactly the f32 product of the same values, rounded once. bf16
// runs on oneDNN's bf16 matmul where the CPU has bf16 instructions: the same f32 sums in
// another order, so within one rounding (2u relative) of that.
TEST(Autocast, CpuHalfPrecisionGemmRoundsTheF32ProductOnce) {
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    const double rtol = low == kF16 ? 0.0 : 2 * unit_roundoff(low);
    const Tensor a = input({5, 33}, 90, low), b = input({33, 7}, 91, low);
    const Tensor c = input({5, 7}, 92, low);
    const Tensor a32 = a.to(kF32), b32 = b.to(kF32), c32 = c.to(kF32);
    expect_close(mm(a, b), mm(a32, b32).to(low), rtol, 0);
    expect_close(mm(b.t(), a.t()), mm(b32.t(), a32.t()).to(low), rtol, 0);
    expect_close(addmm(c, a, b, 0.5, 2.0), addmm(c32, a32, b32, 0.5, 2.0).to(low), rtol, 0);
    const Tensor p = input({3, 4, 6}, 93, low), q = input({3, 6, 2}, 94, low);
    expect_close(bmm(p, q), bmm(p.to(kF32), q.to(kF32)).to(low), rtol, 0);
    expect_close(bmm(p.transpose(1, 2).contiguous().transpose(1, 2), q),
                 bmm(p.to(kF32), q.to(kF32)).to(low), rtol, 0);
    // A broadcast batch (stride 0, no grad: one gemm call) and an empty inner dim.
    const Tensor q1 = q.narrow(0, 1, 1);
    expect_close(matmul(p, q1), matmul(p.to(kF32), q1.to(kF32)).to(low), rtol, 0);
    expect_close(matmul(q1.transpose(1, 2), p.transpose(1, 2)),
                 matmul(q1.to(kF32).transpose(1, 2), p.to(kF32).transpose(1, 2)).to(low), rtol, 0);
    expect_close(mm(empty({2, 0}, low), empty({0, 3}, low)), zeros({2, 3}, low), 0, 0);
  }
}

// bf16 convolution (oneDNN's bf16 kernels where the CPU has them, f32 copies elsewhere) and
// f16 convolution (f32 copies): the f32 sums of the same rounded values, rounded once, so
// within one rounding (2u relative: the f32 sums may round to the neighbouring value).
TEST(Autocast, CpuHalfPrecisionConvolutionRoundsTheF32SumsOnce) {
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    const double u = unit_roundoff(low);
    const Tensor x = input({3, 4, 7, 7}, 95, low), w = input({6, 4, 3, 3}, 96, low);
    const Tensor b = input({6}, 97, low), g = input({3, 6, 4, 4}, 98, low);
    Tensor xl = x.clone().requires_grad_(), wl = w.clone().requires_grad_(),
           bl = b.clone().requires_grad_();
    const Tensor y = conv2d(xl, wl, bl, {2, 2}, {1, 1});
    EXPECT_EQ(y.dtype(), low);
    sum(y.to(kF32) * g.to(kF32)).backward();
    Tensor x32 = x.to(kF32).requires_grad_(), w32 = w.to(kF32).requires_grad_(),
           b32 = b.to(kF32).requires_grad_();
    const Tensor y32 = conv2d(x32, w32, b32, {2, 2}, {1, 1});
    sum(y32 * g.to(kF32)).backward();
    expect_close(y, y32.to(low), 2 * u, 1e-6);
    expect_close(xl.grad(), x32.grad().to(low), 2 * u, 1e-6);
    expect_close(wl.grad(), w32.grad().to(low), 2 * u, 1e-6);
    expect_close(bl.grad(), b32.grad().to(low), 2 * u, 1e-6);
  }
}

TEST(Autocast, BatchNormTakesLowPrecisionInputWithF32Parameters) {
  const Tensor x32 = input({4, 3, 5, 5}, 100, kF32, -2, 3);
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    const Tensor x = x32.to(low).requires_grad_();
    Tensor w = input({3}, 101, kF32, 0.5, 1.5).requires_grad_();
    Tensor b = input({3}, 102).requires_grad_();
    Tensor rm = zeros({3}), rv = ones({3});
    const Tensor y = batch_norm(x, w, b, rm, rv, true);
    EXPECT_EQ(y.dtype(), low);
    const Tensor g = input({4, 3, 5, 5}, 103);
    sum(y.to(kF32) * g).backward();
    EXPECT_EQ(x.grad().dtype(), low);
    EXPECT_EQ(w.grad().dtype(), kF32);
    EXPECT_EQ(b.grad().dtype(), kF32);
    // The f32 reference on the same (rounded) input values.
    Tensor xr = x.detach().to(kF32).requires_grad_();
    Tensor wr = w.detach().clone().requires_grad_(), br = b.detach().clone().requires_grad_();
    Tensor rm32 = zeros({3}), rv32 = ones({3});
    const Tensor yr = batch_norm(xr, wr, br, rm32, rv32, true);
    // The low-precision run's output gradient reaches batch norm rounded to its dtype (the
    // cast's backward): the reference starts from the same rounded values.
    sum(yr * g.to(low).to(kF32)).backward();
    const double u = unit_roundoff(low);
    expect_close(y.to(kF32), yr, 2 * u, 4 * u);  // statistics in f32+: one output rounding
    expect_close(rm, rm32, 1e-6, 1e-6);
    expect_close(rv, rv32, 1e-6, 1e-6);
    expect_close(w.grad(), wr.grad(), 1e-5, 1e-5);
    expect_close(b.grad(), br.grad(), 1e-5, 1e-5);
    expect_close(x.grad().to(kF32), xr.grad(), 2 * u, 4 * u);
    // Eval mode, with a backward through the running statistics.
    Tensor we = w.detach().clone().requires_grad_();
    const Tensor ye = batch_norm(x, we, b.detach(), rm, rv, false);
    EXPECT_EQ(ye.dtype(), low);
    sum(ye.to(kF32) * g).backward();
    EXPECT_EQ(we.grad().dtype(), kF32);
  }
  // Parameters of another dtype are still refused where the input is f32.
  EXPECT_EMBER_ERROR(batch_norm(x32, ones({3}, kBF16), zeros({3}), {}, {}, true),
                     "weight has dtype bf16 but input has f32");
}

// ---------------------------------------------------------------------------------------
// A ResNet basic block with a projection shortcut, one training step (forward, loss,
// backward), as tests/tensor/golden/make_autocast_golden.py runs it in PyTorch.

const nlohmann::json& golden() {
  static const nlohmann::json data = [] {
    std::ifstream in(EMBER_AUTOCAST_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_AUTOCAST_GOLDEN;
    return nlohmann::json::parse(in);
  }();
  return data;
}

Tensor from_json(const nlohmann::json& j) {
  return from_vector(j.at("values").get<std::vector<double>>(), j.at("shape").get<Shape>())
      .to(kF32);
}

struct BlockStep {
  Tensor logits, loss;
  std::map<std::string, Tensor> params, stats;
};

const char* const kParamNames[] = {"conv1.weight", "bn1.weight", "bn1.bias",     "conv2.weight",
                                   "bn2.weight",   "bn2.bias",   "conv3.weight", "bn3.weight",
                                   "bn3.bias",     "fc.weight",  "fc.bias"};

// Runs the step on `device`, under an autocast guard for `low` unless it is f32.
BlockStep run_block(Device device, DType low) {
  const nlohmann::json& g = golden();
  BlockStep s;
  for (const char* name : kParamNames)
    s.params[name] = from_json(g.at("inputs").at(name)).to(device).requires_grad_();
  for (const char* bn : {"bn1", "bn2", "bn3"}) {
    s.stats[std::string(bn) + ".running_mean"] = zeros({8}, {kF32, device});
    s.stats[std::string(bn) + ".running_var"] = ones({8}, {kF32, device});
  }
  const Tensor x = from_json(g.at("inputs").at("x")).to(device);
  const Tensor target = from_vector(g.at("target").get<std::vector<int64_t>>()).to(device);
  auto& p = s.params;
  const auto bn = [&](const Tensor& h, const std::string& name) {
    return batch_norm(h, p[name + ".weight"], p[name + ".bias"], s.stats[name + ".running_mean"],
                      s.stats[name + ".running_var"], true, 0.1, 1e-5);
  };
  {
    AutocastGuard guard(device, low == kF32 ? kBF16 : low, /*enabled=*/low != kF32);
    Tensor h = relu(bn(conv2d(x, p["conv1.weight"], {}, {1, 1}, {1, 1}), "bn1"));
    h = bn(conv2d(h, p["conv2.weight"], {}, {1, 1}, {1, 1}), "bn2");
    const Tensor sc = bn(conv2d(x, p["conv3.weight"]), "bn3");
    const Tensor y = relu(h + sc);
    const Tensor pooled = adaptive_avg_pool2d(y, {1, 1}).flatten(1);
    s.logits = linear(pooled, p["fc.weight"], p["fc.bias"]);
    s.loss = cross_entropy(s.logits, target);
  }
  s.loss.backward();
  return s;
}

TEST(AutocastResNetBlock, Bf16StepHasPyTorchsDtypes) {
  const BlockStep s = run_block(kCPU, kBF16);
  EXPECT_EQ(s.logits.dtype(), kBF16);
  EXPECT_EQ(s.loss.dtype(), kF32);
  for (const auto& [name, param] : s.params) {
    EXPECT_EQ(param.dtype(), kF32) << name;
    ASSERT_TRUE(param.grad().defined()) << name;
    EXPECT_EQ(param.grad().dtype(), kF32) << name;
  }
  for (const auto& [name, stat] : s.stats) EXPECT_EQ(stat.dtype(), kF32) << name;
}

// Tolerances, in units of bf16's unit roundoff u = 2^-8: values of order 1 pass through five
// layers, each rounding to the low dtype, and the gradients back through them again, so the
// errors add up (about 10u on the deepest gradients here). Loss: loss_k * u relative; tensors:
// |d| <= k * u * max|reference| elementwise.
void expect_step_close(const BlockStep& got, const BlockStep& ref, double k, double loss_k) {
  const double u = unit_roundoff(kBF16);
  EXPECT_NEAR(got.loss.item<double>(), ref.loss.item<double>(),
              loss_k * u * std::abs(ref.loss.item<double>()));
  const auto close = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    expect_close_to_scale(a, b, k * u, what);
  };
  close(got.logits.to(kF32), ref.logits.to(kF32), "logits");
  for (const auto& [name, param] : ref.params)
    close(got.params.at(name).grad(), param.grad(), name);
  for (const auto& [name, stat] : ref.stats) close(got.stats.at(name), stat, name);
}

TEST(AutocastResNetBlock, Bf16StepMatchesTheF32Step) {
  expect_step_close(run_block(kCPU, kBF16), run_block(kCPU, kF32), 16, 8);
}

TEST(AutocastResNetBlock, F16StepMatchesTheF32Step) {
  // f16 has 3 more mantissa bits than bf16: the bf16-derived bound is loose by 8x.
  expect_step_close(run_block(kCPU, kF16), run_block(kCPU, kF32), 4, 2);
}

TEST(AutocastResNetBlock, Bf16StepMatchesPyTorchCpuAutocast) {
  const nlohmann::json& g = golden();
  const BlockStep s = run_block(kCPU, kBF16);
  // Both sides round the same f32 sums to bf16 at the same places (oneDNN's bf16 kernels in
  // PyTorch, f32 compute rounded once in ember), in other summation orders: the forward agrees
  // to within one bf16 rounding (the logits come out identical here) and the gradients within
  // 3u of their largest entry. An f32 step (no autocast) misses the deepest gradients by
  // about 12u, a bf16 step that rounds at other places by as much, so this pins the policy.
  const double u = unit_roundoff(kBF16);
  EXPECT_NEAR(s.loss.item<double>(), g.at("loss").get<double>(), u * g.at("loss").get<double>());
  expect_close_to_scale(s.logits, from_json(g.at("logits")), u, "logits");
  for (const char* name : kParamNames)
    expect_close_to_scale(s.params.at(name).grad(), from_json(g.at("grads").at(name)), 3 * u, name);
  for (const auto& [name, stat] : s.stats)
    expect_close_to_scale(stat, from_json(g.at("running").at(name)), u, name);
}

TEST(AutocastResNetBlock, CudaBf16AndF16StepsMatchTheCpu) {
  EMBER_REQUIRE_CUDA();
  for (const DType low : kLowTypes) {
    SCOPED_TRACE(dtype_name(low));
    BlockStep gpu = run_block(cuda_device(), low);
    expect_step_close(gpu, run_block(kCPU, low), 8, 8);
  }
}

}  // namespace
}  // namespace ember
