// CPU/CUDA parity of the layer ops (layer_ops.h): each runs forward and backward through
// autograd on the CPU and on CUDA with the same inputs, and outputs, input gradients and
// updated running statistics must agree. Every test skips where no CUDA device is visible.
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include <ember/tensor/detail/layer_backward.h>
#include <ember/tensor/precision.h>

#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;
using Inputs = std::vector<Tensor>;
using LayerFn = std::function<Tensor(const Inputs&)>;

struct Tolerance {
  double rtol = 0.0;
  double atol = 0.0;
};

constexpr DType kFloatTypes[] = {kF32, kF64, kF16, kBF16};

// Sums of a few hundred products: float rounding on both sides, cuDNN's f16/bf16 kernels
// accumulate in float but round their outputs.
Tolerance layer_tolerance(DType dtype) {
  switch (dtype) {
    case kF32:
      return {2e-4, 2e-4};
    case kF64:
      return {1e-10, 1e-10};
    case kF16:
      return {2e-2, 5e-2};
    case kBF16:
      return {6e-2, 2e-1};
    default:
      return {};
  }
}

// A CPU tensor of `shape` in `dtype` with uniform values in [low, high); same seed, same tensor.
Tensor make_input(const Shape& shape, DType dtype, uint64_t seed, double low = -2.0,
                  double high = 2.0) {
  Generator gen(seed);
  return uniform(shape, low, high, kF32, &gen).to(dtype);
}

// Small integers as floats: many exact ties for the max-pool tie rule.
Tensor make_ties(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return randint(0, 3, shape, kI64, &gen).to(dtype);
}

// Copies of `inputs` on `device`; those flagged differentiable are leaves that require grad.
Inputs leaves_on(Device device, const Inputs& inputs, const std::vector<bool>& differentiable) {
  Inputs result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      result.emplace_back();
      continue;
    }
    Tensor t = device.is_cuda() ? inputs[i].to(device) : inputs[i].clone();
    if (differentiable[i]) t.requires_grad_();
    result.push_back(t);
  }
  return result;
}

struct ParityRun {
  Inputs cpu, cuda;  // the inputs after the run (running statistics updated in place)
};

// Runs `f` forward and backward (with one random output gradient) on both devices and
// compares the outputs and the gradients of every differentiable input.
ParityRun expect_layer_parity(const Inputs& inputs, const std::vector<bool>& differentiable,
                              const LayerFn& f, Tolerance fwd, Tolerance bwd, uint64_t seed) {
  ParityRun run{leaves_on(kCPU, inputs, differentiable),
                leaves_on(cuda_device(), inputs, differentiable)};
  const Tensor expected = f(run.cpu);
  const Tensor grad = make_input(expected.sizes(), expected.dtype(), seed);
  expected.backward(grad);
  const Tensor actual = f(run.cuda);
  EXPECT_TRUE(actual.is_cuda()) << "the CUDA run returned a tensor on " << actual.device();
  actual.backward(grad.to(cuda_device()));
  {
    SCOPED_TRACE("forward");
    expect_close(actual, expected, fwd.rtol, fwd.atol);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!differentiable[i]) continue;
    SCOPED_TRACE(::testing::Message() << "gradient of input " << i);
    if (!run.cuda[i].grad().defined()) {
      ADD_FAILURE() << "no gradient reached input " << i << " on CUDA";
      continue;
    }
    EXPECT_TRUE(run.cuda[i].grad().is_cuda());
    expect_close(run.cuda[i].grad(), run.cpu[i].grad(), bwd.rtol, bwd.atol);
  }
  return run;
}

// ---------------------------------------------------------------------------------------
// conv2d

