// Second derivatives as PyTorch users take them (gradient penalties, Hessian-vector products,
// MAML), written against ember's public API and matched to PyTorch's float64 values
// (tests/autograd/golden/make_second_derivatives_golden.py writes the golden file).
//
// A WGAN-GP critic step, as a user writes it:
//
//   Tensor x_hat = (alpha * real + (1 - alpha) * fake).requires_grad_();
//   Tensor out = critic(x_hat);
//   // d critic(x_hat).sum() / d x_hat, itself recorded (create_graph) so it can be differentiated
//   Tensor g = autograd::grad({out.sum()}, {x_hat}, {}, std::nullopt, /*create_graph=*/true)[0];
//   Tensor penalty = pow(norm(g.flatten(1), 2.0, {1}) - 1.0, 2.0).mean() * lambda;
//   Tensor loss = critic(fake).mean() - critic(real).mean() + penalty;
//   loss.backward();  // the critic's grad() now includes the penalty's second-order term
//
// A Hessian-vector product: g = grad({loss}, params, {}, std::nullopt, true), then
// hv = grad({sum_i (g[i] * v[i]).sum()}, params).
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>

#include <nlohmann/json.hpp>

#include <ember/nn/nn.h>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;

// Every value is float64 in both libraries; what differs is summation order.
constexpr double kRtol = 1e-10;
constexpr double kAtol = 1e-12;

const json& golden() {
  static const json data = [] {
    std::ifstream in(std::filesystem::path(EMBER_SECOND_DERIVATIVES_GOLDEN));
    EXPECT_TRUE(in.good()) << "missing " << EMBER_SECOND_DERIVATIVES_GOLDEN;
    return json::parse(in);
  }();
  return data;
}

// The device the running case puts its models and golden tensors on (CaseOn sets it).
Device case_device = kCPU;

struct CaseOn {
  explicit CaseOn(Device device) { case_device = device; }
  ~CaseOn() { case_device = kCPU; }
};

Tensor tensor_of(const json& j, DType dtype = kF64) {
  const Shape shape = j.at("shape").get<Shape>();
  return from_vector<double>(j.at("values").get<std::vector<double>>(), shape)
      .to(case_device, dtype);
}

// The golden parameters (by PyTorch's names) into `model`, converted to float64; its buffers
// keep their values.
void load_params(nn::Module& model, const json& params) {
  model.to(kF64);
  nn::NamedTensors state = model.named_buffers();
  for (const auto& [name, value] : params.items()) state.emplace_back(name, tensor_of(value));
  model.load_state_dict(state);
  model.to(case_device);
}

std::vector<std::string> names_of(const nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& [name, p] : model.named_parameters()) names.push_back(name);
  return names;
}

// `actual[i]` is the gradient of the parameter named `names[i]`; `expected` maps names to
// PyTorch's values.
void expect_named_close(const std::vector<std::string>& names, const std::vector<Tensor>& actual,
                        const json& expected) {
  ASSERT_EQ(names.size(), actual.size());
  ASSERT_EQ(names.size(), expected.size());
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    ASSERT_TRUE(actual[i].defined());
    testing::expect_close(actual[i], tensor_of(expected.at(names[i])), kRtol, kAtol);
  }
}

// Central differences of the scalar `f` of `params` along a random direction u, against
// sum_i <expected[i], u[i]>: the golden gradient of a second-order quantity, checked through
// ember's forward and first-order gradients alone (f takes no create_graph). `params` are
// restored bit for bit.
void expect_directional_derivative(const std::vector<Tensor>& params,
                                   const std::vector<std::string>& names,
                                   const std::function<double()>& f, const json& expected) {
  constexpr double kEps = 1e-5;
  Generator gen(16);
  std::vector<Tensor> directions, saved;
  double predicted = 0.0;
  for (size_t i = 0; i < params.size(); ++i) {
    directions.push_back(randn(params[i].sizes(), kF64, &gen).to(case_device));
    saved.push_back(params[i].detach().clone());
    predicted += (tensor_of(expected.at(names[i])) * directions.back()).sum().item<double>();
  }
  const auto at = [&](double step) {
    {
      NoGradGuard guard;
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor p = params[i];
        p.copy_(saved[i] + directions[i] * step);
      }
    }
    return f();
  };
  const double plus = at(kEps), minus = at(-kEps);
  {
    NoGradGuard guard;
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i];
      p.copy_(saved[i]);
    }
  }
  EXPECT_NEAR((plus - minus) / (2 * kEps), predicted, 1e-7 * (1.0 + std::abs(predicted)));
}

