// Module registration, state dicts, modes, conversions and the ResNet models' structure.
#include "test_util.h"

namespace ember {
namespace {

using nn::NamedTensors;

class TwoLayer : public nn::Module {
 public:
  TwoLayer() {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8));
    bn = register_module("bn", std::make_shared<nn::BatchNorm1d>(8));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 2, false));
  }
  Tensor forward(const Tensor& x) override {
    return fc2->forward(relu(bn->forward(fc1->forward(x))));
  }
  std::string name() const override { return "TwoLayer"; }
  std::shared_ptr<nn::Linear> fc1;
  std::shared_ptr<nn::BatchNorm1d> bn;
  std::shared_ptr<nn::Linear> fc2;
};

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> names;
  for (const auto& [n, t] : named) names.push_back(n);
  return names;
}

// The activation modules a PyTorch nn.Sequential lists are their functionals, without
// parameters.
TEST(NnModule, ActivationModulesAreTheirFunctionals) {
  const Tensor x = uniform({3, 4}, -3.0, 3.0);
  testing::expect_close(nn::Tanh()(x), tanh(x));
  testing::expect_close(nn::Sigmoid()(x), sigmoid(x));
  testing::expect_close(nn::ReLU()(x), relu(x));
  testing::expect_close(nn::functional::tanh(x), tanh(x));
  testing::expect_close(nn::functional::sigmoid(x), sigmoid(x));
  EXPECT_TRUE(nn::Tanh().named_parameters().empty());
  EXPECT_EQ(nn::Tanh().name(), "Tanh");
  EXPECT_EQ(nn::Sigmoid().name(), "Sigmoid");
  auto mlp = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(3, 2), std::make_shared<nn::Sigmoid>()});
  const Tensor y = (*mlp)(x);
  EXPECT_EQ(y.sizes(), (Shape{3, 2}));
  EXPECT_GT(y.min().item<double>(), 0.0);
  EXPECT_LT(y.max().item<double>(), 1.0);
}

