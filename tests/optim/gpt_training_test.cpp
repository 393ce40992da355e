// What GPT training adds to the optimizers: weight-decay parameter groups by shape (nanoGPT's
// configure_optimizers) or by module type and shape (minGPT's) and nanoGPT's cosine schedule
// with linear warmup.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>

#include <ember/nn/nn.h>
#include <ember/optim/adam.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/param_groups.h>

#include "golden.h"

namespace ember::optim {
namespace {

using nlohmann::json;

std::vector<std::string> names(const nn::NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [name, t] : named) out.push_back(name);
  return out;
}

// A module of a type the rule does not know, with a 1-d gain and a 2-d table of its own.
struct Custom : nn::Module {
  Custom() {
    register_parameter("gain", ones({4}));
    register_parameter("table", zeros({3, 4}));
    register_parameter("frozen", zeros({3, 4}), /*requires_grad=*/false);
  }
  std::string name() const override { return "Custom"; }
};

// Holds another module's tensor under a type name the rule excludes (a tied embedding).
struct TiedEmbedding : nn::Module {
  explicit TiedEmbedding(const Tensor& weight) { register_parameter("weight", weight); }
  std::string name() const override { return "Embedding"; }
};

std::shared_ptr<nn::Sequential> conv_net() {
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Conv2d>(2, 4, 3));
  net->push_back(std::make_shared<nn::BatchNorm2d>(4));
  net->push_back(std::make_shared<nn::Flatten>());
  net->push_back(std::make_shared<nn::Linear>(4 * 2 * 2, 3));
  net->push_back(std::make_shared<Custom>());
  return net;
}

TEST(WeightDecayGroups, LinearAndConvWeightsDecayBiasesNormsAndVectorsDoNot) {
  auto net = conv_net();
  const WeightDecaySplit split = split_weight_decay(*net);
  EXPECT_EQ(names(split.decay), (std::vector<std::string>{"0.weight", "3.weight", "4.table"}));
  EXPECT_EQ(names(split.no_decay),
            (std::vector<std::string>{"0.bias", "1.weight", "1.bias", "3.bias", "4.gain"}));
  EXPECT_TRUE(split.decay[0].second.is_same(net->named_parameters()[0].second));
}

// The embeddings (2-d) decay under nanoGPT's rule, the default, and not under minGPT's; a
// norm's and every bias and gain never do.
TEST(WeightDecayGroups, NanoGPTsRuleDecaysEveryMatrixEmbeddingsIncluded) {
  manual_seed(0);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Embedding>(5, 4));
  net->push_back(std::make_shared<nn::LayerNorm>(4));
  net->push_back(std::make_shared<nn::Linear>(4, 3));
  const std::vector<std::string> matrices = {"0.weight", "2.weight"};
  const std::vector<std::string> vectors = {"1.weight", "1.bias", "2.bias"};
  for (const WeightDecaySplit& split :
       {split_weight_decay(*net), split_weight_decay(*net, WeightDecayRule::kNanoGPT)}) {
    EXPECT_EQ(names(split.decay), matrices);
    EXPECT_EQ(names(split.no_decay), vectors);
  }
  const WeightDecaySplit mingpt = split_weight_decay(*net, WeightDecayRule::kMinGPT);
  EXPECT_EQ(names(mingpt.decay), (std::vector<std::string>{"2.weight"}));
  EXPECT_EQ(names(mingpt.no_decay),
            (std::vector<std::string>{"0.weight", "1.weight", "1.bias", "2.bias"}));
  // The groups follow the rule too.
  const auto nanogpt_groups = weight_decay_groups(*net, 0.1);
  ASSERT_EQ(nanogpt_groups.size(), 2u);
  EXPECT_EQ(nanogpt_groups[0].params.size(), 2u);
  EXPECT_EQ(nanogpt_groups[0].options.at("weight_decay"), 0.1);
  const auto mingpt_groups = weight_decay_groups(*net, 0.1, WeightDecayRule::kMinGPT);
  ASSERT_EQ(mingpt_groups.size(), 2u);
  EXPECT_EQ(mingpt_groups[0].params.size(), 1u);
}

TEST(WeightDecayGroups, ModuleTypesCanBeChosen) {
  auto net = conv_net();
  const WeightDecaySplit split = split_weight_decay(*net, {"Linear", "Custom"});
  EXPECT_EQ(names(split.decay), (std::vector<std::string>{"0.weight"}));
  EXPECT_EQ(names(split.no_decay),
            (std::vector<std::string>{"0.bias", "1.weight", "1.bias", "3.weight", "3.bias",
                                      "4.gain", "4.table"}));
}

TEST(WeightDecayGroups, ATiedWeightIsListedOnceAndDecaysOnlyIfEveryOwnerSaysSo) {
  manual_seed(0);
  auto head = std::make_shared<nn::Linear>(4, 6, /*bias=*/false);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(head);
  net->push_back(std::make_shared<TiedEmbedding>(head->weight));
  const WeightDecaySplit split = split_weight_decay(*net, WeightDecayRule::kMinGPT);
  EXPECT_TRUE(split.decay.empty());
  EXPECT_EQ(names(split.no_decay), (std::vector<std::string>{"0.weight"}));
  // Under nanoGPT's rule both owners hold a matrix, which decays, listed once.
  const WeightDecaySplit nanogpt = split_weight_decay(*net);
  EXPECT_EQ(names(nanogpt.decay), (std::vector<std::string>{"0.weight"}));
  EXPECT_TRUE(nanogpt.no_decay.empty());
  // One group (the empty decay group is left out), which AdamW accepts: no parameter twice.
  const auto groups = weight_decay_groups(*net, 0.1, WeightDecayRule::kMinGPT);
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].options.at("weight_decay"), 0.0);
  AdamW adamw(groups);
  EXPECT_EQ(adamw.param_groups().size(), 1u);
}