// sum_i <grad(loss, params)[i], v[i]>, first-order: its gradient is the Hessian-vector product.
double gradient_dot_v(nn::Module& model, const std::function<Tensor()>& loss_fn, const json& c) {
  const std::vector<Tensor> g = autograd::grad({loss_fn()}, model.parameters());
  const std::vector<std::string> names = names_of(model);
  double dot = 0.0;
  for (size_t i = 0; i < g.size(); ++i)
    dot += (g[i] * tensor_of(c.at("v").at(names[i]))).sum().item<double>();
  return dot;
}

// The parameters' grad() after a plain loss.backward() of a fresh forward: the first-order
// path gives the same values as the create_graph gradients.
void expect_first_order_grads(nn::Module& model, const std::function<Tensor()>& loss_fn,
                              const json& expected) {
  SCOPED_TRACE("first gradients (plain backward)");
  model.zero_grad();
  loss_fn().backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : model.parameters()) grads.push_back(p.grad());
  expect_named_close(names_of(model), grads, expected);
}

// What can be checked without second derivatives: the plain backward's gradients, and the
// Hessian-vector product by central differences of sum_i <grad(loss)[i], v[i]>.
void expect_hessian_vector_product_by_differences(nn::Module& model,
                                                  const std::function<Tensor()>& loss_fn,
                                                  const json& c) {
  expect_first_order_grads(model, loss_fn, c.at("grads"));
  SCOPED_TRACE("Hessian-vector product by differences");
  expect_directional_derivative(
      model.parameters(), names_of(model), [&] { return gradient_dot_v(model, loss_fn, c); },
      c.at("hv"));
}

// grad(sum_i (g[i] * v[i]).sum(), params) for g = grad(loss, params, create_graph): checks
// the loss, g and the Hessian-vector product against the case's golden values.
void expect_hessian_vector_product(nn::Module& model, const Tensor& loss, const json& c) {
  const std::vector<std::string> names = names_of(model);
  const std::vector<Tensor> params = model.parameters();
  EXPECT_NEAR(loss.item<double>(), c.at("loss").get<double>(), kAtol);
  const std::vector<Tensor> g = autograd::grad({loss}, params, {}, std::nullopt, true);
  {
    SCOPED_TRACE("first gradients (create_graph)");
    expect_named_close(names, g, c.at("grads"));
  }
  Tensor dot;
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(g[i].requires_grad()) << names[i] << "'s gradient has no history";
    const Tensor term = (g[i] * tensor_of(c.at("v").at(names[i]))).sum();
    dot = dot.defined() ? dot + term : term;
  }
  SCOPED_TRACE("Hessian-vector product");
  expect_named_close(names, autograd::grad({dot}, params), c.at("hv"));
}

// ---- 1. WGAN-GP ---------------------------------------------------------------------------

// PyTorch's TanhCritic in the generator script.
struct TanhCritic : nn::Module {
  TanhCritic() {
    conv = register_module("conv",
                           std::make_shared<nn::Conv2d>(
                               2, 3, 3, nn::Conv2dOptions{.stride = {2, 2}, .padding = {1, 1}}));
    pool = register_module("pool", std::make_shared<nn::AdaptiveAvgPool2d>(Pair{2, 2}));
    fc = register_module("fc", std::make_shared<nn::Linear>(12, 1));
  }
  Tensor forward(const Tensor& x) override { return (*fc)((*pool)(tanh((*conv)(x))).flatten(1)); }
  std::string name() const override { return "TanhCritic"; }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::AdaptiveAvgPool2d> pool;
  std::shared_ptr<nn::Linear> fc;
};

