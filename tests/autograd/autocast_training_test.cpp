// Mixed-precision training on the CPU: ResNet-20 (nn::resnet20) trained with SGD under a
// bf16 (and an f16) AutocastGuard, beside the same run in f32. Master weights, gradients and
// the optimizer stay f32; the loss tracks the f32 run's.
#include <cmath>
#include <vector>

#include "test_util.h"

namespace ember {
namespace {

void expect_close_all(const Tensor& t, double value) {
  for (const double v : t.to_vector<double>()) EXPECT_DOUBLE_EQ(v, value);
}

struct TrainingRun {
  std::vector<double> losses;
  bool params_f32 = true, grads_f32 = true;
};

// `steps` SGD steps on one fixed batch (so the loss falls steadily), autocast in `low` unless
// it is f32; the guard wraps forward and loss only, backward and step run outside it.
TrainingRun train(DType low, int steps) {
  manual_seed(7);
  auto net = nn::resnet20(10, 1);
  net->train();
  Generator gen(11);
  const Tensor x = normal({8, 1, 8, 8}, 0.0, 1.0, kF32, &gen);
  const Tensor y = randint(0, 10, {8}, kI64, &gen);
  optim::SGD sgd(net->parameters(), {.lr = 0.05, .momentum = 0.9});
  TrainingRun run;
  for (int step = 0; step < steps; ++step) {
    Tensor loss;
    {
      AutocastGuard guard(kCPU, low == kF32 ? kBF16 : low, /*enabled=*/low != kF32);
      loss = cross_entropy((*net)(x), y);
    }
    EXPECT_EQ(loss.dtype(), kF32);
    sgd.zero_grad();
    loss.backward();
    for (const Tensor& p : net->parameters()) {
      run.params_f32 = run.params_f32 && p.dtype() == kF32;
      run.grads_f32 = run.grads_f32 && p.grad().defined() && p.grad().dtype() == kF32;
    }
    sgd.step();
    run.losses.push_back(loss.item<double>());
  }
  return run;
}

TEST(AutocastTraining, ResNet20LossTracksTheF32RunInBf16AndF16) {
  constexpr int kSteps = 8;
  const TrainingRun f32 = train(kF32, kSteps);
  ASSERT_LT(f32.losses.back(), 0.5 * f32.losses.front()) << "the f32 run should learn the batch";
  for (const DType low : {kBF16, kF16}) {
    SCOPED_TRACE(dtype_name(low));
    const TrainingRun mixed = train(low, kSteps);
    EXPECT_TRUE(mixed.params_f32);
    EXPECT_TRUE(mixed.grads_f32);
    // The first loss differs only by the forward's rounding (bf16: u = 2^-8 per layer over
    // 20 layers: 0.002 here); later ones also by the trajectories drifting apart (bf16's
    // largest gap here is 0.076 at step 2, f16's 0.017). Band: 5% of the initial loss (0.13),
    // and the same fall.
    const double band = 0.05 * f32.losses.front();
    for (int i = 0; i < kSteps; ++i)
      EXPECT_NEAR(mixed.losses[i], f32.losses[i], band) << "step " << i;
    EXPECT_LT(mixed.losses.back(), 0.5 * mixed.losses.front());
  }
}

// The cached weight cast of a training loop inside one guard is reached by every step's
// backward: a node that saved nothing survives the first backward, as in PyTorch, while one
// that saved tensors still refuses a second pass.
TEST(AutogradEngine, NodesThatSavedNothingAllowASecondBackward) {
  Tensor x = ones({3}).requires_grad_();
  const Tensor cast = x.to(kBF16);
  sum(cast.to(kF32) * 2.0).backward();
  sum(cast.to(kF32) * 3.0).backward();
  expect_close_all(x.grad(), 5.0);
  const Tensor y = sum(exp(x));
  y.backward();
  EXPECT_EMBER_ERROR(y.backward(), "backward through the graph a second time");
}

}  // namespace
}  // namespace ember
