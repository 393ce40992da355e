// nn::GPT: a 2-layer model's forward, loss, gradients and one AdamW step against PyTorch's
// values (tests/nn/golden/make_gpt_golden.py), the tied head, generation and bad input.
#include <filesystem>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include <ember/nn/gpt.h>
#include <ember/optim/adam.h>
#include <ember/optim/param_groups.h>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;

json load_golden() {
  std::ifstream in(std::filesystem::path(EMBER_GPT_GOLDEN));
  EXPECT_TRUE(in.good()) << "missing " << EMBER_GPT_GOLDEN;
  return json::parse(in);
}

Tensor tensor_of(const json& j, DType dtype = kF64) {
  const Shape shape = j.at("shape").get<Shape>();
  return from_vector<double>(j.at("values").get<std::vector<double>>(), shape).to(dtype);
}

nn::GPTConfig config_of(const json& golden) {
  const json& c = golden.at("config");
  nn::GPTConfig config;
  config.vocab_size = c.at("vocab_size");
  config.block_size = c.at("block_size");
  config.n_layer = c.at("n_layer");
  config.n_head = c.at("n_head");
  config.n_embd = c.at("n_embd");
  return config;
}

// The golden model's weights in `dtype`.
std::shared_ptr<nn::GPT> golden_model(const json& golden, DType dtype) {
  auto model = std::make_shared<nn::GPT>(config_of(golden));
  model->to(dtype);
  nn::NamedTensors state;
  for (const auto& [name, value] : golden.at("weights").items())
    state.emplace_back(name, tensor_of(value, dtype));
  model->load_state_dict(state);
  return model;
}

// The golden model's forward, loss and gradients in `dtype`; returns the model, its
// gradients in place.
std::shared_ptr<nn::GPT> check_gradients(const json& golden, DType dtype, double rtol,
                                         double atol) {
  auto model = golden_model(golden, dtype);
  // nanoGPT's parameter names and order; the tied head is wte.weight itself.
  std::vector<std::string> names;
  for (const auto& [name, p] : model->named_parameters()) names.push_back(name);
  EXPECT_EQ(names, golden.at("parameter_names").get<std::vector<std::string>>());

  const Tensor idx = tensor_of(golden.at("idx"), kI64);
  const Tensor targets = tensor_of(golden.at("targets"), kI64);
  const Tensor logits = model->forward(idx);
  testing::expect_close(logits, tensor_of(golden.at("logits"), dtype), rtol, atol);
  const Tensor loss = cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  EXPECT_NEAR(loss.item<double>(), golden.at("loss").get<double>(), atol * 10);
  loss.backward();
  for (const auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(p.grad().defined());
    if (p.grad().defined())
      testing::expect_close(p.grad(), tensor_of(golden.at("grads").at(name), dtype), rtol, atol);
  }
  return model;
}

// After the gradients, one AdamW step over optim::weight_decay_groups (f64 only: in f32,
// Adam's m / sqrt(v) turns gradients that are rounding noise into full-size steps of either
// sign); `rule` absent is the default. Every parameter, wte and wpe included, must equal
// PyTorch's under the rule's configure_optimizers (golden key `after`).
void check_adamw_step(std::optional<optim::WeightDecayRule> rule, const std::string& after) {
  const json golden = load_golden();
  auto model = check_gradients(golden, kF64, 1e-9, 1e-11);
  const json& c = golden.at("config");
  optim::AdamWOptions options;
  options.lr = c.at("lr");
  options.betas = {c.at("betas")[0], c.at("betas")[1]};
  options.eps = c.at("eps");
  const double weight_decay = c.at("weight_decay");
  optim::AdamW adamw(rule ? optim::weight_decay_groups(*model, weight_decay, *rule)
                          : optim::weight_decay_groups(*model, weight_decay),
                     options);
  adamw.step();
  for (const auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    testing::expect_close(p, tensor_of(golden.at(after).at(name)), 1e-9, 1e-11);
  }
}

// nanoGPT's configure_optimizers is the default: the embeddings decay too.
TEST(GPTGolden, ForwardLossGradientsAndAdamWStepMatchPyTorchInF64) {
  check_adamw_step(std::nullopt, "after_step_nanogpt");
}

TEST(GPTGolden, AdamWStepWithNanoGPTsDecayRuleMatchesPyTorch) {
  check_adamw_step(optim::WeightDecayRule::kNanoGPT, "after_step_nanogpt");
}

TEST(GPTGolden, AdamWStepWithMinGPTsDecayRuleMatchesPyTorch) {
  check_adamw_step(optim::WeightDecayRule::kMinGPT, "after_step_mingpt");
}

