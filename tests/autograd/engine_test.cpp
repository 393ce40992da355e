// The autograd engine: accumulation, graph traversal, retain_graph, hooks, grad mode and the
// checks that keep gradients from being silently wrong.
#include "test_util.h"

namespace ember {
namespace {

Tensor leaf(std::vector<double> values, Shape shape = {}) {
  Tensor t = from_vector<double>(values, shape);
  t.requires_grad_();
  return t;
}

TEST(AutogradEngine, SimpleChainAndAccumulation) {
  Tensor x = leaf({1, 2, 3});
  Tensor y = (x * x * 3 + x).sum();  // dy/dx = 6x + 1
  EXPECT_TRUE(y.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "SumBackward");
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{7, 13, 19}));
  // A second pass over a new graph accumulates.
  (x * 2).sum().backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{9, 15, 21}));
  x.set_grad(Tensor());
  EXPECT_FALSE(x.grad().defined());
}

TEST(AutogradEngine, DiamondGraphsSumBothPaths) {
  Tensor x = leaf({2});
  Tensor a = x * 3;
  Tensor b = x.exp();
  Tensor c = a * b;  // d/dx (3x e^x) = 3 e^x (1 + x)
  c.backward();
  EXPECT_NEAR(x.grad().item<double>(), 3 * std::exp(2.0) * 3, 1e-9);
}

TEST(AutogradEngine, BroadcastGradientsAreSummed) {
  Tensor a = leaf({1, 2, 3}, {3});
  Tensor b = leaf({10, 20}, {2, 1});
  (a * b).sum().backward();
  EXPECT_EQ(a.grad().to_vector<double>(), (std::vector<double>{30, 30, 30}));
  EXPECT_EQ(b.grad().sizes(), (Shape{2, 1}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{6, 6}));
}

TEST(AutogradEngine, RetainGraphAllowsASecondPass) {
  Tensor x = leaf({1, 2});
  Tensor y = (x.exp()).sum();
  y.backward({}, true);
  y.backward();
  testing::expect_close(x.grad(), x.detach().exp() * 2.0);
  EXPECT_EMBER_ERROR(y.backward(), "backward through the graph a second time");
}

TEST(AutogradEngine, NoGradAndDetachStopRecording) {
  Tensor x = leaf({1, 2});
  {
    NoGradGuard guard;
    Tensor y = x * 2;
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_TRUE(GradMode::is_enabled());
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.storage().is_same(x.storage()));
  EXPECT_FALSE((d * 2).requires_grad());
  EXPECT_EMBER_ERROR(d.backward(), "backward: tensor does not require grad");
}

TEST(AutogradEngine, NonScalarBackwardNeedsAGradient) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 3;
  EXPECT_EMBER_ERROR(y.backward(), "grad can be implicitly created only for one-element outputs");
  EXPECT_EMBER_ERROR(y.backward(ones({3}, kF64)),
                     "gradient of shape [3] does not match output of shape [2]");
  y.backward(from_vector<double>({1, 10}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 30}));
}

TEST(AutogradEngine, InPlaceChecks) {
  Tensor x = leaf({1, 2});
  EXPECT_EMBER_ERROR(x.add_(1), "add_: a tensor that requires grad cannot be modified in place");
  EXPECT_EMBER_ERROR(x.fill_(0), "fill_: a tensor that requires grad cannot be modified in place");
  Tensor plain = zeros({2}, kF64);
  EXPECT_EMBER_ERROR(plain.mul_(x),
                     "mul_: an in-place op cannot take an operand that requires grad");
  {
    NoGradGuard guard;  // optimizer-style updates are fine
    x.sub_(ones({2}, kF64), 0.5);
  }
  EXPECT_EQ(x.to_vector<double>(), (std::vector<double>{0.5, 1.5}));
  // A saved tensor modified after saving is reported at backward.
  Tensor w = from_vector<double>({3, 4});
  Tensor y = (x * w).sum();
  w.add_(1);
  EXPECT_EMBER_ERROR(y.backward(), "was modified by an in-place operation after it was saved");
}

TEST(AutogradEngine, LeafRequirements) {
  EXPECT_EMBER_ERROR(zeros({2}, kI64).requires_grad_(),
                     "only floating tensors can require gradients");
  Tensor x = leaf({1});
  Tensor y = x * 2;
  EXPECT_EMBER_ERROR(y.requires_grad_(), "only leaf tensors can change requires_grad");
  EXPECT_EMBER_ERROR(x.set_grad(zeros({2}, kF64)), "set_grad: gradient of shape [2]");
  EXPECT_FALSE(eq(x, 1).requires_grad());  // comparisons are not differentiable
  EXPECT_FALSE(x.to(kI64).requires_grad());
  EXPECT_TRUE(x.to(kF32).requires_grad());
}