struct ConvCase {
  Shape x, w;
  Pair stride, padding, dilation;
  int64_t groups;
  bool bias;
};

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> cases = {
      {{2, 3, 8, 8}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true},
      {{2, 4, 9, 7}, {6, 2, 3, 2}, {2, 1}, {0, 2}, {1, 1}, 2, true},
      {{1, 6, 10, 11}, {6, 2, 3, 3}, {1, 2}, {2, 1}, {2, 2}, 3, false},
      {{3, 8, 5, 5}, {8, 1, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 8, true},  // depthwise
      {{2, 16, 16, 16}, {32, 16, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1, false},
      {{4, 8, 6, 6}, {12, 8, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1, true},  // pointwise
  };
  return cases;
}

TEST(LayersParity, Conv2dForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  Float32PrecisionGuard exact_f32("highest", false);  // cuDNN allows TF32 by default
  uint64_t seed = 100;
  for (DType dtype : kFloatTypes) {
    for (const ConvCase& k : conv_cases()) {
      SCOPED_TRACE(::testing::Message() << dtype << " x " << shape_str(k.x) << " w "
                                        << shape_str(k.w) << " groups " << k.groups);
      const Inputs inputs = {make_input(k.x, dtype, seed++),
                             make_input(k.w, dtype, seed++, -0.5, 0.5),
                             k.bias ? make_input({k.w[0]}, dtype, seed++) : Tensor()};
      const Tolerance tol = layer_tolerance(dtype);
      expect_layer_parity(
          inputs, {true, true, k.bias},
          [&](const Inputs& in) {
            return conv2d(in[0], in[1], in[2], k.stride, k.padding, k.dilation, k.groups);
          },
          tol, tol, seed++);
    }
  }
}

// The second identical call reuses the benchmarked algorithm and the cached blocks: no new
// cudaMalloc, and bit-identical results.
TEST(LayersParity, Conv2dRepeatCallAllocatesNothing) {
  EMBER_REQUIRE_CUDA();
  const Tensor x = make_input({8, 16, 16, 16}, kF32, 1).to(cuda_device());
  const Tensor w = make_input({32, 16, 3, 3}, kF32, 2, -0.5, 0.5).to(cuda_device());
  const Tensor b = make_input({32}, kF32, 3).to(cuda_device());
  const Tensor g = make_input({8, 32, 16, 16}, kF32, 4).to(cuda_device());
  auto step = [&] {
    Tensor xl = x.detach(), wl = w.detach();
    xl.requires_grad_();
    wl.requires_grad_();
    const Tensor y = conv2d(xl, wl, b, {1, 1}, {1, 1});
    y.backward(g);
    return std::vector<Tensor>{y.detach().to(kCPU), xl.grad().to(kCPU), wl.grad().to(kCPU)};
  };
  const std::vector<Tensor> first = step();
  cuda::synchronize();
  const uint64_t allocs = cuda::memory_stats().num_device_allocs;
  const std::vector<Tensor> second = step();
  cuda::synchronize();
  EXPECT_EQ(cuda::memory_stats().num_device_allocs, allocs);
  expect_close(second[0], first[0], 0.0, 0.0);
  expect_close(second[1], first[1], 1e-6, 1e-6);  // backward algorithms may use atomics
  expect_close(second[2], first[2], 1e-6, 1e-6);
}

// ---------------------------------------------------------------------------------------
// batch_norm

TEST(LayersParity, BatchNormTrainingUpdatesRunningStats) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 300;
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : {Shape{4, 3, 5, 6}, Shape{8, 5}, Shape{2, 4, 3}}) {
      for (bool affine : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " " << shape_str(shape) << (affine ? " affine" : " no affine"));
        const int64_t c = shape[1];
        const Inputs inputs = {make_input(shape, dtype, seed++, -1.0, 3.0),
                               affine ? make_input({c}, dtype, seed++) : Tensor(),
                               affine ? make_input({c}, dtype, seed++) : Tensor(),
                               make_input({c}, dtype, seed++, -0.5, 0.5),
                               make_input({c}, dtype, seed++, 0.5, 1.5)};
        const Tolerance tol = layer_tolerance(dtype);
        // Two steps: the running statistics accumulate across calls.
        const ParityRun run = expect_layer_parity(
            inputs, {true, affine, affine, false, false},
            [](const Inputs& in) {
              batch_norm(in[0].detach(), in[1].defined() ? in[1].detach() : Tensor(),
                         in[2].defined() ? in[2].detach() : Tensor(), in[3], in[4], true, 0.1,
                         1e-5);
              return batch_norm(in[0], in[1], in[2], in[3], in[4], true, 0.1, 1e-5);
            },
            tol, tol, seed++);
        expect_close(run.cuda[3], run.cpu[3], tol.rtol, tol.atol);
        expect_close(run.cuda[4], run.cpu[4], tol.rtol, tol.atol);
      }
    }
  }
}