// The two rules' steps differ on the embeddings alone (by lr * weight_decay * w), so each
// test above tells them apart.
TEST(GPTGolden, TheRulesDifferOnTheEmbeddingsAlone) {
  const json golden = load_golden();
  for (const auto& [name, value] : golden.at("after_step_nanogpt").items()) {
    SCOPED_TRACE(name);
    const Tensor nanogpt = tensor_of(value),
                 mingpt = tensor_of(golden.at("after_step_mingpt").at(name));
    const bool embedding = name == "wte.weight" || name == "wpe.weight";
    EXPECT_EQ(equal(nanogpt, mingpt), !embedding);
    if (embedding) {
      const double lr_wd = golden.at("config").at("lr").get<double>() *
                           golden.at("config").at("weight_decay").get<double>();
      testing::expect_close(mingpt - nanogpt, tensor_of(golden.at("weights").at(name)) * lr_wd,
                            1e-9, 1e-12);
    }
  }
}

TEST(GPTGolden, ForwardLossAndGradientsMatchPyTorchInF32) {
  check_gradients(load_golden(), kF32, 1e-4, 2e-5);
}

nn::GPTConfig tiny() {
  nn::GPTConfig c;
  c.vocab_size = 7;
  c.block_size = 5;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 8;
  return c;
}

TEST(GPT, HeadIsTiedToTheTokenEmbedding) {
  manual_seed(3);
  nn::GPT model(tiny());
  Tensor wte = model.named_parameters().front().second;
  EXPECT_EQ(model.named_parameters().front().first, "wte.weight");
  // Changing the embedding changes the head: logits of a token's own row grow with it.
  const Tensor idx = from_vector<int64_t>({1, 2, 3}, {1, 3});
  const Tensor before = model.forward(idx);
  {
    NoGradGuard no_grad;
    wte.mul_(2.0);
  }
  EXPECT_FALSE(allclose(model.forward(idx), before));
  // Both uses of wte reach its gradient: the head's for every row, the lookup's for 1, 2, 3.
  model.zero_grad();
  sum(model.forward(idx)).backward();
  const std::vector<float> g = abs(wte.grad()).sum({1}).to_vector<float>();
  for (float row : g) EXPECT_GT(row, 0.0f);
  // 6 * (7 + 5) * 8 embedding + 1 block + ln_f; no separate head.
  const int64_t block = 2 * 2 * 8 + (8 * 24 + 24) + (8 * 8 + 8) + (8 * 32 + 32) + (32 * 8 + 8);
  EXPECT_EQ(nn::parameter_count(model), (7 + 5) * 8 + block + 2 * 8);
}

TEST(GPT, GreedyGenerationIsDeterministicAndCropsToTheBlock) {
  manual_seed(4);
  nn::GPT model(tiny());
  const Tensor prompt = from_vector<int64_t>({0, 1, 2, 3, 4, 5, 6, 0}, {2, 4});
  const Tensor a = model.generate(prompt, 6, /*temperature=*/0.0);
  EXPECT_EQ(a.sizes(), (Shape{2, 10}));  // longer than block_size 5: the context is cropped
  EXPECT_TRUE(equal(a.narrow(1, 0, 4), prompt));
  EXPECT_TRUE(equal(a, model.generate(prompt, 6, 0.0)));
  EXPECT_TRUE(model.is_training());  // generate() restores the mode
  // Greedy picks the argmax of the last position's logits.
  NoGradGuard no_grad;
  model.eval();
  const Tensor first = argmax(model.forward(prompt).select(1, 3), 1);
  EXPECT_TRUE(equal(a.select(1, 4), first));
}

TEST(GPT, SamplingFollowsTheGeneratorAndTopK) {
  manual_seed(5);
  nn::GPT model(tiny());
  const Tensor prompt = from_vector<int64_t>({1, 2}, {1, 2});
  Generator g1(7), g2(7), g3(8);
  const Tensor a = model.generate(prompt, 20, 1.0, 0, &g1);
  EXPECT_TRUE(equal(a, model.generate(prompt, 20, 1.0, 0, &g2)));
  EXPECT_FALSE(equal(a, model.generate(prompt, 20, 1.0, 0, &g3)));
  // top_k = 1 is greedy whatever the draw.
  Generator g4(9);
  EXPECT_TRUE(equal(model.generate(prompt, 8, 1.5, 1, &g4), model.generate(prompt, 8, 0.0)));
}

TEST(GPT, BadConfigurationsAndInputsAreNamed) {
  nn::GPTConfig c = tiny();
  c.n_embd = 9;
  EXPECT_EMBER_ERROR(nn::GPT{c}, "n_embd (9) must be a positive multiple of n_head (2)");
  c = tiny();
  c.vocab_size = 0;
  EXPECT_EMBER_ERROR(nn::GPT{c}, "vocab_size must be positive, got 0");
  nn::GPT model(tiny());
  EXPECT_EMBER_ERROR(model.forward(zeros({1, 6}, kI64)),
                     "a sequence of 6 tokens does not fit block_size 5");
  EXPECT_EMBER_ERROR(model.forward(zeros({1, 3})), "expected token ids [B, T] of i64");
  EXPECT_EMBER_ERROR(model.forward(full({1, 2}, 7, kI64)), "7");
}

}  // namespace
}  // namespace ember