struct WganGp {
  Tensor grad_norm, penalty, loss;
};

// The critic's loss with the gradient penalty: critic(fake).mean() - critic(real).mean() +
// lambda * mean((|d critic(x_hat).sum() / d x_hat| - 1)^2), x_hat between real and fake.
WganGp wgan_gp(nn::Module& critic, const json& c, bool create_graph) {
  const Tensor real = tensor_of(c.at("real")), fake = tensor_of(c.at("fake"));
  const Tensor alpha = tensor_of(c.at("alpha"));
  Tensor x_hat = (alpha * real + (1.0 - alpha) * fake).requires_grad_();
  const Tensor out = critic(x_hat);
  const Tensor gradients = autograd::grad({out.sum()}, {x_hat}, {}, std::nullopt, create_graph)[0];
  WganGp r;
  r.grad_norm = norm(gradients.reshape({gradients.size(0), -1}), 2.0, {1});
  r.penalty = pow(r.grad_norm - 1.0, 2.0).mean() * c.at("lambda").get<double>();
  r.loss = critic(fake).mean() - critic(real).mean() + r.penalty;
  return r;
}

// The golden critic's parameter gradients checked by central differences of the loss
// (first-order only); then its penalty and loss, taken with create_graph, returned.
Tensor wgan_gp_loss_checked(nn::Module& critic, const json& c) {
  load_params(critic, c.at("params"));
  expect_directional_derivative(
      critic.parameters(), names_of(critic),
      [&] { return wgan_gp(critic, c, false).loss.item<double>(); }, c.at("grads"));
  const WganGp r = wgan_gp(critic, c, true);
  testing::expect_close(r.grad_norm, tensor_of(c.at("grad_norm")), kRtol, kAtol);
  EXPECT_NEAR(r.penalty.item<double>(), c.at("penalty").get<double>(), kAtol);
  EXPECT_NEAR(r.loss.item<double>(), c.at("loss").get<double>(), kAtol);
  return r.loss;
}

// loss.backward(), as a WGAN-GP training step runs it: the critic's grad() against PyTorch's.
void expect_wgan_gp_grads(nn::Module& critic, const Tensor& loss, const json& c) {
  critic.zero_grad();
  loss.backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : critic.parameters()) grads.push_back(p.grad());
  expect_named_close(names_of(critic), grads, c.at("grads"));
}

void wgan_gp_conv_relu_avg_pool() {
  nn::Sequential critic{std::make_shared<nn::Conv2d>(2, 4, 3, nn::Conv2dOptions{.padding = {1, 1}}),
                        std::make_shared<nn::ReLU>(), std::make_shared<nn::AvgPool2d>(Pair{2, 2}),
                        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(16, 1)};
  const json& c = golden().at("wgan_relu_avgpool");
  const Tensor loss = wgan_gp_loss_checked(critic, c);
  expect_wgan_gp_grads(critic, loss, c);
}

TEST(SecondDerivatives, WganGpPenaltyThroughConvReluAvgPoolMatchesPyTorch) {
  wgan_gp_conv_relu_avg_pool();
}

void wgan_gp_strided_conv_tanh_adaptive_pool() {
  TanhCritic critic;
  const json& c = golden().at("wgan_tanh_adaptive");
  const Tensor loss = wgan_gp_loss_checked(critic, c);
  expect_wgan_gp_grads(critic, loss, c);
}

TEST(SecondDerivatives, WganGpPenaltyThroughStridedConvTanhAdaptivePoolMatchesPyTorch) {
  wgan_gp_strided_conv_tanh_adaptive_pool();
}

// ---- 2. Hessian-vector products of an MLP -------------------------------------------------

