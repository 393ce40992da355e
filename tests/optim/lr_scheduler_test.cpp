// LR schedules against PyTorch's learning-rate sequences, resuming, composition, errors.
#include <functional>
#include <memory>

#include <ember/optim/adam.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/sgd.h>

#include "golden.h"

namespace ember::optim {
namespace {

using nlohmann::json;

Tensor leaf() {
  Tensor p = zeros({1});
  p.requires_grad_();
  return p;
}

// The script's optimizer: two groups with lrs 0.1 and 0.02 (SGD with momentum, or Adam).
std::unique_ptr<Optimizer> make_optimizer(bool adam) {
  std::vector<ParamGroup> groups = {ParamGroup({leaf()}, {{"lr", 0.1}}),
                                    ParamGroup({leaf()}, {{"lr", 0.02}})};
  if (adam) return std::make_unique<Adam>(groups);
  return std::make_unique<SGD>(groups, SGDOptions{.lr = 0.1, .momentum = 0.9});
}

struct ScheduleCase {
  const char* name;
  bool adam;
  std::function<std::unique_ptr<LRScheduler>(Optimizer&)> make;
};

std::vector<ScheduleCase> schedule_cases() {
  return {
      {"step", false, [](Optimizer& o) { return std::make_unique<StepLR>(o, 7, 0.5); }},
      {"multistep", false,
       [](Optimizer& o) {
         return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{12, 5, 12, 30}, 0.3);
       }},
      {"cosine", false,
       [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 15, 0.001); }},
      {"cosine_zero_min", false,
       [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 10); }},
      {"onecycle", false,
       [](Optimizer& o) {
         return std::make_unique<OneCycleLR>(o, std::vector<double>{1.0, 0.5}, 40);
       }},
      {"onecycle_three_phase_linear", true,
       [](Optimizer& o) {
         return std::make_unique<OneCycleLR>(
             o, 0.01, 30,
             OneCycleOptions{.pct_start = 0.25,
                             .anneal_strategy = OneCycleOptions::Anneal::kLinear,
                             .div_factor = 10.0,
                             .final_div_factor = 100.0,
                             .three_phase = true,
                             .base_momentum = 0.8,
                             .max_momentum = 0.9});
       }},
      {"warmup_cosine", false,
       [](Optimizer& o) {
         return std::make_unique<LinearWarmup>(std::make_unique<CosineAnnealingLR>(o, 20), 5, 0.1);
       }},
      {"warmup_step", false,
       [](Optimizer& o) {
         return std::make_unique<LinearWarmup>(std::make_unique<StepLR>(o, 6, 0.5), 4, 0.25);
       }},
      {"warmup_constant", false,
       [](Optimizer& o) { return std::make_unique<LinearWarmup>(o, 6, 0.2); }},
  };
}

std::vector<double> group_values(const Optimizer& o, const std::string& key) {
  std::vector<double> out;
  for (const auto& g : o.param_groups()) out.push_back(g.option(key));
  return out;
}

// Compares the optimizer and schedule at step `t` with the golden sequence.
void expect_at(const json& golden, size_t t, const Optimizer& o, const LRScheduler& s, bool adam) {
  const std::string where = "step " + std::to_string(t);
  const auto lrs = golden["lrs"][t].get<std::vector<double>>();
  testing::expect_values_near(group_values(o, "lr"), lrs, 1e-9, 1e-12, "lr at " + where);
  testing::expect_values_near(s.get_last_lr(), lrs, 1e-9, 1e-12, "get_last_lr at " + where);
  EXPECT_EQ(s.last_epoch(), static_cast<int64_t>(t));
  if (golden.contains("momenta")) {
    testing::expect_values_near(group_values(o, adam ? "beta1" : "momentum"),
                                golden["momenta"][t].get<std::vector<double>>(), 1e-9, 1e-12,
                                "momentum at " + where);
  }
}

TEST(LRScheduler, MatchesPyTorch) {
  const json& schedules = testing::optim_golden()["schedules"];
  const auto cases = schedule_cases();
  ASSERT_EQ(cases.size(), schedules.size());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const json& golden = schedules.at(c.name);
    ASSERT_GE(golden["lrs"].size(), 31u);
    auto optimizer = make_optimizer(c.adam);
    auto schedule = c.make(*optimizer);
    expect_at(golden, 0, *optimizer, *schedule, c.adam);
    for (size_t t = 1; t < golden["lrs"].size(); ++t) {
      optimizer->step();
      schedule->step();
      expect_at(golden, t, *optimizer, *schedule, c.adam);
    }
  }
}

TEST(LRScheduler, StateDictResumesExactly) {
  const json& schedules = testing::optim_golden()["schedules"];
  for (const auto& c : schedule_cases()) {
    SCOPED_TRACE(c.name);
    const json& golden = schedules.at(c.name);
    const size_t split = 13;
    auto first_opt = make_optimizer(c.adam);
    auto first = c.make(*first_opt);
    for (size_t t = 0; t < split; ++t) first->step();
    const StateDict saved = first->state_dict();
    EXPECT_DOUBLE_EQ(saved.scalars.at("last_epoch"), static_cast<double>(split));

    // A fresh optimizer and schedule, as after a restart: loading applies step `split`.
    auto optimizer = make_optimizer(c.adam);
    auto schedule = c.make(*optimizer);
    schedule->load_state_dict(saved);
    expect_at(golden, split, *optimizer, *schedule, c.adam);
    for (size_t t = split + 1; t < golden["lrs"].size(); ++t) {
      schedule->step();
      expect_at(golden, t, *optimizer, *schedule, c.adam);
    }
  }
}