TEST(LayersParity, BatchNormTrainingWithoutRunningStats) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 400;
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Inputs inputs = {make_input({3, 4, 7, 2}, dtype, seed++), make_input({4}, dtype, seed++),
                           make_input({4}, dtype, seed++)};
    const Tolerance tol = layer_tolerance(dtype);
    expect_layer_parity(
        inputs, {true, true, true},
        [](const Inputs& in) {
          return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true, 0.1, 1e-3);
        },
        tol, tol, seed++);
  }
}

TEST(LayersParity, BatchNormEvalUsesRunningStats) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 500;
  for (DType dtype : kFloatTypes) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype << (affine ? " affine" : " no affine"));
      const Inputs inputs = {make_input({4, 3, 5, 6}, dtype, seed++),
                             affine ? make_input({3}, dtype, seed++) : Tensor(),
                             affine ? make_input({3}, dtype, seed++) : Tensor(),
                             make_input({3}, dtype, seed++, -0.5, 0.5),
                             make_input({3}, dtype, seed++, 0.5, 1.5)};
      const Tolerance tol = layer_tolerance(dtype);
      const ParityRun run = expect_layer_parity(
          inputs, {true, affine, affine, false, false},
          [](const Inputs& in) {
            return batch_norm(in[0], in[1], in[2], in[3], in[4], false, 0.1, 1e-5);
          },
          tol, tol, seed++);
      // Eval leaves the running statistics alone.
      expect_close(run.cuda[3], inputs[3], 0.0, 0.0);
      expect_close(run.cuda[4], inputs[4], 0.0, 0.0);
    }
  }
}

// Mixed precision (autocast's batch norm): a bf16/f16 input with f32 weight, bias and
// running statistics, in training and in eval (whose backward is ember's own CUDA kernel).
TEST(LayersParity, BatchNormLowPrecisionInputWithF32Parameters) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 550;
  for (DType dtype : {kF16, kBF16}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype << (training ? " training" : " eval"));
      const Inputs inputs = {make_input({4, 3, 5, 6}, dtype, seed++, -1.0, 3.0),
                             make_input({3}, kF32, seed++), make_input({3}, kF32, seed++),
                             make_input({3}, kF32, seed++, -0.5, 0.5),
                             make_input({3}, kF32, seed++, 0.5, 1.5)};
      const Tolerance tol = layer_tolerance(dtype);
      const ParityRun run = expect_layer_parity(
          inputs, {true, true, true, false, false},
          [training](const Inputs& in) {
            const Tensor out = batch_norm(in[0], in[1], in[2], in[3], in[4], training, 0.1, 1e-5);
            EXPECT_EQ(out.dtype(), in[0].dtype());
            return out;
          },
          tol, tol, seed++);
      for (int i : {1, 2}) EXPECT_EQ(run.cuda[static_cast<size_t>(i)].grad().dtype(), kF32);
      expect_close(run.cuda[3], run.cpu[3], 1e-5, 1e-6);
      expect_close(run.cuda[4], run.cpu[4], 1e-5, 1e-6);
    }
  }
}

// ---------------------------------------------------------------------------------------
// pooling

struct PoolCase {
  Shape x;
  Pair kernel, stride, padding, dilation;
  bool ceil_mode;
};

const std::vector<PoolCase>& pool_cases() {
  static const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, {2, 2}, {0, 0}, {0, 0}, {1, 1}, false},
      {{2, 3, 9, 7}, {3, 3}, {2, 2}, {1, 1}, {1, 1}, false},
      {{1, 4, 10, 9}, {3, 2}, {2, 1}, {1, 1}, {1, 1}, true},
      {{2, 2, 11, 12}, {3, 3}, {1, 2}, {1, 0}, {2, 2}, false},  // dilation (max pool only)
      {{3, 2, 7, 7}, {4, 4}, {3, 3}, {2, 1}, {1, 1}, true},
  };
  return cases;
}

