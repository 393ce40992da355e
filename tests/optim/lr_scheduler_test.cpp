// LR schedules against PyTorch's learning-rate sequences, resuming, composition, errors.
#include <cmath>
#include <fstream>
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

// Steps every case's schedule along its golden sequence (optimizer.step() then step()).
void expect_sequences(const json& schedules, const std::vector<ScheduleCase>& cases) {
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

// Saves every case's schedule after each of `splits` steps and resumes a fresh one (on a
// fresh optimizer, as after a restart) from it: the rest of the sequence must follow.
void expect_resumes(const json& schedules, const std::vector<ScheduleCase>& cases,
                    const std::vector<size_t>& splits) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const json& golden = schedules.at(c.name);
    for (size_t split : splits) {
      SCOPED_TRACE("split " + std::to_string(split));
      auto first_opt = make_optimizer(c.adam);
      auto first = c.make(*first_opt);
      for (size_t t = 0; t < split; ++t) first->step();
      const StateDict saved = first->state_dict();
      EXPECT_DOUBLE_EQ(saved.scalars.at("last_epoch"), static_cast<double>(split));

      auto optimizer = make_optimizer(c.adam);
      auto schedule = c.make(*optimizer);
      schedule->load_state_dict(saved);
      EXPECT_EQ(schedule->state_dict().scalars, saved.scalars);
      expect_at(golden, split, *optimizer, *schedule, c.adam);
      for (size_t t = split + 1; t < golden["lrs"].size(); ++t) {
        schedule->step();
        expect_at(golden, t, *optimizer, *schedule, c.adam);
      }
    }
  }
}

TEST(LRScheduler, MatchesPyTorch) {
  const json& schedules = testing::optim_golden()["schedules"];
  ASSERT_EQ(schedule_cases().size(), schedules.size());
  expect_sequences(schedules, schedule_cases());
}

TEST(LRScheduler, StateDictResumesExactly) {
  expect_resumes(testing::optim_golden()["schedules"], schedule_cases(), {2, 13});
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
  void step_group(ParamGroup& group, std::vector<ParamState>&, const DeviceInputs&) override {
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
                     "StepLR: load_state_dict: the state is for 2 param groups, the optimizer "
                     "has 1");
  StateDict no_epoch = two.state_dict();
  no_epoch.scalars.erase("last_epoch");
  EXPECT_EMBER_ERROR(two.load_state_dict(no_epoch), "missing or invalid \"last_epoch\"");
}

// --- The schedules of tests/optim/golden/make_sched_golden.py ----------------------------------

