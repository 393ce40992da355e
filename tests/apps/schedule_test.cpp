// ember-train's schedule: warm-up and decay laid out over the run's real optimizer steps.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include <ember/ember.h>

#include "schedule.h"

namespace ember::apps {
namespace {

constexpr int64_t kStepsPerEpoch = 468;  // Fashion-MNIST, batch 128
constexpr double kPeak = 0.1;

// The lr the optimizer holds for step `step` (0-based) of `kind` under `options`.
struct ScheduleRun {
  SchedulePlan plan;
  std::vector<double> lrs;  // lrs[i]: the lr step i runs with
};
ScheduleRun run_schedule(const TrainOptions& options) {
  ScheduleRun run;
  run.plan = plan_schedule(options, kStepsPerEpoch);
  Tensor w = zeros({1}).requires_grad_();
  optim::SGD sgd({w}, {.lr = kPeak, .momentum = 0.9, .nesterov = true});
  auto schedule = make_schedule(options.schedule, sgd, kPeak, run.plan);
  for (int64_t i = 0; i < run.plan.total_steps; ++i) {
    run.lrs.push_back(sgd.param_groups()[0].lr());
    schedule->step();
  }
  return run;
}

TrainOptions with(const std::string& schedule, int64_t epochs, int64_t max_steps = 0) {
  TrainOptions o;
  o.schedule = schedule;
  o.epochs = epochs;
  o.max_steps = max_steps;
  return o;
}

double cosine_between(double from, double to, double pct) {
  return to + (from - to) / 2 * (1 + std::cos(std::numbers::pi * pct));
}

// OneCycleLR (PyTorch's formula): cosine up from peak/25 to the peak at step
// e = pct_start x total - 1, cosine down to peak / 25 / 1e4 at the last step.
double onecycle_lr(int64_t step, double pct_start, int64_t total) {
  const double e = pct_start * static_cast<double>(total) - 1, i = static_cast<double>(step);
  if (i <= e) return cosine_between(kPeak / 25, kPeak, i / e);
  return cosine_between(kPeak, kPeak / 25e4, (i - e) / (static_cast<double>(total - 1) - e));
}

void expect_onecycle(const ScheduleRun& r) {
  const int64_t n = r.plan.total_steps, w = r.plan.warmup_steps;
  EXPECT_NEAR(r.plan.pct_start * static_cast<double>(n), static_cast<double>(w), 0.5);
  EXPECT_NEAR(r.lrs.front(), kPeak / 25, 1e-12);
  for (int64_t i : {w - 2, w - 1, w, w + (n - w) / 2, n - 2}) {
    EXPECT_NEAR(r.lrs[static_cast<size_t>(i)], onecycle_lr(i, r.plan.pct_start, n), 1e-12)
        << "step " << i << " of " << n;
  }
  EXPECT_NEAR(r.lrs[static_cast<size_t>(w - 1)], kPeak,
              1e-4 * kPeak);  // the peak (at step 139.4 of 468)
  EXPECT_NEAR(r.lrs.back(), kPeak / 25 / 1e4, 1e-12);
}

// LinearLR 1/3 -> 1 over warmup steps, then cosine to 0 at total_steps.
void expect_warmup_cosine(const ScheduleRun& r) {
  const int64_t w = r.plan.warmup_steps, n = r.plan.total_steps;
  EXPECT_NEAR(r.lrs.front(), kPeak / 3, 1e-12);
  EXPECT_NEAR(r.lrs[static_cast<size_t>(w)], kPeak, 1e-12);
  EXPECT_LT(r.lrs[static_cast<size_t>(w - 1)], kPeak);
  EXPECT_NEAR(r.lrs.back(),
              cosine_between(kPeak, 0, static_cast<double>(n - 1 - w) / static_cast<double>(n - w)),
              1e-12);
  EXPECT_LT(r.lrs.back(), kPeak * 1e-3);  // decayed, not at the peak
}

TEST(Schedule, OneEpochOneCycleWarmsUpFor30PercentAndDecays) {
  const ScheduleRun r = run_schedule(with("onecycle", 1));
  EXPECT_EQ(r.plan.total_steps, 468);
  EXPECT_EQ(r.plan.warmup_steps, 140);  // 30% of 468
  EXPECT_EQ(r.plan.pct_start, 0.3);     // PyTorch's default, exactly: the peak at step 139.4
  expect_onecycle(r);
}

TEST(Schedule, OneEpochCosineCapsItsOneEpochWarmup) {
  const ScheduleRun r = run_schedule(with("cosine", 1));
  EXPECT_EQ(r.plan.total_steps, 468);
  EXPECT_EQ(r.plan.warmup_steps, 140);
  EXPECT_TRUE(r.plan.warmup_capped);
  expect_warmup_cosine(r);
}

TEST(Schedule, TenEpochs) {
  const ScheduleRun one_cycle = run_schedule(with("onecycle", 10));
  EXPECT_EQ(one_cycle.plan.total_steps, 4680);
  EXPECT_EQ(one_cycle.plan.warmup_steps, 1404);
  expect_onecycle(one_cycle);
  const ScheduleRun cosine = run_schedule(with("cosine", 10));
  EXPECT_EQ(cosine.plan.warmup_steps, 468);  // one epoch, under the cap
  EXPECT_FALSE(cosine.plan.warmup_capped);
  expect_warmup_cosine(cosine);
}

TEST(Schedule, MaxStepsIsTheRunLength) {
  const ScheduleRun one_cycle = run_schedule(with("onecycle", 10, 200));
  EXPECT_EQ(one_cycle.plan.total_steps, 200);
  EXPECT_EQ(one_cycle.plan.warmup_steps, 60);
  expect_onecycle(one_cycle);
  TrainOptions asked = with("onecycle", 10, 200);
  asked.warmup_steps = 20;
  const ScheduleRun short_warmup = run_schedule(asked);
  EXPECT_EQ(short_warmup.plan.pct_start, 0.1);
  expect_onecycle(short_warmup);
  const ScheduleRun cosine = run_schedule(with("cosine", 10, 200));
  EXPECT_EQ(cosine.plan.warmup_steps, 60);
  expect_warmup_cosine(cosine);
}

TEST(Schedule, WarmupStepsWinOverEpochsAndAreCapped) {
  TrainOptions o = with("cosine", 10);
  o.warmup_epochs = 2;
  EXPECT_EQ(plan_schedule(o, kStepsPerEpoch).warmup_steps, 936);
  o.warmup_steps = 100;
  EXPECT_EQ(plan_schedule(o, kStepsPerEpoch).warmup_steps, 100);
  expect_warmup_cosine(run_schedule(o));
  o.warmup_steps = 4000;
  const SchedulePlan plan = plan_schedule(o, kStepsPerEpoch);
  EXPECT_EQ(plan.warmup_steps, 1404);
  EXPECT_TRUE(plan.warmup_capped);
  o.warmup_steps = 0;
  const ScheduleRun none = run_schedule(o);
  EXPECT_NEAR(none.lrs.front(), kPeak, 1e-12);
}

TEST(Schedule, ConstantAndStep) {
  TrainOptions o = with("constant", 2);
  const ScheduleRun constant = run_schedule(o);
  EXPECT_NEAR(constant.lrs.front(), kPeak / 3, 1e-12);
  EXPECT_NEAR(constant.lrs.back(), kPeak, 1e-12);
  o.schedule = "step";
  o.epochs = 4;
  const ScheduleRun step = run_schedule(o);  // warm-up 1 epoch, x0.1 at 50% and 75%
  EXPECT_NEAR(step.lrs[468], kPeak, 1e-12);
  EXPECT_NEAR(step.lrs[935], kPeak, 1e-12);
  EXPECT_NEAR(step.lrs[936], kPeak * 0.1, 1e-12);
  EXPECT_NEAR(step.lrs.back(), kPeak * 0.01, 1e-12);
}

TEST(Schedule, RefusesARunWithoutSteps) {
  EXPECT_THROW(plan_schedule(with("cosine", 1), 0), Error);
}

}  // namespace
}  // namespace ember::apps

namespace ember::apps {
namespace {

// Smoke runs of a few steps: every lr is finite and positive, none above the peak.
TEST(Schedule, TinyRunsHaveFiniteLrs) {
  for (const char* kind : {"onecycle", "cosine", "step", "constant"}) {
    for (int64_t steps = 1; steps <= 12; ++steps) {
      const ScheduleRun r = run_schedule(with(kind, 1, steps));
      ASSERT_EQ(static_cast<int64_t>(r.lrs.size()), steps);
      for (size_t i = 0; i < r.lrs.size(); ++i) {
        EXPECT_TRUE(std::isfinite(r.lrs[i]) && r.lrs[i] > 0 && r.lrs[i] <= kPeak * (1 + 1e-12))
            << kind << " over " << steps << " steps: lr " << r.lrs[i] << " at step " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ember::apps