struct Mlp : nn::Module {
  Mlp() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 6));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(6, 5));
    fc3 = register_module("fc3", std::make_shared<nn::Linear>(5, 3));
  }
  Tensor forward(const Tensor& x) override { return (*fc3)(sigmoid((*fc2)(tanh((*fc1)(x))))); }
  std::string name() const override { return "Mlp"; }
  std::shared_ptr<nn::Linear> fc1, fc2, fc3;
};

// mse_loss(softmax(logits), target) + 0.5 * soft-target cross-entropy through log_softmax.
void mlp_hvp_softmax_mse() {
  const json& c = golden().at("hvp_mlp_mse");
  Mlp model;
  load_params(model, c.at("params"));
  const Tensor x = tensor_of(c.at("data").at("x")), target = tensor_of(c.at("data").at("target"));
  const auto loss_fn = [&] {
    const Tensor logits = model(x);
    const Tensor soft_ce = -(log_softmax(logits, 1) * target).sum({1}).mean();
    return mse_loss(softmax(logits, 1), target) + soft_ce * 0.5;
  };
  expect_hessian_vector_product_by_differences(model, loss_fn, c);
  expect_hessian_vector_product(model, loss_fn(), c);
}

TEST(SecondDerivatives, MlpHessianVectorProductWithSoftmaxAndMseMatchesPyTorch) {
  mlp_hvp_softmax_mse();
}

// cross_entropy with class indices, plus one with an ignored entry and label smoothing.
void mlp_hvp_cross_entropy() {
  const json& c = golden().at("hvp_mlp_cross_entropy");
  Mlp model;
  load_params(model, c.at("params"));
  const Tensor x = tensor_of(c.at("data").at("x"));
  const Tensor labels = tensor_of(c.at("data").at("labels"), kI64);
  const Tensor ignored = tensor_of(c.at("data").at("labels_ignored"), kI64);
  const auto loss_fn = [&] {
    const Tensor logits = model(x);
    return cross_entropy(logits, labels) +
           cross_entropy(logits, ignored, {.ignore_index = -100, .label_smoothing = 0.1});
  };
  expect_hessian_vector_product_by_differences(model, loss_fn, c);
  expect_hessian_vector_product(model, loss_fn(), c);
}

TEST(SecondDerivatives, MlpHessianVectorProductWithCrossEntropyMatchesPyTorch) {
  mlp_hvp_cross_entropy();
}

// ---- 3. MAML ------------------------------------------------------------------------------

// Two inner SGD steps on the support set with create_graph, the query loss at the fast
// weights, its gradient with respect to the initial weights (and first-order MAML's, whose
// inner gradients are constants, as a check that the second-order term is there).
void maml_two_inner_steps() {
  const json& c = golden().at("maml");
  const std::vector<std::string> names = {"0.weight", "0.bias",   "2.weight",
                                          "2.bias",   "4.weight", "4.bias"};
  std::vector<Tensor> w;
  for (const std::string& name : names)
    w.push_back(tensor_of(c.at("params").at(name)).requires_grad_());
  const Tensor support_x = tensor_of(c.at("support_x")), support_y = tensor_of(c.at("support_y"));
  const Tensor query_x = tensor_of(c.at("query_x")), query_y = tensor_of(c.at("query_y"));
  const double inner_lr = c.at("inner_lr");
  const int inner_steps = c.at("inner_steps");

  const auto forward = [](const std::vector<Tensor>& p, const Tensor& x) {
    Tensor h = tanh(linear(x, p[0], p[1]));
    h = tanh(linear(h, p[2], p[3]));
    return linear(h, p[4], p[5]);
  };
  const auto outer = [&](bool create_graph) {
    std::vector<Tensor> fast = w;
    for (int step = 0; step < inner_steps; ++step) {
      const Tensor inner = mse_loss(forward(fast, support_x), support_y);
      const std::vector<Tensor> g = autograd::grad({inner}, fast, {}, std::nullopt, create_graph);
      for (size_t i = 0; i < fast.size(); ++i) fast[i] = fast[i] - g[i] * inner_lr;
    }
    const Tensor loss = mse_loss(forward(fast, query_x), query_y);
    return std::make_pair(loss, autograd::grad({loss}, w));
  };

  const auto [loss, grads] = outer(true);
  EXPECT_NEAR(loss.item<double>(), c.at("loss").get<double>(), kAtol);
  expect_named_close(names, grads, c.at("grads"));
  expect_named_close(names, outer(false).second, c.at("first_order_grads"));
}

