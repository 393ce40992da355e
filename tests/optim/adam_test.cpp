// Adam and AdamW: hand-computed steps, coupled vs decoupled weight decay, amsgrad, errors.
#include <cmath>

#include <ember/optim/adam.h>

#include "test_util.h"

namespace ember::optim {
namespace {

Tensor leaf(std::vector<float> values) {
  Tensor p = from_vector(values);
  p.requires_grad_();
  return p;
}

// One scalar Adam step in double, for reference.
struct RefAdam {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled, amsgrad;
  double m = 0, v = 0, v_max = 0;
  int t = 0;
  double step(double p, double grad) {
    ++t;
    if (decoupled)
      p *= 1 - lr * weight_decay;
    else
      grad += weight_decay * p;
    m = beta1 * m + (1 - beta1) * grad;
    v = beta2 * v + (1 - beta2) * grad * grad;
    v_max = std::max(v_max, v);
    const double denom = std::sqrt(amsgrad ? v_max : v) / std::sqrt(1 - std::pow(beta2, t)) + eps;
    return p - lr / (1 - std::pow(beta1, t)) * m / denom;
  }
};

TEST(Adam, FirstStepMovesByLrTimesSignOfGradient) {
  Tensor p = leaf({1.0f, -1.0f});
  Adam adam({p}, {.lr = 0.01});
  p.set_grad(from_vector<float>({3.0f, -0.002f}));
  adam.step();
  // m_hat / sqrt(v_hat) = sign(g) on the first step (up to eps).
  testing::expect_close(p.detach(), from_vector<float>({0.99f, -0.99f}), 1e-5);
  EXPECT_EQ(adam.state(0, 0).step, 1);
  EXPECT_EQ(adam.state(0, 0).buffers.size(), 2u);  // exp_avg, exp_avg_sq
}

TEST(Adam, MatchesReferenceOverSeveralSteps) {
  for (const bool decoupled : {false, true}) {
    for (const bool amsgrad : {false, true}) {
      SCOPED_TRACE(std::string(decoupled ? "AdamW" : "Adam") + (amsgrad ? " amsgrad" : ""));
      Tensor p = leaf({0.7f});
      RefAdam ref{0.05, 0.8, 0.9, 1e-6, 0.1, decoupled, amsgrad};
      std::unique_ptr<Optimizer> opt;
      if (decoupled)
        opt = std::make_unique<AdamW>(std::vector<Tensor>{p}, AdamWOptions{.lr = 0.05,
                                                                           .betas = {0.8, 0.9},
                                                                           .eps = 1e-6,
                                                                           .weight_decay = 0.1,
                                                                           .amsgrad = amsgrad});
      else
        opt = std::make_unique<Adam>(std::vector<Tensor>{p}, AdamOptions{.lr = 0.05,
                                                                         .betas = {0.8, 0.9},
                                                                         .eps = 1e-6,
                                                                         .weight_decay = 0.1,
                                                                         .amsgrad = amsgrad});
      double expected = 0.7;
      // Large then small gradients, so the amsgrad maximum matters.
      for (const double g : {2.0, 1.5, -0.1, 0.05, 0.2, -0.3}) {
        p.set_grad(full({1}, g));
        opt->step();
        expected = ref.step(expected, static_cast<float>(g));
        EXPECT_NEAR(p.item<double>(), expected, 1e-5 * std::abs(expected));
      }
      EXPECT_EQ(opt->state(0, 0).buffers.count("max_exp_avg_sq"), amsgrad ? 1u : 0u);
    }
  }
}

TEST(AdamW, DecaysEvenWithZeroGradient) {
  Tensor p = leaf({2.0f});
  AdamW adamw({p}, {.lr = 0.1, .weight_decay = 0.5});
  EXPECT_DOUBLE_EQ(adamw.param_groups()[0].option("weight_decay"), 0.5);
  p.set_grad(zeros({1}));
  adamw.step();
  EXPECT_NEAR(p.item<double>(), 2.0 * (1 - 0.1 * 0.5), 1e-6);
  // Adam's L2 penalty instead goes through the moments: the first step moves by lr.
  Tensor q = leaf({2.0f});
  Adam adam({q}, {.lr = 0.1, .weight_decay = 0.5});
  q.set_grad(zeros({1}));
  adam.step();
  EXPECT_NEAR(q.item<double>(), 1.9, 1e-6);
}

TEST(AdamW, DefaultsFollowPyTorch) {
  AdamW adamw({leaf({1.0f})});
  EXPECT_EQ(adamw.name(), "AdamW");
  EXPECT_DOUBLE_EQ(adamw.defaults().at("weight_decay"), 1e-2);
  Adam adam({leaf({1.0f})});
  EXPECT_DOUBLE_EQ(adam.defaults().at("weight_decay"), 0.0);
  EXPECT_DOUBLE_EQ(adam.defaults().at("lr"), 1e-3);
  EXPECT_DOUBLE_EQ(adam.defaults().at("beta2"), 0.999);
  EXPECT_DOUBLE_EQ(adam.defaults().at("eps"), 1e-8);
}

TEST(Adam, RejectsBadOptions) {
  Tensor p = leaf({1.0f});
  EXPECT_EMBER_ERROR(Adam({p}, {.lr = -1e-3}), "Adam: invalid learning rate -0.001");
  EXPECT_EMBER_ERROR(Adam({p}, {.betas = {1.0, 0.999}}),
                     "Adam: invalid beta1 1 (must be in [0, 1))");
  EXPECT_EMBER_ERROR(Adam({p}, {.betas = {0.9, -0.1}}), "Adam: invalid beta2 -0.1");
  EXPECT_EMBER_ERROR(Adam({p}, {.eps = 0.0}), "Adam: invalid eps 0 (must be > 0)");
  EXPECT_EMBER_ERROR(AdamW({p}, {.weight_decay = -0.5}), "AdamW: invalid weight_decay -0.5");
  EXPECT_EMBER_ERROR(AdamW({p}, {.eps = -1e-8}), "AdamW: invalid eps");
}

}  // namespace
}  // namespace ember::optim