TEST(NnModule, NamesParametersAndBuffersInRegistrationOrder) {
  TwoLayer m;
  EXPECT_EQ(
      names_of(m.named_parameters()),
      (std::vector<std::string>{"fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "fc2.weight"}));
  EXPECT_EQ(
      names_of(m.named_buffers()),
      (std::vector<std::string>{"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}));
  EXPECT_EQ(m.state_dict().size(), 8u);
  EXPECT_EQ(nn::parameter_count(m), 4 * 8 + 8 + 8 + 8 + 16);
  for (const auto& t : m.parameters()) EXPECT_TRUE(t.requires_grad());
  EXPECT_EQ(m.named_modules().size(), 4u);
  EXPECT_EQ(m.named_modules()[1].first, "fc1");
}

TEST(NnModule, StateDictRoundTripAndStrictErrors) {
  manual_seed(1);
  TwoLayer a;
  manual_seed(2);
  TwoLayer b;
  EXPECT_FALSE(equal(a.fc1->weight, b.fc1->weight));
  b.load_state_dict(a.state_dict());
  for (size_t i = 0; i < a.state_dict().size(); ++i) {
    EXPECT_TRUE(equal(a.state_dict()[i].second, b.state_dict()[i].second))
        << a.state_dict()[i].first;
  }
  // The copy is by value: changing a afterwards leaves b alone.
  {
    NoGradGuard g;
    a.fc1->weight.add_(1.0);
  }
  EXPECT_FALSE(equal(a.fc1->weight, b.fc1->weight));

  NamedTensors missing = a.state_dict();
  missing.erase(missing.begin());
  EXPECT_EMBER_ERROR(b.load_state_dict(missing), "load_state_dict: missing keys: fc1.weight");
  NamedTensors extra = a.state_dict();
  extra.emplace_back("head.weight", zeros({1}));
  EXPECT_EMBER_ERROR(b.load_state_dict(extra), "unexpected keys: head.weight");
  b.load_state_dict(extra, false);  // non-strict ignores extras
  NamedTensors wrong = a.state_dict();
  wrong[0].second = zeros({3, 3});
  EXPECT_EMBER_ERROR(b.load_state_dict(wrong),
                     "shape mismatch for fc1.weight (checkpoint [3, 3], model [8, 4])");
}

TEST(NnModule, TrainEvalAndZeroGrad) {
  TwoLayer m;
  EXPECT_TRUE(m.is_training());
  m.eval();
  EXPECT_FALSE(m.bn->is_training());
  m.train();
  EXPECT_TRUE(m.fc2->is_training());
  for (auto& p : m.parameters()) p.set_grad(ones_like(p));
  m.zero_grad(false);
  for (auto& p : m.parameters()) EXPECT_EQ(sum(p.grad()).item<double>(), 0.0);
  m.zero_grad();
  for (auto& p : m.parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(NnModule, ToDtypeKeepsReferencesValid) {
  TwoLayer m;
  Tensor weight = m.fc1->weight;  // a reference as an optimizer would hold it
  m.to(kF64);
  EXPECT_EQ(weight.dtype(), kF64);
  EXPECT_EQ(m.named_parameters()[0].second.dtype(), kF64);
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_EQ(m.bn->num_batches_tracked.dtype(), kI64);  // integer buffers stay
  EXPECT_EMBER_ERROR(m.to(kI32), "modules convert only to floating dtypes");
}

TEST(NnModule, DefaultInitialisationFollowsPyTorch) {
  manual_seed(0);
  nn::Linear fc(100, 50);
  const double bound = 1.0 / std::sqrt(100.0);
  EXPECT_LE(max(abs(fc.weight)).item<double>(), bound);
  EXPECT_LE(max(abs(fc.bias)).item<double>(), bound);
  EXPECT_GT(max(abs(fc.weight)).item<double>(), 0.9 * bound);
  nn::Conv2d conv(16, 32, 3);
  EXPECT_LE(max(abs(conv.weight)).item<double>(), 1.0 / std::sqrt(16.0 * 9));
  nn::BatchNorm2d bn(4);
  EXPECT_EQ(bn.weight.to_vector<float>(), std::vector<float>(4, 1.0f));
  EXPECT_EQ(bn.running_var.to_vector<float>(), std::vector<float>(4, 1.0f));
  // torchvision's ResNet init: kaiming-normal with fan_out for convolutions.
  auto net = nn::resnet20();
  const Tensor w = net->named_parameters()[0].second;  // conv1.weight [16, 3, 3, 3]
  EXPECT_NEAR(std(w).item<double>(), std::sqrt(2.0 / (16 * 9)), 0.05);
}

TEST(NnModule, ResNetParameterCounts) {
  EXPECT_EQ(nn::parameter_count(*nn::resnet20()), 272474);
  EXPECT_EQ(nn::parameter_count(*nn::resnet18()), 11173962);
  EXPECT_EQ(nn::parameter_count(*nn::resnet32()), 466906);
  EXPECT_EQ(nn::parameter_count(*nn::resnet56()), 855770);
  EXPECT_EQ(nn::parameter_count(*nn::resnet18(1000, 3, nn::Stem::kImageNet)),
            11689512);  // torchvision resnet18
  EXPECT_EQ(nn::parameter_count(*nn::resnet34(1000, 3, nn::Stem::kImageNet)),
            21797672);  // torchvision resnet34
  EXPECT_EQ(nn::parameter_count(*nn::resnet20(10, 1)), 272474 - 2 * 16 * 9);
  const auto names = names_of(nn::resnet20()->named_parameters());
  EXPECT_EQ(names[0], "conv1.weight");
  EXPECT_EQ(names[1], "bn1.weight");
  EXPECT_EQ(names.back(), "fc.bias");
  EXPECT_NE(std::find(names.begin(), names.end(), "layer2.0.downsample.0.weight"), names.end());
  EXPECT_EMBER_ERROR(nn::resnet("resnet19"), "resnet: unknown model \"resnet19\"");
}

// Two inputs (a pair of feature vectors) and two outputs (a score per input), the way a
// PyTorch module with forward(self, a, b) is written.
class PairScorer : public nn::Module {
 public:
  PairScorer() { fc = register_module("fc", std::make_shared<nn::Linear>(3, 1)); }
  nn::TensorList forward_list(const nn::TensorList& in) override {
    return {fc->forward(in.at(0)), fc->forward(in.at(1)) * 2.0};
  }
  std::string name() const override { return "PairScorer"; }
  std::shared_ptr<nn::Linear> fc;
};

TEST(NnModule, SeveralInputsAndOutputs) {
  manual_seed(2);
  PairScorer model;
  const Tensor a = ones({2, 3}), b = full({2, 3}, 0.5);
  nn::TensorList out = model(a, b);
  ASSERT_EQ(out.size(), 2u);
  testing::expect_close(out[0], model.fc->forward(a), 0, 0);
  testing::expect_close(out[1], model.fc->forward(b) * 2.0, 0, 0);
  (out[0].sum() + out[1].sum()).backward();
  // d/dW of sum(a W^T) + 2 sum(b W^T) = column sums of a + 2 b: 2 * 1 + 2 * (2 * 0.5) = 4.
  testing::expect_close(model.fc->weight.grad(), full({1, 3}, 4.0), 1e-6, 0);
  struct TwoOutputs : nn::Module {
    nn::TensorList forward_list(const nn::TensorList& in) override { return {in[0], in[0]}; }
    std::string name() const override { return "TwoOutputs"; }
  } two_outputs;
  EXPECT_EMBER_ERROR(two_outputs(a),
                     "TwoOutputs: forward_list returns 2 outputs; call "
                     "forward_list() (or module(a, b, ...)) instead");

  // A single-input module is called either way; a module defining neither form says so.
  nn::Linear fc(3, 2);
  EXPECT_EQ(fc(nn::TensorList{a}).size(), 1u);
  testing::expect_close(fc(nn::TensorList{a})[0], fc(a), 0, 0);
  EXPECT_EMBER_ERROR(fc(a, b), "Linear: takes one input (forward(input)) but was given 2");
  struct Empty : nn::Module {
    std::string name() const override { return "Empty"; }
  } empty;
  EXPECT_EMBER_ERROR(empty(a), "Empty: defines neither forward(input) nor forward_list(inputs)");
}

TEST(NnModule, InputOfAnotherDtypeNamesTheLayer) {
  nn::Linear fc(3, 2);
  EXPECT_EMBER_ERROR(fc(ones({4, 3}, kF64)),
                     "Linear: input is f64 on cpu but the layer's weight is f32 on cpu (input [4, "
                     "3], weight [2, 3]); convert the model (model.to(...)) or the input");
  nn::Conv2d conv(3, 4, 3);
  EXPECT_EMBER_ERROR(conv(ones({1, 3, 5, 5}, kF64)),
                     "Conv2d: input is f64 on cpu but the layer's "
                     "weight is f32 on cpu");
  nn::BatchNorm2d bn(3);
  EXPECT_EMBER_ERROR(bn(ones({2, 3, 2, 2}, kF64)),
                     "BatchNorm2d: input is f64 on cpu but the "
                     "layer's weight is f32 on cpu");
  fc.to(kF64);  // the fix the message names
  EXPECT_EQ(fc(ones({4, 3}, kF64)).dtype(), kF64);
}

TEST(NnModule, ConstructorErrors) {
  EXPECT_EMBER_ERROR(nn::Linear(0, 3), "Linear: features must be positive");
  EXPECT_EMBER_ERROR(nn::Conv2d(3, 8, 3, nn::Conv2dOptions{{1, 1}, {0, 0}, {1, 1}, 2, true}),
                     "Conv2d: channels (in 3, out 8) must be divisible by groups 2");
  EXPECT_EMBER_ERROR(nn::Dropout(1.5), "Dropout: probability must be in [0, 1]");
  nn::BatchNorm2d bn(3);
  EXPECT_EMBER_ERROR(bn.forward(zeros({2, 3, 4})),
                     "BatchNorm2d: expected 4-d input, got shape [2, 3, 4]");
  EXPECT_EMBER_ERROR(bn.forward(zeros({2, 4, 4, 4})),
                     "BatchNorm2d: input has 4 channels but the layer has 3");
}

}  // namespace
}  // namespace ember
