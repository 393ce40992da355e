// SGD: hand-computed updates, the first-step momentum buffer, Nesterov checks and errors.
#include <ember/optim/sgd.h>

#include "test_util.h"

namespace ember::optim {
namespace {

Tensor leaf(std::vector<float> values) {
  Tensor p = from_vector(values);
  p.requires_grad_();
  return p;
}

void set_grad(const Tensor& p, std::vector<float> values) { p.set_grad(from_vector(values)); }

TEST(SGD, PlainStepIsGradientDescent) {
  Tensor p = leaf({1.0f, -2.0f});
  SGD sgd({p}, {.lr = 0.5});
  set_grad(p, {0.2f, 0.4f});
  sgd.step();
  testing::expect_close(p.detach(), from_vector<float>({0.9f, -2.2f}));
}

TEST(SGD, MomentumBufferStartsAsTheGradientWithoutDampening) {
  // momentum 0.9, dampening 0.5: step 1 b = g (no dampening); step 2 b = 0.9 b + 0.5 g.
  Tensor p = leaf({1.0f});
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  set_grad(p, {1.0f});
  sgd.step();
  EXPECT_NEAR(p.item<double>(), 1.0 - 0.1 * 1.0, 1e-6);
  testing::expect_close(sgd.state(0, 0).buffers.at("momentum_buffer"), from_vector<float>({1.0f}));
  set_grad(p, {2.0f});
  sgd.step();
  const double b2 = 0.9 * 1.0 + 0.5 * 2.0;
  EXPECT_NEAR(p.item<double>(), 0.9 - 0.1 * b2, 1e-6);
  EXPECT_EQ(sgd.state(0, 0).step, 0);  // SGD keeps no step count, as PyTorch
}

TEST(SGD, NesterovAndWeightDecay) {
  // g = grad + wd p; b = g; update = g + m b.
  Tensor p = leaf({2.0f});
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.5, .weight_decay = 0.25, .nesterov = true});
  set_grad(p, {1.0f});
  sgd.step();
  const double g1 = 1.0 + 0.25 * 2.0;
  const double p1 = 2.0 - 0.1 * (g1 + 0.5 * g1);
  EXPECT_NEAR(p.item<double>(), p1, 1e-6);
  set_grad(p, {-1.0f});
  sgd.step();
  const double g2 = -1.0 + 0.25 * p1;
  const double b2 = 0.5 * g1 + g2;
  EXPECT_NEAR(p.item<double>(), p1 - 0.1 * (g2 + 0.5 * b2), 1e-6);
  // The gradient itself is never modified by the update.
  testing::expect_close(p.grad(), from_vector<float>({-1.0f}));
}

TEST(SGD, ParametersWithoutGradientsAreLeftAlone) {
  Tensor a = leaf({1.0f});
  Tensor b = leaf({5.0f});
  SGD sgd({a, b}, {.lr = 1.0, .momentum = 0.9});
  set_grad(a, {1.0f});
  sgd.step();
  EXPECT_FLOAT_EQ(a.item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(b.item<float>(), 5.0f);
  EXPECT_TRUE(sgd.state(0, 1).empty());
}

TEST(SGD, TrainsThroughAutograd) {
  // Minimise sum((p - 3)^2): gradients come from backward().
  Tensor p = leaf({0.0f, 10.0f});
  SGD sgd({p}, {.lr = 0.1, .momentum = 0.5});
  for (int i = 0; i < 100; ++i) {
    sgd.zero_grad();
    Tensor diff = sub(p, 3.0);
    mul(diff, diff).backward(ones({2}));  // the gradient of sum((p - 3)^2)
    sgd.step();
  }
  EXPECT_FALSE(p.grad_fn());
  testing::expect_close(p.detach(), from_vector<float>({3.0f, 3.0f}), 1e-4, 1e-4);
}

TEST(SGD, RejectsBadOptions) {
  Tensor p = leaf({1.0f});
  EXPECT_EMBER_ERROR(SGD({p}, {.lr = -0.1}), "SGD: invalid learning rate -0.1");
  EXPECT_EMBER_ERROR(SGD({p}, {.lr = 0.1, .momentum = -0.5}), "SGD: invalid momentum -0.5");
  EXPECT_EMBER_ERROR(SGD({p}, {.lr = 0.1, .weight_decay = -1}), "invalid weight_decay -1");
  EXPECT_EMBER_ERROR(SGD({p}, {.lr = 0.1, .nesterov = true}),
                     "Nesterov momentum requires momentum > 0 and dampening == 0 (momentum 0,");
  EXPECT_EMBER_ERROR(SGD({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                     "dampening 0.1");
  EXPECT_EMBER_ERROR(SGD(std::vector<Tensor>{}, {.lr = 0.1}), "SGD: ");
  // A group's own options are checked as well.
  SGD sgd({p}, {.lr = 0.1});
  EXPECT_EMBER_ERROR(sgd.add_param_group({{leaf({1.0f})}, {{"lr", -2.0}}}),
                     "SGD: invalid learning rate -2");
  EXPECT_EMBER_ERROR(sgd.add_param_group({{leaf({1.0f})}, {{"betas", 0.9}}}),
                     "SGD: unknown option \"betas\"");
  EXPECT_EQ(sgd.param_groups().size(), 1u);
}

}  // namespace
}  // namespace ember::optim