TEST(SecondDerivatives, MamlOuterGradientThroughTwoInnerStepsMatchesPyTorch) {
  maml_two_inner_steps();
}

// ---- 4. A GPT-ish block -------------------------------------------------------------------

struct Block : nn::Module {
  static constexpr int64_t kVocab = 7, kEmbd = 8;
  Block() {
    wte = register_module("wte", std::make_shared<nn::Embedding>(kVocab, kEmbd));
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(kEmbd));
    fc = register_module("fc", std::make_shared<nn::Linear>(kEmbd, 2 * kEmbd));
    proj = register_module("proj", std::make_shared<nn::Linear>(2 * kEmbd, kEmbd));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(kEmbd));
    head = register_module("head", std::make_shared<nn::Linear>(kEmbd, kVocab));
  }
  // The logits from the embedding output h.
  Tensor forward_from(const Tensor& h) {
    const Tensor x = h + (*proj)(gelu((*fc)((*ln_1)(h))));
    return (*head)((*ln_f)(x));
  }
  std::string name() const override { return "Block"; }
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::LayerNorm> ln_1, ln_f;
  std::shared_ptr<nn::Linear> fc, proj, head;
};

struct GptPenalty {
  Tensor loss, penalty;
};

// The block's cross-entropy and lambda * |d loss / d wrt|^2, wrt the embedding output or the
// embedding weight.
GptPenalty gpt_penalty(Block& block, const json& c, bool wrt_weight, bool create_graph) {
  const Tensor idx = tensor_of(c.at("idx"), kI64), targets = tensor_of(c.at("targets"), kI64);
  const Tensor h = (*block.wte)(idx);
  const Tensor logits = block.forward_from(h);
  GptPenalty r;
  r.loss = cross_entropy(logits.reshape({-1, Block::kVocab}), targets.reshape({-1}));
  const Tensor wrt = wrt_weight ? block.wte->weight : h;
  const Tensor g = autograd::grad({r.loss}, {wrt}, {}, std::nullopt, create_graph)[0];
  r.penalty = pow(g, 2.0).sum() * c.at("lambda").get<double>();
  return r;
}

// The loss and penalty values and, by central differences of their sum, the parameters'
// gradients: everything first-order ember checks without create_graph.
void expect_gpt_penalty_by_differences(Block& block, const json& c, bool wrt_weight) {
  load_params(block, c.at("params"));
  const GptPenalty r = gpt_penalty(block, c, wrt_weight, false);
  EXPECT_NEAR(r.loss.item<double>(), c.at("loss").get<double>(), kAtol);
  EXPECT_NEAR(r.penalty.item<double>(), c.at("penalty").get<double>(), kAtol);
  expect_directional_derivative(
      block.parameters(), names_of(block),
      [&] {
        const GptPenalty shifted = gpt_penalty(block, c, wrt_weight, false);
        return (shifted.loss + shifted.penalty).item<double>();
      },
      c.at("grads"));
}

// grad(loss + penalty, parameters) through the create_graph gradient, against PyTorch's.
void expect_gpt_penalty_grads(Block& block, const json& c, bool wrt_weight) {
  const GptPenalty r = gpt_penalty(block, c, wrt_weight, true);
  EXPECT_NEAR(r.penalty.item<double>(), c.at("penalty").get<double>(), kAtol);
  expect_named_close(names_of(block), autograd::grad({r.loss + r.penalty}, block.parameters()),
                     c.at("grads"));
}

