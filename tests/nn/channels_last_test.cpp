// channels_last (NHWC) against NCHW through conv2d, batch_norm, relu, add and pooling, forward
// and backward, and a whole ResNet-20 step: the same values, with outputs and gradients that
// keep channels_last strides. CUDA variants run where a GPU is visible.
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "test_util.h"

namespace ember {
namespace {

constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;

bool is_cl(const Tensor& t) { return t.is_contiguous(kCL) && !t.is_contiguous(); }

// Runs `op` on NCHW leaves and on their channels_last copies; returns outputs and gradients
// (of sum(out * probe)) of both, for the caller's comparison.
struct Outcome {
  Tensor out;
  std::vector<Tensor> grads;
};

Outcome run(const std::function<Tensor(const std::vector<Tensor>&)>& op, std::vector<Tensor> inputs,
            const Tensor& probe) {
  for (Tensor& t : inputs) t.requires_grad_();
  Outcome r;
  r.out = op(inputs);
  (r.out * probe).sum().backward();
  for (const Tensor& t : inputs) r.grads.push_back(t.grad());
  return r;
}

// Leaves in both layouts (4-d ones channels_last in the second), same values.
std::pair<std::vector<Tensor>, std::vector<Tensor>> both_layouts(const std::vector<Tensor>& ts) {
  std::vector<Tensor> nchw, nhwc;
  for (const Tensor& t : ts) {
    nchw.push_back(t.clone());
    nhwc.push_back(t.dim() == 4 ? t.clone().to(kCL) : t.clone());
  }
  return {nchw, nhwc};
}

// Compares NCHW and NHWC runs: values within `tol` (0: bitwise), NHWC outputs and the
// gradients of 4-d inputs channels_last.
void compare(const std::function<Tensor(const std::vector<Tensor>&)>& op,
             const std::vector<Tensor>& inputs, double tol, Device device = kCPU) {
  std::vector<Tensor> on_device;
  for (const Tensor& t : inputs) on_device.push_back(t.to(device));
  auto [nchw, nhwc] = both_layouts(on_device);
  const Tensor probe_shape = op(nchw).detach();
  const Tensor probe = randn(probe_shape.sizes(), probe_shape.options());
  const Outcome a = run(op, nchw, probe);
  const Outcome b = run(op, nhwc, probe.dim() == 4 ? probe.to(kCL) : probe);
  if (a.out.dim() == 4) {
    EXPECT_TRUE(is_cl(b.out) || b.out.is_contiguous(kCL)) << shape_str(b.out.strides());
  }
  auto check = [&](const Tensor& x, const Tensor& y, const std::string& what) {
    if (tol == 0) {
      EXPECT_TRUE(equal(x.cpu(), y.cpu())) << what;
    } else {
      EXPECT_TRUE(allclose(x.cpu(), y.cpu(), tol, tol)) << what;
    }
  };
  check(a.out, b.out, "output");
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(b.grads[i].defined());
    check(a.grads[i], b.grads[i], "grad " + std::to_string(i));
    if (inputs[i].dim() == 4) {
      EXPECT_TRUE(b.grads[i].is_contiguous(kCL))
          << "grad " << i << " strides " << shape_str(b.grads[i].strides());
    }
  }
}

TEST(ChannelsLast, Conv2dForwardAndBackward) {
  manual_seed(1);
  const auto conv = [](const std::vector<Tensor>& x) {
    return conv2d(x[0], x[1], x[2], {2, 1}, {1, 1});
  };
  // f64 runs im2col (NCHW) through explicit conversions: bitwise. f32 runs oneDNN's nhwc
  // kernels against its blocked ones: a different summation order.
  compare(conv, {randn({2, 3, 7, 6}, kF64), randn({4, 3, 3, 3}, kF64), randn({4}, kF64)}, 0);
  compare(conv, {randn({2, 3, 7, 6}), randn({4, 3, 3, 3}), randn({4})}, 1e-5);
  // Grouped, and a 1-channel input (dense in both layouts).
  compare(
      [](const auto& x) {
        return conv2d(x[0], x[1], {}, {1, 1}, {1, 1}, {1, 1}, 2);
      },
      {randn({2, 4, 5, 5}), randn({6, 2, 3, 3})}, 1e-5);
  compare(
      [](const auto& x) {
        return conv2d(x[0], x[1], {}, {1, 1}, {1, 1});
      },
      {randn({3, 1, 6, 6}), randn({5, 1, 3, 3})}, 1e-5);
}

TEST(ChannelsLast, Conv2dBf16) {
  // bf16 rounds each output once in both layouts; the f32 sums differ in order only.
  compare(
      [](const auto& x) {
        return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1});
      },
      {randn({2, 8, 6, 6}, kBF16), randn({4, 8, 3, 3}, kBF16), randn({4}, kBF16)}, 2e-2);
}

