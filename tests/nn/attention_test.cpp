// nn::MultiheadSelfAttention: minGPT's CausalSelfAttention state dict loads into it and gives
// PyTorch's output and gradients (golden/attention_module_golden.json, written by
// make_attention_module_golden.py); causality; dropout only in training; errors; and the
// nn::functional spelling of the attention op, which refuses a number as its fourth argument.
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;
using testing::expect_close;

Tensor tensor_from(const json& j, DType dtype) {
  return from_vector(j.at("values").get<std::vector<double>>())
      .reshape(j.at("shape").get<Shape>())
      .to(dtype);
}

TEST(MultiheadSelfAttention, ParametersCarryMinGptsNames) {
  nn::MultiheadSelfAttention attn(12, 3);
  std::set<std::string> names;
  for (const auto& [name, p] : attn.named_parameters()) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight",
                                          "c_proj.bias"}));
  EXPECT_EQ(attn.c_attn->weight.sizes(), (Shape{36, 12}));
  EXPECT_EQ(attn.c_proj->weight.sizes(), (Shape{12, 12}));
  EXPECT_EQ(attn.embed_dim(), 12);
  EXPECT_EQ(attn.num_heads(), 3);
  EXPECT_TRUE(attn.causal());
  nn::MultiheadSelfAttention no_bias(8, 2, /*bias=*/false);
  EXPECT_EQ(no_bias.named_parameters().size(), 2u);
}

TEST(MultiheadSelfAttention, MatchesMinGpt) {
  std::ifstream in(EMBER_ATTENTION_MODULE_GOLDEN);
  ASSERT_TRUE(in.good()) << "cannot open " << EMBER_ATTENTION_MODULE_GOLDEN;
  const json golden = json::parse(in);
  for (const json& c : golden.at("cases")) {
    const DType dtype = c.at("dtype") == "f64" ? kF64 : kF32;
    SCOPED_TRACE(dtype_name(dtype));
    nn::MultiheadSelfAttention attn(c.at("embed_dim").get<int64_t>(),
                                    c.at("num_heads").get<int64_t>());
    attn.to(dtype);
    nn::NamedTensors state;
    for (const auto& [name, value] : c.at("state_dict").items()) {
      if (name == "bias") continue;  // minGPT's causal-mask buffer: `causal` replaces it
      state.emplace_back(name, tensor_from(value, dtype));
    }
    attn.load_state_dict(state);
    Tensor x = tensor_from(c.at("x"), dtype).requires_grad_();
    const Tensor y = attn(x);
    y.backward(tensor_from(c.at("grad_output"), dtype));
    const double tol = dtype == kF64 ? 1e-12 : 1e-5;
    expect_close(y, tensor_from(c.at("y"), dtype), tol, tol);
    expect_close(x.grad(), tensor_from(c.at("grad_x"), dtype), tol, tol);
    for (const auto& [name, p] : attn.named_parameters()) {
      SCOPED_TRACE(name);
      expect_close(p.grad(), tensor_from(c.at("grads").at(name), dtype), tol, tol);
    }
  }
}

TEST(MultiheadSelfAttention, CausalOutputsIgnoreLaterPositions) {
  manual_seed(3);
  nn::MultiheadSelfAttention causal(16, 4), full(16, 4, true, 0.0, /*causal=*/false);
  full.load_state_dict(causal.state_dict());
  const Tensor x = randn({2, 10, 16});
  Tensor changed = x.clone();
  changed.narrow(1, 6, 4).copy_(randn({2, 4, 16}));
  // Positions 0..5 see only 0..5: changing 6..9 leaves them alone in the causal layer.
  expect_close(causal(changed).narrow(1, 0, 6), causal(x).narrow(1, 0, 6), 1e-6, 1e-6);
  EXPECT_FALSE(allclose(full(changed).narrow(1, 0, 6), full(x).narrow(1, 0, 6)));
}

TEST(MultiheadSelfAttention, DropoutOnlyInTraining) {
  manual_seed(5);
  Generator gen(9);
  nn::MultiheadSelfAttention attn(8, 2, true, 0.5, true, &gen);
  const Tensor x = randn({3, 7, 8});
  const Tensor a = attn(x), b = attn(x);
  EXPECT_FALSE(equal(a, b)) << "training: fresh masks each call";
  attn.eval();
  const uint64_t offset = gen.offset();
  const Tensor c = attn(x), d = attn(x);
  EXPECT_TRUE(equal(c, d));
  EXPECT_EQ(gen.offset(), offset) << "eval draws nothing";
  // Eval equals the layer with dropout 0.
  nn::MultiheadSelfAttention plain(8, 2, true, 0.0, true);
  plain.load_state_dict(attn.state_dict());
  expect_close(c, plain(x), 0.0, 0.0);
}

TEST(MultiheadSelfAttention, Errors) {
  EXPECT_EMBER_ERROR(nn::MultiheadSelfAttention(10, 3),
                     "MultiheadSelfAttention: embed_dim 10 is not divisible by num_heads 3");
  EXPECT_EMBER_ERROR(nn::MultiheadSelfAttention(8, 2, true, 1.5), "dropout must be in [0, 1]");
  nn::MultiheadSelfAttention attn(8, 2);
  EXPECT_EMBER_ERROR(attn(randn({2, 5, 6})), "expected an input [B, L, 8], got [2, 5, 6]");
}

// PyTorch's fourth argument is attn_mask and its fifth dropout_p: a number in the fourth place,
// as in sdpa(q, k, v, 0.1) written from PyTorch code, must not compile into is_causal = true.
template <typename Fourth>
concept AttentionTakesAsFourth = requires(const Tensor& t, Fourth x) {
  nn::functional::scaled_dot_product_attention(t, t, t, x);
};
static_assert(AttentionTakesAsFourth<bool>);
static_assert(!AttentionTakesAsFourth<double>);
static_assert(!AttentionTakesAsFourth<float>);
static_assert(!AttentionTakesAsFourth<int>);

TEST(MultiheadSelfAttention, FunctionalNamespaceSpellsTheOp) {
  namespace F = nn::functional;
  const Tensor q = randn({1, 2, 5, 4}), k = randn({1, 2, 5, 4}), v = randn({1, 2, 5, 4});
  expect_close(F::scaled_dot_product_attention(q, k, v, true),
               scaled_dot_product_attention(q, k, v, true), 0.0, 0.0);
  const Tensor w = randn({3, 4});
  expect_close(F::linear(q, w), linear(q, w), 0.0, 0.0);
}

}  // namespace
}  // namespace ember