void gpt_penalty_on_embedding_output() {
  const json& c = golden().at("gpt_penalty_output");
  Block block;
  expect_gpt_penalty_by_differences(block, c, false);
  expect_gpt_penalty_grads(block, c, false);
}

TEST(SecondDerivatives, GptBlockPenaltyOnTheEmbeddingOutputMatchesPyTorch) {
  gpt_penalty_on_embedding_output();
}

void gpt_penalty_on_embedding_weight() {
  const json& c = golden().at("gpt_penalty_weight");
  Block block;
  expect_gpt_penalty_by_differences(block, c, true);
  expect_gpt_penalty_grads(block, c, true);
}

TEST(SecondDerivatives, GptBlockPenaltyOnTheEmbeddingWeightMatchesPyTorch) {
  gpt_penalty_on_embedding_weight();
}

// ---- 5. A batch-norm net ------------------------------------------------------------------

struct BnNet : nn::Module {
  BnNet() {
    conv = register_module(
        "conv",
        std::make_shared<nn::Conv2d>(2, 3, 3, nn::Conv2dOptions{.padding = {1, 1}, .bias = false}));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(3));
    fc = register_module("fc", std::make_shared<nn::Linear>(12, 2));
  }
  // max before relu: relu then max's values, without the ties relu's zeros would make in a
  // window (whose gradient goes to an index each library picks its own way).
  Tensor forward(const Tensor& x) override {
    return (*fc)(relu(max_pool2d((*bn)((*conv)(x)), {2, 2})).flatten(1));
  }
  std::string name() const override { return "BnNet"; }
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Linear> fc;
};

// Training mode: the batch statistics are part of the function being differentiated twice.
void batch_norm_net_hvp() {
  const json& c = golden().at("bn_hvp");
  BnNet model;
  load_params(model, c.at("params"));
  const Tensor x = tensor_of(c.at("data").at("x")), target = tensor_of(c.at("data").at("target"));
  const auto loss_fn = [&] { return mse_loss(model(x), target); };
  // One forward's update of the running statistics.
  expect_first_order_grads(model, loss_fn, c.at("grads"));
  testing::expect_close(model.bn->running_mean, tensor_of(c.at("running_mean")), kRtol, kAtol);
  testing::expect_close(model.bn->running_var, tensor_of(c.at("running_var")), kRtol, kAtol);
  expect_hessian_vector_product_by_differences(model, loss_fn, c);
  expect_hessian_vector_product(model, loss_fn(), c);
}

TEST(SecondDerivatives, BatchNormNetHessianVectorProductMatchesPyTorch) { batch_norm_net_hvp(); }

// Every case on the GPU, against the same values: the twice-differentiable formulas and
// kernels on CUDA.
TEST(SecondDerivatives, EveryCaseMatchesPyTorchInFloat64OnCuda) {
  EMBER_REQUIRE_CUDA();
  const CaseOn on(cuda_device(0));
  const std::pair<const char*, void (*)()> cases[] = {
      {"wgan_gp_conv_relu_avg_pool", &wgan_gp_conv_relu_avg_pool},
      {"wgan_gp_strided_conv_tanh_adaptive_pool", &wgan_gp_strided_conv_tanh_adaptive_pool},
      {"mlp_hvp_softmax_mse", &mlp_hvp_softmax_mse},
      {"mlp_hvp_cross_entropy", &mlp_hvp_cross_entropy},
      {"maml_two_inner_steps", &maml_two_inner_steps},
      {"gpt_penalty_on_embedding_output", &gpt_penalty_on_embedding_output},
      {"gpt_penalty_on_embedding_weight", &gpt_penalty_on_embedding_weight},
      {"batch_norm_net_hvp", &batch_norm_net_hvp},
  };
  for (const auto& [name, run] : cases) {
    SCOPED_TRACE(name);
    run();
  }
}

}  // namespace
}  // namespace ember