TEST(AutogradEngine, HooksOnLeavesAndIntermediates) {
  Tensor x = leaf({1, 2});
  Tensor y = x * 2;
  std::vector<double> seen;
  y.register_hook([&](const Tensor& g) {
    seen = g.to_vector<double>();
    return g * 10;  // replaces the gradient flowing on
  });
  x.register_hook([](const Tensor& g) { return g + 1; });
  y.retain_grad();
  y.sum().backward();
  EXPECT_EQ(seen, (std::vector<double>{1, 1}));
  // The retained gradient is the one after the hooks, as in PyTorch.
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{10, 10}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{21, 21}));
}

TEST(AutogradEngine, PostAccumulateHookFiresOnceWithTheFullGradient) {
  // x feeds three branches; the hook must fire once, after all three contributions.
  Tensor x = leaf({1, 2});
  int calls = 0;
  std::vector<double> at_hook;
  x.register_post_accumulate_grad_hook([&](const Tensor& t) {
    ++calls;
    at_hook = t.grad().to_vector<double>();
  });
  Tensor y = (x * 2).sum() + (x * 3).sum() + (x.exp() * 0).sum();
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(at_hook, (std::vector<double>{5, 5}));
}

TEST(AutogradEngine, QueuedCallbacksRunAfterTheWholeGraphInOrder) {
  // a's AccumulateGrad runs first (a is used last); its hook queues a callback that must see
  // b's gradient too, and the callback may queue another, which runs after it.
  Tensor a = leaf({1}), b = leaf({2});
  std::vector<std::string> order;
  a.register_post_accumulate_grad_hook([&](const Tensor&) {
    order.push_back("hook a");
    autograd::queue_callback([&] {
      order.push_back(b.grad().defined() ? "callback saw b" : "callback before b");
      autograd::queue_callback([&] { order.push_back("queued by the callback"); });
    });
  });
  b.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("hook b"); });
  ((b * 3).exp() * a).sum().backward();
  EXPECT_EQ(order, (std::vector<std::string>{"hook a", "hook b", "callback saw b",
                                             "queued by the callback"}));
  // A second pass starts with no callbacks left over.
  order.clear();
  ((b * 3) * a).sum().backward();
  EXPECT_EQ(order.front(), "hook a");
  EXPECT_EQ(order.size(), 4u);
}

TEST(AutogradEngine, QueueCallbackOutsideBackwardIsAnError) {
  EXPECT_EMBER_ERROR(autograd::queue_callback([] {}),
                     "queue_callback: callbacks can only be queued during a backward pass");
}

TEST(AutogradEngine, LeavesReachedThroughViewsAndCasts) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = x.t().reshape({3, 2}).to(kF32).narrow(0, 1, 2).select(1, 0);
  y.sum().backward();
  EXPECT_EQ(x.grad().dtype(), kF64);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 1, 1, 0, 0, 0}));
}

TEST(AutogradEngine, CreateGraphGivesSecondDerivatives) {
  Tensor x = leaf({2});
  Tensor y = x * x * x;  // y' = 3x^2, y'' = 6x
  y.backward({}, false, true);
  Tensor first = x.grad();
  EXPECT_DOUBLE_EQ(first.item<double>(), 12.0);
  EXPECT_TRUE(first.requires_grad());
  x.set_grad(Tensor());
  first.backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 12.0);
}

// A formula reading its op's saved output (exp's, tanh's) records the output's dependence on
// the input: the saved output takes its node as history again under create_graph.
TEST(AutogradEngine, SavedOutputsKeepTheirHistoryUnderCreateGraph) {
  Tensor x = leaf({0.5, -1.0});
  exp(x).sum().backward({}, false, true);  // d/dx = exp(x), d2/dx2 = exp(x)
  Tensor first = x.grad();
  x.set_grad(Tensor());
  first.sum().backward();
  EXPECT_NEAR(x.grad().to_vector<double>()[0], std::exp(0.5), 1e-15);
  EXPECT_NEAR(x.grad().to_vector<double>()[1], std::exp(-1.0), 1e-15);

  Tensor y = leaf({0.3});
  tanh(y).backward({}, false, true);  // d2/dy2 tanh = -2 tanh (1 - tanh^2)
  first = y.grad();
  y.set_grad(Tensor());
  first.backward();
  const double t = std::tanh(0.3);
  EXPECT_NEAR(y.grad().item<double>(), -2 * t * (1 - t * t), 1e-15);
}