TEST(LRScheduler, HandComputedValues) {
  auto optimizer = make_optimizer(false);
  StepLR step(*optimizer, 2, 0.1);
  EXPECT_EQ(step.base_lrs(), (std::vector<double>{0.1, 0.02}));
  EXPECT_DOUBLE_EQ(step.lr_at(1)[0], 0.1);
  EXPECT_NEAR(step.lr_at(2)[0], 0.01, 1e-15);
  EXPECT_NEAR(step.lr_at(5)[1], 0.02 * 0.01, 1e-15);
  CosineAnnealingLR cosine(*optimizer, 4, 0.0);
  EXPECT_NEAR(cosine.lr_at(2)[0], 0.05, 1e-15);
  EXPECT_NEAR(cosine.lr_at(4)[0], 0.0, 1e-15);
  EXPECT_NEAR(cosine.lr_at(6)[0], 0.05, 1e-15);  // past T_max the cosine rises again
}

TEST(LRScheduler, OneCycleStopsAtTotalSteps) {
  auto optimizer = make_optimizer(false);
  OneCycleLR schedule(*optimizer, 0.5, 10);
  EXPECT_NEAR(optimizer->param_groups()[1].lr(), 0.5 / 25,
              1e-15);  // the optimizer's lr is replaced
  EXPECT_DOUBLE_EQ(optimizer->param_groups()[0].option("momentum"), 0.95);
  // The final lr is reached at step total_steps - 1; PyTorch allows one step more.
  for (int i = 0; i < 9; ++i) schedule.step();
  EXPECT_NEAR(schedule.get_last_lr()[0], 0.5 / 25 / 1e4, 1e-15);
  EXPECT_NEAR(optimizer->param_groups()[0].option("momentum"), 0.95, 1e-15);
  schedule.step();
  EXPECT_EMBER_ERROR(schedule.step(), "OneCycleLR: tried to step 11 times; total_steps is 10");
  EXPECT_EQ(schedule.last_epoch(), 10);
}

// An optimizer with nothing but a learning rate, to check what needs momentum.
class PlainDescent : public Optimizer {
 public:
  explicit PlainDescent(std::vector<Tensor> params) : Optimizer("PlainDescent", {{"lr", 0.1}}) {
    add_param_group(ParamGroup(std::move(params)));
  }

 protected:
  void check_options(const Options& options) const override {
    EMBER_CHECK(options.at("lr") >= 0, "PlainDescent", "invalid lr ", options.at("lr"));
  }
  void step_group(ParamGroup& group, std::vector<ParamState>&) override {
    for (auto& p : group.params)
      if (p.grad().defined()) p.sub_(p.grad(), group.lr());
  }
};

TEST(LRScheduler, RejectsBadArguments) {
  auto optimizer = make_optimizer(false);
  EXPECT_EMBER_ERROR(StepLR(*optimizer, 0), "StepLR: step_size must be > 0, got 0");
  EXPECT_EMBER_ERROR(MultiStepLR(*optimizer, {3}, -0.5), "MultiStepLR: gamma must be > 0");
  EXPECT_EMBER_ERROR(CosineAnnealingLR(*optimizer, 0), "CosineAnnealingLR: T_max must be > 0");
  EXPECT_EMBER_ERROR(OneCycleLR(*optimizer, std::vector<double>{1.0}, 10),
                     "OneCycleLR: expected 2 values for max_lr, got 1");
  EXPECT_EMBER_ERROR(OneCycleLR(*optimizer, 1.0, 0), "total_steps must be > 0");
  EXPECT_EMBER_ERROR(OneCycleLR(*optimizer, 1.0, 10, {.pct_start = 1.5}), "pct_start");
  EXPECT_EMBER_ERROR(LinearWarmup(*optimizer, 0), "LinearWarmup: warmup_steps must be > 0");
  EXPECT_EMBER_ERROR(LinearWarmup(*optimizer, 5, 0.0), "start_factor must be in (0, 1]");
  EXPECT_EMBER_ERROR(LinearWarmup(std::unique_ptr<LRScheduler>(), 5), "is null");
  auto stepped = std::make_unique<StepLR>(*optimizer, 3);
  stepped->step();
  EXPECT_EMBER_ERROR(LinearWarmup(std::move(stepped), 5), "has already stepped 1 times");

  PlainDescent plain({leaf()});
  EXPECT_EMBER_ERROR(OneCycleLR(plain, 1.0, 10),
                     "OneCycleLR: PlainDescent has neither momentum nor beta1");
  OneCycleLR no_momentum(plain, 1.0, 10, {.cycle_momentum = false});
  EXPECT_NEAR(plain.param_groups()[0].lr(), 0.04, 1e-15);
  plain.param_groups()[0].params[0].set_grad(ones({1}));
  plain.step();
  EXPECT_NEAR(plain.param_groups()[0].params[0].item<double>(), -0.04, 1e-7);

  // A two-group schedule's state does not fit a one-group optimizer.
  StepLR two(*optimizer, 3);
  StepLR one(plain, 3);
  EXPECT_EMBER_ERROR(one.load_state_dict(two.state_dict()),
                     "StepLR: load_state_dict: expected 3 scalars for 1 param groups but got 5");
  StateDict no_epoch = two.state_dict();
  no_epoch.scalars.erase("last_epoch");
  EXPECT_EMBER_ERROR(two.load_state_dict(no_epoch), "missing or invalid \"last_epoch\"");
}

}  // namespace
}  // namespace ember::optim