// One AdamW step on zero gradients moves nothing but the decoupled decay: exactly the decay
// group shrinks by (1 - lr * weight_decay).
TEST(WeightDecayGroups, AdamWDecaysOnlyTheDecayGroup) {
  auto net = conv_net();
  auto groups = weight_decay_groups(*net, 0.5);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].options.at("weight_decay"), 0.5);
  EXPECT_EQ(groups[1].options.at("weight_decay"), 0.0);
  AdamW adamw(groups, {.lr = 0.1, .weight_decay = 0.01});
  EXPECT_EQ(adamw.param_groups()[0].option("weight_decay"), 0.5);
  EXPECT_EQ(adamw.param_groups()[0].option("lr"), 0.1);
  std::map<std::string, Tensor> before;
  for (const auto& [name, p] : net->named_parameters()) {
    before[name] = p.detach().clone();
    if (p.requires_grad()) p.set_grad(zeros_like(p));
  }
  adamw.step();
  const WeightDecaySplit split = split_weight_decay(*net);
  for (const auto& [name, now] : net->named_parameters()) {
    SCOPED_TRACE(name);
    const Tensor& old = before.at(name);
    const bool decays = std::any_of(split.decay.begin(), split.decay.end(),
                                    [&](const auto& e) { return e.first == name; });
    ::ember::testing::expect_close(now.detach(), decays ? old * (1 - 0.1 * 0.5) : old, 1e-6, 0);
  }
  EXPECT_EMBER_ERROR(weight_decay_groups(*net, -1.0), "weight_decay must be >= 0, got -1");
}

// --- CosineWithWarmupLR -------------------------------------------------------------------------

const json& cosine_golden() {
  static const json golden = ::ember::testing::read_golden(EMBER_COSINE_WARMUP_GOLDEN);
  return golden;
}

std::unique_ptr<AdamW> adamw_with_lrs(const std::vector<double>& lrs) {
  std::vector<ParamGroup> groups;
  for (double lr : lrs) {
    Tensor p = zeros({1});
    p.requires_grad_();
    groups.emplace_back(std::vector<Tensor>{p}, Options{{"lr", lr}});
  }
  return std::make_unique<AdamW>(groups);
}

TEST(CosineWithWarmupLR, MatchesNanoGptGetLr) {
  ASSERT_EQ(cosine_golden().size(), 3u);
  for (const auto& [name, c] : cosine_golden().items()) {
    SCOPED_TRACE(name);
    auto opt = adamw_with_lrs(c["lrs"].get<std::vector<double>>());
    CosineWithWarmupLR schedule(*opt, c["warmup"].get<int64_t>(), c["max_steps"].get<int64_t>(),
                                c["min_lr"].get<double>());
    const auto expected = c["expected"].get<std::vector<std::vector<double>>>();
    for (size_t step = 0; step < expected.size(); ++step) {
      ::ember::testing::expect_values_near(schedule.get_last_lr(), expected[step], 1e-14, 1e-18,
                                           "step " + std::to_string(step));
      EXPECT_EQ(opt->param_groups()[0].lr(), schedule.get_last_lr()[0]);
      opt->step();
      schedule.step();
    }
  }
}

TEST(CosineWithWarmupLR, ResumesFromItsStateDict) {
  auto opt = adamw_with_lrs({1e-3, 5e-4});
  CosineWithWarmupLR first(*opt, 5, 30, 1e-4);
  for (int i = 0; i < 17; ++i) first.step();
  const StateDict saved = first.state_dict();

  auto fresh = adamw_with_lrs({1e-3, 5e-4});
  CosineWithWarmupLR resumed(*fresh, 5, 30, 1e-4);
  EXPECT_EQ(resumed.get_last_lr()[0], 0.0);  // step 0 of the warmup
  resumed.load_state_dict(saved);
  EXPECT_EQ(resumed.last_epoch(), 17);
  EXPECT_EQ(resumed.get_last_lr(), first.get_last_lr());
  EXPECT_EQ(fresh->param_groups()[1].lr(), first.get_last_lr()[1]);
  first.step();
  resumed.step();
  EXPECT_EQ(resumed.get_last_lr(), first.get_last_lr());
}

TEST(CosineWithWarmupLR, RefusesBadSettings) {
  auto opt = adamw_with_lrs({1e-3});
  EXPECT_EMBER_ERROR(CosineWithWarmupLR(*opt, 10, 10),
                     "CosineWithWarmupLR: max_steps (10) must be larger than warmup_steps (10)");
  EXPECT_EMBER_ERROR(CosineWithWarmupLR(*opt, -1, 10), "warmup_steps must be >= 0, got -1");
  EXPECT_EMBER_ERROR(CosineWithWarmupLR(*opt, 1, 10, 0.01),
                     "min_lr 0.01 is larger than the lr 0.001 of group 0");
}

}  // namespace
}  // namespace ember::optim
