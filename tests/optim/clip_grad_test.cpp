// clip_grad_norm_ against PyTorch and by hand.
#include <cmath>
#include <limits>
#include <optional>

#include <ember/optim/clip_grad.h>

#include "golden.h"

namespace ember::optim {
namespace {

using nlohmann::json;

std::vector<Tensor> golden_params(Device device, DType dtype) {
  const json& clip = testing::optim_golden()["clip"];
  std::vector<Tensor> params;
  for (size_t k = 0; k < clip["grads"].size(); ++k) {
    const auto shape = clip["shapes"][k].get<Shape>();
    Tensor p = zeros(shape, TensorOptions(dtype, device));
    p.requires_grad_();
    p.set_grad(from_vector(clip["grads"][k].get<std::vector<double>>(), shape, device).to(dtype));
    params.push_back(p);
  }
  return params;
}

// float64 must agree to double rounding: max_norm and the 1e-6 guard are not rounded to f32.
// foreach: the multi-tensor norm and scaling (true), per gradient (false), the device's default.
void check_golden(Device device, DType dtype, std::optional<bool> foreach = std::nullopt) {
  const json& cases = testing::optim_golden()[dtype == kF64 ? "clip_f64" : "clip"]["cases"];
  const double rtol = dtype == kF64 ? 1e-14 : 1e-5, atol = dtype == kF64 ? 1e-16 : 1e-7;
  ASSERT_GE(cases.size(), 4u);
  for (const json& c : cases) {
    const double norm_type = c["norm_type"].is_string() ? std::numeric_limits<double>::infinity()
                                                        : c["norm_type"].get<double>();
    SCOPED_TRACE("norm_type " + std::to_string(norm_type));
    SCOPED_TRACE("max_norm " + std::to_string(c["max_norm"].get<double>()));
    auto params = golden_params(device, dtype);
    const Tensor total = clip_grad_norm_(params, c["max_norm"].get<double>(), norm_type, foreach);
    EXPECT_EQ(total.device(), device);
    EXPECT_EQ(total.dtype(), dtype);
    EXPECT_EQ(total.numel(), 1);
    const double expected = c["total_norm"].get<double>();
    EXPECT_NEAR(total.item<double>(), expected, rtol * expected);
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_EQ(params[k].grad().dtype(), dtype);
      testing::expect_values_near(params[k].grad().to_vector<double>(),
                                  c["grads"][k].get<std::vector<double>>(), rtol, atol,
                                  "grad " + std::to_string(k));
    }
  }
}

TEST(ClipGradNorm, MatchesPyTorch) { check_golden(kCPU, kF32); }
TEST(ClipGradNorm, MatchesPyTorchInFloat64) { check_golden(kCPU, kF64); }
TEST(ClipGradNorm, ForeachMatchesPyTorch) { check_golden(kCPU, kF32, true); }
TEST(ClipGradNorm, ForeachMatchesPyTorchInFloat64) { check_golden(kCPU, kF64, true); }

// The CUDA default is the multi-tensor pass; this pins the per-gradient one there.
TEST(ClipGradNorm, PerGradientMatchesPyTorchOnCuda) {
  EMBER_REQUIRE_CUDA();
  check_golden(cuda_device(0), kF32, false);
  check_golden(cuda_device(0), kF64, false);
}

TEST(ClipGradNorm, MatchesPyTorchOnCuda) {
  EMBER_REQUIRE_CUDA();
  check_golden(cuda_device(0), kF32);
}

TEST(ClipGradNorm, MatchesPyTorchInFloat64OnCuda) {
  EMBER_REQUIRE_CUDA();
  check_golden(cuda_device(0), kF64);
}

TEST(ClipGradNorm, HandComputed) {
  Tensor a = zeros({2});
  a.requires_grad_();
  Tensor b = zeros({1});
  b.requires_grad_();
  Tensor no_grad = zeros({3});
  no_grad.requires_grad_();
  a.set_grad(from_vector<float>({3.0f, 0.0f}));
  b.set_grad(from_vector<float>({-4.0f}));
  // Total 2-norm 5; clipped to 1 they scale by 1 / (5 + 1e-6).
  const Tensor total = clip_grad_norm_({a, no_grad, b}, 1.0);
  EXPECT_NEAR(total.item<double>(), 5.0, 1e-6);
  EXPECT_NEAR(a.grad().to_vector<double>()[0], 3.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(b.grad().item<double>(), -4.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_FALSE(no_grad.grad().defined());
  // Already small enough: unchanged; the inf norm is the largest |g|.
  const Tensor inf_total = clip_grad_norm_({a, b}, 10.0, std::numeric_limits<double>::infinity());
  EXPECT_NEAR(inf_total.item<double>(), 4.0 / (5.0 + 1e-6), 1e-6);
  EXPECT_NEAR(b.grad().item<double>(), -4.0 / (5.0 + 1e-6), 1e-6);
  // Nothing to clip.
  EXPECT_EQ(clip_grad_norm_({no_grad}, 1.0).item<double>(), 0.0);
}

// The two halves PyTorch also offers: get_total_norm then clip_grads_with_norm_ give
// clip_grad_norm_'s result bit for bit.
TEST(ClipGradNorm, TotalNormThenClipWithItIsClipGradNorm) {
  auto whole = golden_params(kCPU, kF32);
  auto halves = golden_params(kCPU, kF32);
  const Tensor total = clip_grad_norm_(whole, 0.5);
  std::vector<Tensor> grads;
  for (const Tensor& p : halves) grads.push_back(p.grad());
  const Tensor again = get_total_norm(grads);
  EXPECT_TRUE(equal(again, total));
  clip_grads_with_norm_(halves, 0.5, again);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(equal(halves[i].grad(), whole[i].grad()));
  EXPECT_EQ(get_total_norm({}).item<double>(), 0.0);
  EXPECT_EMBER_ERROR(clip_grads_with_norm_(halves, 0.5, Tensor()),
                     "clip_grads_with_norm_: total_norm must be a one-element tensor");
}

TEST(ClipGradNorm, RejectsBadArguments) {
  Tensor a = zeros({2});
  a.requires_grad_();
  a.set_grad(ones({2}));
  EXPECT_EMBER_ERROR(clip_grad_norm_({a}, 1.0, 0.0),
                     "clip_grad_norm_: norm_type must be > 0, got 0");
  EXPECT_EMBER_ERROR(clip_grad_norm_({a}, -1.0), "clip_grad_norm_: max_norm must be >= 0, got -1");
  testing::expect_close(a.grad(), ones({2}));
}

}  // namespace
}  // namespace ember::optim
