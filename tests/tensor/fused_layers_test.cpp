// The fused batch norm + ReLU ops (batch_norm_relu, batch_norm_add_relu) against the unfused
// composition relu(batch_norm(x) [+ residual]) they replace: outputs, gradients and running
// statistics in f64, f32 and bf16, NCHW and channels_last, training and eval; PyTorch 1.13's
// values (golden/fused_bn_golden.json, written by golden/make_fused_bn_golden.py); and
// finite-difference first and second derivatives in f64. Then linear with a fused bias + ReLU.
#include <fstream>
#include <functional>
#include <vector>

#include <ember/tensor/detail/kernel_table.h>
#include <ember/tensor/detail/layer_backward.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using ember::testing::expect_close;
using nlohmann::json;

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, double lo = -2.0,
                     double hi = 2.0) {
  Generator gen(seed);
  return uniform(shape, lo, hi, kF64, &gen).to(dtype);
}

struct BnCase {
  DType dtype;
  MemoryFormat format;
  bool training, residual, affine;
};

std::string describe(const BnCase& c) {
  return detail::str_cat(c.dtype, c.format == MemoryFormat::ChannelsLast ? " nhwc" : " nchw",
                         c.training ? " train" : " eval", c.residual ? " add_relu" : " relu",
                         c.affine ? " affine" : "");
}

// One run's results: output, gradients of input/weight/bias/residual, running statistics.
struct BnRun {
  Tensor out, gx, gw, gb, gr, rm, rv;
};

// Runs the fused op (or the unfused composition) twice on fresh copies of the same inputs
// (the running statistics accumulate over both calls) and backward from the second output.
BnRun run_bn(const BnCase& c, bool fused) {
  const Shape shape = {4, 6, 5, 3};
  const Tensor x0 = random_tensor(shape, c.dtype, 1, -1.0, 3.0).contiguous(c.format);
  const Tensor r0 = random_tensor(shape, c.dtype, 2).contiguous(c.format);
  const Tensor g0 = random_tensor(shape, c.dtype, 3).contiguous(c.format);
  // Parameters and statistics in f32 beside a bf16 input, as under autocast.
  const DType param = c.dtype == kBF16 ? kF32 : c.dtype;
  Tensor w = c.affine ? random_tensor({6}, param, 4) : Tensor();
  Tensor b = c.affine ? random_tensor({6}, param, 5) : Tensor();
  BnRun run;
  run.rm = random_tensor({6}, param, 6, -0.5, 0.5);
  run.rv = random_tensor({6}, param, 7, 0.5, 1.5);
  if (c.affine) {
    w.requires_grad_();
    b.requires_grad_();
  }
  const Tensor x = x0.clone().contiguous(c.format).requires_grad_();
  const Tensor r = r0.clone().contiguous(c.format).requires_grad_();
  auto forward = [&] {
    if (fused) {
      return c.residual ? batch_norm_add_relu(x, r, w, b, run.rm, run.rv, c.training)
                        : batch_norm_relu(x, w, b, run.rm, run.rv, c.training);
    }
    const Tensor y = batch_norm(x, w, b, run.rm, run.rv, c.training);
    return relu(c.residual ? y + r : y);
  };
  forward();
  run.out = forward();
  run.out.backward(g0);
  run.gx = x.grad();
  run.gr = c.residual ? r.grad() : Tensor();
  if (c.affine) {
    run.gw = w.grad();
    run.gb = b.grad();
  }
  return run;
}

TEST(FusedBatchNorm, EqualsUnfusedComposition) {
  for (DType dtype : {kF64, kF32, kBF16}) {
    for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      for (bool training : {true, false}) {
        for (bool residual : {false, true}) {
          for (bool affine : {true, false}) {
            const BnCase c{dtype, format, training, residual, affine};
            SCOPED_TRACE(describe(c));
            const BnRun fused = run_bn(c, true), unfused = run_bn(c, false);
            // The CPU's fused pass rounds where the composition does: equal in every dtype.
            const double tol = 0.0;
            expect_close(fused.out, unfused.out, tol, tol);
            EXPECT_TRUE(fused.out.is_contiguous(format));
            EXPECT_EQ(fused.out.dtype(), dtype);
            expect_close(fused.gx, unfused.gx, tol, tol);
            EXPECT_TRUE(fused.gx.is_contiguous(format));
            if (residual) expect_close(fused.gr, unfused.gr, tol, tol);
            if (affine) {
              expect_close(fused.gw, unfused.gw, tol, tol);
              expect_close(fused.gb, unfused.gb, tol, tol);
            }
            expect_close(fused.rm, unfused.rm, 0.0, 0.0);
            expect_close(fused.rv, unfused.rv, 0.0, 0.0);
          }
        }
      }
    }
  }
}