// A fused first-order gradient under create_graph: a second backward reaching it names the op;
// one that does not reach it runs.
TEST(AutogradEngine, SecondBackwardThroughAFirstOrderGradientIsAnError) {
  Generator g(5);
  Tensor q = randn({1, 3, 4}, kF64, &g).requires_grad_();
  Tensor k = randn({1, 3, 4}, kF64, &g), v = randn({1, 3, 4}, kF64, &g);
  Tensor x = leaf({2});
  (scaled_dot_product_attention(q, k, v).sum() + x * x * x).backward({}, false, true);
  ASSERT_TRUE(q.grad().requires_grad());
  Tensor dx = x.grad();
  x.set_grad(Tensor());
  dx.backward();
  EXPECT_DOUBLE_EQ(x.grad().item<double>(), 12.0);
  EXPECT_EMBER_ERROR(q.grad().sum().backward(),
                     "scaled_dot_product_attention: its gradient has no derivative in ember");
  // autograd::grad finds the way through the marked gradient and stops there too, instead of
  // returning the other terms' part (here 2) of a Hessian-vector product.
  const Tensor dq = autograd::grad({scaled_dot_product_attention(q, k, v).sum() + (q * q).sum()},
                                   {q}, {}, std::nullopt, true)[0];
  EXPECT_EMBER_ERROR(autograd::grad({dq.sum()}, {q}),
                     "scaled_dot_product_attention: its gradient has no derivative in ember");
}

// torch.autograd.grad: gradients returned, nothing accumulated, only the part of the graph
// leading to the inputs run.
TEST(AutogradGrad, ReturnsGradientsWithoutAccumulating) {
  Tensor x = leaf({1, 2, 3}), w = leaf({2});
  Tensor other = leaf({5});
  int other_branch_runs = 0;
  const Tensor side = autograd::apply_function(
      "CountedBackward", {other}, [&] { return std::vector<Tensor>{other * 1.0}; },
      [&](const std::vector<Tensor>& grads) {
        ++other_branch_runs;
        return std::vector<Tensor>{grads[0]};
      })[0];
  const Tensor y = (x * x * w).sum() + side.sum();
  const auto grads = autograd::grad({y}, {x}, {}, true);
  ASSERT_EQ(grads.size(), 1U);
  EXPECT_EQ(grads[0].to_vector<double>(), (std::vector<double>{4, 8, 12}));  // 2 x w
  EXPECT_FALSE(grads[0].requires_grad());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(other_branch_runs, 0);

  // Several inputs, one of them not a leaf, and an output gradient.
  const Tensor h = x * 2.0;
  const Tensor z = h * h * w;  // dz/dh = 2 h w, dz/dw = h^2
  const auto both = autograd::grad({z}, {h, w}, {from_vector<double>({1, 0, 1})});
  EXPECT_EQ(both[0].to_vector<double>(), (std::vector<double>{8, 0, 24}));
  EXPECT_EQ(both[1].to_vector<double>(), (std::vector<double>{4 + 36}));
  EXPECT_FALSE(x.grad().defined());
}

// Branches that lead to none of grad()'s inputs get no gradient: their hooks and retained
// grads see nothing (as in PyTorch), and an input listed twice has its hooks run once.
TEST(AutogradGrad, BranchesLeadingElsewhereSeeNothing) {
  Tensor x = leaf({1, 2}), w = leaf({3});
  const Tensor s = w * 2.0, t = w * 4.0;
  s.retain_grad();
  int t_hooks = 0, x_hooks = 0;
  t.register_hook([&](const Tensor&) {
    ++t_hooks;
    return Tensor();
  });
  x.register_hook([&](const Tensor& g) {
    ++x_hooks;
    return g * 10.0;
  });
  const Tensor z = (x * s).sum() + (x * t).sum();
  const auto grads = autograd::grad({z}, {x, x}, {}, true);
  EXPECT_EQ(grads[0].to_vector<double>(), (std::vector<double>{180, 180}));  // 10 (2w + 4w)
  EXPECT_EQ(grads[1].to_vector<double>(), grads[0].to_vector<double>());
  EXPECT_EQ(x_hooks, 1);
  EXPECT_EQ(t_hooks, 0);
  EXPECT_FALSE(s.grad().defined());
  z.backward();  // then a plain backward: each gradient once
  EXPECT_EQ(s.grad().to_vector<double>(), (std::vector<double>{3}));
  EXPECT_EQ(t_hooks, 1);
}

// A formula that fails under create_graph (here on a saved tensor changed in place) leaves no
// reference cycle behind: the graph is freed with its tensors.
TEST(AutogradGrad, AFailedCreateGraphBackwardLeavesNoCycle) {
  std::weak_ptr<autograd::Node> node;
  {
    Tensor x = leaf({2});
    Tensor e = from_vector<double>({3});
    const Tensor y = pow(x, e);  // saves its output, which a create_graph backward re-attaches
    node = y.grad_fn();
    e.add_(1.0);
    EXPECT_EMBER_ERROR(autograd::grad({y.sum()}, {x}, {}, std::nullopt, true),
                       "modified by an in-place");
  }
  EXPECT_TRUE(node.expired());
}