TEST(ChannelsLast, ConversionsAreDifferentiable) {
  const Tensor x = randn({2, 3, 4, 5}).requires_grad_();
  const Tensor y = x.to(kCL);
  EXPECT_TRUE(is_cl(y));
  (y * 2.0).sum().backward();
  EXPECT_TRUE(x.grad().is_contiguous());  // the leaf's own layout
  EXPECT_TRUE(equal(x.grad(), full({2, 3, 4, 5}, 2.0)));
  const Tensor z = randn({2, 3, 4, 5}).to(kCL).requires_grad_();
  (z.contiguous() * 3.0).sum().backward();
  EXPECT_TRUE(is_cl(z.grad()));
  EXPECT_TRUE(equal(z.grad(), full({2, 3, 4, 5}, 3.0)));
}

TEST(ChannelsLast, ConvOutputFollowsInputOrWeight) {
  const Tensor x = randn({2, 3, 6, 6}), w = randn({4, 3, 3, 3});
  EXPECT_TRUE(is_cl(conv2d(x.to(kCL), w)));
  EXPECT_TRUE(is_cl(conv2d(x, w.to(kCL))));  // as PyTorch: either operand decides
  EXPECT_TRUE(conv2d(x, w).is_contiguous());
  EXPECT_TRUE(allclose(conv2d(x, w.to(kCL)), conv2d(x, w), 1e-5, 1e-5));
}

TEST(ChannelsLast, BatchNormTrainingAndEval) {
  manual_seed(2);
  for (const bool training : {true, false}) {
    const Tensor rm = randn({3}, kF64), rv = rand({3}, kF64) + 0.5;
    Tensor rm_a = rm.clone(), rv_a = rv.clone(), rm_b = rm.clone(), rv_b = rv.clone();
    bool first = true;
    const auto bn = [&](const std::vector<Tensor>& x) {
      Tensor& m = first ? rm_a : rm_b;
      Tensor& v = first ? rv_a : rv_b;
      return batch_norm(x[0], x[1], x[2], m, v, training, 0.1, 1e-5);
    };
    // Channel sums run over rows of C instead of planes: f64 within rounding.
    std::vector<Tensor> in{randn({4, 3, 5, 7}, kF64) * 3 + 1, randn({3}, kF64), randn({3}, kF64)};
    auto [nchw, nhwc] = both_layouts(in);
    const Tensor probe = randn({4, 3, 5, 7}, kF64);
    const Outcome a = run(bn, nchw, probe);
    first = false;
    const Outcome b = run(bn, nhwc, probe.to(kCL));
    EXPECT_TRUE(is_cl(b.out));
    EXPECT_TRUE(is_cl(b.grads[0]));
    EXPECT_TRUE(allclose(a.out, b.out, 1e-12, 1e-12));
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(allclose(a.grads[i], b.grads[i], 1e-10, 1e-10)) << i;
    EXPECT_TRUE(allclose(rm_a, rm_b, 1e-12, 1e-12));
    EXPECT_TRUE(allclose(rv_a, rv_b, 1e-12, 1e-12));
  }
  // f32 too (the CPU kernels' channels-last loop).
  compare([](const auto& x) { return batch_norm(x[0], x[1], x[2], {}, {}, true); },
          {randn({8, 16, 9, 9}), randn({16}), randn({16})}, 1e-5);
}

TEST(ChannelsLast, ReluAndAdd) {
  compare([](const auto& x) { return relu(x[0]) + x[1]; },
          {randn({2, 5, 4, 3}), randn({2, 5, 4, 3})}, 0);
  compare([](const auto& x) { return relu(x[0] + x[1]); },
          {randn({2, 5, 4, 3}), randn({1, 5, 1, 1})}, 0);
}