TEST(FusedBatchNorm, RecordsOneNodeThatSavesTheOutput) {
  const Tensor x = random_tensor({2, 3, 4, 4}, kF32, 8).requires_grad_();
  const Tensor r = random_tensor({2, 3, 4, 4}, kF32, 9).requires_grad_();
  const Tensor rm = zeros({3}), rv = ones({3});
  const Tensor out = batch_norm_add_relu(x, r, {}, {}, rm, rv, true);
  ASSERT_TRUE(out.grad_fn() != nullptr);
  EXPECT_EQ(out.grad_fn()->name(), "BatchNormAddReluBackward");
  EXPECT_EQ(batch_norm_relu(x, {}, {}, rm, rv, true).grad_fn()->name(), "BatchNormReluBackward");
}

TEST(FusedBatchNorm, ResidualOfAnotherDtypePromotesAsTheComposition) {
  const Tensor x = random_tensor({2, 3, 4, 4}, kBF16, 10);
  const Tensor r = random_tensor({2, 3, 4, 4}, kF32, 11);
  const Tensor out = batch_norm_add_relu(x, r, {}, {}, {}, {}, true);
  EXPECT_EQ(out.dtype(), kF32);
  expect_close(out, relu(batch_norm(x, {}, {}, {}, {}, true) + r), 0.0, 0.0);
}

TEST(FusedBatchNorm, RejectsMismatchedResidual) {
  const Tensor x = zeros({2, 3, 4, 4});
  EXPECT_EMBER_ERROR(batch_norm_add_relu(x, zeros({2, 3, 4, 5}), {}, {}, {}, {}, true),
                     "batch_norm_add_relu: residual of shape [2, 3, 4, 5] does not match input");
  EXPECT_EMBER_ERROR(batch_norm_add_relu(x, Tensor(), {}, {}, {}, {}, true), "residual");
  EXPECT_EMBER_ERROR(batch_norm_relu(x, zeros({4}), {}, {}, {}, true),
                     "batch_norm_relu: weight of shape [4] does not match 3 channels");
  EXPECT_EMBER_ERROR(batch_norm_relu(x, {}, {}, {}, {}, false),
                     "batch_norm_relu: running_mean and running_var are needed in eval mode");
}

// bf16 autocast: a conv's bf16 output through the fused op with the f32 BN parameters
// autocast leaves alone: bf16 out, f32 parameter gradients, close to the f32 composition.
TEST(FusedBatchNorm, Bf16AutocastKeepsStatisticsInF32) {
  const Tensor x = random_tensor({4, 3, 6, 6}, kF32, 12);
  const Tensor k = random_tensor({5, 3, 3, 3}, kF32, 13, -0.3, 0.3);
  const Tensor r = random_tensor({4, 5, 6, 6}, kF32, 14);
  Tensor w = random_tensor({5}, kF32, 15).requires_grad_();
  Tensor b = random_tensor({5}, kF32, 16).requires_grad_();
  const Tensor rm = zeros({5}), rv = ones({5});
  Tensor out;
  {
    AutocastGuard autocast(kCPU, kBF16);
    const Tensor y = conv2d(x, k, {}, {1, 1}, {1, 1});
    out = batch_norm_add_relu(y, conv2d(r, random_tensor({5, 5, 1, 1}, kF32, 17)), w, b, rm, rv,
                              true);
  }
  EXPECT_EQ(out.dtype(), kBF16);
  out.to(kF32).sum().backward();
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_EQ(b.grad().dtype(), kF32);
  EXPECT_EQ(rm.dtype(), kF32);

  Tensor w32 = w.detach().clone().requires_grad_(), b32 = b.detach().clone().requires_grad_();
  const Tensor rm32 = zeros({5}), rv32 = ones({5});
  const Tensor ref = relu(batch_norm(conv2d(x, k, {}, {1, 1}, {1, 1}), w32, b32, rm32, rv32, true) +
                          conv2d(r, random_tensor({5, 5, 1, 1}, kF32, 17)));
  ref.sum().backward();
  expect_close(out.to(kF32), ref, 5e-2, 1e-1);
  expect_close(rm, rm32, 2e-2, 2e-2);
  expect_close(rv, rv32, 2e-2, 2e-2);
  // A few outputs near 0 may take the other side of the ReLU in bf16.
  expect_close(b.grad(), b32.grad(), 5e-2, 2.0);
}