TEST(LayersParity, MaxPool2dForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 600;
  for (DType dtype : kFloatTypes) {
    for (const PoolCase& k : pool_cases()) {
      for (bool ties : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " x " << shape_str(k.x) << " kernel (" << k.kernel[0] << ", "
                     << k.kernel[1] << ")" << (ties ? " ties" : ""));
        const Tensor x = ties ? make_ties(k.x, dtype, seed++) : make_input(k.x, dtype, seed++);
        // Pooling picks or averages values: exact, up to the 16-bit types' sums of gradients.
        const Tolerance tol =
            dtype == kF32 || dtype == kF64 ? Tolerance{1e-6, 1e-6} : layer_tolerance(dtype);
        expect_layer_parity(
            {x}, {true},
            [&](const Inputs& in) {
              return max_pool2d(in[0], k.kernel, k.stride, k.padding, k.dilation, k.ceil_mode);
            },
            {0.0, 0.0}, tol, seed++);
      }
    }
  }
}

TEST(LayersParity, MaxPool2dNanWins) {
  EMBER_REQUIRE_CUDA();
  std::vector<float> values = make_input({1, 2, 6, 6}, kF32, 7).to_vector<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  values[3] = nan;
  values[14] = nan;
  values[15] = nan;  // two NaNs in one window: the first wins
  values[40] = nan;
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor x = from_vector(values, {1, 2, 6, 6}).to(dtype);
    expect_layer_parity(
        {x}, {true},
        [](const Inputs& in) {
          return max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1});
        },
        {0.0, 0.0}, {0.0, 0.0}, 8);
  }
}

TEST(LayersParity, AvgPool2dForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 700;
  for (DType dtype : kFloatTypes) {
    for (const PoolCase& k : pool_cases()) {
      if (k.dilation[0] != 1) continue;  // average pooling has no dilation
      for (bool include_pad : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " x " << shape_str(k.x) << " kernel (" << k.kernel[0] << ", "
                     << k.kernel[1] << ")" << (include_pad ? " count_include_pad" : ""));
        const Tolerance tol = dtype == kF32   ? Tolerance{1e-5, 1e-6}
                              : dtype == kF64 ? Tolerance{1e-12, 1e-12}
                                              : layer_tolerance(dtype);
        expect_layer_parity(
            {make_input(k.x, dtype, seed++)}, {true},
            [&](const Inputs& in) {
              return avg_pool2d(in[0], k.kernel, k.stride, k.padding, k.ceil_mode, include_pad);
            },
            tol, tol, seed++);
      }
    }
  }
}

TEST(LayersParity, AdaptiveAvgPool2dForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 800;
  const std::vector<std::pair<Shape, Pair>> cases = {
      {{2, 3, 8, 8}, {1, 1}},   // global average pooling
      {{2, 3, 7, 10}, {3, 4}},  // uneven, overlapping windows
      {{1, 2, 5, 3}, {7, 4}},   // output larger than input
      {{2, 4, 6, 6}, {6, 6}}};  // identity windows
  for (DType dtype : kFloatTypes) {
    for (const auto& [shape, out] : cases) {
      SCOPED_TRACE(::testing::Message() << dtype << " x " << shape_str(shape) << " -> (" << out[0]
                                        << ", " << out[1] << ")");
      const Tolerance tol = dtype == kF32   ? Tolerance{1e-5, 1e-6}
                            : dtype == kF64 ? Tolerance{1e-12, 1e-12}
                                            : layer_tolerance(dtype);
      expect_layer_parity(
          {make_input(shape, dtype, seed++)}, {true},
          [&](const Inputs& in) { return adaptive_avg_pool2d(in[0], out); }, tol, tol, seed++);
    }
  }
}

TEST(LayersParity, PoolingChannelsLast) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 900;
  constexpr MemoryFormat kCL = MemoryFormat::ChannelsLast;
  for (DType dtype : kFloatTypes) {
    for (const PoolCase& k : pool_cases()) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " channels_last x " << shape_str(k.x) << " kernel (" << k.kernel[0]
                   << ", " << k.kernel[1] << ")");
      const Tolerance tol = dtype == kF32   ? Tolerance{1e-5, 1e-6}
                            : dtype == kF64 ? Tolerance{1e-12, 1e-12}
                                            : layer_tolerance(dtype);
      const Tensor x = make_input(k.x, dtype, seed++).to(kCL);
      const ParityRun max = expect_layer_parity(
          {x}, {true},
          [&](const Inputs& in) {
            const Tensor y =
                max_pool2d(in[0], k.kernel, k.stride, k.padding, k.dilation, k.ceil_mode);
            EXPECT_TRUE(y.is_contiguous(kCL)) << shape_str(y.strides());
            return y;
          },
          {0.0, 0.0}, tol, seed++);
      EXPECT_TRUE(max.cuda[0].grad().is_contiguous(kCL));
      if (k.dilation[0] == 1) {
        expect_layer_parity(
            {x}, {true},
            [&](const Inputs& in) {
              return avg_pool2d(in[0], k.kernel, k.stride, k.padding, k.ceil_mode, false);
            },
            tol, tol, seed++);
      }
      const ParityRun adaptive = expect_layer_parity(
          {x}, {true},
          [&](const Inputs& in) {
            return adaptive_avg_pool2d(in[0], {3, 2});
          },
          tol, tol, seed++);
      EXPECT_TRUE(adaptive.cuda[0].grad().is_contiguous(kCL));
    }
  }
}

