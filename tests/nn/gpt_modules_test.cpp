// The GPT layer modules (GELU, LayerNorm, Embedding) and weight tying: a tensor shared by an
// embedding and an output Linear is one parameter to named_parameters(), the optimizers and
// zero_grad, while state_dict() keeps both names, as in PyTorch.
#include <cmath>

#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;

TEST(GptModules, GeluModuleIsTheFunctional) {
  const Tensor x = uniform({3, 4}, -3.0, 3.0);
  expect_close(nn::GELU()(x), gelu(x));
  expect_close(nn::GELU(GeluApproximate::kTanh)(x), gelu(x, GeluApproximate::kTanh));
  EXPECT_TRUE(nn::GELU().named_parameters().empty());
}

TEST(GptModules, SiluModuleIsTheFunctional) {
  const Tensor x = uniform({3, 4}, -6.0, 6.0);
  expect_close(nn::SiLU()(x), silu(x));
  expect_close(nn::functional::silu(x), silu(x));
  EXPECT_TRUE(nn::SiLU().named_parameters().empty());
  EXPECT_EQ(nn::SiLU().name(), "SiLU");
}

TEST(GptModules, LayerNormParametersAndOptions) {
  nn::LayerNorm ln({3, 4});
  ASSERT_EQ(ln.named_parameters().size(), 2u);
  EXPECT_EQ(ln.named_parameters()[0].first, "weight");
  EXPECT_EQ(ln.named_parameters()[1].first, "bias");
  expect_close(ln.weight, ones({3, 4}));
  expect_close(ln.bias, zeros({3, 4}));
  const Tensor x = uniform({2, 3, 4}, -1.0, 1.0);
  expect_close(ln(x), layer_norm(x, {3, 4}));

  nn::LayerNorm no_bias(8, {.eps = 1e-3, .bias = false});
  ASSERT_EQ(no_bias.named_parameters().size(), 1u);
  EXPECT_FALSE(no_bias.bias.defined());
  nn::LayerNorm plain(8, {.elementwise_affine = false});
  EXPECT_TRUE(plain.named_parameters().empty());
  const Tensor y = uniform({5, 8}, -1.0, 1.0);
  expect_close(plain(y), layer_norm(y, {8}));
  expect_close(no_bias(y), layer_norm(y, {8}, ones({8}), {}, 1e-3));
  EXPECT_EMBER_ERROR(nn::LayerNorm(Shape{}), "LayerNorm: normalized_shape must have a dim");
  EXPECT_EMBER_ERROR(ln(x.to(kF64)), "LayerNorm: input is f64");
}

TEST(GptModules, EmbeddingIsStandardNormalWithAZeroPaddingRow) {
  manual_seed(0);
  nn::Embedding emb(1000, 64, -1);
  ASSERT_EQ(emb.padding_idx(), 999);
  EXPECT_EQ(emb.weight.sizes(), (Shape{1000, 64}));
  const Tensor rows = emb.weight.narrow(0, 0, 999);
  EXPECT_NEAR(mean(rows).item<double>(), 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(var(rows).item<double>()), 1.0, 0.01);
  EXPECT_TRUE(equal(emb.weight.select(0, 999), zeros({64})));
  EXPECT_TRUE(emb.weight.requires_grad() && emb.weight.is_leaf());

  const Tensor idx = from_vector<int64_t>({5, 999, 5}, {1, 3});
  const Tensor y = emb(idx);
  EXPECT_EQ(y.sizes(), (Shape{1, 3, 64}));
  y.sum().backward();
  EXPECT_TRUE(equal(emb.weight.grad().select(0, 5), full({64}, 2.0f)));
  EXPECT_TRUE(equal(emb.weight.grad().select(0, 999), zeros({64})));
  EXPECT_EMBER_ERROR(nn::Embedding(4, 2, 4), "Embedding: padding_idx 4 is out of range");
}

// A minimal language-model head: token embedding and an output projection sharing a weight.
class TiedModel : public nn::Module {
 public:
  TiedModel() {
    embedding = register_module("wte", std::make_shared<nn::Embedding>(6, 3));
    head = register_module("lm_head", std::make_shared<nn::Linear>(3, 6, false));
    head->weight = head->parameter("weight") = embedding->weight;
  }
  Tensor forward(const Tensor& indices) override { return head->forward((*embedding)(indices)); }
  std::string name() const override { return "TiedModel"; }
  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::Linear> head;
};

TEST(GptModules, TiedWeightIsOneParameter) {
  TiedModel model;
  const auto named = model.named_parameters();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "wte.weight");
  EXPECT_EQ(model.parameters().size(), 1u);
  EXPECT_EQ(nn::parameter_count(model), 18);
  // state_dict keeps both names, as PyTorch's does, and both load.
  const auto state = model.state_dict();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[1].first, "lm_head.weight");
  EXPECT_TRUE(state[0].second.is_same(state[1].second));
  model.load_state_dict(state);
}

TEST(GptModules, TiedWeightTakesBothGradientsAndOneOptimizerStep) {
  TiedModel model;
  const Tensor before = model.embedding->weight.detach().clone();
  const Tensor idx = from_vector<int64_t>({1, 4, 1});
  model(idx).sum().backward();
  // d/dW of sum(E[idx] W^T): the head's part is the column sums of E[idx] in every row; the
  // embedding's part is sum_o W[o] in the rows picked.
  const Tensor picked = embedding(idx, before);
  Tensor expected = sum(picked, {0}, true).expand({6, 3}).clone();
  const Tensor row_sum = sum(before, {0});
  for (int64_t i : {1, 4, 1}) {
    Tensor r = expected.select(0, i);
    r += row_sum;
  }
  expect_close(model.embedding->weight.grad(), expected, 1e-5, 1e-6);

  optim::SGD sgd(model.parameters(), {.lr = 0.5});
  sgd.step();
  expect_close(model.head->weight, before - expected * 0.5, 1e-5, 1e-6);
  EXPECT_TRUE(model.head->weight.is_same(model.embedding->weight));
  model.zero_grad();
  EXPECT_FALSE(model.embedding->weight.grad().defined());
}

}  // namespace
}  // namespace ember