// The pooling cases both layouts run: padding, strides, dilation, ceil_mode, count_include_pad
// off, windows larger than the stride, adaptive windows that overlap and upsample, and
// shapes dense in both layouts (C == 1, a 1x1 plane).
std::vector<std::pair<std::string, std::function<Tensor(const std::vector<Tensor>&)>>>
pooling_ops() {
  return {
      {"max 3x3/2 pad 1",
       [](const auto& x) {
         return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1});
       }},
      {"max 2x2",
       [](const auto& x) {
         return max_pool2d(x[0], {2, 2});
       }},
      {"max dilated ceil",
       [](const auto& x) {
         return max_pool2d(x[0], {3, 2}, {1, 2}, {1, 0}, {2, 2}, true);
       }},
      {"avg 2x2",
       [](const auto& x) {
         return avg_pool2d(x[0], {2, 2});
       }},
      {"avg 3x3/2 pad 1 ceil excl",
       [](const auto& x) {
         return avg_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}, true, false);
       }},
      {"avg 4x3/1",
       [](const auto& x) {
         return avg_pool2d(x[0], {4, 3}, {1, 1});
       }},
      {"adaptive 1x1",
       [](const auto& x) {
         return adaptive_avg_pool2d(x[0], {1, 1});
       }},
      {"adaptive 2x3",
       [](const auto& x) {
         return adaptive_avg_pool2d(x[0], {2, 3});
       }},
      {"adaptive 11x9",
       [](const auto& x) {
         return adaptive_avg_pool2d(x[0], {11, 9});
       }},
  };
}

TEST(ChannelsLast, Pooling) {
  // The channels_last kernels visit the same taps in the same order: bitwise equal values,
  // outputs and gradients channels_last.
  for (DType dtype : {kF32, kF64, kBF16}) {
    for (const auto& [name, op] : pooling_ops()) {
      SCOPED_TRACE(name + " " + std::string(dtype_name(dtype)));
      compare(op, {randn({2, 4, 9, 8}).to(dtype)}, 0);
      compare(op, {randn({3, 1, 7, 6}).to(dtype)}, 0);  // C == 1: dense in both layouts
    }
  }
  compare(
      [](const auto& x) {
        return adaptive_avg_pool2d(x[0], {2, 3});
      },
      {randn({2, 5, 1, 1})},
      0);  // a 1x1 plane (dense in both layouts) to a channels_last 2x3 output
}

TEST(ChannelsLast, MaxPoolNanAndInfinityPickTheSameTaps) {
  // NaN wins (the first in the window), -inf windows keep their first tap: the same outputs,
  // and gradients routed to the same positions, in both layouts.
  std::vector<float> v = randn({2, 3, 6, 6}).to_vector<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int i : {3, 14, 15, 40, 77}) v[static_cast<size_t>(i)] = nan;
  for (int i = 36; i < 48; ++i) v[static_cast<size_t>(i)] = -std::numeric_limits<float>::infinity();
  const Tensor a = from_vector(v, {2, 3, 6, 6}).requires_grad_();
  const Tensor b = a.detach().to(kCL).requires_grad_();
  const Tensor ya = max_pool2d(a, {3, 3}, {2, 2}, {1, 1}),
               yb = max_pool2d(b, {3, 3}, {2, 2}, {1, 1});
  EXPECT_TRUE(is_cl(yb));
  const auto va = ya.to_vector<float>(), vb = yb.contiguous().to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i) {
    EXPECT_TRUE(va[i] == vb[i] || (std::isnan(va[i]) && std::isnan(vb[i]))) << "output " << i;
  }
  const Tensor probe = randn(ya.sizes());
  ya.backward(probe);
  yb.backward(probe.to(kCL));
  EXPECT_TRUE(equal(a.grad(), b.grad().contiguous()));
}

TEST(ChannelsLast, PoolingRecordsItsLayoutForTheGradient) {
  // The gradient takes the layout the forward computed in, even when the gradient reaching
  // it arrives in the other one.
  const Tensor x = randn({2, 3, 6, 6}).to(kCL).requires_grad_();
  const Tensor y = max_pool2d(x, {2, 2});
  ASSERT_TRUE(is_cl(y));
  y.backward(randn(y.sizes()));  // an NCHW gradient
  EXPECT_TRUE(is_cl(x.grad())) << shape_str(x.grad().strides());
  const Tensor z = randn({2, 3, 6, 6}).requires_grad_();
  avg_pool2d(z, {3, 3}).backward(randn({2, 3, 2, 2}).to(kCL));
  EXPECT_TRUE(z.grad().is_contiguous()) << shape_str(z.grad().strides());
}