TEST(AutogradGrad, CreateGraphGivesHessianVectorProducts) {
  Tensor x = leaf({1, -2});
  Tensor y = (x * x * x).sum() + (x.select(0, 0) * x.select(0, 1));
  // g = (3 x0^2 + x1, 3 x1^2 + x0); H = [[6 x0, 1], [1, 6 x1]]
  const Tensor g = autograd::grad({y}, {x}, {}, std::nullopt, true)[0];
  ASSERT_TRUE(g.requires_grad());
  EXPECT_EQ(g.to_vector<double>(), (std::vector<double>{1, 13}));
  const Tensor v = from_vector<double>({1, 2});
  const Tensor hv = autograd::grad({(g * v).sum()}, {x})[0];
  EXPECT_EQ(hv.to_vector<double>(), (std::vector<double>{6 + 2, 1 - 24}));
  EXPECT_FALSE(x.grad().defined());
}

TEST(AutogradGrad, UnusedInputsAndFreedGraphs) {
  Tensor x = leaf({1, 2}), unused = leaf({3});
  Tensor y = (x * x).sum();
  EXPECT_EMBER_ERROR(autograd::grad({y}, {x, unused}, {}, true),
                     "grad: input 1 (shape [1]) was not used in the graph of the outputs");
  const auto grads = autograd::grad({y}, {x, unused}, {}, std::nullopt, false, true);
  EXPECT_EQ(grads[0].to_vector<double>(), (std::vector<double>{2, 4}));
  EXPECT_FALSE(grads[1].defined());
  // retain_graph defaults to create_graph: the first call freed the graph.
  EXPECT_EMBER_ERROR(autograd::grad({y}, {x}), "backward through the graph a second time");
  EXPECT_EMBER_ERROR(autograd::grad({y}, {from_vector<double>({1})}),
                     "grad: input 0 does not require grad");
}

// A custom function's backward written in recorded ops is differentiated again; one declared
// kOnce (PyTorch's @once_differentiable) refuses a second backward by name.
TEST(AutogradEngine, CustomFunctionsUnderCreateGraph) {
  Tensor x = leaf({3});
  for (auto kind : {autograd::Differentiability::kTwice, autograd::Differentiability::kOnce}) {
    const Tensor y = autograd::apply_function(
        "CubeBackward", {x}, [&] { return std::vector<Tensor>{x * x * x}; },
        [x](const std::vector<Tensor>& grads) {
          return std::vector<Tensor>{grads[0] * 3.0 * x * x};
        },
        kind)[0];
    const Tensor dy = autograd::grad({y}, {x}, {}, std::nullopt, true)[0];
    EXPECT_DOUBLE_EQ(dy.item<double>(), 27.0);
    if (kind == autograd::Differentiability::kTwice) {
      EXPECT_DOUBLE_EQ(autograd::grad({dy}, {x})[0].item<double>(), 18.0);  // 6 x
    } else {
      EXPECT_EMBER_ERROR(autograd::grad({dy}, {x}),
                         "CubeBackward: its gradient has no derivative in ember");
    }
  }
}

TEST(AutogradEngine, CustomFunctionsJoinTheGraph) {
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({2});
  int backward_calls = 0;
  // y = x * w with a hand-written backward.
  const auto outputs = autograd::apply_function(
      "ScaleBackward", {x, w}, [&] { return std::vector<Tensor>{x * w}; },
      [x, w, &backward_calls](const std::vector<Tensor>& grads) {
        ++backward_calls;
        return std::vector<Tensor>{grads[0] * w, sum(grads[0] * x).reshape({1})};
      });
  const Tensor& y = outputs[0];
  ASSERT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "ScaleBackward");
  (y * y).sum().backward();  // d/dx = 2 x w^2, d/dw = 2 w sum(x^2)
  EXPECT_EQ(backward_calls, 1);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{8, 16, 24}));
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{56}));
  EXPECT_EMBER_ERROR(y.sum().backward(), "backward through the graph a second time");
  {
    NoGradGuard no_grad;
    const auto plain = autograd::apply_function(
        "ScaleBackward", {x, w}, [&] { return std::vector<Tensor>{x * w}; },
        [](const std::vector<Tensor>&) { return std::vector<Tensor>{}; });
    EXPECT_FALSE(plain[0].requires_grad());
  }
}

}  // namespace
}  // namespace ember