// ---------------------------------------------------------------------------------------
// PyTorch's values.

const json& golden() {
  static const json data = [] {
    std::ifstream in(EMBER_FUSED_BN_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_FUSED_BN_GOLDEN;
    return json::parse(in);
  }();
  return data;
}

Tensor tensor_from(const json& j, MemoryFormat format = MemoryFormat::Contiguous) {
  const auto values = j.at("values").get<std::vector<double>>();
  const auto shape = j.at("shape").get<Shape>();
  const Tensor t = from_vector(values, {static_cast<int64_t>(values.size())}).reshape(shape);
  return shape.size() == 4 ? t.contiguous(format) : t;
}

TEST(FusedBatchNorm, MatchesPyTorch) {
  ASSERT_FALSE(golden().at("cases").empty());
  for (const json& c : golden().at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const MemoryFormat format =
        c.at("channels_last").get<bool>() ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    const bool residual = c.at("residual").get<bool>(), training = c.at("training").get<bool>();
    const Tensor x = tensor_from(c.at("input"), format).requires_grad_();
    const Tensor w = tensor_from(c.at("weight")).requires_grad_();
    const Tensor b = tensor_from(c.at("bias")).requires_grad_();
    const Tensor rm = tensor_from(c.at("running_mean")), rv = tensor_from(c.at("running_var"));
    const double momentum = c.at("momentum").get<double>(), eps = c.at("eps").get<double>();
    Tensor r;
    Tensor out;
    if (residual) {
      r = tensor_from(c.at("residual_values"), format).requires_grad_();
      out = batch_norm_add_relu(x, r, w, b, rm, rv, training, momentum, eps);
    } else {
      out = batch_norm_relu(x, w, b, rm, rv, training, momentum, eps);
    }
    EXPECT_TRUE(out.is_contiguous(format));
    out.backward(tensor_from(c.at("grad_output"), format));
    expect_close(out, tensor_from(c.at("output")), 1e-12, 1e-12);
    expect_close(rm, tensor_from(c.at("running_mean_after")), 1e-12, 1e-12);
    expect_close(rv, tensor_from(c.at("running_var_after")), 1e-12, 1e-12);
    expect_close(x.grad(), tensor_from(c.at("grad_input")), 1e-10, 1e-10);
    EXPECT_TRUE(x.grad().is_contiguous(format));
    expect_close(w.grad(), tensor_from(c.at("grad_weight")), 1e-10, 1e-10);
    expect_close(b.grad(), tensor_from(c.at("grad_bias")), 1e-10, 1e-10);
    if (residual) expect_close(r.grad(), tensor_from(c.at("grad_residual")), 1e-12, 1e-12);
  }
}

// ---------------------------------------------------------------------------------------
// Finite differences (f64). Inputs stay away from the ReLU's kink: shifted by the bias so few
// outputs sit within the step of 0.

TEST(FusedBatchNormGradcheck, ReluAndAddRelu) {
  auto leaf = [](const Shape& shape, uint64_t seed) {
    return random_tensor(shape, kF64, seed).requires_grad_();
  };
  const Tensor rm = random_tensor({3}, kF64, 20, -0.5, 0.5);
  const Tensor rv = random_tensor({3}, kF64, 21, 0.5, 1.5);
  for (bool channels_last : {false, true}) {
    const MemoryFormat format =
        channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
    SCOPED_TRACE(channels_last ? "nhwc" : "nchw");
    using Fn = std::function<Tensor(const std::vector<Tensor>&)>;
    const std::vector<std::pair<const char*, Fn>> cases = {
        {"relu train",
         [&](const auto& v) {
           return batch_norm_relu(v[0].contiguous(format), v[1], v[2], {}, {}, true, 0.1, 1e-3);
         }},
        {"relu eval",
         [&](const auto& v) {
           return batch_norm_relu(v[0].contiguous(format), v[1], v[2], rm, rv, false);
         }},
        {"add_relu train",
         [&](const auto& v) {
           return batch_norm_add_relu(v[0].contiguous(format), v[3].contiguous(format), v[1], v[2],
                                      {}, {}, true, 0.1, 1e-3);
         }},
        {"add_relu eval",
         [&](const auto& v) {
           return batch_norm_add_relu(v[0].contiguous(format), v[3].contiguous(format), v[1], v[2],
                                      rm, rv, false);
         }},
    };
    for (const auto& [name, f] : cases) {
      SCOPED_TRACE(name);
      const std::vector<Tensor> inputs = {leaf({3, 3, 2, 2}, 22), leaf({3}, 23), leaf({3}, 24),
                                          leaf({3, 3, 2, 2}, 25)};
      const auto result = autograd::gradcheck(f, inputs);
      EXPECT_TRUE(result.ok) << result.message;
      // Second derivatives, through a create_graph backward (the ReLU's mask a constant).
      const auto second = autograd::gradgradcheck(f, inputs);
      EXPECT_TRUE(second.ok) << second.message;
      // Without the affine parameters.
      const auto plain = autograd::gradgradcheck(
          [&](const auto& v) {
            return f({v[0], Tensor(), Tensor(), v[1]});
          },
          {leaf({3, 3, 2, 2}, 26), leaf({3, 3, 2, 2}, 27)});
      EXPECT_TRUE(plain.ok) << plain.message;
    }
  }
}

// Without create_graph the gradients are the fused kernels' own, bit for bit (the path that
// existed before create_graph), with no history; with create_graph they are recorded ops that
// agree within rounding and keep the dtypes (bf16 input, f32 parameters) and the layout.
TEST(FusedBatchNorm, FirstOrderGradientsAreTheKernelsAndCreateGraphAgrees) {
  const Shape shape = {4, 6, 5, 3};
  const auto& table = detail::kernel_table(DeviceType::kCPU);
  for (DType dtype : {kF32, kBF16}) {
    for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
      for (bool training : {true, false}) {
        for (int form = 0; form < 3; ++form) {  // batch_norm, batch_norm_relu, _add_relu
          SCOPED_TRACE(::testing::Message() << dtype << " format " << static_cast<int>(format)
                                            << (training ? " train" : " eval") << " form " << form);
          const Tensor x = random_tensor(shape, dtype, 30).contiguous(format).requires_grad_();
          const Tensor r = random_tensor(shape, dtype, 31).contiguous(format).requires_grad_();
          const Tensor g = random_tensor(shape, dtype, 32).contiguous(format);
          const Tensor w = random_tensor({6}, kF32, 33).requires_grad_();
          const Tensor b = random_tensor({6}, kF32, 34).requires_grad_();
          const Tensor rm = random_tensor({6}, kF32, 35, -0.5, 0.5);
          const Tensor rv = random_tensor({6}, kF32, 36, 0.5, 1.5);
          auto forward = [&] {
            const Tensor m = rm.clone(), v = rv.clone();
            if (form == 0) return batch_norm(x, w, b, m, v, training);
            if (form == 1) return batch_norm_relu(x, w, b, m, v, training);
            return batch_norm_add_relu(x, r, w, b, m, v, training);
          };
          // The kernels: the forward's saved statistics, then the backward computation.
          const Tensor rows = detail::batch_norm_rows(x.detach(), format);
          const Tensor mean = empty({6}), invstd = empty({6});
          table.batch_norm_forward(detail::batch_norm_rows(empty(shape, dtype, format), format),
                                   mean, invstd, rows, w.detach(), b.detach(), rm.clone(),
                                   rv.clone(), training, 0.1, 1e-5);
          const Tensor y = forward();
          std::array<Tensor, 4> want;
          if (form == 0) {
            const auto k = detail::batch_norm_backward(g, x.detach(), w.detach(), mean, invstd,
                                                       training, {true, true, true});
            want = {k[0], k[1], k[2], Tensor()};
          } else {
            want =
                detail::batch_norm_relu_backward(g, y.detach(), x.detach(), w.detach(), mean,
                                                 invstd, training, {true, true, true, form == 2});
          }
          const std::vector<Tensor> params = {x, w, b, r};
          for (bool create_graph : {false, true}) {
            SCOPED_TRACE(create_graph ? "create_graph" : "first order");
            for (const Tensor& t : params) t.set_grad(Tensor());
            autograd::backward({forward()}, {g}, false, create_graph);
            const double tol = create_graph ? (dtype == kBF16 ? 2e-2 : 1e-4) : 0.0;
            for (size_t i = 0; i < params.size(); ++i) {
              const Tensor& got = params[i].grad();
              if (!want[i].defined()) {
                EXPECT_FALSE(got.defined());
                continue;
              }
              ASSERT_TRUE(got.defined());
              // The input's and weight's depend on the input; the bias's (sum of the masked g)
              // and the residual's (the masked g) only on g, a constant here.
              EXPECT_EQ(got.requires_grad(), create_graph && i < 2);
              EXPECT_EQ(got.dtype(), want[i].dtype());
              if (got.dim() == 4) {
                EXPECT_TRUE(got.is_contiguous(format));
              }
              expect_close(got.detach(), want[i], tol, tol);
            }
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// linear(input, weight, bias, Activation): the GEMM, then bias + ReLU in one pass.

TEST(FusedLinear, EqualsLinearThenRelu) {
  for (DType dtype : {kF64, kF32, kBF16}) {
    for (const Shape& in_shape : {Shape{5, 7}, Shape{2, 3, 7}}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype << " " << shape_str(in_shape) << (with_bias ? " bias" : " no bias"));
        auto make = [&](uint64_t seed) {
          const Tensor x = random_tensor(in_shape, dtype, seed).requires_grad_();
          const Tensor w = random_tensor({4, 7}, dtype, seed + 1).requires_grad_();
          const Tensor b =
              with_bias ? random_tensor({4}, dtype, seed + 2).requires_grad_() : Tensor();
          return std::vector<Tensor>{x, w, b};
        };
        const std::vector<Tensor> f = make(30), u = make(30);
        const Tensor fused = linear(f[0], f[1], f[2], Activation::kRelu);
        const Tensor unfused = relu(linear(u[0], u[1], u[2]));
        EXPECT_EQ(fused.grad_fn()->name(), "BiasActivationBackward");
        // bf16: the unfused sum rounds once more (the GEMM's product plus the bias).
        const double tol = dtype == kF64 ? 1e-12 : dtype == kF32 ? 1e-5 : 2e-2;
        expect_close(fused, unfused, tol, tol);
        const Tensor g = random_tensor(fused.sizes(), dtype, 33);
        fused.backward(g);
        unfused.backward(g);
        if (dtype == kBF16) continue;  // a value within a rounding of 0 may switch its mask
        for (size_t i = 0; i < 3; ++i) {
          if (f[i].defined()) expect_close(f[i].grad(), u[i].grad(), tol, tol);
        }
      }
    }
  }
}

TEST(FusedLinear, NoActivationIsLinear) {
  const Tensor x = random_tensor({3, 5}, kF64, 40), w = random_tensor({2, 5}, kF64, 41);
  const Tensor b = random_tensor({2}, kF64, 42);
  expect_close(linear(x, w, b, Activation::kNone), linear(x, w, b), 0.0, 0.0);
}

TEST(FusedLinear, AutocastRunsTheGemmInBf16) {
  const Tensor x = random_tensor({3, 5}, kF32, 43);
  const Tensor w = random_tensor({2, 5}, kF32, 44).requires_grad_();
  const Tensor b = random_tensor({2}, kF32, 45).requires_grad_();
  Tensor out;
  {
    AutocastGuard autocast(kCPU, kBF16);
    out = linear(x, w, b, Activation::kRelu);
  }
  EXPECT_EQ(out.dtype(), kBF16);
  expect_close(out.to(kF32), relu(linear(x, w.detach(), b.detach())), 2e-2, 2e-2);
  out.to(kF32).sum().backward();
  EXPECT_EQ(w.grad().dtype(), kF32);
  EXPECT_EQ(b.grad().dtype(), kF32);
}

TEST(FusedLinear, RejectsMismatchedArguments) {
  EXPECT_EMBER_ERROR(linear(zeros({3, 5}), zeros({2, 4}), {}, Activation::kRelu),
                     "linear: input has 5 features but weight expects 4");
  EXPECT_EMBER_ERROR(linear(zeros({3, 5}), zeros({2, 5}), zeros({2}, kF64), Activation::kRelu),
                     "linear: bias has dtype");
}

TEST(FusedLinearGradcheck, BiasRelu) {
  const auto f = [](const std::vector<Tensor>& v) {
    return linear(v[0], v[1], v[2], Activation::kRelu);
  };
  const std::vector<Tensor> inputs{random_tensor({2, 3, 4}, kF64, 50).requires_grad_(),
                                   random_tensor({5, 4}, kF64, 51).requires_grad_(),
                                   random_tensor({5}, kF64, 52).requires_grad_()};
  const auto result = autograd::gradcheck(f, inputs);
  EXPECT_TRUE(result.ok) << result.message;
  const auto second = autograd::gradgradcheck(f, inputs);  // the epilogue's gradient records
  EXPECT_TRUE(second.ok) << second.message;
}

}  // namespace
}  // namespace ember