TEST(ChannelsLast, ModuleToConvertsOnlyFourDimTensors) {
  auto model = nn::resnet20(10, 3);
  std::map<std::string, Tensor> before;
  int four_dim = 0;
  for (const auto& [name, t] : model->named_parameters()) {
    before[name] = t;
    four_dim += t.dim() == 4 ? 1 : 0;
  }
  model->to(kCL);
  int converted = 0;
  for (const auto& [name, t] : model->state_dict()) {
    if (t.dim() == 4) {
      EXPECT_EQ(t.suggest_memory_format(), kCL) << name;
      ++converted;
    } else {
      EXPECT_TRUE(t.is_contiguous()) << name;
    }
  }
  EXPECT_EQ(converted, four_dim);  // the convolutions' weights, and nothing else
  EXPECT_GE(converted, 19);
  // Same tensors (optimizers' references stay valid), same values.
  for (const auto& [name, t] : model->named_parameters()) {
    EXPECT_TRUE(t.is_same(before.at(name))) << name;
  }
  model->to(MemoryFormat::Contiguous);
  for (const auto& [name, t] : model->state_dict()) EXPECT_TRUE(t.is_contiguous()) << name;
}

// One training step's forward and backward of ResNet-20 in both formats.
void resnet_step_matches(Device device, double tol) {
  manual_seed(3);
  auto a = nn::resnet20(10, 3);
  auto b = nn::resnet20(10, 3);
  b->load_state_dict(a->state_dict());
  a->to(device);
  b->to(device);
  b->to(kCL);
  const Tensor x = randn({4, 3, 16, 16}).to(device);
  const Tensor y = from_vector<int64_t>({1, 7, 3, 0}).to(device);
  const Tensor la = cross_entropy(a->forward(x), y);
  const Tensor lb = cross_entropy(b->forward(x.to(kCL)), y);
  la.backward();
  lb.backward();
  EXPECT_NEAR(la.item<double>(), lb.item<double>(), tol);
  const auto pa = a->named_parameters(), pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor& ga = pa[i].second.grad();
    const Tensor& gb = pb[i].second.grad();
    EXPECT_TRUE(allclose(ga.cpu(), gb.cpu(), 1e-3, tol)) << pa[i].first;
    if (gb.dim() == 4) {
      EXPECT_TRUE(gb.is_contiguous(kCL)) << pa[i].first;
    }
  }
  const auto sa = a->state_dict(), sb = b->state_dict();  // running statistics
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_TRUE(allclose(sa[i].second.cpu().to(kF64), sb[i].second.cpu().to(kF64), 1e-4, tol))
        << sa[i].first;
  }
}

TEST(ChannelsLast, ResNet20StepMatchesNchw) { resnet_step_matches(kCPU, 1e-4); }

TEST(ChannelsLastCuda, OpsMatchNchw) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const Device gpu = cuda_device(0);
  compare(
      [](const auto& x) {
        return conv2d(x[0], x[1], x[2], {1, 1}, {1, 1});
      },
      {randn({2, 8, 7, 6}), randn({4, 8, 3, 3}), randn({4})}, 1e-3, gpu);
  compare([](const auto& x) { return batch_norm(x[0], x[1], x[2], {}, {}, true); },
          {randn({8, 16, 9, 9}), randn({16}), randn({16})}, 1e-4, gpu);
  compare([](const auto& x) { return relu(x[0]) + x[1]; },
          {randn({2, 5, 4, 3}), randn({2, 5, 4, 3})}, 0, gpu);
  for (const auto& [name, op] : pooling_ops()) {
    SCOPED_TRACE(name);
    compare(op, {randn({2, 4, 9, 8})}, 0, gpu);
    compare(op, {randn({3, 1, 7, 6})}, 0, gpu);
  }
}

TEST(ChannelsLastCuda, ResNet20StepMatchesNchw) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  resnet_step_matches(cuda_device(0), 1e-3);
}

}  // namespace
}  // namespace ember