const json& sched_golden() {
  static const json golden = [] {
    std::ifstream in(EMBER_SCHED_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_SCHED_GOLDEN;
    return json::parse(in);
  }();
  return golden;
}

// The script's lambdas.
double lam0(int64_t e) { return std::pow(0.95, static_cast<double>(e)); }
double lam1(int64_t e) { return 1.0 / (1.0 + 0.1 * static_cast<double>(e)); }
double lam_shared(int64_t e) { return e % 10 < 5 ? 0.5 : 1.0; }
double mul0(int64_t) { return 0.97; }
double mul1(int64_t e) { return 1.0 - 0.005 * static_cast<double>(e); }

using Schedules = std::vector<std::unique_ptr<LRScheduler>>;

// Builds the children in order, as the script does (construction order matters to PyTorch).
template <typename... Makers>
Schedules build(Makers... makers) {
  Schedules out;
  (out.push_back(makers()), ...);
  return out;
}

std::vector<ScheduleCase> sched_cases() {
  using std::make_unique;
  return {
      {"lambda_per_group", false,
       [](Optimizer& o) {
         return make_unique<LambdaLR>(o, std::vector<LrLambda>{lam0, lam1});
       }},
      {"lambda_shared", false, [](Optimizer& o) { return make_unique<LambdaLR>(o, lam_shared); }},
      {"multiplicative", false,
       [](Optimizer& o) {
         return make_unique<MultiplicativeLR>(o, std::vector<LrLambda>{mul0, mul1});
       }},
      {"exponential", false, [](Optimizer& o) { return make_unique<ExponentialLR>(o, 0.9); }},
      {"polynomial", false, [](Optimizer& o) { return make_unique<PolynomialLR>(o, 20, 2.0); }},
      {"polynomial_default", false, [](Optimizer& o) { return make_unique<PolynomialLR>(o); }},
      {"constant", false, [](Optimizer& o) { return make_unique<ConstantLR>(o, 0.25, 6); }},
      {"constant_default", false, [](Optimizer& o) { return make_unique<ConstantLR>(o); }},
      {"linear", false, [](Optimizer& o) { return make_unique<LinearLR>(o, 0.2, 0.9, 10); }},
      {"linear_default", false, [](Optimizer& o) { return make_unique<LinearLR>(o); }},
      {"sequential_linear_cosine", false,
       [](Optimizer& o) {
         return make_unique<SequentialLR>(
             o,
             build([&] { return make_unique<LinearLR>(o, 0.1, 1.0, 5); },
                   [&] { return make_unique<CosineAnnealingLR>(o, 30, 0.001); }),
             std::vector<int64_t>{5});
       }},
      {"sequential_three", false,
       [](Optimizer& o) {
         return make_unique<SequentialLR>(o,
                                          build([&] { return make_unique<ConstantLR>(o, 0.5, 3); },
                                                [&] { return make_unique<ExponentialLR>(o, 0.9); },
                                                [&] { return make_unique<StepLR>(o, 5, 0.5); }),
                                          std::vector<int64_t>{4, 15});
       }},
      {"sequential_lambda_polynomial", false,
       [](Optimizer& o) {
         return make_unique<SequentialLR>(
             o,
             build(
                 [&] {
                   return make_unique<LambdaLR>(o, std::vector<LrLambda>{lam0, lam1});
                 },
                 [&] { return make_unique<PolynomialLR>(o, 12, 1.5); }),
             std::vector<int64_t>{10});
       }},
      {"sequential_multiplicative_step", false,
       [](Optimizer& o) {
         return make_unique<SequentialLR>(
             o,
             build(
                 [&] {
                   return make_unique<MultiplicativeLR>(o, std::vector<LrLambda>{mul0, mul1});
                 },
                 [&] { return make_unique<StepLR>(o, 4, 0.5); }),
             std::vector<int64_t>{10});
       }},
      {"sequential_linear_onecycle", false,
       [](Optimizer& o) {
         return make_unique<SequentialLR>(
             o,
             build([&] { return make_unique<LinearLR>(o, 0.25, 1.0, 5); },
                   [&] {
                     return make_unique<OneCycleLR>(o, std::vector<double>{1.0, 0.5}, 40);
                   }),
             std::vector<int64_t>{5});
       }},
      {"chained_exponential_step", false,
       [](Optimizer& o) {
         return make_unique<ChainedScheduler>(
             build([&] { return make_unique<ExponentialLR>(o, 0.9); },
                   [&] { return make_unique<StepLR>(o, 4, 0.5); }));
       }},
      {"chained_linear_exponential", false,
       [](Optimizer& o) {
         return make_unique<ChainedScheduler>(
             build([&] { return make_unique<LinearLR>(o, 0.1, 1.0, 8); },
                   [&] { return make_unique<ExponentialLR>(o, 0.95); }));
       }},
      {"chained_constant_exponential", false,
       [](Optimizer& o) {
         return make_unique<ChainedScheduler>(
             build([&] { return make_unique<ConstantLR>(o, 0.1, 2); },
                   [&] { return make_unique<ExponentialLR>(o, 0.9); }));
       }},
      {"chained_multistep_polynomial_multiplicative", false,
       [](Optimizer& o) {
         return make_unique<ChainedScheduler>(build(
             [&] {
               return make_unique<MultiStepLR>(o, std::vector<int64_t>{6, 6, 20}, 0.5);
             },
             [&] { return make_unique<PolynomialLR>(o, 40, 0.5); },
             [&] {
               return make_unique<MultiplicativeLR>(o, std::vector<LrLambda>{mul0, mul1});
             }));
       }},
      {"chained_nested", false,
       [](Optimizer& o) {
         return make_unique<ChainedScheduler>(build(
             [&] {
               return make_unique<ChainedScheduler>(
                   build([&] { return make_unique<LinearLR>(o, 0.5, 1.0, 4); },
                         [&] { return make_unique<StepLR>(o, 10, 0.1); }));
             },
             [&] { return make_unique<ExponentialLR>(o, 0.98); }));
       }},
  };
}

TEST(LRScheduler, MoreSchedulesMatchPyTorch) {
  expect_sequences(sched_golden()["schedules"], sched_cases());
}

TEST(LRScheduler, MoreSchedulesResumeExactly) {
  // Inside and after the warmups and first schedules.
  expect_resumes(sched_golden()["schedules"], sched_cases(), {3, 7, 17});
}

struct PlateauCase {
  const char* name;
  PlateauOptions options;
};

std::vector<PlateauCase> plateau_cases() {
  using Mode = PlateauOptions::Mode;
  return {
      {"plateau_default", {}},
      {"plateau_min_rel", {.mode = Mode::kMin, .factor = 0.5, .patience = 2}},
      {"plateau_max_abs_cooldown",
       {.mode = Mode::kMax,
        .factor = 0.3,
        .patience = 1,
        .threshold = 0.05,
        .threshold_mode = PlateauOptions::ThresholdMode::kAbs,
        .cooldown = 2,
        .min_lr = {0.01, 0.001}}},
      {"plateau_eps",
       {.mode = Mode::kMin, .factor = 0.9, .patience = 0, .threshold = 0.0, .eps = 0.005}},
  };
}

void expect_plateau_at(const json& golden, size_t t, const Optimizer& o,
                       const ReduceLROnPlateau& s) {
  const std::string where = "step " + std::to_string(t);
  const auto lrs = golden["lrs"][t].get<std::vector<double>>();
  testing::expect_values_near(group_values(o, "lr"), lrs, 1e-12, 0.0, "lr at " + where);
  testing::expect_values_near(s.get_last_lr(), lrs, 1e-12, 0.0, "get_last_lr at " + where);
  EXPECT_EQ(s.num_bad_epochs(), golden["num_bad_epochs"][t].get<int64_t>()) << where;
  EXPECT_EQ(s.cooldown_counter(), golden["cooldown_counter"][t].get<int64_t>()) << where;
  EXPECT_EQ(s.last_epoch(), static_cast<int64_t>(t));
}

TEST(ReduceLROnPlateau, MatchesPyTorch) {
  const json& schedules = sched_golden()["schedules"];
  ASSERT_EQ(sched_cases().size() + plateau_cases().size(), schedules.size());  // all tested
  for (const auto& c : plateau_cases()) {
    SCOPED_TRACE(c.name);
    const json& golden = schedules.at(c.name);
    const auto metrics = golden["metrics"].get<std::vector<double>>();
    auto optimizer = make_optimizer(false);
    ReduceLROnPlateau schedule(*optimizer, c.options);
    expect_plateau_at(golden, 0, *optimizer, schedule);
    for (size_t t = 1; t <= metrics.size(); ++t) {
      optimizer->step();
      schedule.step(metrics[t - 1]);
      expect_plateau_at(golden, t, *optimizer, schedule);
    }
  }
}

TEST(ReduceLROnPlateau, ReducesAfterPatienceWithinBounds) {
  auto optimizer = make_optimizer(false);
  ReduceLROnPlateau plateau(*optimizer, {.factor = 0.5, .patience = 1, .min_lr = {0.03, 0.0}});
  plateau.step(1.0);  // the first metric is always an improvement
  EXPECT_EQ(plateau.best(), 1.0);
  plateau.step(1.0);  // not better by the relative threshold: 1 bad step, within patience
  EXPECT_EQ(plateau.num_bad_epochs(), 1);
  EXPECT_EQ(optimizer->param_groups()[0].lr(), 0.1);
  plateau.step(0.99995);  // better by less than 1e-4 relative: still bad, so reduce
  EXPECT_EQ(plateau.num_bad_epochs(), 0);
  EXPECT_EQ(plateau.get_last_lr(), (std::vector<double>{0.05, 0.01}));
  plateau.step(2.0);
  plateau.step(2.0);
  EXPECT_EQ(plateau.get_last_lr(), (std::vector<double>{0.03, 0.005}));  // min_lr holds group 0
  plateau.step(std::nan(""));  // a NaN metric is never better
  EXPECT_EQ(plateau.num_bad_epochs(), 1);
  EXPECT_EQ(plateau.best(), 1.0);
  EXPECT_EMBER_ERROR(plateau.step(), "ReduceLROnPlateau: step() needs the watched metric");
  EXPECT_EMBER_ERROR(plateau.lr_at(3), "ReduceLROnPlateau: the lr follows the metrics");
}

TEST(ReduceLROnPlateau, StateDictResumesExactly) {
  const json& schedules = sched_golden()["schedules"];
  for (const auto& c : plateau_cases()) {
    SCOPED_TRACE(c.name);
    const json& golden = schedules.at(c.name);
    const auto metrics = golden["metrics"].get<std::vector<double>>();
    for (size_t split : {0u, 8u, 10u, 21u}) {
      auto first_opt = make_optimizer(false);
      ReduceLROnPlateau first(*first_opt, c.options);
      for (size_t t = 0; t < split; ++t) first.step(metrics[t]);
      const StateDict saved = first.state_dict();
      EXPECT_EQ(saved.scalars.at("best"), first.best());
      EXPECT_EQ(saved.scalars.at("num_bad_epochs"), static_cast<double>(first.num_bad_epochs()));
      EXPECT_EQ(saved.scalars.at("cooldown_counter"),
                static_cast<double>(first.cooldown_counter()));

      // A restart: the optimizer is fresh (lrs 0.1, 0.02); loading writes the saved lrs.
      auto optimizer = make_optimizer(false);
      ReduceLROnPlateau schedule(*optimizer, c.options);
      schedule.load_state_dict(saved);
      expect_plateau_at(golden, split, *optimizer, schedule);
      EXPECT_EQ(schedule.best(), first.best());
      for (size_t t = split + 1; t <= metrics.size(); ++t) {
        schedule.step(metrics[t - 1]);
        expect_plateau_at(golden, t, *optimizer, schedule);
      }
    }
  }
}

TEST(LRScheduler, ChainedMultipliesFactorsFromTheFirstBaseLr) {
  auto optimizer = make_optimizer(false);
  Schedules parts;
  parts.push_back(std::make_unique<ConstantLR>(*optimizer, 0.5, 2));
  parts.push_back(std::make_unique<StepLR>(*optimizer, 3, 0.1));
  ChainedScheduler chain(std::move(parts));
  // Both start from 0.1 and 0.02, not from the lr the ConstantLR left when StepLR was built.
  EXPECT_EQ(chain.base_lrs(), (std::vector<double>{0.1, 0.02}));
  EXPECT_EQ(chain.scheduler(1).base_lrs(), (std::vector<double>{0.1, 0.02}));
  const std::vector<double> expected = {0.05, 0.05, 0.1, 0.01, 0.01, 0.01, 0.001};
  for (size_t t = 0; t < expected.size(); ++t) {
    if (t > 0) chain.step();
    EXPECT_NEAR(chain.get_last_lr()[0], expected[t], 1e-15) << t;
    EXPECT_EQ(chain.scheduler(0).last_epoch(), static_cast<int64_t>(t));
  }
  const StateDict dict = chain.state_dict();
  EXPECT_EQ(dict.scalars.count("type.ChainedScheduler"), 1u);
  EXPECT_EQ(dict.scalars.count("schedulers.0.type.ConstantLR"), 1u);
  EXPECT_EQ(dict.scalars.at("schedulers.1.last_epoch"), 6.0);
}

TEST(LRScheduler, LinearWarmupIsASequentialLR) {
  auto optimizer = make_optimizer(false);
  LinearWarmup warmup(std::make_unique<ExponentialLR>(*optimizer, 0.5), 4, 0.2);
  ASSERT_EQ(warmup.size(), 2u);
  EXPECT_STREQ(warmup.scheduler(0).name(), "LinearLR");
  EXPECT_STREQ(warmup.scheduler(1).name(), "ExponentialLR");
  const std::vector<double> expected = {0.02, 0.04, 0.06, 0.08, 0.1, 0.05, 0.025};
  for (size_t t = 0; t < expected.size(); ++t) {
    if (t > 0) warmup.step();
    EXPECT_NEAR(optimizer->param_groups()[0].lr(), expected[t], 1e-15) << t;
  }
  EXPECT_EQ(warmup.scheduler(1).last_epoch(), 2);
  EXPECT_EQ(warmup.state_dict().scalars.count("type.LinearWarmup"), 1u);
}

TEST(LRScheduler, StateOfAnotherScheduleIsRefused) {
  auto optimizer = make_optimizer(false);
  StepLR step(*optimizer, 3);
  ExponentialLR exponential(*optimizer, 0.9);
  EXPECT_EMBER_ERROR(exponential.load_state_dict(step.state_dict()),
                     "ExponentialLR: load_state_dict: the state is from StepLR, not ExponentialLR");
  ReduceLROnPlateau plateau(*optimizer);
  EXPECT_EMBER_ERROR(plateau.load_state_dict(step.state_dict()),
                     "the state is from StepLR, not ReduceLROnPlateau");

  auto sequential = [&](bool exponential_second) {
    Schedules parts;
    parts.push_back(std::make_unique<LinearLR>(*optimizer));
    if (exponential_second) {
      parts.push_back(std::make_unique<ExponentialLR>(*optimizer, 0.9));
    } else {
      parts.push_back(std::make_unique<StepLR>(*optimizer, 3));
    }
    return std::make_unique<SequentialLR>(*optimizer, std::move(parts), std::vector<int64_t>{5});
  };
  auto with_step = sequential(false);
  with_step->step();
  const std::vector<double> before = with_step->get_last_lr();
  EXPECT_EMBER_ERROR(with_step->load_state_dict(sequential(true)->state_dict()),
                     "SequentialLR: load_state_dict: the state at \"schedulers.1.\" is from "
                     "ExponentialLR, not StepLR");
  EXPECT_EQ(with_step->last_epoch(), 1);  // unchanged
  EXPECT_EQ(with_step->get_last_lr(), before);

  StateDict untyped = step.state_dict();
  untyped.scalars.erase("type.StepLR");
  EXPECT_EMBER_ERROR(step.load_state_dict(untyped),
                     "StepLR: load_state_dict: the state names no scheduler (no \"type.StepLR\" "
                     "key); expected the state of StepLR");
  StateDict extra = step.state_dict();
  extra.scalars["best"] = 1.0;
  EXPECT_EMBER_ERROR(step.load_state_dict(extra), "StepLR: load_state_dict: unexpected \"best\"");

  // A OneCycleLR state beyond a shorter run's total_steps leaves the schedule as it was.
  OneCycleLR long_run(*optimizer, 1.0, 50);
  for (int i = 0; i < 30; ++i) long_run.step();
  OneCycleLR short_run(*optimizer, 1.0, 20);
  short_run.step();
  EXPECT_EMBER_ERROR(short_run.load_state_dict(long_run.state_dict()),
                     "OneCycleLR: tried to step 30 times; total_steps is 20");
  EXPECT_EQ(short_run.last_epoch(), 1);
  EXPECT_EQ(optimizer->param_groups()[0].lr(), short_run.lr_at(1)[0]);
}

TEST(LRScheduler, CompositesRejectBadArguments) {
  auto optimizer = make_optimizer(false);
  auto other = make_optimizer(false);
  auto two = [&](std::unique_ptr<LRScheduler> a, std::unique_ptr<LRScheduler> b) {
    Schedules out;
    out.push_back(std::move(a));
    out.push_back(std::move(b));
    return out;
  };
  using std::make_unique;
  EXPECT_EMBER_ERROR(
      SequentialLR(*optimizer,
                   two(make_unique<LinearLR>(*optimizer), make_unique<StepLR>(*optimizer, 3)),
                   {5, 10}),
      "SequentialLR: expected 1 milestones for 2 schedules, got 2");
  EXPECT_EMBER_ERROR(
      SequentialLR(*optimizer,
                   two(make_unique<LinearLR>(*optimizer), make_unique<StepLR>(*other, 3)), {5}),
      "SequentialLR: schedule 1 (StepLR) is on a different optimizer");
  EXPECT_EMBER_ERROR(
      SequentialLR(*other,
                   two(make_unique<LinearLR>(*optimizer), make_unique<StepLR>(*optimizer, 3)), {5}),
      "SequentialLR: schedule 0 (LinearLR) is on a different optimizer");
  EXPECT_EMBER_ERROR(SequentialLR(*optimizer, {}, {}), "SequentialLR: needs at least one");
  EXPECT_EMBER_ERROR(
      SequentialLR(*optimizer,
                   two(make_unique<LinearLR>(*optimizer), make_unique<StepLR>(*optimizer, 3)),
                   {-4}),
      "SequentialLR: milestones must be > 0 and increasing, got -4 first");
  EXPECT_EMBER_ERROR(
      SequentialLR(*optimizer,
                   two(make_unique<LinearLR>(*optimizer), make_unique<StepLR>(*optimizer, 3)), {0}),
      "SequentialLR: milestones must be > 0 and increasing, got 0 first");
  EXPECT_EMBER_ERROR(
      SequentialLR(
          *optimizer,
          two(make_unique<LinearLR>(*optimizer), make_unique<ReduceLROnPlateau>(*optimizer)), {5}),
      "SequentialLR: schedule 1 is a ReduceLROnPlateau");
  EXPECT_EMBER_ERROR(SequentialLR(*optimizer,
                                  two(make_unique<LinearLR>(*optimizer),
                                      make_unique<MultiplicativeLR>(*optimizer, mul0)),
                                  {5}),
                     "SequentialLR: schedule 1 is a MultiplicativeLR, which may only come first");
  EXPECT_EMBER_ERROR(
      SequentialLR(*optimizer,
                   two(make_unique<LinearLR>(*optimizer), make_unique<LinearWarmup>(*optimizer, 3)),
                   {5}),
      "SequentialLR: schedule 1 (LinearWarmup) is itself a composite");
  auto stepped = make_unique<StepLR>(*optimizer, 3);
  stepped->step();
  EXPECT_EMBER_ERROR(
      SequentialLR(*optimizer, two(make_unique<LinearLR>(*optimizer), std::move(stepped)), {5}),
      "SequentialLR: schedule 1 (StepLR) has already stepped 1 times");

  EXPECT_EMBER_ERROR(ChainedScheduler(two(make_unique<LinearLR>(*optimizer),
                                          make_unique<CosineAnnealingLR>(*optimizer, 10))),
                     "ChainedScheduler: schedule 1 (CosineAnnealingLR) is not of the form "
                     "lr = base_lr * factor(step)");
  EXPECT_EMBER_ERROR(ChainedScheduler(two(make_unique<LambdaLR>(*optimizer, lam0),
                                          make_unique<ExponentialLR>(*optimizer, 0.9))),
                     "ChainedScheduler: schedule 0 (LambdaLR) is not of the form");
  EXPECT_EMBER_ERROR(ChainedScheduler(two(make_unique<ExponentialLR>(*optimizer, 0.9),
                                          make_unique<ExponentialLR>(*other, 0.9))),
                     "ChainedScheduler: schedule 1 (ExponentialLR) is on a different optimizer");
  EXPECT_EMBER_ERROR(ChainedScheduler(two(make_unique<ExponentialLR>(*optimizer, 0.9), nullptr)),
                     "ChainedScheduler: schedule 1 is null");
  EXPECT_EMBER_ERROR(ChainedScheduler(Schedules{}), "ChainedScheduler: needs at least one");
}

TEST(LRScheduler, NewSchedulesRejectBadArguments) {
  auto optimizer = make_optimizer(false);
  EXPECT_EMBER_ERROR(ExponentialLR(*optimizer, 0.0), "ExponentialLR: gamma must be > 0, got 0");
  EXPECT_EMBER_ERROR(PolynomialLR(*optimizer, -3), "PolynomialLR: total_iters must be > 0, got -3");
  EXPECT_EMBER_ERROR(PolynomialLR(*optimizer, 5, -1.0), "PolynomialLR: power must be >= 0, got -1");
  EXPECT_EMBER_ERROR(ConstantLR(*optimizer, 1.5), "ConstantLR: factor must be in [0, 1], got 1.5");
  EXPECT_EMBER_ERROR(ConstantLR(*optimizer, 0.5, -1),
                     "ConstantLR: total_iters must be > 0, got -1");
  EXPECT_EMBER_ERROR(LinearLR(*optimizer, 0.0), "LinearLR: start_factor must be in (0, 1], got 0");
  EXPECT_EMBER_ERROR(LinearLR(*optimizer, 0.5, 1.2),
                     "LinearLR: end_factor must be in [0, 1], got 1.2");
  EXPECT_EMBER_ERROR(LinearLR(*optimizer, 0.5, 1.0, 0), "LinearLR: total_iters must be > 0, got 0");
  EXPECT_EMBER_ERROR(LambdaLR(*optimizer, std::vector<LrLambda>{lam0, lam1, lam0}),
                     "LambdaLR: expected 2 lr_lambdas, got 3");
  EXPECT_EMBER_ERROR(LambdaLR(*optimizer, LrLambda()), "LambdaLR: lr_lambda of group 0 is empty");
  EXPECT_EMBER_ERROR(MultiplicativeLR(*optimizer, std::vector<LrLambda>{}),
                     "MultiplicativeLR: expected 2 lr_lambdas, got 0");
  EXPECT_EMBER_ERROR(ReduceLROnPlateau(*optimizer, {.factor = 1.0}),
                     "ReduceLROnPlateau: factor must be in [0, 1), got 1");
  EXPECT_EMBER_ERROR(ReduceLROnPlateau(*optimizer, {.patience = -1}),
                     "ReduceLROnPlateau: patience must be >= 0, got -1");
  EXPECT_EMBER_ERROR(ReduceLROnPlateau(*optimizer, {.cooldown = -2}),
                     "ReduceLROnPlateau: cooldown must be >= 0, got -2");
  EXPECT_EMBER_ERROR(ReduceLROnPlateau(*optimizer, {.min_lr = {0.1, 0.2, 0.3}}),
                     "ReduceLROnPlateau: expected 1 or 2 min_lr values, got 3");
  EXPECT_EMBER_ERROR(ReduceLROnPlateau(*optimizer, {.min_lr = {-0.1}}),
                     "ReduceLROnPlateau: min_lr must be >= 0, got -0.1");
  EXPECT_EMBER_ERROR(ReduceLROnPlateau(*optimizer, {.eps = -1.0}),
                     "ReduceLROnPlateau: eps must be >= 0, got -1");
}

TEST(LRScheduler, MultiplicativeLRLooksBackAndForth) {
  auto optimizer = make_optimizer(false);
  MultiplicativeLR schedule(*optimizer, [](int64_t e) { return e % 2 == 0 ? 0.5 : 1.0; });
  EXPECT_NEAR(schedule.lr_at(4)[0], 0.1 * 0.25, 1e-15);
  EXPECT_NEAR(schedule.lr_at(1)[0], 0.1, 1e-15);  // earlier than the cache: recomputed
  EXPECT_NEAR(schedule.lr_at(6)[1], 0.02 * 0.125, 1e-15);
}

}  // namespace
}  // namespace ember::optim