// ---------------------------------------------------------------------------------------
// cross_entropy

TEST(LayersParity, CrossEntropySmoothingAndIgnoreIndex) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 900;
  const int64_t n = 7, classes = 10;
  for (DType dtype : kFloatTypes) {
    for (int64_t ignore : {int64_t{-100}, int64_t{3}}) {
      for (double smoothing : {0.0, 0.1}) {
        for (Reduction reduction : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype << " ignore_index " << ignore << " smoothing " << smoothing
                       << " reduction " << static_cast<int>(reduction));
          std::vector<float> logits =
              make_input({n, classes}, kF32, seed++, -4.0, 4.0).to_vector<float>();
          logits[5] = 60.0f;  // large logits: the log-sum-exp must stay finite
          const std::vector<int64_t> target = {0, 3, ignore, 9, 3, 5, 1};
          const Tensor x = from_vector(logits, {n, classes}).to(dtype);
          const Tensor t = from_vector(target, {n});
          const Tolerance tol = dtype == kF32   ? Tolerance{1e-5, 1e-5}
                                : dtype == kF64 ? Tolerance{1e-12, 1e-12}
                                                : layer_tolerance(dtype);
          expect_layer_parity(
              {x, t}, {true, false},
              [&](const Inputs& in) {
                return cross_entropy(
                    in[0], in[1],
                    {.ignore_index = ignore, .reduction = reduction, .label_smoothing = smoothing});
              },
              tol, tol, seed++);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// scaled-dot-product attention

// Tile-crossing lengths, causal or not, Lq != Lk and E != Ev, and dropout (the same Philox
// mask on both devices, so the results still agree).
TEST(LayersParity, ScaledDotProductAttention) {
  EMBER_REQUIRE_CUDA();
  struct Case {
    Shape q, k, v;
    bool causal;
    double dropout;
  };
  const Case cases[] = {
      {{2, 3, 7, 8}, {2, 3, 7, 8}, {2, 3, 7, 8}, false, 0.0},
      {{2, 3, 65, 16}, {2, 3, 65, 16}, {2, 3, 65, 16}, true, 0.0},
      {{1, 2, 130, 64}, {1, 2, 130, 64}, {1, 2, 130, 64}, true, 0.0},
      {{2, 40, 8}, {2, 33, 8}, {2, 33, 12}, false, 0.0},
      {{1, 2, 70, 32}, {1, 2, 70, 32}, {1, 2, 70, 32}, true, 0.2},
  };
  uint64_t seed = 1000;
  for (DType dtype : kFloatTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " q " << shape_str(c.q) << " k " << shape_str(c.k)
                   << (c.causal ? " causal" : "") << " dropout " << c.dropout);
      const Inputs inputs = {make_input(c.q, dtype, seed++, -1.0, 1.0),
                             make_input(c.k, dtype, seed++, -1.0, 1.0),
                             make_input(c.v, dtype, seed++)};
      const Tolerance tol = layer_tolerance(dtype);
      expect_layer_parity(
          inputs, {true, true, true},
          [&](const Inputs& in) {
            Generator gen(77);
            return scaled_dot_product_attention(in[0], in[1], in[2], c.causal, c.dropout,
                                                std::nullopt, &gen);
          },
          tol, tol, seed++);
    }
  }
}

// ---------------------------------------------------------------------------------------
// GPT layers: gelu, layer_norm, embedding, dropout

TEST(LayersParity, GeluExactAndTanh) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 1200;
  for (DType dtype : kFloatTypes) {
    for (GeluApproximate approximate : {GeluApproximate::kNone, GeluApproximate::kTanh}) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " tanh " << (approximate == GeluApproximate::kTanh));
      const Tolerance tol = dtype == kF32   ? Tolerance{1e-5, 1e-6}
                            : dtype == kF64 ? Tolerance{1e-12, 1e-14}
                                            : layer_tolerance(dtype);
      expect_layer_parity(
          {make_input({3, 129}, dtype, seed++, -6.0, 6.0)}, {true},
          [&](const Inputs& in) { return gelu(in[0], approximate); }, tol, tol, seed++);
    }
  }
}

TEST(LayersParity, Silu) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 1250;
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tolerance tol = dtype == kF32   ? Tolerance{1e-5, 1e-6}
                          : dtype == kF64 ? Tolerance{1e-12, 1e-14}
                                          : layer_tolerance(dtype);
    expect_layer_parity(
        {make_input({3, 129}, dtype, seed++, -8.0, 8.0)}, {true},
        [](const Inputs& in) { return silu(in[0]); }, tol, tol, seed++);
  }
}

TEST(LayersParity, LayerNormForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 1300;
  struct Case {
    Shape x, normalized;
    bool weight, bias;
  };
  const Case cases[] = {{{4, 7, 768}, {768}, true, true},
                        {{33, 40}, {40}, true, false},
                        {{2, 3, 5, 6}, {5, 6}, false, false},
                        {{300, 16}, {16}, true, true},  // several chunks of rows for the sums
                        {{2, 2049}, {2049}, true, true}};
  for (DType dtype : kFloatTypes) {
    for (const Case& k : cases) {
      SCOPED_TRACE(::testing::Message() << dtype << " x " << shape_str(k.x));
      const Inputs inputs = {make_input(k.x, dtype, seed++, 1.0, 5.0),
                             k.weight ? make_input(k.normalized, dtype, seed++) : Tensor(),
                             k.bias ? make_input(k.normalized, dtype, seed++) : Tensor()};
      const Tolerance tol = layer_tolerance(dtype);
      expect_layer_parity(
          inputs, {true, k.weight, k.bias},
          [&](const Inputs& in) { return layer_norm(in[0], k.normalized, in[1], in[2]); }, tol, tol,
          seed++);
    }
  }
}

TEST(LayersParity, EmbeddingWithPadding) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 1400;
  for (DType dtype : {kF32, kF64}) {
    for (std::optional<int64_t> padding : {std::optional<int64_t>(), std::optional<int64_t>(2)}) {
      SCOPED_TRACE(::testing::Message() << dtype << " padding " << padding.value_or(-1));
      Generator gen(seed++);
      const Tensor indices = randint(0, 50, {4, 33}, kI64, &gen);
      const Tolerance tol = dtype == kF32 ? Tolerance{1e-5, 1e-5} : Tolerance{1e-12, 1e-12};
      expect_layer_parity(
          {indices, make_input({50, 24}, dtype, seed++)}, {false, true},
          [&](const Inputs& in) { return embedding(in[0], in[1], padding); }, tol, tol, seed++);
    }
  }
}

TEST(LayersParity, DropoutMaskMatchesTheCpu) {
  EMBER_REQUIRE_CUDA();
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(::testing::Message() << dtype);
    const Tensor x = ones({5, 301}, dtype);
    Generator cpu_gen(42), cuda_gen(42);
    const Tensor expected = dropout(x, 0.3, true, &cpu_gen);
    const Tensor actual = dropout(x.to(cuda_device()), 0.3, true, &cuda_gen);
    expect_close(actual, expected, 0.0, 0.0);
  }
}

// ---------------------------------------------------------------------------------------
// fused batch norm + ReLU (+ residual): ember's own CUDA kernels against the CPU's

// Shapes reaching both CUDA reduction layouts: S > 1 with several row chunks, and
// channels-last rows (S == 1 after the transpose) with a partial 32-channel tile.
const std::vector<Shape>& fused_bn_shapes() {
  static const std::vector<Shape> shapes = {{8, 5, 33, 33}, {16, 40, 6, 5}, {6, 3, 1, 1}};
  return shapes;
}

TEST(LayersParity, BatchNormReluForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  uint64_t seed = 2000;
  for (DType dtype : kFloatTypes) {
    for (const Shape& shape : fused_bn_shapes()) {
      for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
        for (bool training : {true, false}) {
          for (bool residual : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << dtype << " " << shape_str(shape)
                         << (format == MemoryFormat::ChannelsLast ? " nhwc" : " nchw")
                         << (training ? " train" : " eval") << (residual ? " add_relu" : " relu"));
            const int64_t c = shape[1];
            // 16-bit inputs come with f32 parameters and statistics, as under autocast.
            const DType param = dtype == kF16 || dtype == kBF16 ? kF32 : dtype;
            const Inputs inputs = {make_input(shape, dtype, seed++, -1.0, 3.0).contiguous(format),
                                   make_input({c}, param, seed++),
                                   make_input({c}, param, seed++),
                                   make_input({c}, param, seed++, -0.5, 0.5),
                                   make_input({c}, param, seed++, 0.5, 1.5),
                                   make_input(shape, dtype, seed++).contiguous(format)};
            auto f = [training, residual](const Inputs& in) {
              return residual
                         ? batch_norm_add_relu(in[0], in[5], in[1], in[2], in[3], in[4], training)
                         : batch_norm_relu(in[0], in[1], in[2], in[3], in[4], training);
            };
            const Tolerance tol = layer_tolerance(dtype);
            if (dtype == kF32 || dtype == kF64) {
              const ParityRun run = expect_layer_parity(
                  inputs, {true, true, true, false, false, residual}, f, tol, tol, seed++);
              expect_close(run.cuda[3], run.cpu[3], tol.rtol, tol.atol);
              expect_close(run.cuda[4], run.cpu[4], tol.rtol, tol.atol);
              continue;
            }
            // 16 bits: an output within a rounding of 0 may land on either side of the ReLU,
            // so the backward runs on both devices from the CPU's output (the same mask).
            const Inputs cpu = leaves_on(kCPU, inputs, std::vector<bool>(6, false));
            const Inputs gpu = leaves_on(cuda_device(), inputs, std::vector<bool>(6, false));
            const Tensor expected = f(cpu), actual = f(gpu);
            EXPECT_TRUE(actual.is_contiguous(format));
            expect_close(actual, expected, tol.rtol, tol.atol);
            expect_close(gpu[3], cpu[3], 1e-5, 1e-6);
            expect_close(gpu[4], cpu[4], 1e-5, 1e-6);
            const Tensor grad = make_input(shape, dtype, seed++).contiguous(format);
            const Tensor mean = make_input({c}, kF32, seed++, -0.5, 0.5);
            const Tensor invstd = make_input({c}, kF32, seed++, 0.5, 1.5);
            const auto want =
                detail::batch_norm_relu_backward(grad, expected, cpu[0], cpu[1], mean, invstd,
                                                 training, {true, true, true, residual});
            const Device dev = cuda_device();
            const auto got = detail::batch_norm_relu_backward(
                grad.to(dev), expected.to(dev), gpu[0], gpu[1], mean.to(dev), invstd.to(dev),
                training, {true, true, true, residual});
            for (size_t i = 0; i < 4; ++i) {
              if (!want[i].defined()) continue;
              SCOPED_TRACE(::testing::Message() << "gradient " << i);
              expect_close(got[i], want[i], tol.rtol, tol.atol);
            }
          }
        }
      }
    }
  }
}

TEST(LayersParity, LinearBiasReluForwardAndBackward) {
  EMBER_REQUIRE_CUDA();
  Float32PrecisionGuard exact_f32("highest", false);  // no TF32 in the f32 GEMM
  uint64_t seed = 2500;
  for (DType dtype : {kF32, kF64}) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype << (bias ? " bias" : " no bias"));
      const Inputs inputs = {make_input({4, 6, 33}, dtype, seed++),
                             make_input({17, 33}, dtype, seed++),
                             bias ? make_input({17}, dtype, seed++) : Tensor()};
      const Tolerance tol = layer_tolerance(dtype);
      expect_layer_parity(
          inputs, {true, true, bias},
          [](const Inputs& in) { return linear(in[0], in[1], in[2], Activation::kRelu); }, tol, tol,
          seed++);
    }
  }
}

}  // namespace
}  // namespace ember
